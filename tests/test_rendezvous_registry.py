"""Registry, parameters, settings and parsers: torch's names and exact messages."""

from __future__ import annotations

import re
import socket
from datetime import timedelta

import pytest

from elastic.errors import ConfigError
from elastic.memstore import MemoryStore
from elastic.rendezvous import (
    RendezvousContext,
    RendezvousHandler,
    RendezvousHandlerRegistry,
    RendezvousParameters,
    get_rendezvous_handler,
)
from elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousSettings,
    RendezvousTimeout,
)
from elastic.rendezvous.utils import parse_rendezvous_config, parse_rendezvous_endpoint
from sim.clock import SimClock


def ctx() -> RendezvousContext:
    clock = SimClock()
    return RendezvousContext(MemoryStore(clock), clock, "host-a", "a")


def params(backend: str = "c10d", **conf: object) -> RendezvousParameters:
    return RendezvousParameters(backend, "localhost:29400", "job", 1, 2, **conf)


def test_c10d_is_registered_and_builds_the_dynamic_handler() -> None:
    h = get_rendezvous_handler(params(), ctx())
    assert isinstance(h, DynamicRendezvousHandler)
    assert h.get_backend() == "c10d" and h.get_run_id() == "job"


def test_get_rendezvous_handler_accepts_the_ports_as_keywords() -> None:
    clock = SimClock()
    h = get_rendezvous_handler(params(), store=MemoryStore(clock), clock=clock, node="n7")
    assert isinstance(h, DynamicRendezvousHandler) and h.node_id == "n7"


def test_get_rendezvous_handler_without_ports_builds_the_real_ports_as_torch_does() -> None:
    h = get_rendezvous_handler(RendezvousParameters("c10d", "localhost:0", "no-ports", 1, 1))
    assert isinstance(h, DynamicRendezvousHandler) and h.sync_runner is not None
    info = h.next_rendezvous()  # torch's blocking call, min_nodes=1: completes alone
    assert (info.rank, info.world_size) == (0, 1)
    info.store.set("k", "v")  # torch's blocking Store methods
    assert info.store.get("k") == b"v"
    assert h.shutdown()


