"""torch's ``timer.debug_info_logging``: what is logged when timers expire."""

from __future__ import annotations

import logging

__all__ = ["log_debug_info_for_expired_timers"]

logger = logging.getLogger(__name__)


def log_debug_info_for_expired_timers(run_id: str, expired_timers: dict[int, list[str]]) -> None:
    """Log the expired timers of ``run_id`` (worker pid → the timers' JSON), if any.

    The file-based server calls it before reaping, as torch's does; a deployment that
    wants more (stack dumps, a page) wraps or replaces this function.
    """
    if expired_timers:
        logger.info("Timers expired for run:[%s] [%s].", run_id, expired_timers)
