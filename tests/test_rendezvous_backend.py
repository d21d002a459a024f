"""torch's backend-driven dynamic rendezvous: RendezvousBackend, from_backend, the backends."""

from __future__ import annotations

import base64
import json
import re
import threading
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest

from elastic.clock import Clock
from elastic.memstore import MemoryStore
from elastic.rendezvous import (
    RendezvousConnectionError,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStateError,
)
from elastic.rendezvous.api import sync_store_of
from elastic.rendezvous.backend_store import BackendStore
from elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from elastic.rendezvous.c10d_rendezvous_backend import create_backend as c10d_create_backend
from elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousBackend,
    RendezvousTimeout,
    Token,
    create_handler,
)
from elastic.rendezvous.etcd_rendezvous_backend import EtcdRendezvousBackend
from elastic.rendezvous.etcd_rendezvous_backend import create_backend as etcd_create_backend
from tests.worlds import run_in

POLL = 0.05


class DictBackend(RendezvousBackend):
    """A user's own backend, blocking, with integer tokens (as a Redis or SQL row would)."""

    def __init__(self) -> None:
        self.value: bytes | None = None
        self.version = 0
        self.writes = 0

    @property
    def name(self) -> str:
        return "dict"

    def get_state(self) -> tuple[bytes, Token] | None:
        return None if self.value is None else (self.value, self.version)

    def set_state(self, state: bytes, token: Token | None = None) -> tuple[bytes, Token, bool]:
        if (token is None and self.value is None) or (token == self.version and token):
            self.value, self.version = state, self.version + 1
            self.writes += 1
            return state, self.version, True
        assert self.value is not None
        return self.value, self.version, False


def handlers(
    clock: Clock, backend: RendezvousBackend, ids: Sequence[str], lo: int, hi: int
) -> list[DynamicRendezvousHandler]:
    store = MemoryStore(clock)  # torch's `store` argument: where each round's store lives
    return [
        DynamicRendezvousHandler.from_backend(
            "job",
            store,
            backend,
            lo,
            hi,
            local_addr=f"host-{i}",
            timeout=RendezvousTimeout(join=10, last_call=0.2, close=2),
            keep_alive_interval=1,
            keep_alive_max_attempt=1,
            clock=clock,
            node_id=i,
            poll_interval=POLL,
        )
        for i in ids
    ]


async def join_all(clock: Clock, hs: Sequence[DynamicRendezvousHandler]) -> list[RendezvousInfo]:
    tasks = [clock.spawn(h.next_rendezvous_async()) for h in hs]
    return [await t.join() for t in tasks]


@pytest.mark.parametrize("kind", ["c10d", "etcd-v2", "user"])
def test_from_backend_forms_one_round_with_ranks_by_node_id_over_any_backend(
    world: str, kind: str
) -> None:
    ids = ["c", "a", "b"]

    async def body(clock: Clock) -> tuple[list[RendezvousInfo], str]:
        backend: RendezvousBackend
        if kind == "c10d":
            backend = C10dRendezvousBackend(MemoryStore(clock), "job")
        elif kind == "etcd-v2":
            backend = EtcdRendezvousBackend(MemoryStore(clock), "job", key_prefix="/p")
        else:
            backend = DictBackend()
        hs = handlers(clock, backend, ids, 3, 3)
        infos = await join_all(clock, hs)
        for h in hs:
            await h.leave_async()
        return infos, hs[0].get_backend()

    infos, name = run_in(world, body)
    assert [i.rank for i in infos] == [2, 0, 1]
    assert {i.world_size for i in infos} == {3} and {i.round for i in infos} == {0}
    assert {i.bootstrap_store_info.master_addr for i in infos} == {"host-a"}
    assert name == {"c10d": "c10d", "etcd-v2": "etcd-v2", "user": "dict"}[kind]


def test_state_through_a_backend_is_json_never_pickle() -> None:
    async def body(clock: Clock) -> bytes:
        backend = DictBackend()
        hs = handlers(clock, backend, ["a", "b"], 2, 2)
        await join_all(clock, hs)
        assert backend.value is not None
        raw = backend.value
        for h in hs:
            await h.leave_async()
        return raw

    raw = run_in("sim", body)
    assert not raw.startswith(b"\x80")  # a pickle's PROTO opcode
    state = json.loads(raw)
    assert state["version"] == 1
    members = [k for k in state["kv"] if "/c/alive/" in k]
    assert sorted(m.rsplit("/", 1)[1] for m in members) == ["a", "b"]


