"""What torch's blocking rendezvous API hands out is a torch ``Store`` in a program that
uses torch.distributed: ``next_rendezvous().store`` and ``create_backend``'s store go to
``init_process_group`` and ``PrefixStore`` as torch's own would."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from elastic.utils.distributed import get_free_port
from tests.leftovers import no_leftover_processes

pytestmark = pytest.mark.torch

PROGRAM = textwrap.dedent(
    """
    import sys
    import torch
    import torch.distributed as dist
    from elastic.rendezvous import RendezvousParameters
    from elastic.rendezvous.c10d_rendezvous_backend import create_backend
    from elastic.rendezvous.dynamic_rendezvous import create_handler

    port, node = sys.argv[1], sys.argv[2]
    params = RendezvousParameters(
        "c10d", f"127.0.0.1:{port}", "ts-job", 2, 2, join_timeout="60",
        local_addr="127.0.0.1", is_host=str(node == "0").lower(),
    )
    backend, store = create_backend(params)
    assert isinstance(store, dist.Store), type(store)
    # what programs read of the TCPStore torch returns here
    from datetime import timedelta
    assert (store.host, store.port) == ("127.0.0.1", int(port)), (store.host, store.port)
    assert store.timeout == timedelta(seconds=60), store.timeout
    handler = create_handler(store, backend, params)
    info = handler.next_rendezvous()
    assert isinstance(info.store, dist.Store), type(info.store)
    # torch's own PrefixStore over it, and the process group over it
    dist.PrefixStore("user", info.store).set("seen", b"yes")
    dist.init_process_group(
        "gloo", store=info.store, rank=info.rank, world_size=info.world_size
    )
    t = torch.tensor([float(info.rank + 1)])
    dist.all_reduce(t)
    dist.barrier()
    print(info.rank, info.world_size, int(t.item()), flush=True)
    dist.destroy_process_group()
    handler.shutdown()
    """
)


@pytest.mark.timeout(120)
def test_two_programs_init_a_gloo_group_over_the_rendezvous_store(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed")
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    port = get_free_port()
    root = Path(__file__).resolve().parent.parent
    with no_leftover_processes():
        procs = [
            subprocess.Popen(
                [sys.executable, str(script), str(port), node],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=root,
            )
            for node in ("0", "1")
        ]
        try:
            outs = [p.communicate(timeout=90) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    lines = sorted(out.strip() for out, _ in outs)
    assert lines == ["0 2 3", "1 2 3"]


def test_without_torch_imported_the_store_is_elastics_own() -> None:
    # a program that never imported torch.distributed gets no torch import from here
    code = textwrap.dedent(
        """
        import sys
        from elastic.rendezvous.api import SyncStore, torch_store
        from elastic.memstore import MemoryStore
        from elastic.real.clock import AsyncioClock
        s = SyncStore(MemoryStore(AsyncioClock()), lambda c: None)
        assert torch_store(s) is s
        assert "torch" not in sys.modules
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def _torch_params(port: int, run_id: str = "tcp-job", **conf: str) -> Any:
    from elastic.rendezvous import RendezvousParameters

    return RendezvousParameters(
        "c10d", f"localhost:{port}", run_id, 2, 2, local_addr="127.0.0.1", **conf
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize("is_host", ["false", None])
def test_a_torch_tcpstore_at_the_endpoint_is_joined_with_torchs_client(
    is_host: str | None,
) -> None:
    # torch's create_backend with is_host false (or absent, the port taken): a client of
    # the TCPStore already there; the rendezvous then runs over it (no leases)
    dist = pytest.importorskip("torch.distributed")
    import threading
    from base64 import b64encode
    from datetime import timedelta

    from elastic.rendezvous.c10d_rendezvous_backend import create_backend
    from elastic.rendezvous.dynamic_rendezvous import create_handler

    port = get_free_port()
    server = dist.TCPStore("localhost", port, is_master=True, wait_for_workers=False)
    conf = {"read_timeout": "20", "join_timeout": "30", "last_call_timeout": "1"}
    if is_host is not None:
        conf["is_host"] = is_host
    backend, store = create_backend(_torch_params(port, **conf))
    assert isinstance(store, dist.TCPStore)
    assert (store.host, store.port, store.timeout) == ("localhost", port, timedelta(seconds=20))
    backend.set_state(b"state")
    assert server.get("torch.rendezvous.tcp-job") == b64encode(b"state")
    # two nodes over it, each with its own client (as on two machines)
    infos: list[Any] = []
    handlers = []
    for _ in range(2):
        b, s = create_backend(_torch_params(port, "tcp-job-2", **conf))
        handlers.append(create_handler(s, b, _torch_params(port, "tcp-job-2", **conf)))
    threads = [
        threading.Thread(target=lambda h=h: infos.append(h.next_rendezvous())) for h in handlers
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=40)
    try:
        assert sorted(i.rank for i in infos) == [0, 1]
        assert {i.world_size for i in infos} == {2}
    finally:
        for h in handlers:
            h.shutdown()


@pytest.mark.timeout(60)
def test_our_store_is_recognised_at_once_and_never_sent_torchs_bytes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a program that imported torch asks who listens before joining: our host answers
    # its own hello at once (a token or not), and is never sent torch's validation, for
    # which it would warn of a torchrun node pointed at the job
    import asyncio
    import logging
    import time

    from elastic.real.netstore import StoreServer
    from elastic.real.torch_probe import answers_torch_ping, who_listens
    from elastic.rendezvous.c10d_rendezvous_backend import _torch_tcp_store_at

    async def ask(token: str | None) -> tuple[str, object, float]:
        server = StoreServer("127.0.0.1", 0, token=token)
        await server.start()
        try:
            t0 = time.monotonic()
            ours = await asyncio.to_thread(who_listens, "127.0.0.1", server.port, 5.0)
            took = time.monotonic() - t0
            joined = await asyncio.to_thread(_torch_tcp_store_at, "127.0.0.1", server.port, None, 5)
            return ours, joined, took
        finally:
            await server.aclose()

    caplog.set_level(logging.INFO, logger="elastic.real.netstore")
    for token in (None, "secret"):
        ours, joined, took = asyncio.run(ask(token))
        assert ours == "elastic" and took < 2.0, took
        assert joined is None  # not torch's: the project's own client will join it
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    # nothing listening: both answers at once
    free = get_free_port()
    t0 = time.monotonic()
    assert who_listens("127.0.0.1", free, 5.0) == "none"
    assert answers_torch_ping("127.0.0.1", free, 5.0) is False
    assert time.monotonic() - t0 < 2.0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("libuv", [True, False])
def test_a_torch_tcpstore_does_not_pass_for_ours_and_answers_torchs_ping(libuv: bool) -> None:
    dist = pytest.importorskip("torch.distributed")
    from elastic.real.torch_probe import answers_torch_ping, who_listens

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=libuv)
    # silent to our hello (libuv), or hangs up on it (the older backend)
    assert who_listens("127.0.0.1", server.port, 0.5) == "other"
    assert answers_torch_ping("127.0.0.1", server.port, 5.0) is True
