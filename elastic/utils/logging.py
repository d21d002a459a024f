"""``get_logger``: a logger named after the calling module, level from ``LOGLEVEL``.

As torch: the level is the ``LOGLEVEL`` environment variable (default ``WARNING``) at the
time of the call; with no name, the logger is named after the module that called.
"""

from __future__ import annotations

import inspect
import logging
import os
import warnings

from elastic.utils.log_level import get_log_level

__all__ = ["get_logger"]


def get_logger(name: str | None = None) -> logging.Logger:
    """The logger ``name``, or the caller's module's logger when ``name`` is None."""
    logger = logging.getLogger(name or _derive_module_name(depth=2))
    logger.setLevel(os.environ.get("LOGLEVEL", get_log_level()))
    return logger


def _derive_module_name(depth: int = 1) -> str | None:
    """The name of the module ``depth`` frames up the stack (1: the caller of this
    function), or its file's stem when the frame has no module; None (with a warning) if
    the stack is not that deep."""
    frame = inspect.currentframe()
    try:
        for _ in range(depth):
            if frame is None:
                break
            frame = frame.f_back
        if frame is None:
            warnings.warn(
                f"get_logger: no caller {depth} frame(s) up the stack; using the root logger",
                RuntimeWarning,
                stacklevel=2,
            )
            return None
        module = inspect.getmodule(frame)
        if module is not None:
            return module.__name__
        return os.path.splitext(os.path.basename(frame.f_code.co_filename))[0]
    finally:
        del frame
