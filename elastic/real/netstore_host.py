"""A network store in a process of its own: ``python -m elastic.real.netstore_host``.

The agents of a multi-node job normally host their store themselves (the agent the
endpoint names).  ``elastic real`` hosts it here instead and starts every agent with
``--rdzv-conf is_host=false``, so the store host is a machine of its own, as in the
simulator: an outage (SIGSTOP … SIGCONT of this process) stops the store and no agent,
and killing an agent never takes the store with it.

It binds ``--host:--port`` (port 0: any free port), prints ``listening HOST:PORT`` on
one line once clients can connect, and serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence

from elastic.real.netstore import StoreServer
from elastic.real.rdzv_store import TOKEN_ENV

__all__ = ["main", "serve"]


async def serve(host: str, port: int, token: str | None) -> None:
    server = StoreServer(host, port, token=token, idle_timeout=3600.0)
    await server.start()
    print(f"listening {server.address}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
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
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    if not 0 <= args.port <= 65535:
        print(f"netstore_host: --port: got {args.port}; expected 0..65535", file=sys.stderr)
        return 2
    import os

    try:
        asyncio.run(serve(args.host, args.port, os.environ.get(TOKEN_ENV) or None))
    except OSError as e:
        print(
            f"netstore_host: cannot listen at {args.host}:{args.port}: {e.strerror or e}",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