def test_a_dead_node_is_seen_by_the_others_within_its_ttl_and_a_poll(world: str) -> None:
    async def body(clock: Clock) -> tuple[list[str], float, list[RendezvousInfo]]:
        backend = C10dRendezvousBackend(MemoryStore(clock), "job")
        hs = handlers(clock, backend, ["a", "b", "c"], 2, 3)
        await join_all(clock, hs)
        watches = [clock.spawn(h.watch_async()) for h in hs[:2]]
        t0 = clock.now()
        lease = hs[2].lease
        assert lease is not None
        lease.abandon()  # node c stops renewing: it died
        reasons = [await w.join() for w in watches]
        took = clock.now() - t0
        again = await join_all(clock, hs[:2])
        for h in hs[:2]:
            await h.leave_async()
        return reasons, took, again

    reasons, took, infos = run_in(world, body)
    assert reasons == ["peer_lost", "peer_lost"]
    ttl = 1.0  # keep_alive_interval * keep_alive_max_attempt
    # The lease expires ttl after its owner's last renewal, which came up to ttl / 3
    # (the renewal period) before the abandon: not sooner than that, not much later.
    assert ttl - ttl / 3 <= took < ttl + ttl / 3 + 3 * POLL + 1.0
    assert [i.world_size for i in infos] == [2, 2] and infos[0].round == 1


def test_a_node_that_stays_alive_is_never_expired_by_the_others() -> None:
    async def body(clock: Clock) -> int:
        backend = C10dRendezvousBackend(MemoryStore(clock), "job")
        hs = handlers(clock, backend, ["a", "b"], 2, 2)
        await join_all(clock, hs)
        watch = clock.spawn(hs[0].watch_async())
        await clock.sleep(30.0)  # 30 lease lifetimes
        assert not watch.done()
        watch.cancel()
        waiting = await hs[1].num_nodes_waiting_async()
        for h in hs:
            await h.leave_async()
        return waiting

    assert run_in("sim", body) == 0


# -- the backends' own contract (what torch's backend tests check) -------------------------


@pytest.mark.parametrize("make", ["c10d", "etcd-v2"])
def test_backend_get_and_set_state_follow_torchs_fencing_contract(make: str) -> None:
    async def body(clock: Clock) -> None:
        store = MemoryStore(clock)
        b: RendezvousBackend = (
            C10dRendezvousBackend(store, "run")
            if make == "c10d"
            else EtcdRendezvousBackend(store, "run", key_prefix="/torch")
        )
        assert b.name == make
        assert await b.get_state_async() is None
        first = await b.set_state_async(b"x")
        assert first is not None and first[0] == b"x" and first[2] is True
        got = await b.get_state_async()
        assert got is not None and got[0] == b"x"
        token = got[1]
        # no token: only if there is no state
        none_token = await b.set_state_async(b"y")
        assert none_token is not None and none_token[0] == b"x" and none_token[2] is False
        # the current token: written
        ok = await b.set_state_async(b"y", token)
        assert ok is not None and ok[0] == b"y" and ok[2] is True
        # a stale token: not written; the current state and token come back
        stale = await b.set_state_async(b"z", token)
        assert stale is not None and stale[0] == b"y" and stale[2] is False
        assert stale[1] == ok[1]
        # a token of the wrong type is stale too
        odd = await b.set_state_async(b"z", 42)
        assert odd is not None and odd[0] == b"y" and odd[2] is False
        key = "torch.rendezvous.run" if make == "c10d" else "/torch/run"
        assert base64.b64decode(await store.get(key)) == b"y"
        await store.set(key, b"not base64!")
        with pytest.raises(RendezvousStateError, match="The state object is corrupt"):
            await b.get_state_async()

    run_in("sim", body)


def test_backends_refuse_an_empty_run_id_and_etcd_keeps_torchs_key_and_ttl() -> None:
    async def body(clock: Clock) -> None:
        store = MemoryStore(clock)
        for make in (C10dRendezvousBackend, EtcdRendezvousBackend):
            with pytest.raises(
                ValueError, match=re.escape("The run id must be a non-empty string.")
            ):
                make(store, "")
        assert EtcdRendezvousBackend(store, "r")._key == "r"
        assert EtcdRendezvousBackend(store, "r", key_prefix="/a")._key == "/a/r"
        assert EtcdRendezvousBackend(store, "r")._ttl == 7200
        assert EtcdRendezvousBackend(store, "r", ttl=-1)._ttl == 7200
        assert EtcdRendezvousBackend(store, "r", ttl=5)._ttl == 5

    run_in("sim", body)


def test_a_corrupt_blob_raises_state_error_naming_the_backend() -> None:
    async def body(clock: Clock) -> str:
        backend = DictBackend()
        backend.value, backend.version = b'{"version":1,"rev":"x"}', 1
        bs = BackendStore(backend, clock)
        with pytest.raises(RendezvousStateError) as e:
            await bs.try_get("k")
        return str(e.value)

    assert "in the dict backend is corrupt" in run_in("sim", body)


