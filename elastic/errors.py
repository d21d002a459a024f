"""The root of every error ``elastic`` raises, and the tree below it.

::

    ElasticError                         — root: catch this to catch everything of ours
    ├── ConfigError (also a ValueError)  — bad user input (flag, file, scenario); one line
    │   ├── EntrypointNotFoundError (also a FileNotFoundError) — no such worker program
    │   └── EntrypointNotExecutableError (also a PermissionError) — not executable
    ├── StoreError                       — the store failed an operation
    │   ├── StoreClosedError             — the store was shut down
    │   ├── StoreUnsupportedError        — an optional operation this store (a host of an
    │   │                                  older version) lacks; the caller falls back
    │   └── real.netstore_protocol.ProtocolError — bytes that are not the network
    │                                      store's protocol (a peer's bug or an attack)
    ├── rendezvous.RendezvousError       — (elastic.rendezvous.api) torch's names:
    │   ├── RendezvousClosedError
    │   ├── RendezvousTimeoutError
    │   ├── RendezvousConnectionError
    │   ├── RendezvousStateError
    │   └── RendezvousGracefulExitError
    ├── multiprocessing.errors.ChildFailedError
    └── timer.TimerError

Every class keeps all of its fields in ``args`` (simpy rebuilds an exception from its
``args`` when it leaves a process), and every message says what to do.
``TimeoutError`` (the builtin) is raised for timeouts on the ports, in both worlds.

Where torch raises a builtin exception for the same mistake, ours derives from it too,
so a torch user's ``except`` keeps working: :class:`ConfigError` is a ``ValueError``
(torch raises ``ValueError`` for bad launcher and rendezvous input), and a worker program
that is missing or not executable is also the ``FileNotFoundError`` or ``PermissionError``
torch's ``start_processes`` raises (from ``subprocess.Popen``).
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "ElasticError",
    "EntrypointNotExecutableError",
    "EntrypointNotFoundError",
    "StoreClosedError",
    "StoreError",
    "StoreUnsupportedError",
    "one_line",
]


class ElasticError(Exception):
    """Root of the errors raised by elastic."""


def one_line(text: str) -> str:
    """``text`` with control characters escaped (a newline as ``\\n``, ESC as ``\\x1b``):
    one line, and nothing for a terminal to act on."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


class ConfigError(ElasticError, ValueError):
    """Bad input: ``where`` (file:line or --flag), ``value`` and what was ``expected``.

    A ``ValueError`` too, as torch's errors for the same input are.
    """

    def __init__(self, where: str, message: str) -> None:
        super().__init__(where, message)
        self.where = where
        self.message = message

    def __str__(self) -> str:
        # one line whatever the input put in it (a key or a path may hold a newline)
        return one_line(f"{self.where}: {self.message}")


class EntrypointNotFoundError(ConfigError, FileNotFoundError):
    """The worker program does not exist (where torch's ``Popen`` raises
    ``FileNotFoundError``)."""


class EntrypointNotExecutableError(ConfigError, PermissionError):
    """The worker program exists but may not be executed (torch: ``PermissionError``)."""


class StoreError(ElasticError):
    """A store operation failed."""


class StoreClosedError(StoreError):
    """The store was closed; start a new one or stop using it."""


class StoreUnsupportedError(StoreError):
    """The store lacks an optional operation (a network store host of an older version):
    nothing was sent or changed; use the port's plain operations instead."""
