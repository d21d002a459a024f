"""torch's documented elastic API, used the way torch's docs and tests use it.

The names come from the seeds (torch's docs: ``seeds/000`` to ``004``) and issue 19; each is
imported at torch's path with ``torch.distributed.elastic`` replaced by ``elastic``.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from elastic.rendezvous import (
    RendezvousError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    get_rendezvous_handler,
    rendezvous_handler_registry,
)
from elastic.rendezvous.api import sync_store_of

# (module, name) at torch's path; name None = the module itself
SEED_NAMES: list[tuple[str, str | None]] = [
    # seeds 000/002: the agent
    ("elastic.agent", None),
    ("elastic.agent.server", None),
    ("elastic.agent.server", "ElasticAgent"),
    ("elastic.agent.server", "WorkerSpec"),
    ("elastic.agent.server", "WorkerState"),
    ("elastic.agent.server", "Worker"),
    ("elastic.agent.server", "WorkerGroup"),
    ("elastic.agent.server", "SimpleElasticAgent"),
    ("elastic.agent.server.health_check_server", "HealthCheckServer"),
    ("elastic.agent.server.api", "RunResult"),
    ("elastic.agent.server.local_elastic_agent", "LocalElasticAgent"),
    ("elastic.agent.server.health_check_server", "create_healthcheck_server"),
    # seed 001: agent.server.api's __all__ and what it imports
    ("elastic.agent.server.api", "WorkerSpec"),
    ("elastic.agent.server.api", "Worker"),
    ("elastic.agent.server.api", "WorkerState"),
    ("elastic.agent.server.api", "WorkerGroup"),
    ("elastic.agent.server.api", "ElasticAgent"),
    ("elastic.agent.server.api", "SimpleElasticAgent"),
    ("elastic.metrics", "prof"),
    ("elastic.metrics", "put_metric"),
    ("elastic.events", "Event"),
    ("elastic.events", "EventSource"),
    ("elastic.events", "record"),
    # seed 003: rendezvous
    ("elastic.rendezvous", "RendezvousParameters"),
    ("elastic.rendezvous", "RendezvousHandlerRegistry"),
    ("elastic.rendezvous.registry", None),
    ("elastic.rendezvous.registry", "get_rendezvous_handler"),
    ("elastic.rendezvous", "RendezvousHandler"),
    ("elastic.rendezvous", "RendezvousInfo"),
    ("elastic.rendezvous.api", "RendezvousStoreInfo"),
    ("elastic.rendezvous.api", "RendezvousError"),
    ("elastic.rendezvous.api", "RendezvousClosedError"),
    ("elastic.rendezvous.api", "RendezvousTimeoutError"),
    ("elastic.rendezvous.api", "RendezvousConnectionError"),
    ("elastic.rendezvous.api", "RendezvousStateError"),
    ("elastic.rendezvous.api", "RendezvousGracefulExitError"),
    ("elastic.rendezvous.api", "rendezvous_handler_registry"),
    ("elastic.rendezvous.dynamic_rendezvous", "create_handler"),
    ("elastic.rendezvous.dynamic_rendezvous", "DynamicRendezvousHandler"),
    ("elastic.rendezvous.dynamic_rendezvous", "RendezvousBackend"),
    ("elastic.rendezvous.dynamic_rendezvous", "RendezvousTimeout"),
    ("elastic.rendezvous.c10d_rendezvous_backend", "create_backend"),
    ("elastic.rendezvous.c10d_rendezvous_backend", "C10dRendezvousBackend"),
    ("elastic.rendezvous.etcd_rendezvous_backend", "create_backend"),
    ("elastic.rendezvous.etcd_rendezvous_backend", "EtcdRendezvousBackend"),
    ("elastic.rendezvous.etcd_rendezvous", "EtcdRendezvousHandler"),
    ("elastic.rendezvous.etcd_store", "EtcdStore"),
    ("elastic.rendezvous.etcd_server", "EtcdServer"),
    # seed 004: timers
    ("elastic.timer", "configure"),
    ("elastic.timer", "expires"),
    ("elastic.timer", "LocalTimerServer"),
    ("elastic.timer", "LocalTimerClient"),
    ("elastic.timer", "TimerRequest"),
    ("elastic.timer", "TimerServer"),
    ("elastic.timer", "TimerClient"),
    # issue 19: named there as missing
    ("elastic.timer", "FileTimerServer"),
    ("elastic.timer", "FileTimerClient"),
    ("elastic.timer.debug_info_logging", "log_debug_info_for_expired_timers"),
    ("elastic.events", "get_logging_handler"),
    ("elastic.events", "construct_and_record_rdzv_event"),
    ("elastic.events", "NodeState"),
    ("elastic.events", "RdzvEvent"),
    ("elastic.multiprocessing", "start_processes"),
    ("elastic.multiprocessing", "PContext"),
    ("elastic.multiprocessing", "RunProcsResult"),
    ("elastic.multiprocessing", "ProcessFailure"),
    ("elastic.multiprocessing", "Std"),
    ("elastic.multiprocessing", "DefaultLogsSpecs"),
    ("elastic.multiprocessing.api", "SignalException"),
    ("elastic.multiprocessing.api", "PContext"),
    ("elastic.multiprocessing.api", "RunProcsResult"),
    ("elastic.multiprocessing.errors", "record"),
    ("elastic.multiprocessing.errors", "ChildFailedError"),
    ("elastic.launcher.api", "LaunchConfig"),
    ("elastic.launcher.api", "elastic_launch"),
    ("elastic.launcher.api", "launch_agent"),
    ("elastic.run", "main"),
]


@pytest.mark.parametrize(
    ("module", "name"),
    [pytest.param(m, n, id=f"{m}:{n}" if n else m) for m, n in SEED_NAMES],
)
def test_every_documented_name_imports_at_torchs_path(module: str, name: str | None) -> None:
    mod = importlib.import_module(module)
    if name is not None:
        assert getattr(mod, name) is not None


# -- a torch user's synchronous handler ---------------------------------------------------


class TorchStore:
    """A blocking store with torch's methods (what a torch user's handler returns)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.cond = threading.Condition()

    def set(self, key: str, value: bytes) -> None:
        with self.cond:
            self.data[key] = bytes(value)
            self.cond.notify_all()

    def get(self, key: str) -> bytes:
        self.wait([key])
        return self.data[key]

    def add(self, key: str, amount: int) -> int:
        with self.cond:
            n = int(self.data.get(key, b"0")) + amount
            self.data[key] = str(n).encode()
            self.cond.notify_all()
            return n

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        with self.cond:
            cur = self.data.get(key, b"")
            if cur == expected:
                self.data[key] = desired
                self.cond.notify_all()
                return desired
            return cur

    def wait(self, keys: Sequence[str], timeout: timedelta = timedelta(seconds=30)) -> None:
        with self.cond:
            if not self.cond.wait_for(
                lambda: all(k in self.data for k in keys), timeout.total_seconds()
            ):
                raise TimeoutError(f"{keys}")

    def check(self, keys: Sequence[str]) -> bool:
        return all(k in self.data for k in keys)

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        return [self.get(k) for k in keys]

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes]) -> None:
        for k, v in zip(keys, values, strict=True):
            self.set(k, v)

    def delete_key(self, key: str) -> bool:
        with self.cond:
            return self.data.pop(key, None) is not None


