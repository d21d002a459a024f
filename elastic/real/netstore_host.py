"""A network store in a process of its own: ``python -m elastic.real.netstore_host``.

The agents of a multi-node job normally host their store themselves (the agent the
endpoint names).  ``elastic real`` hosts it here instead and starts every agent with
``--rdzv-conf is_host=false``, so the store host is a machine of its own, as in the
simulator: an outage (SIGSTOP … SIGCONT of this process) stops the store and no agent,
and killing an agent never takes the store with it.

It binds ``--host:--port`` (port 0: any free port), prints ``listening HOST:PORT`` on
one line once clients can connect, and serves until SIGTERM or SIGINT.  With
``--outage-file``, SIGUSR1 announces an outage: every lease is extended by the seconds
that file holds, so the SIGSTOP that follows expires nobody's lease.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Sequence

from elastic.real.netstore import StoreServer
from elastic.real.rdzv_store import TOKEN_ENV

__all__ = ["main", "serve"]


async def serve(host: str, port: int, token: str | None, outage_file: str | None = None) -> None:
    server = StoreServer(host, port, token=token, idle_timeout=3600.0)
    await server.start()
    print(f"listening {server.address}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def outage_ahead() -> None:
        # SIGUSR1: the host is about to be stopped (SIGSTOP) for the seconds written in
        # the outage file.  An outage expires nobody's lease (no store runs to see its
        # holder go quiet, as etcd extends leases across a leader change, and as the
        # simulator models it), so every deadline moves by that much; renewals after
        # the outage move them as usual.  Done before the stop, not on SIGCONT: when
        # the host resumes, its due expiries and dropped connections may run before any
        # handler of the resume.
        try:
            with open(outage_file or "", "rb") as f:
                seconds = float(f.read(64))
        except (OSError, ValueError):
            return
        for lease in list(server.hosted.leases.values()):
            expires_at = getattr(lease, "expires_at", None)
            if expires_at is not None:
                lease.expires_at = expires_at + seconds  # type: ignore[attr-defined]

    if outage_file:
        loop.add_signal_handler(signal.SIGUSR1, outage_ahead)
    try:
        await stop.wait()
    finally:
        await server.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m elastic.real.netstore_host",
        description="Serve the agents' network store (c10d) in a process of its own.",
    )
    p.add_argument("--host", default="127.0.0.1", help="the address to bind")
    p.add_argument("--port", type=int, default=0, help="the port to bind (0: any free port)")
    p.add_argument(
        "--outage-file",
        metavar="FILE",
        help="on SIGUSR1, extend every lease by the seconds written in FILE (an outage ahead)",
    )
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    if not 0 <= args.port <= 65535:
        print(f"netstore_host: --port: got {args.port}; expected 0..65535", file=sys.stderr)
        return 2
    try:
        asyncio.run(
            serve(args.host, args.port, os.environ.get(TOKEN_ENV) or None, args.outage_file)
        )
    except OSError as e:
        print(
            f"netstore_host: cannot listen at {args.host}:{args.port}: {e.strerror or e}",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
