"""The scenario writer: a :class:`~sim.scenario.model.Scenario` → the file's schema and YAML.

Guarantee: :func:`scenario_to_yaml` writes a scenario that
:func:`~sim.scenario.reader.load_scenario_text` reads back equal, laid out like the
hand-written files (one fault and one range per line).  ``elastic sim --write-faults``,
``elastic minimize`` and ``elastic sweep`` write through it; ``Scenario.to_dict()`` and
``Scenario.to_yaml()`` are these two functions.
"""

from __future__ import annotations

from typing import Any

import yaml

from sim.durations import format_duration
from sim.expect import ExpectedState
from sim.scenario.model import PARAM_FIELDS, Fault, RateFault, Scenario
from sim.scenario.walker import LOADER

__all__ = ["scenario_to_dict", "scenario_to_yaml"]

_DUMPER_BASE: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def scenario_to_dict(sc: Scenario) -> dict[str, Any]:
    """``sc`` in the file's schema (plain dicts, lists, str and numbers)."""
    out: dict[str, Any] = {"name": sc.name}
    if sc.description:
        out["description"] = sc.description
    out["seed"] = sc.seed
    out["until"] = format_duration(sc.until)
    out["cluster"] = {
        "nodes": sc.cluster.nodes,
        "nproc_per_node": sc.cluster.nproc_per_node,
        "spare_nodes": sc.cluster.spare_nodes,
    }
    job: dict[str, Any] = {
        "steps": sc.job.steps,
        "step_time": format_duration(sc.job.step_time),
        "startup_time": format_duration(sc.job.startup_time),
        "checkpoint_every": sc.job.checkpoint_every,
        "checkpoint_time": format_duration(sc.job.checkpoint_time),
        "collective_timeout": format_duration(sc.job.collective_timeout),
    }
    if sc.job.timer is not None:
        job["timer"] = format_duration(sc.job.timer)
    if sc.job.hang_timeout is not None:
        job["hang_timeout"] = format_duration(sc.job.hang_timeout)
    if sc.job.preload_saves is not None:
        job["preload_saves"] = format_duration(sc.job.preload_saves)
    out["job"] = job
    out["agent"] = {
        "max_restarts": sc.agent.max_restarts,
        "monitor_interval": format_duration(sc.agent.monitor_interval),
        "exit_barrier_timeout": format_duration(sc.agent.exit_barrier_timeout),
        "shutdown_timeout": format_duration(sc.agent.shutdown_timeout),
    }
    rdzv = sc.rendezvous
    out["rendezvous"] = {
        "backend": rdzv.backend.value,
        "min_nodes": rdzv.min_nodes,
        "max_nodes": rdzv.max_nodes,
        "join_timeout": format_duration(rdzv.join_timeout),
        "last_call_timeout": format_duration(rdzv.last_call_timeout),
        "heartbeat_timeout": format_duration(rdzv.heartbeat_timeout),
        "close_timeout": format_duration(rdzv.close_timeout),
    }
    out["store"] = {"latency": format_duration(sc.store.latency)}
    if sc.calibration:
        out["calibration"] = sc.calibration
    if sc.failures is not None:
        out["failures"] = sc.failures.to_data()
    out["faults"] = [_fault_to_dict(f) for f in sc.faults]
    expect: dict[str, Any] = {}
    for key, wanted in sc.expect.items():
        if isinstance(wanted, ExpectedState):
            expect[key] = wanted.value
        elif wanted.exact is not None:
            expect[key] = wanted.exact
        else:
            expect[key] = {
                k: v for k, v in (("min", wanted.min), ("max", wanted.max)) if v is not None
            }
    out["expect"] = expect
    return out


def scenario_to_yaml(sc: Scenario) -> str:
    """``sc`` as YAML that :func:`~sim.scenario.reader.load_scenario_text` reads back equal."""
    data = scenario_to_dict(sc)
    # one fault (and one range) per line reads like the hand-written files
    data["faults"] = [_FlowDict(f) for f in data["faults"]]
    data["expect"] = {
        k: _FlowDict(v) if isinstance(v, dict) else v for k, v in data["expect"].items()
    }
    for allow_unicode in (True, False):
        text = yaml.dump(
            data,
            Dumper=_ScenarioDumper,
            sort_keys=False,
            default_flow_style=False,
            allow_unicode=allow_unicode,
            width=100,
        )
        # PyYAML writes some characters (NEL U+0085, U+2028) raw that read back as line
        # breaks; escaping all non-ASCII is the exact fallback
        if yaml.load(text, Loader=LOADER) == data:
            break
    return text


class _FlowDict(dict[str, Any]):
    """A mapping written in flow style (``{at: 10m, kind: worker_crash}``)."""


def _represent_flow(dumper: yaml.SafeDumper, data: _FlowDict) -> yaml.Node:
    return dumper.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=True)


def _represent_list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    # short lists of scalars (network_partition nodes) stay on one line
    flow = all(not isinstance(item, dict | list) for item in data) and bool(data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


# a SafeDumper (libyaml's when available) writing _FlowDict in flow style, lists as in
# the examples; built with type() because its base is chosen at import time
_ScenarioDumper: Any = type("_ScenarioDumper", (_DUMPER_BASE,), {})
_ScenarioDumper.add_representer(_FlowDict, _represent_flow)
_ScenarioDumper.add_representer(list, _represent_list)


def _fault_to_dict(fault: Fault | RateFault) -> dict[str, Any]:
    out: dict[str, Any]
    if isinstance(fault, Fault):
        out = {"at": format_duration(fault.at), "kind": fault.kind.value}
    else:
        out = {"kind": fault.kind.value, "every": format_duration(fault.every)}
        if fault.start:
            out["from"] = format_duration(fault.start)
        if fault.end is not None:
            out["to"] = format_duration(fault.end)
    for name in PARAM_FIELDS:
        value = getattr(fault, name)
        if value is None:
            continue
        if name == "nodes":
            value = list(value)
        elif name in ("restart_after", "notice", "duration"):
            value = format_duration(value)
        out[name] = value
    return out