def test_create_backend_has_torchs_parameters_and_errors() -> None:
    def p(**conf: Any) -> RendezvousParameters:
        return RendezvousParameters("c10d", "localhost:29400", "cb-job", 1, 1, **conf)

    with pytest.raises(
        ValueError,
        match=re.escape("Invalid store type given. Currently only supports file and tcp."),
    ):
        c10d_create_backend(p(store_type="dummy"))
    with pytest.raises(ValueError, match=re.escape("The read timeout must be a positive integer.")):
        c10d_create_backend(p(read_timeout="0"))
    with pytest.raises(ValueError, match="does not represent a valid boolean"):
        c10d_create_backend(p(is_host="maybe"))
    with pytest.raises(ValueError, match=re.escape("The protocol must be HTTP or HTTPS.")):
        etcd_create_backend(p(protocol="ftp"))
    with pytest.raises(ValueError, match=re.escape("The read timeout must be a positive integer.")):
        etcd_create_backend(p(read_timeout="-3"))
    backend, store = c10d_create_backend(p())
    assert isinstance(backend, C10dRendezvousBackend) and backend.name == "c10d"
    # torch's blocking backend API works on what create_backend returns
    assert backend.get_state() is None
    written = backend.set_state(b"s")
    assert written is not None and written[2]
    store.set("k", b"1")
    assert store.add("k", 2) == 3


@pytest.mark.timeout(60)
def test_torch_create_handler_from_store_backend_and_params_runs_blocking() -> None:
    params = RendezvousParameters(
        "c10d", "localhost:29400", "ch-job", 1, 1, join_timeout="30", keep_alive_interval="2"
    )
    backend, store = c10d_create_backend(params)
    h = create_handler(store, backend, params)
    assert h.get_backend() == "c10d" and h.get_run_id() == "ch-job"
    assert h.settings.keep_alive_interval.total_seconds() == 2
    info = h.next_rendezvous()
    assert (info.rank, info.world_size) == (0, 1)
    assert info.store.get("MASTER_ADDR")
    h.set_closed()
    assert h.is_closed()
    with pytest.raises(TypeError, match="You passed 'keep_alive_interval=None'"):
        create_handler(
            store, backend, RendezvousParameters("c10d", "", "x", 1, 1, keep_alive_interval=None)
        )


class NoVerdictBackend(RendezvousBackend):
    """A backend that keeps nothing and never says whether a write took: get_state() and
    set_state() both return None (torch's contract allows it)."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    @property
    def name(self) -> str:
        return "no-verdict"

    def get_state(self) -> tuple[bytes, Token] | None:
        return None

    def set_state(self, state: bytes, token: Token | None = None) -> None:
        self.written.append(state)
        return None


def test_a_write_without_verdict_is_adopted_so_a_lone_node_finishes_its_round(
    world: str,
) -> None:
    # torch's state holder goes on from the state it wrote when set_state() returns None;
    # retrying instead would never end (the backend never reports a state)
    async def body(clock: Clock) -> tuple[RendezvousInfo, float, int]:
        backend = NoVerdictBackend()
        (h,) = handlers(clock, backend, ["a"], 1, 1)
        start = clock.now()
        info = await h.next_rendezvous_async()
        took = clock.now() - start
        await h.leave_async()
        for raw in backend.written:
            json.loads(raw)  # every write is our JSON blob
        return info, took, len(backend.written)

    info, took, writes = run_in(world, body)
    assert (info.rank, info.world_size, info.round) == (0, 1, 0)
    assert info.bootstrap_store_info.master_addr == "host-a"
    assert took < 5  # well inside the 10 s join timeout: no retry loop
    assert writes >= 1


class BlockingDictStore:
    """torch's blocking ``Store`` methods over a dict (what a HashStore offers)."""

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
            current = self.data.get(key, b"")
            if current == expected:
                self.data[key] = bytes(desired)
                self.cond.notify_all()
                return bytes(desired)
            return current

    def check(self, keys: list[str]) -> bool:
        with self.cond:
            return all(k in self.data for k in keys)

    def wait(self, keys: list[str], timeout: timedelta = timedelta(seconds=30)) -> None:
        with self.cond:
            if not self.cond.wait_for(
                lambda: all(k in self.data for k in keys), timeout.total_seconds()
            ):
                raise TimeoutError(f"keys {keys} not set")

    def delete_key(self, key: str) -> bool:
        with self.cond:
            return self.data.pop(key, None) is not None

    def multi_get(self, keys: list[str]) -> list[bytes]:
        with self.cond:
            return [self.data[k] for k in keys]

    def multi_set(self, keys: list[str], values: list[bytes]) -> None:
        with self.cond:
            self.data.update(zip(keys, map(bytes, values), strict=True))
            self.cond.notify_all()