class TorchStyleHandler(RendezvousHandler):
    """Only torch's synchronous methods, as a torch user writes one."""

    def __init__(self) -> None:
        self.closed = False
        self.threads: list[str] = []
        self.store = TorchStore()

    def get_backend(self) -> str:
        return "mine"

    def get_run_id(self) -> str:
        return "mine-run"

    def next_rendezvous(self) -> RendezvousInfo:
        self.threads.append(threading.current_thread().name)
        return RendezvousInfo(self.store, 0, 1, RendezvousStoreInfo("127.0.0.1", 29999))

    def is_closed(self) -> bool:
        return self.closed

    def set_closed(self) -> None:
        self.closed = True

    def num_nodes_waiting(self) -> int:
        return 0

    def shutdown(self) -> bool:
        return True


def test_a_torch_style_synchronous_handler_can_be_instantiated_and_used_directly() -> None:
    h = TorchStyleHandler()
    assert h.synchronous_methods() == [
        "next_rendezvous",
        "is_closed",
        "set_closed",
        "num_nodes_waiting",
        "shutdown",
    ]
    assert h.next_rendezvous().world_size == 1
    h.set_closed()
    assert h.is_closed() and h.shutdown()


@pytest.mark.timeout(60)
def test_the_real_agent_drives_a_synchronous_handler_in_threads(tmp_path: Path) -> None:
    from elastic.agent.server.api import WorkerSpec, WorkerState
    from elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from elastic.multiprocessing.api import DefaultLogsSpecs

    h = TorchStyleHandler()
    spec = WorkerSpec(
        role="default", local_world_size=2, entrypoint="/bin/true", rdzv_handler=h, max_restarts=0
    )
    result = LocalElasticAgent(spec, DefaultLogsSpecs(str(tmp_path))).run()
    assert result is not None and result.state == WorkerState.SUCCEEDED
    # the agent's loop thread never blocked in the handler
    assert h.threads and all(t != threading.main_thread().name for t in h.threads)
    # the agent exchanged ranks through the handler's own (blocking) store
    assert any(k.startswith("torchelastic/role_info") for k in h.store.data)


