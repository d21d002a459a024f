"""A small DDP training job on CPU (gloo) that checkpoints and resumes — runs unchanged
under ``torchrun`` and ``elastic run``::

    elastic run --standalone --nproc-per-node 2 --max-restarts 1 examples/ddp_gloo.py \
        --ckpt-dir /tmp/ckpt --steps 40 --ckpt-every 5 --out /tmp/final.txt

Everything is deterministic (seeded model, data drawn per step and rank), so a run
that is killed and resumes from its last checkpoint ends with the same parameters as
an uninterrupted one; rank 0 writes their SHA-256 to ``--out``.

``--crash-once-at STEP``: at that step (on its first pass only; a marker file in the
checkpoint directory remembers) rank 1 kills itself with SIGKILL, as a hard failure
would; the agent restarts the group and training resumes from the checkpoint.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import signal

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from elastic.multiprocessing.errors import record


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--crash-once-at", type=int, default=None)
    p.add_argument("--out", default=None)
    return p.parse_args()


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(32, 16, generator=g)
    y = x.sum(dim=1, keepdim=True) * 0.5 + 0.1 * torch.randn(32, 1, generator=g)
    return x, y


def params_hash(model: nn.Module) -> str:
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


@record
def main() -> None:
    args = parse()
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    os.makedirs(args.ckpt_dir, exist_ok=True)  # every rank: none may wait for another
    path = os.path.join(args.ckpt_dir, "ckpt.pt")
    start = 0
    if os.path.exists(path):
        state = torch.load(path)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = int(state["step"]) + 1
        print(f"rank {rank}: resumed at step {start}", flush=True)
    ddp = DistributedDataParallel(model)
    marker = os.path.join(args.ckpt_dir, "crashed")
    for step in range(start, args.steps):
        if step == args.crash_once_at and rank == 1 and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = batch(step, rank)
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        if (step + 1) % args.ckpt_every == 0:
            if rank == 0:
                tmp = path + ".tmp"
                torch.save(
                    {"step": step, "model": model.state_dict(), "opt": opt.state_dict()}, tmp
                )
                os.replace(tmp, path)  # atomic: a crash never leaves half a checkpoint
            dist.barrier()
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            f.write(params_hash(model) + "\n")
    # Tear down in order, before the interpreter does: the DDP reducer first (left to
    # interpreter shutdown, it is destroyed with gloo's threads already half gone and the
    # process dies in std::terminate, "terminate called without an active exception" --
    # 3 of 20 runs on a loaded machine under torchrun and elastic run alike, 0 of 60 with
    # this), then, once every rank has reached the end, the process group.
    del ddp
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
