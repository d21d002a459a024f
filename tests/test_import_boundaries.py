"""The import rules of DESIGN §1, read from the source (AST), so a new import breaks a test.

1. Nothing in ``elastic/`` imports simpy or the simulator.
2. Only the real adapters import asyncio, subprocess, socket, signal, selectors or time
   (the wall clock).  The agent, rendezvous, rank assignment, the timer table and driver,
   the store and the ports go through the clock port.  The one exception is
   ``elastic/clock.py`` naming ``asyncio.CancelledError`` as the port's cancellation type.
3. ``sim/`` may import ``elastic/`` (it adds worlds, not agent logic).
4. Transitively too: a module of the pure core (:data:`MUST_BE_PURE`) reaches no real
   adapter through its ``elastic`` imports (``agent`` → ``metrics`` → the wall clock is as
   much a wall-clock import as ``import time``), except through the edges of
   :data:`KNOWN_EDGES`, each written down with its reason.
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
    "elastic/cli.py",  # the `elastic` command's process entry: its SIGINT handler, its exit
    "elastic/launcher/*",
    "elastic/agent/server/local_elastic_agent.py",
    "elastic/agent/server/health_check_server.py",
    # torch's synchronous driver, for subclasses written for torch: polls their
    # _monitor_workers on the wall clock, as torch's run() does
    "elastic/agent/server/_torch_style.py",
    # torch's LocalElasticAgent hooks over real processes (start_processes, signals)
    "elastic/agent/server/_torch_local.py",
    "elastic/multiprocessing/*",
    "elastic/multiprocessing/errors/*",
    "elastic/multiprocessing/subprocess_handler/*",  # torch's Popen wrapper for one worker
    "elastic/metrics/api.py",
    "elastic/progress.py",
    "elastic/timer/wallclock.py",
    "elastic/timer/serving.py",
    "elastic/timer/guard.py",
    "elastic/timer/local_timer.py",
    "elastic/timer/file_based_local_timer.py",
    "elastic/utils/api.py",  # torch's get_socket_with_port: opens a listening socket
    # newer torch's GPU health check: NVML from a worker thread, asyncio's sleep between
    # checks (a real-mode utility for programs; the agent checks through elastic.gpu)
    "elastic/utils/gpu_health_check.py",
}

# The pure core: these must stay free of I/O imports whatever else changes.
MUST_BE_PURE = [
    "elastic/store.py",
    "elastic/workers.py",
    "elastic/memstore.py",
    "elastic/agent/ranks.py",
    "elastic/agent/server/api.py",
    "elastic/agent/server/_decide.py",
    "elastic/events/kinds.py",
    "elastic/metrics/core.py",
    "elastic/rendezvous/_core.py",
    "elastic/rendezvous/dynamic.py",
    "elastic/rendezvous/dynamic_rendezvous.py",
    "elastic/rendezvous/static.py",
    "elastic/rendezvous/api.py",
    "elastic/rendezvous/assignment.py",
    "elastic/timer/table.py",
    "elastic/timer/driver.py",
    "elastic/timer/api.py",
    "elastic/events/__init__.py",
    "elastic/testing/store.py",
]


# (importer, imported) edges allowed to reach a real adapter, and why.  A new path to an
# adapter fails test_no_core_module_reaches_a_real_adapter_transitively.
KNOWN_EDGES: dict[tuple[str, str], str] = {
    ("elastic/agent/server/api.py", "elastic/real/clock.py"): (
        "the synchronous run() (torch's API) makes an asyncio clock when none was given; "
        "imported inside run(), never by the async agent"
    ),
    ("elastic/agent/server/api.py", "elastic/metrics/api.py"): (
        "the synchronous run() (torch's API, real mode) sends the agent's metrics to the "
        "handlers set with metrics.configure(), and torch's put_metric is a name of the "
        "module (torch's tests patch it there); never called by the async agent, whose "
        "metrics go through its own AgentMetrics on its clock"
    ),
    ("elastic/agent/server/api.py", "elastic/agent/server/_torch_style.py"): (
        "torch's synchronous driver, given (in __init_subclass__) only to a subclass that "
        "defines torch's _monitor_workers; no class of elastic's does, and the async "
        "agent never runs it"
    ),
    ("elastic/timer/api.py", "elastic/timer/wallclock.py"): (
        "debt: torch's expires() runs in the worker process and reads the wall clock there; "
        "timer.driver imports timer.api for its request types only"
    ),
    ("elastic/agent/server/api.py", "elastic/launcher/api.py"): (
        "torch's _get_fq_hostname(): this host's FQDN, imported inside the call"
    ),
    ("elastic/rendezvous/static_tcp_rendezvous.py", "elastic/real/rdzv_context.py"): (
        "torch's create_rdzv_handler(params) with no ports builds real mode's (inside the call)"
    ),
    # torch's port-less API (get_rendezvous_handler(params), from_backend(...) without a
    # clock, RendezvousStoreInfo.build without an address, rdzv events' hostname): real
    # mode by definition, so it builds real mode's ports, inside those calls only; the
    # agent and the simulator always pass ports and never reach these imports
    ("elastic/rendezvous/registry.py", "elastic/real/rdzv_context.py"): (
        "get_rendezvous_handler(params) with no ports builds real mode's (inside the call)"
    ),
    ("elastic/rendezvous/etcd_rendezvous.py", "elastic/real/rdzv_context.py"): (
        "torch's create_rdzv_handler(params) with no ports builds real mode's (inside the call)"
    ),
    ("elastic/rendezvous/api.py", "elastic/launcher/api.py"): (
        "torch's RendezvousStoreInfo.build with no address: this host's FQDN and a free port"
    ),
    ("elastic/rendezvous/dynamic_rendezvous.py", "elastic/launcher/api.py"): (
        "from_backend(...) with no local_addr: this host's FQDN (inside the call)"
    ),
    ("elastic/rendezvous/dynamic_rendezvous.py", "elastic/real/rdzv_context.py"): (
        "from_backend(...) with no clock: real mode's shared loop and torch's node id"
    ),
    ("elastic/rendezvous/dynamic_rendezvous.py", "elastic/timer/wallclock.py"): (
        "from_backend(...) with no clock: backend leases compare wall times across nodes, "
        "as torch's heartbeats do"
    ),
    ("elastic/events/api.py", "elastic/launcher/api.py"): (
        "construct_and_record_rdzv_event's default hostname (torch's FQDN), computed only "
        "when a handler other than the null one is configured"
    ),
}


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


def _resolve(mod: str) -> Path | None:
    p = ROOT.joinpath(*mod.split("."))
    if p.with_suffix(".py").exists():
        return p.with_suffix(".py")
    if (p / "__init__.py").exists():
        return p / "__init__.py"
    return None


def _elastic_deps(path: Path) -> list[str]:
    """The files of ``elastic`` modules ``path`` imports (a ``from m import sub`` counts
    the submodule too)."""
    out: list[str] = []
    for mod, names in _modules(ast.parse(path.read_text())):
        if mod.split(".")[0] != "elastic":
            continue
        for target in [mod, *(f"{mod}.{n}" for n in names)]:
            f = _resolve(target)
            if f is not None and _rel(f) not in out:
                out.append(_rel(f))
    return out


def _paths_to_adapters(
    start: str, deps: dict[str, list[str]], allowed: set[tuple[str, str]]
) -> list[list[str]]:
    """Every adapter reachable from ``start`` (not crossing an allowed edge), each with
    the import chain that reaches it."""
    parent: dict[str, str | None] = {start: None}
    todo = [start]
    found: list[list[str]] = []
    while todo:
        cur = todo.pop()
        for nxt in deps.get(cur, []):
            if nxt in parent or (cur, nxt) in allowed:
                continue
            parent[nxt] = cur
            if _is_adapter(nxt):
                chain = [nxt]
                while (up := parent[chain[-1]]) is not None:
                    chain.append(up)
                found.append(chain[::-1])
            else:
                todo.append(nxt)
    return found


def _all_deps() -> dict[str, list[str]]:
    return {_rel(p): _elastic_deps(p) for p in ALL_ELASTIC}


def test_no_core_module_reaches_a_real_adapter_transitively() -> None:
    deps = _all_deps()
    bad = [
        " -> ".join(chain)
        for rel in MUST_BE_PURE
        for chain in _paths_to_adapters(rel, deps, set(KNOWN_EDGES))
    ]
    assert bad == [], "a core module reaches a real adapter:\n" + "\n".join(sorted(set(bad)))


def test_every_known_edge_still_exists_and_still_needs_its_exception() -> None:
    deps = _all_deps()
    for (src, dst), why in KNOWN_EDGES.items():
        assert dst in deps.get(src, []), f"{src} no longer imports {dst}: drop the entry ({why})"
        others = set(KNOWN_EDGES) - {(src, dst)}
        assert _paths_to_adapters(src, deps, others), f"{src} -> {dst} reaches no adapter"


def test_the_transitive_check_names_the_chain_to_an_adapter() -> None:
    deps = {
        "elastic/agent/x.py": ["elastic/metrics/y.py"],
        "elastic/metrics/y.py": ["elastic/real/clock.py"],
    }
    assert _paths_to_adapters("elastic/agent/x.py", deps, set()) == [
        ["elastic/agent/x.py", "elastic/metrics/y.py", "elastic/real/clock.py"]
    ]
    allowed = {("elastic/agent/x.py", "elastic/metrics/y.py")}
    assert _paths_to_adapters("elastic/agent/x.py", deps, allowed) == []