def test_the_simulator_refuses_a_synchronous_handler_in_one_line() -> None:
    from elastic.agent.server.api import SimpleElasticAgent, WorkerSpec
    from sim.clock import SimClock

    spec = WorkerSpec(
        role="r", local_world_size=1, entrypoint="x", rdzv_handler=TorchStyleHandler()
    )
    agent = SimpleElasticAgent(spec, clock=SimClock())
    coro = agent.run_async()
    with pytest.raises(RendezvousError) as e:
        coro.send(None)
    assert "\n" not in str(e.value)
    assert "TorchStyleHandler implements only torch's synchronous next_rendezvous()" in str(e.value)
    assert "implement next_rendezvous_async()" in str(e.value)


def test_a_handler_with_neither_face_says_which_methods_are_missing() -> None:
    class Half(TorchStyleHandler):
        next_rendezvous = RendezvousHandler.next_rendezvous  # type: ignore[assignment]

    with pytest.raises(NotImplementedError, match="neither next_rendezvous"):
        Half().next_rendezvous()


# -- an asynchronous handler through torch's blocking API ---------------------------------


@pytest.fixture
def real_handler(request: pytest.FixtureRequest) -> Iterator[RendezvousHandler]:
    # one run id per test: shutdown() closes the rendezvous for good, as torch's does
    run_id = request.node.name.replace("[", "_").replace("]", "")
    h = get_rendezvous_handler(RendezvousParameters("c10d", "localhost:0", run_id, 1, 1))
    yield h
    h.shutdown()


def test_rendezvous_info_store_offers_torchs_blocking_store_methods(
    real_handler: RendezvousHandler,
) -> None:
    store = real_handler.next_rendezvous().store
    store.set("a", "1")
    assert store.get("a") == b"1"
    assert store.add("n", 2) == 2 and store.add("n", 3) == 5
    assert store.compare_set("c", "", "x") == b"x"  # empty expected: set if absent
    assert store.compare_set("c", "y", "z") == b"x"  # mismatch: the current value
    assert store.compare_set("c", "x", "z") == b"z"
    store.multi_set(["m1", "m2"], [b"v1", "v2"])
    assert store.multi_get(["m1", "m2"]) == [b"v1", b"v2"]
    store.wait(["a", "m1"], timedelta(seconds=1))
    with pytest.raises(TimeoutError):
        store.wait(["never"], timedelta(milliseconds=50))
    store.timeout = 0.05  # the store's own timeout bounds a get, as torch's does
    with pytest.raises(TimeoutError):
        store.get("never")
    assert store.check(["a", "m2"]) and not store.check(["a", "never"])
    before = store.num_keys()
    assert store.delete_key("a") and not store.delete_key("a")
    assert store.num_keys() == before - 1


def test_rendezvous_store_info_build_publishes_rank_zeros_address(
    real_handler: RendezvousHandler,
) -> None:
    store = real_handler.next_rendezvous().store
    info0 = RendezvousStoreInfo.build(0, store, "node-0", 4242)
    info1 = RendezvousStoreInfo.build(1, store, "ignored")
    assert (info0.master_addr, info0.master_port) == ("node-0", 4242)
    assert info1 == info0
    port = sync_store_of(store)
    assert port is not None  # a SyncStore, or a torch Store over one (torch imported)
    with pytest.raises(TypeError, match="use build_async"):
        RendezvousStoreInfo.build(0, port.port, "x", 1)


