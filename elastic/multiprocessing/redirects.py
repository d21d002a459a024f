"""torch's ``redirects``: send this process's stdout or stderr to a file, C code included.

``redirect("stdout", path)`` is a context manager that points file descriptor 1 (2 for
stderr) at ``path`` for its block, so ``print``, C ``printf`` and child processes all
write there, then restores it.  Buffers are flushed on both sides of each switch (Python's
stream and the C library's ``FILE``), so nothing written before the block lands in the
file and nothing written in it lands on the console.  ``path``'s directory must exist;
the file is overwritten.  Linux (glibc) only, as torch's: elsewhere the C library's
buffers are not flushed.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from functools import partial
from typing import Any

__all__ = ["get_libc", "redirect", "redirect_stderr", "redirect_stdout"]

logger = logging.getLogger(__name__)

_VALID_STD = ("stdout", "stderr")


def get_libc() -> Any:
    """The C library (``libc.so.6``), or None where it cannot be loaded."""
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        logger.warning("redirects: no libc.so.6 here; C-level output is not flushed")
        return None


libc = get_libc()


def _flush_c(std: str) -> None:
    if libc is None:
        return
    try:
        libc.fflush(ctypes.c_void_p.in_dll(libc, std))
    except (ValueError, AttributeError):
        libc.fflush(None)  # every C stream


@contextmanager
def redirect(std: str, to_file: str) -> Iterator[None]:
    """Send ``std`` (``"stdout"`` or ``"stderr"``) to ``to_file`` for the block."""
    if std not in _VALID_STD:
        raise ValueError(f"unknown standard stream <{std}>, must be one of {set(_VALID_STD)}")
    std_fd = 1 if std == "stdout" else 2
    py_std = getattr(sys, std)

    def _flush() -> None:
        _flush_c(std)
        with suppress(OSError, ValueError):
            py_std.flush()

    saved_fd = os.dup(std_fd)
    try:
        with open(to_file, "w+b") as dst:
            _flush()
            os.dup2(dst.fileno(), std_fd)
            try:
                yield
            finally:
                _flush()
                os.dup2(saved_fd, std_fd)
    finally:
        os.close(saved_fd)


redirect_stdout = partial(redirect, "stdout")
redirect_stdout.__doc__ = "Send stdout to ``to_file`` for the block (see :func:`redirect`)."
redirect_stderr = partial(redirect, "stderr")
redirect_stderr.__doc__ = "Send stderr to ``to_file`` for the block (see :func:`redirect`)."
