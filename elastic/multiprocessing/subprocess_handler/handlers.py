"""torch's ``get_subprocess_handler``: the factory a process context calls per worker."""

from __future__ import annotations

from typing import Any

from elastic.multiprocessing.subprocess_handler.subprocess_handler import SubprocessHandler

__all__ = ["get_subprocess_handler"]


def get_subprocess_handler(
    entrypoint: str,
    args: tuple[Any, ...],
    env: dict[str, str],
    stdout: str | None,
    stderr: str | None,
    local_rank_id: int,
    numa_options: Any = None,
) -> SubprocessHandler:
    """A :class:`SubprocessHandler` started with these arguments."""
    return SubprocessHandler(
        entrypoint=entrypoint,
        args=args,
        env=env,
        stdout=stdout,
        stderr=stderr,
        local_rank_id=local_rank_id,
        numa_options=numa_options,
    )