class _PlainDefPort:
    """A store port whose methods return awaitables without being ``async def`` (as the
    simulator's store client does): still the asynchronous port, not a blocking store."""

    def __init__(self, port: Any) -> None:
        self._port = port

    def get(self, key: str, timeout: float | None = None) -> Any:
        return self._port.get(key, timeout)

    def set(self, key: str, value: bytes, *, lease: Any = None) -> Any:
        return self._port.set(key, value, lease=lease)

    def grant_lease(self, ttl: float) -> Any:
        return self._port.grant_lease(ttl)

    def watch(self, prefix: str, after: int, timeout: float | None = None) -> Any:
        return self._port.watch(prefix, after, timeout)


def test_a_store_port_of_plain_functions_is_not_taken_for_a_blocking_store(
    real_handler: RendezvousHandler,
) -> None:
    sync = sync_store_of(real_handler.next_rendezvous().store)
    assert sync is not None
    port = _PlainDefPort(sync.port)
    with pytest.raises(TypeError, match="use build_async"):
        RendezvousStoreInfo.build(0, port, "x", 1)


def test_the_dynamic_handlers_workers_build_their_own_store_and_are_told_so(
    real_handler: RendezvousHandler,
) -> None:
    # elastic's agent store lives in the agent (or our own network protocol): workers
    # cannot open it as a TCPStore, so they are told TORCHELASTIC_USE_AGENT_STORE=False
    # and bootstrap at MASTER_ADDR/MASTER_PORT, which a restarted group re-creates
    assert real_handler.use_agent_store is False


# -- the registry ---------------------------------------------------------------------------


@pytest.fixture
def clean_registry() -> Iterator[None]:
    saved = dict(rendezvous_handler_registry._registry)
    yield
    rendezvous_handler_registry._registry.clear()
    rendezvous_handler_registry._registry.update(saved)


def test_a_torch_style_one_argument_creator_is_called_with_one_argument(
    clean_registry: None,
) -> None:
    seen: list[RendezvousParameters] = []

    def create_my_rdzv(params: RendezvousParameters) -> RendezvousHandler:
        seen.append(params)
        return TorchStyleHandler()

    rendezvous_handler_registry.register("mine", create_my_rdzv)
    p = RendezvousParameters("mine", "localhost:1", "mine-run", 1, 1)
    h = get_rendezvous_handler(p)
    assert isinstance(h, TorchStyleHandler) and seen == [p]


