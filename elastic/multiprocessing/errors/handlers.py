"""The factory for the error handler used by ``@record``."""

from __future__ import annotations

from elastic.multiprocessing.errors.error_handler import ErrorHandler

__all__ = ["get_error_handler"]


def get_error_handler() -> ErrorHandler:
    """A new :class:`ErrorHandler` (torch's default)."""
    return ErrorHandler()
