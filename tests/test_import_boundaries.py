"""The import rules of DESIGN §1, read from the source (AST), so a new import breaks a test.

1. Nothing in ``elastic/`` imports simpy or the simulator.
2. Only the real adapters import asyncio, subprocess, socket, signal, selectors or time
   (the wall clock).  The agent, rendezvous, rank assignment, the timer table and driver,
   the store and the ports go through the clock port.  The one exception is
   ``elastic/clock.py`` naming ``asyncio.CancelledError`` as the port's cancellation type.
3. ``sim/`` may import ``elastic/`` (it adds worlds, not agent logic).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ELASTIC = ROOT / "elastic"

FORBIDDEN_IN_CORE = {"asyncio", "subprocess", "socket", "signal", "selectors", "time"}

# Modules whose whole purpose is OS I/O: real-mode adapters and real-mode entry points.
REAL_ADAPTERS = {
    "elastic/real/*",
    "elastic/run.py",
    "elastic/launcher/*",
    "elastic/agent/server/local_elastic_agent.py",
    "elastic/agent/server/health_check_server.py",
    "elastic/multiprocessing/*",
    "elastic/multiprocessing/errors/*",
    "elastic/metrics/api.py",
    "elastic/progress.py",
    "elastic/timer/wallclock.py",
    "elastic/timer/serving.py",
    "elastic/timer/guard.py",
    "elastic/timer/local_timer.py",
    "elastic/timer/file_based_local_timer.py",
}

# The pure core: these must stay free of I/O imports whatever else changes.
MUST_BE_PURE = [
    "elastic/store.py",
    "elastic/workers.py",
    "elastic/memstore.py",
    "elastic/agent/ranks.py",
    "elastic/agent/server/api.py",
    "elastic/rendezvous/_core.py",
    "elastic/rendezvous/dynamic.py",
    "elastic/rendezvous/dynamic_rendezvous.py",
    "elastic/rendezvous/static.py",
    "elastic/rendezvous/api.py",
    "elastic/timer/table.py",
    "elastic/timer/driver.py",
    "elastic/timer/api.py",
    "elastic/events/__init__.py",
    "elastic/testing/store.py",
]


def _modules(node: ast.AST) -> list[tuple[str, list[str]]]:
    """(module, imported names) for every import statement, nested ones included."""
    out: list[tuple[str, list[str]]] = []
    for n in ast.walk(node):
        if isinstance(n, ast.Import):
            out += [(a.name, []) for a in n.names]
        elif isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
            out.append((n.module, [a.name for a in n.names]))
    return out


def _rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def _is_adapter(rel: str) -> bool:
    return any(Path(rel).match(pat) for pat in REAL_ADAPTERS)


ALL_ELASTIC = sorted(ELASTIC.rglob("*.py"))


@pytest.mark.parametrize("path", ALL_ELASTIC, ids=_rel)
def test_elastic_never_imports_the_simulator(path: Path) -> None:
    for mod, _ in _modules(ast.parse(path.read_text())):
        top = mod.split(".")[0]
        assert top not in {"simpy", "sim"}, f"{_rel(path)} imports {mod}"


@pytest.mark.parametrize("path", ALL_ELASTIC, ids=_rel)
def test_only_real_adapters_import_os_io_or_the_wall_clock(path: Path) -> None:
    rel = _rel(path)
    if _is_adapter(rel):
        return
    for mod, names in _modules(ast.parse(path.read_text())):
        top = mod.split(".")[0]
        if top not in FORBIDDEN_IN_CORE:
            continue
        if rel == "elastic/clock.py" and mod == "asyncio" and names == ["CancelledError"]:
            continue
        raise AssertionError(f"{rel} imports {mod} {names or ''}; only real adapters may")


@pytest.mark.parametrize("rel", MUST_BE_PURE)
def test_the_core_modules_exist_and_are_not_listed_as_adapters(rel: str) -> None:
    assert (ROOT / rel).exists(), rel
    assert not _is_adapter(rel)


def test_the_checker_catches_a_forbidden_import(tmp_path: Path) -> None:
    bad = ast.parse("def f():\n    import time\n    return time.time()\n")
    assert ("time", []) in _modules(bad)