@pytest.mark.timeout(60)
def test_create_handler_takes_a_blocking_torch_store_and_reports_it_as_underlying() -> None:
    # torch users pass torch's own stores (HashStore, TCPStore) to create_handler: the
    # handler calls them in threads, and the round's store reports the store given
    store = BlockingDictStore()
    params = RendezvousParameters(
        "dict", "unused", "bs-job", 1, 1, join_timeout="30", local_addr="127.0.0.2"
    )
    h = create_handler(store, DictBackend(), params)
    info = h.next_rendezvous()
    assert (info.rank, info.world_size) == (0, 1)
    assert info.bootstrap_store_info.master_addr == "127.0.0.2"
    # rank 0 publishes a free port, as torch's does: a fixed 29500 collides with a second
    # job on the same host
    port = info.bootstrap_store_info.master_port
    assert port != 29500 and 1024 <= port < 65536
    again = h.next_rendezvous().bootstrap_store_info.master_port
    assert again != 29500
    assert info.store.underlying_store is store
    info.store.set("k", b"v")
    assert info.store.get("k") == b"v"
    assert any(k.endswith("k") and v == b"v" for k, v in store.data.items())
    h.set_closed()
    assert h.is_closed()


def test_from_backend_refuses_a_blocking_store_on_a_clock_without_threads() -> None:
    async def body(clock: Clock) -> str:
        with pytest.raises(TypeError) as e:
            DynamicRendezvousHandler.from_backend(
                "job", BlockingDictStore(), DictBackend(), 1, 1, clock=clock, node_id="a"
            )
        return str(e.value)

    msg = run_in("sim", body)
    assert "BlockingDictStore" in msg and "store port" in msg


def test_c10d_create_backend_gives_a_portless_endpoint_the_module_default_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # torch reads c10d_rendezvous_backend.DEFAULT_PORT when the backend is created: a
    # patched value names the store a portless endpoint reaches
    from elastic.rendezvous import c10d_rendezvous_backend as c10d

    def store_for(endpoint: str) -> Any:
        params = RendezvousParameters("c10d", endpoint, "port-job", 1, 1)
        _, store = c10d_create_backend(params)
        sync = sync_store_of(store)  # the store port under it (torch's Store or not)
        assert sync is not None
        return sync.port

    unpatched = store_for("localhost")
    assert unpatched is store_for(f"localhost:{c10d.DEFAULT_PORT}")
    monkeypatch.setattr(c10d, "DEFAULT_PORT", 29461)
    patched = store_for("localhost")
    assert patched is store_for("localhost:29461")
    assert patched is not unpatched


@pytest.mark.torch
@pytest.mark.timeout(60)
def test_c10d_store_type_file_is_torchs_file_store_and_forms_a_round(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    dist = pytest.importorskip("torch.distributed")

    def p(endpoint: str) -> RendezvousParameters:
        return RendezvousParameters(
            "c10d", endpoint, "fs-job", 1, 1, store_type="file", join_timeout="30"
        )

    path = tmp_path / "rdzv"
    backend, store = c10d_create_backend(p(str(path)))
    assert isinstance(store, dist.FileStore) and path.exists()
    h = create_handler(store, backend, p(str(path)))
    info = h.next_rendezvous()
    assert (info.rank, info.world_size) == (0, 1)
    # the state is torch's key in the file store, base64 of JSON (never a pickle)
    assert json.loads(base64.b64decode(store.get("torch.rendezvous.fs-job")))
    h.set_closed()
    # an empty endpoint is a new temporary file, as torch's
    _, other = c10d_create_backend(p(""))
    assert isinstance(other, dist.FileStore)
    # a FileStore that cannot be opened is a connection error, in torch's words (torch's
    # own FileStore waits for a missing directory, so the failure is made here)
    import elastic.rendezvous.c10d_rendezvous_backend as module

    def refuse(path: str) -> None:
        raise RuntimeError(f"cannot open {path}")

    monkeypatch.setattr(module, "FileStore", refuse, raising=False)
    with pytest.raises(RendezvousConnectionError, match=r"^The connection to the C10d store") as e:
        c10d_create_backend(p(str(path)))
    assert "cannot open" in str(e.value.__cause__)


@pytest.mark.timeout(60)
def test_shutdown_after_the_store_went_away_closes_and_does_not_raise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a node whose store host shut down first (torch's shutdown() never raises a
    # RendezvousError): the close took, the lease cannot be revoked and expires later
    params = RendezvousParameters("dict", "unused", "gone-job", 1, 1, join_timeout="30")
    h = create_handler(BlockingDictStore(), DictBackend(), params)
    h.next_rendezvous()
    lease = h.lease
    assert lease is not None

    async def refuse() -> None:
        raise RendezvousConnectionError("The connection to the C10d store has failed.")

    monkeypatch.setattr(lease, "revoke", refuse)
    assert h.shutdown() is True
    assert h.is_closed() and h.lease is None