@pytest.mark.timeout(60)
def test_get_rendezvous_handler_without_ports_opens_the_network_store_for_several_nodes() -> None:
    import socket
    import threading

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = RendezvousParameters("c10d", f"127.0.0.1:{port}", "net", 2, 2, last_call_timeout=1)
    handlers = [get_rendezvous_handler(p) for _ in range(2)]  # this process hosts the store
    ranks: list[int] = []
    threads = [
        threading.Thread(target=lambda h=h: ranks.append(h.next_rendezvous().rank))
        for h in handlers
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(ranks) == [0, 1]


@pytest.mark.timeout(60)
def test_get_rendezvous_handler_without_ports_names_a_store_it_cannot_reach() -> None:
    from elastic.rendezvous import RendezvousConnectionError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    p = RendezvousParameters(
        "c10d", f"127.0.0.1:{port}", "job", 1, 2, is_host="false", read_timeout=1
    )
    with pytest.raises(RendezvousConnectionError, match=f"127.0.0.1:{port}"):
        get_rendezvous_handler(p)


def test_unknown_backend_has_torchs_message() -> None:
    with pytest.raises(
        ValueError,
        match=re.escape(
            "The rendezvous backend 'nope' is not registered. Did you forget to call `register`?"
        ),
    ):
        get_rendezvous_handler(params("nope"), ctx())


def test_etcd_backends_build_handlers_named_for_their_backend() -> None:
    from elastic.rendezvous.etcd_rendezvous import EtcdRendezvousHandler

    for backend in ("etcd", "etcd-v2"):
        h = get_rendezvous_handler(params(backend), ctx())
        assert h.get_backend() == backend
    assert isinstance(get_rendezvous_handler(params("etcd"), ctx()), EtcdRendezvousHandler)


def test_register_refuses_empty_names_and_a_second_creator() -> None:
    reg = RendezvousHandlerRegistry()

    def one(p: RendezvousParameters, c: RendezvousContext) -> RendezvousHandler:
        raise AssertionError

    def two(p: RendezvousParameters, c: RendezvousContext) -> RendezvousHandler:
        raise AssertionError

    with pytest.raises(
        ValueError, match=re.escape("The rendezvous backend name must be a non-empty string.")
    ):
        reg.register("", one)
    reg.register("x", one)
    reg.register("x", one)  # the same creator again is fine
    with pytest.raises(
        ValueError, match=r"cannot be registered with .* as it is already registered"
    ):
        reg.register("x", two)


def test_handler_backend_must_match_the_requested_one() -> None:
    reg = RendezvousHandlerRegistry()
    reg.register("mine", lambda p, c: get_rendezvous_handler(params(), c))
    with pytest.raises(
        RuntimeError,
        match=re.escape(
            "The rendezvous backend 'c10d' does not match the requested backend 'mine'."
        ),
    ):
        reg.create_handler(params("mine"), ctx())


def test_conf_keys_reach_the_handler() -> None:
    h = get_rendezvous_handler(
        params(join_timeout="60", last_call_timeout="2", close_timeout="3", heartbeat_timeout="7"),
        ctx(),
    )
    assert isinstance(h, DynamicRendezvousHandler)
    t = h.settings.timeout
    assert (t.join, t.last_call, t.close, t.heartbeat) == (
        timedelta(seconds=60),
        timedelta(seconds=2),
        timedelta(seconds=3),
        timedelta(seconds=7),
    )


def test_bad_conf_value_is_one_config_error_line_naming_the_flag_and_option() -> None:
    with pytest.raises(ConfigError) as e:
        get_rendezvous_handler(params(join_timeout="soon"), ctx())
    assert str(e.value) == (
        "--rdzv-conf: The rendezvous configuration option 'join_timeout' does not represent a "
        "valid number of seconds."
    )
    with pytest.raises(
        ConfigError, match=re.escape("The join timeout (0:00:00) must be positive.")
    ):
        get_rendezvous_handler(params(join_timeout="0"), ctx())
    with pytest.raises(ConfigError, match="You passed 'keep_alive_interval=None'"):
        get_rendezvous_handler(params(keep_alive_interval=None), ctx())


def test_timeout_defaults_are_torchs() -> None:
    t = RendezvousTimeout()
    assert [x.total_seconds() for x in (t.join, t.last_call, t.close, t.heartbeat)] == [
        600,
        30,
        30,
        5,
    ]
    with pytest.raises(ValueError, match=re.escape("The last_call timeout (-1 day, 23:59:59)")):
        RendezvousTimeout(last_call=-1)


def test_lease_ttl_defaults_to_torchs_dead_node_threshold() -> None:
    s = RendezvousSettings("job", 1, 2, RendezvousTimeout())
    assert s.dead_after == 15.0


def test_handler_validation_messages_are_torchs() -> None:
    clock = SimClock()
    store = MemoryStore(clock)

    def make(run_id: str, lo: int, hi: int) -> None:
        s = RendezvousSettings(run_id, lo, hi, RendezvousTimeout())
        DynamicRendezvousHandler("a", "a", s, "c10d", store, clock)

    with pytest.raises(ValueError, match=re.escape("The run id must be a non-empty string.")):
        make("", 1, 1)
    with pytest.raises(ValueError, match=re.escape("The minimum number of nodes (0) must be")):
        make("j", 0, 1)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "The maximum number of nodes (1) must be greater than or equal to the minimum "
            "number of nodes (2)."
        ),
    ):
        make("j", 2, 1)


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        (None, ("localhost", 29400)),
        ("  ", ("localhost", 29400)),
        ("node1", ("node1", 29400)),
        ("node1:123", ("node1", 123)),
        ("10.0.0.1:0", ("10.0.0.1", 0)),
        ("[::1]", ("::1", 29400)),
        ("[::1]:5", ("::1", 5)),
    ],
)
def test_parse_endpoint_follows_torchs_rules(
    endpoint: str | None, expected: tuple[str, int]
) -> None:
    assert parse_rendezvous_endpoint(endpoint, 29400) == expected


def test_parse_endpoint_messages_are_torchs() -> None:
    with pytest.raises(
        ValueError,
        match=re.escape(
            "The port number of the rendezvous endpoint 'h:65536' must be an integer between 0 "
            "and 65536."
        ),
    ):
        parse_rendezvous_endpoint("h:65536", 1)
    with pytest.raises(ValueError, match="The port number of the rendezvous endpoint 'h:x'"):
        parse_rendezvous_endpoint("h:x", 1)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "The hostname of the rendezvous endpoint 'a b:1' must be a dot-separated list of "
            "labels, an IPv4 address, or an IPv6 address."
        ),
    ):
        parse_rendezvous_endpoint("a b:1", 1)


def test_parse_config_trims_splits_on_first_equals_and_refuses_missing_parts() -> None:
    assert parse_rendezvous_config("  ") == {}
    assert parse_rendezvous_config(" a = 1 , b=x=y") == {"a": "1", "b": "x=y"}
    with pytest.raises(
        ValueError,
        match=re.escape(
            "The rendezvous configuration string must be in format "
            "<key1>=<value1>,...,<keyN>=<valueN>."
        ),
    ):
        parse_rendezvous_config("=1")
    with pytest.raises(
        ValueError,
        match=re.escape("The rendezvous configuration option 'a' must have a value specified."),
    ):
        parse_rendezvous_config("a=1,a")
