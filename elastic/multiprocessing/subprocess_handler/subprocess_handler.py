"""torch's ``SubprocessHandler``: ``subprocess.Popen`` for one worker, with its output
files.

The worker runs ``entrypoint`` with ``str()`` of each argument, the agent's environment
updated by ``env``, stdout/stderr to the named files (truncated) or inherited, in a
session of its own so that :meth:`close` can signal its whole process group (default
``SIGTERM``).  Closing a worker whose group has already gone is not an error (torch
raises ``ProcessLookupError`` there).  ``numa_options`` is accepted for torch's
signature; NUMA binding is not applied here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import IO, Any

__all__ = ["SubprocessHandler"]


def _get_default_signal() -> signal.Signals:
    """The signal :meth:`SubprocessHandler.close` sends by default."""
    return signal.SIGTERM


class SubprocessHandler:
    """One worker process and the files its output goes to."""

    def __init__(
        self,
        entrypoint: str,
        args: tuple[Any, ...],
        env: dict[str, str],
        stdout: str | None,
        stderr: str | None,
        local_rank_id: int,
        numa_options: Any = None,
    ) -> None:
        self._stdout: IO[str] | None = open(stdout, "w") if stdout else None  # noqa: SIM115
        self._stderr: IO[str] | None = open(stderr, "w") if stderr else None  # noqa: SIM115
        env_vars = dict(os.environ)
        env_vars.update(env)
        self.local_rank_id = local_rank_id
        self.numa_options = numa_options
        try:
            self.proc: subprocess.Popen[bytes] = self._popen(
                (entrypoint, *(str(a) for a in args)), env_vars
            )
        except BaseException:
            self._close_files()
            raise

    def _popen(self, args: tuple[str, ...], env: dict[str, str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            args, env=env, stdout=self._stdout, stderr=self._stderr, start_new_session=True
        )

    def close(self, death_sig: signal.Signals | None = None) -> None:
        """Send ``death_sig`` (default ``SIGTERM``) to the worker's process group and close
        its output files.  Does not wait: ``self.proc.wait()`` does."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, death_sig or _get_default_signal())
        self._close_files()

    def _close_files(self) -> None:
        for f in (self._stdout, self._stderr):
            if f is not None:
                f.close()
