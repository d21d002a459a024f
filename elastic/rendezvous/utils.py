"""Parsing of rendezvous endpoints and ``--rdzv-conf`` strings, with torch's rules and messages.

Pure functions: no sockets, no clock.  torch's other helpers here, which resolve names,
sleep or run a thread (``_matches_machine_hostname``, ``_delay``, ``_PeriodicTimer``), are
real mode's (:mod:`elastic.real.rdzv_utils`) and handed out lazily by :func:`__getattr__`,
so importing this module stays free of them.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["parse_rendezvous_config", "parse_rendezvous_endpoint"]

_PORT_RE = re.compile(r"^[0-9]{1,5}$")
_HOST_RE = re.compile(r"^[\w\.:-]+$")


def _parse_rendezvous_config(config_str: str) -> dict[str, str]:
    """Extract key-value pairs from ``<key1>=<value1>,...,<keyN>=<valueN>``.

    Values may contain ``=`` (the split is on the first one).  Raises :class:`ValueError`
    with torch's messages for an empty key or a missing value.
    """
    config: dict[str, str] = {}
    config_str = config_str.strip()
    if not config_str:
        return config
    for kv in config_str.split(","):
        key, *values = kv.split("=", 1)
        key = key.strip()
        if not key:
            raise ValueError(
                "The rendezvous configuration string must be in format "
                "<key1>=<value1>,...,<keyN>=<valueN>."
            )
        value = values[0].strip() if values else None
        if not value:
            raise ValueError(
                f"The rendezvous configuration option '{key}' must have a value specified."
            )
        config[key] = value
    return config


parse_rendezvous_config = _parse_rendezvous_config


def _try_parse_port(port_str: str) -> int | None:
    """The port number in ``port_str``, or ``None`` if it is not 1-5 digits."""
    if port_str and _PORT_RE.match(port_str):
        return int(port_str)
    return None


def parse_rendezvous_endpoint(endpoint: str | None, default_port: int) -> tuple[str, int]:
    """Split ``<hostname>[:<port>]`` into ``(host, port)``.

    ``None`` or blank gives ``("localhost", default_port)``; ``[v6]`` (whole brackets) has
    no port; brackets are stripped from an IPv6 host.  Raises :class:`ValueError` with
    torch's messages for a bad port or hostname.
    """
    if endpoint is not None:
        endpoint = endpoint.strip()
    if not endpoint:
        return ("localhost", default_port)
    rest: list[str]
    if endpoint[0] == "[" and endpoint[-1] == "]":
        host, rest = endpoint, []
    else:
        host, *rest = endpoint.rsplit(":", 1)
    if len(host) > 1 and host[0] == "[" and host[-1] == "]":
        host = host[1:-1]
    if len(rest) == 1:
        port = _try_parse_port(rest[0])
        if port is None or port >= 2**16:
            raise ValueError(
                f"The port number of the rendezvous endpoint '{endpoint}' must be an integer "
                "between 0 and 65536."
            )
    else:
        port = default_port
    if not _HOST_RE.match(host):
        raise ValueError(
            f"The hostname of the rendezvous endpoint '{endpoint}' must be a dot-separated list "
            "of labels, an IPv4 address, or an IPv6 address."
        )
    return host, port


#: torch's names in this module -> their real-mode implementations
_REAL_MODE_HELPERS = {
    "_matches_machine_hostname": "matches_machine_hostname",
    "_delay": "delay",
    "_PeriodicTimer": "PeriodicTimer",
}


def __getattr__(name: str) -> Any:
    real = _REAL_MODE_HELPERS.get(name)
    if real is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from elastic.real import rdzv_utils

    return getattr(rdzv_utils, real)