def test_handlers_published_under_torchrun_handlers_entry_points_are_loaded(
    clean_registry: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a small out-of-tree package, installed on sys.path with its dist-info
    pkg = tmp_path / "elastic_test_plugin"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from tests.test_torch_api import TorchStyleHandler\n"
        "class PluginHandler(TorchStyleHandler):\n"
        "    def get_backend(self):\n"
        "        return 'plugged'\n"
        "def get_creator():\n"
        "    return lambda params: PluginHandler()\n"
    )
    info = tmp_path / "elastic_test_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: elastic-test-plugin\n")
    (info / "entry_points.txt").write_text(
        "[torchrun.handlers]\nplugged = elastic_test_plugin:get_creator\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    h = get_rendezvous_handler(RendezvousParameters("plugged", "", "p", 1, 1))
    assert h.get_backend() == "plugged" and type(h).__name__ == "PluginHandler"


def test_a_handler_named_for_another_backend_is_torchs_runtime_error(
    clean_registry: None,
) -> None:
    rendezvous_handler_registry.register("other", lambda params: TorchStyleHandler())
    with pytest.raises(RuntimeError, match="'mine' does not match the requested backend 'other'"):
        get_rendezvous_handler(RendezvousParameters("other", "", "o", 1, 1))


# -- agent subclassing (seed 001) ----------------------------------------------------------


def _spec() -> Any:
    from elastic.agent.server.api import WorkerSpec

    return WorkerSpec(
        role="r", local_world_size=1, entrypoint="x", rdzv_handler=TorchStyleHandler()
    )


def test_an_agent_overriding_torchs_synchronous_hooks_runs_under_torchs_driver() -> None:
    """A subclass defining ``_monitor_workers`` (torch's abstract hook) gets torch's
    synchronous driver (tests/test_torch_agent_hooks.py runs it); the event-driven entry
    point refuses it, and a synchronous override of an async hook without it is refused,
    each in one line naming the class."""
    import asyncio

    from elastic.agent.server._torch_style import is_torch_style
    from elastic.agent.server.api import SimpleElasticAgent, WorkerGroup, WorkerState

    class Polling(SimpleElasticAgent):
        def _monitor_workers(self, worker_group: WorkerGroup) -> None:
            raise AssertionError

    class SyncStart(SimpleElasticAgent):
        def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:  # type: ignore[override]
            raise AssertionError

    polling = Polling(_spec())
    assert is_torch_style(Polling) and not is_torch_style(SyncStart)
    assert polling.get_worker_group().state == WorkerState.INIT
    assert polling._remaining_restarts == 3
    with pytest.raises(TypeError, match=r"Polling is written against torch's synchronous") as e:
        asyncio.run(polling.run_async())
    assert "\n" not in str(e.value)
    with pytest.raises(TypeError, match=r"SyncStart\._start_workers is synchronous") as e:
        asyncio.run(SyncStart(_spec()).run_async())
    assert "async def _start_workers" in str(e.value) and "\n" not in str(e.value)


def test_the_agents_status_events_carry_torchs_metadata() -> None:
    import json

    from elastic.agent.server.api import SimpleElasticAgent
    from elastic.events.api import Event, EventSource

    agent = SimpleElasticAgent(_spec())
    ok = agent.get_event_succeeded()
    assert isinstance(ok, Event) and ok.source == EventSource.AGENT
    assert ok.name == "torchelastic.worker.status.SUCCEEDED"
    md = ok.metadata
    assert (md["state"], md["role"], md["rdzv_backend"]) == ("SUCCEEDED", "r", "mine")
    assert md["raw_error"] is None and md["agent_restarts"] == 0 and md["global_rank"] is None
    assert json.loads(str(md["metadata"])) == {"group_world_size": None, "entry_point": "x"}
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        bad = agent.get_event_failed()
    assert bad.name == "torchelastic.worker.status.FAILED" and bad.metadata["state"] == "FAILED"
    assert "RuntimeError: boom" in str(bad.metadata["raw_error"])
    assert Event.deserialize(bad.serialize()) == bad


def test_an_agent_overriding_the_async_hooks_is_accepted() -> None:
    from elastic.agent.server.api import SimpleElasticAgent, WorkerGroup

    class Custom(SimpleElasticAgent):
        async def _start_workers(self, wg: WorkerGroup) -> None:
            await super()._start_workers(wg)

    assert Custom(_spec()).get_worker_group().spec.role == "r"


# -- errors torch users catch -----------------------------------------------------------------


def test_config_errors_are_value_errors_as_torchs_are() -> None:
    from elastic.errors import ConfigError
    from elastic.launcher.api import LaunchConfig

    assert issubclass(ConfigError, ValueError)
    with pytest.raises(ValueError, match="--shutdown-timeout"):
        LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, shutdown_timeout=-5)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "argv",
    [
        ["--no-python", "--module", "x"],
        ["--logs-specs", "no-such-specs", "/bin/true"],
        ["--nproc-per-node=unknown", "/bin/true"],
    ],
    ids=["no-python-with-module", "unknown-logs-specs", "nproc-unknown"],
)
def test_run_main_raises_value_error_where_torch_does(argv: list[str]) -> None:
    from elastic.run import main

    with pytest.raises(ValueError):
        main(["--standalone", *argv])


