"""torch's ``torch.distributed.elastic.control_plane``: :func:`worker_main`.

``worker_main()`` wraps a worker's main entry (as a ``with`` block or a decorator).  When
the ``TORCH_WORKER_SERVER_SOCKET`` environment variable names a path, it serves torch's
worker handlers (``/handler/ping``, ``/handler/dump_nccl_trace_pickle``, … -- whatever
this torch registers) over HTTP on that unix socket, with torch's ``_WorkerServer``, for
the length of the block, and shuts the server down when the block ends, however it ends.
Without the variable it does nothing and torch is not imported.  As torch's, it is
wrapped in :func:`elastic.multiprocessing.errors.record`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from elastic.multiprocessing.errors import record

__all__ = ["worker_main"]

TORCH_WORKER_SERVER_SOCKET = "TORCH_WORKER_SERVER_SOCKET"


@contextmanager
def _worker_server(socket_path: str) -> Iterator[None]:
    try:
        from torch._C._distributed_c10d import _WorkerServer
    except ImportError as e:
        raise ImportError(
            f"{TORCH_WORKER_SERVER_SOCKET} is set ({socket_path!r}): its worker server is "
            f"torch's, install torch (built with distributed support) or unset it ({e})"
        ) from e
    server = _WorkerServer(socket_path)
    try:
        yield
    finally:
        server.shutdown()


@record
@contextmanager
def worker_main() -> Iterator[None]:
    """Serve torch's worker handlers on ``$TORCH_WORKER_SERVER_SOCKET`` for the block.

    Example::

        @worker_main()
        def main():
            ...
    """
    with ExitStack() as stack:
        socket_path = os.environ.get(TORCH_WORKER_SERVER_SOCKET)
        if socket_path is not None:
            stack.enter_context(_worker_server(socket_path))
        yield
