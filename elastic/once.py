"""Messages said once per process (``say_once``), without importing anything heavy.

For messages that do not change between restarts — "NVML not available", "no NVIDIA
driver" — which the agent would otherwise repeat before every (re)start.  A module of its
own so that the launch path can use it without importing :mod:`elastic.gpu`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

__all__ = ["say_once"]

# the messages said once are the GPU checks'; they keep the logger they always had
logger = logging.getLogger("elastic.gpu")

_said: set[str] = set()
_said_lock = threading.Lock()


def say_once(message: str, log: Callable[[str], object] | None = None) -> bool:
    """Log ``message`` the first time this process is asked to; True if it was logged."""
    with _said_lock:
        if message in _said:
            return False
        _said.add(message)
    (log or logger.info)(message)
    return True