def test_a_private_registry_behaves_as_torchs_registry_test_expects() -> None:
    from elastic.rendezvous import RendezvousHandlerRegistry

    class Dummy(TorchStyleHandler):
        def __init__(self, params: RendezvousParameters) -> None:
            super().__init__()
            self.params = params

        def get_backend(self) -> str:
            return "dummy_backend"

    def create(params: RendezvousParameters) -> RendezvousHandler:
        return Dummy(params)

    reg = RendezvousHandlerRegistry()
    params = RendezvousParameters("dummy_backend", "dummy_endpoint", "dummy_run_id", 1, 1)
    with pytest.raises(ValueError, match=r"is not registered\. Did you forget to call `register`"):
        reg.create_handler(params)
    reg.register("dummy_backend", create)
    reg.register("dummy_backend", create)
    handler = reg.create_handler(params)
    assert isinstance(handler, Dummy) and handler.params is params


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("backend", "conf"),
    [("c10d", {}), ("etcd-v2", {}), ("etcd", {"last_call_timeout": 1}), ("static", {"rank": 0})],
)
def test_get_rendezvous_handler_with_params_alone_works_for_every_builtin_backend(
    backend: str, conf: dict[str, Any]
) -> None:
    with contextlib.ExitStack() as stack:
        endpoint = "localhost:0"
        if backend.startswith("etcd"):  # torch's etcd backends connect to the endpoint's etcd
            from tests.etcd_servers import EtcdCluster, etcd_binary

            cluster = stack.enter_context(EtcdCluster(etcd_binary("distro")))
            endpoint = cluster.endpoints[0]
        params = RendezvousParameters(backend, endpoint, f"alone-{backend}", 1, 1, **conf)
        h = get_rendezvous_handler(params)
        assert h.get_backend() == backend
        info = h.next_rendezvous()
        assert (info.rank, info.world_size) == (0, 1)
        info.store.set("k", b"v")
        assert info.store.get("k") == b"v"
        h.shutdown()


def test_submodules_are_attributes_of_their_packages_as_in_torch() -> None:
    """torch's packages import these submodules, so ``pkg.sub.Name`` works after
    ``import pkg`` alone; here they load on first use (a fresh interpreter shows it)."""
    import subprocess
    import sys

    code = """
import sys
import elastic.agent.server as server, elastic.multiprocessing as mp
import elastic.rendezvous as rdzv, elastic.utils as utils
assert "elastic.agent.server.local_elastic_agent" not in sys.modules
assert server.local_elastic_agent.LocalElasticAgent.__name__ == "LocalElasticAgent"
assert server.health_check_server.HealthCheckServer.__name__ == "HealthCheckServer"
assert callable(mp.redirects.redirect_stdout) and mp.subprocess_handler.SubprocessHandler
assert rdzv.dynamic_rendezvous.DynamicRendezvousHandler and rdzv.utils.parse_rendezvous_endpoint
assert rdzv.c10d_rendezvous_backend.create_backend and rdzv.etcd_store.EtcdStore
assert utils.distributed.get_free_port and utils.logging.get_logger and utils.log_level
from elastic.rendezvous.registry import create_handler, handler_registry
from elastic.rendezvous.dynamic_rendezvous import create_handler as dyn_create
assert create_handler is dyn_create and handler_registry is rdzv.rendezvous_handler_registry
try:
    utils.no_such_module
except AttributeError as e:
    assert "no_such_module" in str(e)
else:
    raise AssertionError("an unknown name must raise AttributeError")
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_node_descriptors_are_torchs_and_name_real_modes_nodes() -> None:
    import os
    import socket

    from elastic.real.rdzv_context import node_id
    from elastic.rendezvous.api import RendezvousHandlerCreator
    from elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler,
        _NodeDesc,
        _NodeDescGenerator,
    )

    assert repr(_NodeDesc("dummy_fqdn", 3, 5)) == "dummy_fqdn_3_5"
    a, b = _NodeDesc("h", 2, 4), _NodeDesc("h", 3, 5)
    assert {a, b} == {_NodeDesc("h", 2, 4), b} and a < b
    gen = _NodeDescGenerator()
    pid = os.getpid()
    assert [repr(gen.generate()) for _ in range(3)] == [
        f"{socket.getfqdn()}_{pid}_{i}" for i in range(3)
    ]
    assert repr(gen.generate("10.0.0.1")) == f"10.0.0.1_{pid}_3"
    # real mode's node ids come from the class's one generator, as torch's do
    before = DynamicRendezvousHandler._node_desc_generator.generate("x").local_id
    assert node_id("host") == f"host_{pid}_{before + 1}"
    assert RendezvousHandlerCreator is not None
