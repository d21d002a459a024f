"""What torch's blocking rendezvous API hands out is a torch ``Store`` in a program that
uses torch.distributed: ``next_rendezvous().store`` and ``create_backend``'s store go to
``init_process_group`` and ``PrefixStore`` as torch's own would."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

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
