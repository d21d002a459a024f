"""A JSON Schema for scenario files, built from the loader's own tables (``elastic schema``).

Editors validate and complete YAML against a JSON Schema (yaml-language-server, used by VS
Code's and Neovim's YAML support, and JetBrains IDEs).  This module writes that schema from
what :mod:`sim.scenario.reader` reads, so the two cannot drift apart silently:

- the keys come from the loader's tables: the top-level keys (``TOP_KEYS``), each section's
  keys (``SECTIONS``), what each fault kind takes (``KIND_FIELDS`` and ``param_reader``)
  and the report keys ``expect:`` accepts (:data:`sim.expect.EXPECT_KEYS`);
- each value's type and bounds come from the loader's reader objects
  (:mod:`sim.scenario.walker`: ``Int``, ``Duration``, ``Choice``, …), converted one to one
  by :func:`_reader_schema`; the readers of the section keys, which the loader calls
  inline, are named in :data:`_SECTION_READERS`, and tests/test_schema.py checks that this
  table covers the loader's keys exactly and that the loader and the schema accept and
  refuse the same values at every bound.

What a JSON Schema cannot say is left to the loader (which an editor does not run): the
relations between keys (``min_nodes ≤ max_nodes``, a node index below the nodes that exist
at a fault's time, ``preload_saves ≤ startup_time``), the bounds of durations written as
strings, the number of faults rate faults would draw.

Use::

    elastic schema > scenario.schema.json          # or: python -m sim.schema
    # then, first line of a scenario file (yaml-language-server):
    # yaml-language-server: $schema=../docs/scenario.schema.json
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from sim import failures as gen
from sim.cliparse import OneLineParser
from sim.durations import DURATION_EXPECTED
from sim.expect import COUNT_KEYS, EXPECT_KEYS, SECONDS_KEYS, ExpectedState
from sim.scenario.limits import MAX_EXIT, MAX_FAULTS, MAX_NODES, MAX_NPROC, MAX_SECONDS
from sim.scenario.model import KIND_FIELDS, Cluster, Need, RendezvousBackendName
from sim.scenario.reader import RDZV_TIMEOUT, SECTIONS, TOP_KEYS, param_reader
from sim.scenario.walker import AnyInt, Choice, Duration, Int, NodeList, Real, Text

__all__ = ["DURATION_PATTERN", "SCHEMA_ID", "main", "scenario_schema"]

SCHEMA_ID = "https://github.com/elastic-sim-agent/elastic/scenario.schema.json"

_NUM = r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)"
#: A duration written as a string, as :func:`sim.durations.parse_duration` reads it: one
#: number (an exponent allowed) and a unit, or several parts from the largest unit down.
DURATION_PATTERN = (
    rf"^\s*(?:\+?{_NUM}(?:[eE][+-]?[0-9]+)?\s*(?:ms|s|m|h|d)"
    rf"|(?=\s*[0-9.])(?:{_NUM}\s*d)?(?:\s*{_NUM}\s*h)?(?:\s*{_NUM}\s*m)?"
    rf"(?:\s*{_NUM}\s*s)?(?:\s*{_NUM}\s*ms)?)\s*$"
)

# The readers the loader applies to each section key (it calls them inline in
# sim.scenario.reader's _ScenarioReader._cluster, _job, ...).  tests/test_schema.py probes
# the loader at every bound given here, so a reader changed there and not here fails a test.
_SECTION_READERS: dict[str, dict[str, Any]] = {
    "": {
        "name": Text(),
        "description": Text(),
        "seed": Int(0, 2**64),
        "until": Duration(positive=True),
        "calibration": Text(),
    },
    "cluster": {
        "nodes": Int(1, MAX_NODES),
        "nproc_per_node": Int(1, MAX_NPROC),
        "spare_nodes": Int(0, MAX_NODES),
    },
    "job": {
        "steps": Int(1),
        "step_time": Duration(positive=True),
        "startup_time": Duration(),
        "checkpoint_every": Int(0),
        "checkpoint_time": Duration(),
        "collective_timeout": Duration(positive=True),
        "timer": Duration(positive=True),
        "hang_timeout": Duration(positive=True),
        "preload_saves": Duration(),
    },
    "agent": {
        "max_restarts": Int(0),
        "monitor_interval": Duration(positive=True),
        "exit_barrier_timeout": Duration(),
        "shutdown_timeout": Duration(),
    },
    "rendezvous": {
        "backend": Choice(RendezvousBackendName),
        "min_nodes": Int(1, MAX_NODES),
        "max_nodes": Int(1, MAX_NODES),
        "join_timeout": RDZV_TIMEOUT,
        "last_call_timeout": RDZV_TIMEOUT,
        "heartbeat_timeout": RDZV_TIMEOUT,
        "close_timeout": RDZV_TIMEOUT,
    },
    "store": {"latency": Duration()},
}
# Required keys: what the loader refuses when absent (a fault's are in KIND_FIELDS).
_REQUIRED: dict[str, tuple[str, ...]] = {
    "": ("cluster", "job"),
    "cluster": ("nodes", "nproc_per_node"),
    "job": ("steps", "step_time"),
}
_NULL = {"type": "null"}


def _reader_schema(reader: Any) -> dict[str, Any]:
    """The JSON Schema of the values ``reader`` accepts (its ``expected`` as description)."""
    out: dict[str, Any]
    if isinstance(reader, Int):
        out = {"type": "integer", "minimum": reader.lo}
        if reader.hi is not None:
            out["maximum"] = reader.hi
    elif isinstance(reader, AnyInt):
        out = {"type": "integer", "minimum": -MAX_EXIT, "maximum": MAX_EXIT - 1}
    elif isinstance(reader, Real):
        out = {"type": "number"}
        out["exclusiveMinimum" if reader.lo_open else "minimum"] = reader.lo
        if reader.hi is not None:
            out["maximum"] = reader.hi
    elif isinstance(reader, Duration):
        number: dict[str, Any] = {"type": "number", "maximum": MAX_SECONDS}
        if reader.least:
            number["minimum"] = reader.least
        elif reader.positive:
            number["exclusiveMinimum"] = 0
        else:
            number["minimum"] = 0
        out = {"anyOf": [number, {"type": "string", "pattern": DURATION_PATTERN}]}
    elif isinstance(reader, Text):
        out = {"type": "string"}
    elif isinstance(reader, Choice):
        out = {"enum": [choice.value for choice in reader.choices]}
    elif isinstance(reader, NodeList):
        out = {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": MAX_NODES},
            "minItems": 1,
            "maxItems": MAX_NODES,
            "uniqueItems": True,
        }
    else:
        raise TypeError(f"no JSON Schema for the reader {reader!r}")
    out["description"] = reader.expected
    return out


def _optional(schema: dict[str, Any]) -> dict[str, Any]:
    # the loader reads an explicit null as "use the default" (Map.value_node)
    return {"anyOf": [schema, _NULL]}


def _section(name: str, keys: Sequence[str]) -> dict[str, Any]:
    readers = _SECTION_READERS[name]
    missing = [key for key in keys if key not in readers]
    if missing:
        raise KeyError(f"the schema has no reader for {name or 'top-level'} keys {missing}")
    required = _REQUIRED.get(name, ())
    return {
        "type": "object",
        "additionalProperties": False,
        "required": list(required),
        "properties": {
            key: _reader_schema(readers[key])
            if key in required
            else _optional(_reader_schema(readers[key]))
            for key in keys
        },
    }


def _fault_schemas() -> list[dict[str, Any]]:
    # a cluster with the largest nproc_per_node: local_rank's bound depends on the file
    widest = Cluster(nodes=1, nproc_per_node=MAX_NPROC)
    out: list[dict[str, Any]] = []
    for kind, params in KIND_FIELDS.items():
        for rate in (False, True):
            props: dict[str, Any] = {"kind": {"const": kind.value}}
            required = ["kind"]
            if rate:
                props["every"] = _reader_schema(Duration(positive=True))
                props["from"] = _optional(_reader_schema(Duration()))
                props["to"] = _optional(_reader_schema(Duration()))
                required.append("every")
            else:
                props["at"] = _reader_schema(Duration())
                required.append("at")
            props["category"] = _optional(_reader_schema(Text()))
            for name, need in params.items():
                schema = _reader_schema(param_reader(name, widest))
                needed = need is Need.REQUIRED or (need is Need.TARGET and not rate)
                if needed:
                    required.append(name)
                    props[name] = schema
                else:
                    props[name] = _optional(schema)
            out.append(
                {
                    "title": f"{kind.value} {'rate' if rate else 'at a time'}",
                    "type": "object",
                    "additionalProperties": False,
                    "required": required,
                    "properties": props,
                }
            )
    return out


def _failures_schema() -> dict[str, Any]:
    """``failures:``: a preset's name, or streams of categories (sim/failures.py's tables)."""
    widest = Cluster(nodes=1, nproc_per_node=1)
    repairs: list[dict[str, Any]] = [_reader_schema(Duration())]
    for dist, keys in gen._DIST_KEYS.items():
        props: dict[str, Any] = {"dist": {"const": dist.value}}
        for key in keys:
            props[key] = (
                _reader_schema(Real(0.0, 10.0)) if key == "sigma" else _reader_schema(Duration())
            )
        repairs.append(
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["dist", *keys],
                "properties": props,
            }
        )
    category_props: dict[str, Any] = {
        "name": _reader_schema(Text()),
        "weight": _optional(_reader_schema(Real(0.0, 1e12, lo_open=True))),
        "kind": {"enum": [k.value for k in gen.FAILURE_KINDS]},
        "repair": _optional({"anyOf": repairs}),
    }
    for key in ("notice", "factor", "exit_code"):
        category_props[key] = _optional(_reader_schema(param_reader(key, widest)))
    assert list(category_props) == list(gen._CATEGORY_KEYS)
    category = {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "kind"],
        "properties": category_props,
    }
    stream_props: dict[str, Any] = {
        "mtbf": _reader_schema(Duration(positive=True)),
        "per": _optional(_reader_schema(Choice(gen.Unit))),
        "categories": {
            "type": "array",
            "minItems": 1,
            "maxItems": gen._MAX_CATEGORIES,
            "items": category,
        },
    }
    assert list(stream_props) == list(gen._STREAM_KEYS)
    stream = {
        "type": "object",
        "additionalProperties": False,
        "required": ["mtbf", "categories"],
        "properties": stream_props,
    }
    return {
        "anyOf": [
            {"enum": sorted(gen.PRESETS), "description": "a named failure model"},
            {
                "type": "object",
                "additionalProperties": False,
                "minProperties": 1,
                "properties": {key: _optional(stream) for key in gen._MODEL_KEYS},
            },
        ]
    }


def _expect_schema() -> dict[str, Any]:
    props: dict[str, Any] = {}
    for key in EXPECT_KEYS:
        if key == "state":
            props[key] = _optional(_reader_schema(Choice(ExpectedState)))
            continue
        reader: Any
        if key in COUNT_KEYS:
            reader = Int(0)
        elif key in SECONDS_KEYS:
            reader = Duration()
        else:
            reader = Real(0.0, 1.0)
        value = _reader_schema(reader)
        bound = {
            "type": "object",
            "additionalProperties": False,
            "minProperties": 1,
            "properties": {"min": value, "max": value},
        }
        props[key] = {"anyOf": [value, bound, _NULL]}
    return {"type": "object", "additionalProperties": False, "properties": props}


def scenario_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of scenario files, from :mod:`sim.scenario`'s tables."""
    top = _section("", [k for k in TOP_KEYS if k in _SECTION_READERS[""]])
    props: dict[str, Any] = {}
    for key in TOP_KEYS:
        if key in top["properties"]:
            props[key] = top["properties"][key]
        elif key in SECTIONS:
            section = _section(key, SECTIONS[key])
            props[key] = section if key in _REQUIRED[""] else _optional(section)
        elif key == "faults":
            fault = {"oneOf": _fault_schemas()}
            props[key] = _optional({"type": "array", "maxItems": MAX_FAULTS, "items": fault})
        elif key == "failures":
            props[key] = _optional(_failures_schema())
        elif key == "expect":
            props[key] = _optional(_expect_schema())
        else:
            raise KeyError(f"the schema does not know the top-level key {key!r}")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "elastic scenario",
        "description": (
            "A scenario for `elastic sim` (sim/scenario/). Durations: "
            + DURATION_EXPECTED
            + ". Relations between keys are checked by the loader only."
        ),
        "type": "object",
        "additionalProperties": False,
        "required": list(_REQUIRED[""]),
        "properties": props,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Print the JSON Schema of scenario files (for editors' YAML validation and completion)."""
    parser = OneLineParser(
        prog="elastic schema",
        description="Print the JSON Schema of scenario files, built from the loader's tables.",
    )
    parser.add_argument("-o", "--output", help="write it to this file instead of stdout")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    text = json.dumps(scenario_schema(), indent=2, ensure_ascii=False) + "\n"
    if args.output is None:
        sys.stdout.write(text)
        return 0
    try:
        with open(args.output, "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as error:
        print(
            f"elastic schema: --output {args.output}: {error.strerror or error}; "
            "expected a writable file path",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
