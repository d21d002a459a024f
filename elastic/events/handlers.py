"""torch's ``events.handlers``: the logging handlers events are recorded to, by name."""

from __future__ import annotations

import logging

__all__ = ["get_logging_handler"]

_log_handlers: dict[str, logging.Handler] = {
    "console": logging.StreamHandler(),
    "dynamic_rendezvous": logging.NullHandler(),
    "null": logging.NullHandler(),
}


def get_logging_handler(destination: str = "null") -> logging.Handler:
    """The handler for ``destination`` (``console``, ``dynamic_rendezvous``, ``null``).

    A deployment replaces an entry of ``_log_handlers`` to send events elsewhere, as in
    torch; an unknown name raises ``KeyError``, as in torch.
    """
    return _log_handlers[destination]
