"""The JSON Schema of scenario files (sim/schema.py) says what the loader says.

The schema is built from the loader's tables; these tests pin that the shipped copy in docs/
is the built one, that it covers the loader's keys exactly, and that the schema and the
loader accept and refuse the same values at every bound the readers set.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from elastic.errors import ConfigError
from sim.durations import parse_duration
from sim.scenario.limits import MAX_NODES, MAX_SECONDS
from sim.scenario.model import KIND_FIELDS, FaultKind, Need
from sim.scenario.reader import SECTIONS, TOP_KEYS, load_scenario_text
from sim.scenario.walker import Choice, Duration, Int, Text
from sim.schema import _SECTION_READERS, DURATION_PATTERN, main, scenario_schema

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "docs" / "scenario.schema.json"
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))
VALIDATOR = jsonschema.Draft202012Validator(scenario_schema())

BASE: dict[str, Any] = {
    "cluster": {"nodes": 2, "nproc_per_node": 2},
    # the longest start-up, so that preload_saves (≤ startup_time) is probed on its own bounds
    "job": {"steps": 10, "step_time": 1, "startup_time": MAX_SECONDS},
}


def _loader_accepts(data: dict[str, Any]) -> bool:
    try:
        load_scenario_text(yaml.safe_dump(data, sort_keys=False))
    except ConfigError:
        return False
    return True


def _schema_accepts(data: dict[str, Any]) -> bool:
    return VALIDATOR.is_valid(data)


def _with(section: str, key: str, value: object) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    if section:
        data.setdefault(section, {})[key] = value
    else:
        data[key] = value
    return data


def test_shipped_schema_is_the_one_the_loader_tables_build() -> None:
    shipped = json.loads(SHIPPED.read_text(encoding="utf-8"))
    assert shipped == scenario_schema(), (
        "docs/scenario.schema.json is stale; regenerate it: "
        "python -m sim.schema -o docs/scenario.schema.json"
    )


def test_schema_is_valid_draft_2020_12() -> None:
    jsonschema.Draft202012Validator.check_schema(scenario_schema())


def test_schema_keys_are_the_loaders_keys() -> None:
    props = scenario_schema()["properties"]
    assert list(props) == list(TOP_KEYS)
    for section, keys in SECTIONS.items():
        schema = props[section]
        if "anyOf" in schema:
            schema = schema["anyOf"][0]
        assert list(schema["properties"]) == list(keys)
        assert set(_SECTION_READERS[section]) == set(keys)
    faults = props["faults"]["anyOf"][0]["items"]["oneOf"]
    assert {f["properties"]["kind"]["const"] for f in faults} == {k.value for k in FaultKind}


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_every_shipped_scenario_validates(path: Path) -> None:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    errors = [e.message for e in VALIDATOR.iter_errors(data)]
    assert errors == []


# relations between keys the schema cannot express (see sim/schema.py's docstring)
RELATIONAL = {
    ("cluster", "spare_nodes", repr(MAX_NODES)),  # nodes + spares ≤ MAX_NODES
}


def _probes(reader: Any) -> list[object]:
    if isinstance(reader, Int):
        values: list[object] = [reader.lo, reader.lo - 1, "7", 1.5, True]
        if reader.hi is not None:
            values += [reader.hi, reader.hi + 1]
        return values
    if isinstance(reader, Duration):
        return [
            0,
            0.5,
            1,
            reader.least,
            MAX_SECONDS,
            MAX_SECONDS * 2,
            -1,
            "10m",
            "1h30m",
            "abc",
            "-5s",
            True,
            [1],
        ]
    if isinstance(reader, Choice):
        return [*[c.value for c in reader.choices], "nope", 3]
    if isinstance(reader, Text):
        return ["x", 3, [1]]
    raise AssertionError(f"no probes for {reader!r}")


CASES = [
    (section, key, value)
    for section, readers in _SECTION_READERS.items()
    for key, reader in readers.items()
    for value in _probes(reader)
]


@pytest.mark.parametrize(("section", "key", "value"), CASES)
def test_schema_and_loader_agree_at_the_bounds(section: str, key: str, value: object) -> None:
    data = _with(section, key, value)
    loaded = _loader_accepts(data)
    if (section, key, repr(value)) in RELATIONAL:
        assert not loaded and _schema_accepts(data)
        return
    assert _schema_accepts(data) == loaded, f"{section}.{key}={value!r}: loader {loaded}"


def _minimal_fault(kind: FaultKind, rate: bool) -> dict[str, Any]:
    fault: dict[str, Any] = {"kind": kind.value}
    fault.update({"every": "1h"} if rate else {"at": "10m"})
    values = {
        "node": 1,
        "local_rank": 0,
        "notice": "30s",
        "duration": "1m",
        "nodes": [1],
        "factor": 2.0,
    }
    for name, need in KIND_FIELDS[kind].items():
        if need is Need.REQUIRED or (need is Need.TARGET and not rate):
            fault[name] = values[name]
    return fault


@pytest.mark.parametrize("rate", [False, True], ids=["timed", "rate"])
@pytest.mark.parametrize("kind", list(FaultKind), ids=[k.value for k in FaultKind])
def test_schema_and_loader_agree_on_each_fault_kind(kind: FaultKind, rate: bool) -> None:
    fault = _minimal_fault(kind, rate)
    data = {**copy.deepcopy(BASE), "until": "1d", "faults": [fault]}
    assert _loader_accepts(data) and _schema_accepts(data)
    for name in fault:
        if name == "kind":
            continue
        missing = {**data, "faults": [{k: v for k, v in fault.items() if k != name}]}
        assert _schema_accepts(missing) == _loader_accepts(missing), f"without {name}"
    unknown = {**data, "faults": [{**fault, "colour": "red"}]}
    assert not _schema_accepts(unknown) and not _loader_accepts(unknown)
    both = {**data, "faults": [{**fault, "at": "1m", "every": "1h"}]}
    assert not _schema_accepts(both) and not _loader_accepts(both)


@pytest.mark.parametrize(
    "text",
    [
        "10m",
        "1.5h",
        "500ms",
        " 2 d ",
        "1h30m",
        "2m30s",
        "1m500ms",
        "1e3s",
        "+5s",
        ".5s",
        "5.s",
        "1m1m",
        "30s1m",
        "m",
        "",
        "1x",
        "-5s",
        "1h 30m",
        "10 ms",
        "1d2h3m4s5ms",
        "1 h30",
        "1ms1s",
    ],
)
def test_duration_pattern_is_the_parsers(text: str) -> None:
    try:
        parse_duration(text)
        parsed = True
    except ValueError:
        parsed = False
    assert (re.search(DURATION_PATTERN, text) is not None) == parsed


def test_schema_command_writes_the_file_and_refuses_an_unwritable_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "s.json"
    assert main(["-o", str(out)]) == 0
    assert json.loads(out.read_text(encoding="utf-8")) == scenario_schema()
    assert main(["-o", str(tmp_path / "missing" / "s.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--output" in err
