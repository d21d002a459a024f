"""``elastic sweep --cluster ADDRESS``: the sweep's runs on a Dask distributed cluster.

When one machine is not enough, the same runs go to the workers of an existing Dask
scheduler (``tcp://host:8786``, or ``tls://`` with certificates) instead of local worker
processes.  Each run is :func:`sim.sweep.run_cell`, submitted *by reference* (a module and
a name), with JSON text in (the scenario's YAML with the settings applied, its source name,
the seed) and JSON text out (the run's figures, and the fingerprint of the code that made
them), so:

- the results are those of the local sweep, byte for byte: a run is a pure function of
  (scenario, settings, seed, code), the answers go through the same JSON either way, and a
  worker whose ``elastic``/``sim`` code differs from ours is refused (its fingerprint);
- no object of ours crosses the wire pickled, and this process asks for and reads task
  results as msgpack only (the client's serializers and deserializers): an answer that is
  not plain data, or a pickled exception, is refused, never unpickled here.

Dask's own protocol still pickles its task specifications (the reference to ``run_cell``)
and some of its control messages, and unpickles those unconditionally; its scheduler
refuses to start with ``distributed.scheduler.pickle: false`` ("Pickling can no longer be
disabled"), so that cannot be switched off.  Hence: **the cluster must be trusted** (Dask's
own security advice: anyone who can reach the scheduler can run code on it and on us); use
``tls://`` with ``--tls-ca-file/--tls-cert/--tls-key`` (or Dask's ``distributed.comm.tls.*``
settings) on a network that others share.

The scheduler and every worker need this package (the workers the same code: the fingerprint
checks it) and the ``cluster`` extra installed: Dask's scheduler unpickles the task graph,
so it imports :mod:`sim.sweep` too.

Bad input is one line (exit 2): Dask not installed (the ``cluster`` extra), a malformed
address, no scheduler answering within :data:`CONNECT_TIMEOUT_S`, a scheduler with no
worker within :data:`WORKERS_TIMEOUT_S`.  A worker lost mid-sweep is Dask's business (it
reschedules the run elsewhere); a run that fails for good ends the sweep in one line.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from elastic.errors import ConfigError
from sim.sweep import SweepError, job_text, run_cell, take_result

__all__ = [
    "CONNECT_TIMEOUT_S",
    "WORKERS_TIMEOUT_S",
    "ClusterTLS",
    "check_address",
    "run_on_cluster",
]

#: How long to try to reach the scheduler before giving up (Dask's default is 30 s).
CONNECT_TIMEOUT_S = 10.0
#: How long to wait for a scheduler without workers to get one.
WORKERS_TIMEOUT_S = 30.0
_SCHEMES = ("tcp", "tls")
_INSTALL = "pip install 'elastic-sim-agent[cluster]'"


@dataclass(frozen=True, slots=True)
class ClusterTLS:
    """The client's TLS files (PEM), as Dask's own ``--tls-*`` flags name them."""

    ca_file: str | None = None
    cert: str | None = None
    key: str | None = None

    @property
    def given(self) -> bool:
        return any((self.ca_file, self.cert, self.key))


def check_address(address: str) -> str:
    """``address`` as Dask wants it (``tcp://`` added to a bare ``host:port``), or a
    ConfigError naming ``--cluster`` and what is expected."""
    expected = "expected a Dask scheduler address such as tcp://host:8786 or tls://host:8786"
    text = address.strip()
    if "://" not in text:
        text = f"tcp://{text}"
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as error:
        raise ConfigError("--cluster", f"got {address!r} ({error}); {expected}") from None
    if parts.scheme not in _SCHEMES:
        raise ConfigError(
            "--cluster", f"got {address!r}: scheme {parts.scheme!r} is not tcp or tls; {expected}"
        )
    if not parts.hostname or port is None or port == 0:
        raise ConfigError("--cluster", f"got {address!r}: no host and port; {expected}")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ConfigError("--cluster", f"got {address!r}: more than host:port; {expected}")
    if not re.fullmatch(r"[A-Za-z0-9.\-\[\]:]+", parts.netloc):
        raise ConfigError("--cluster", f"got {address!r}: not a host name; {expected}")
    return f"{parts.scheme}://{parts.netloc}"


def _dask() -> Any:
    """The ``distributed`` module, or the one line that says how to install it."""
    try:
        import distributed
    except ImportError:
        raise ConfigError(
            "--cluster", f"needs Dask's distributed package, which is not installed: {_INSTALL}"
        ) from None
    return distributed


def _security(distributed: Any, address: str, tls: ClusterTLS) -> Any:
    if tls.given and not address.startswith("tls://"):
        raise ConfigError(
            "--tls-ca-file", f"TLS files given but --cluster {address} is not tls://; expected both"
        )
    if not address.startswith("tls://"):
        return None
    if tls.given:
        if not (tls.ca_file and tls.cert and tls.key):
            raise ConfigError(
                "--tls-ca-file", "expected all three of --tls-ca-file, --tls-cert and --tls-key"
            )
        try:
            security = distributed.Security(
                tls_ca_file=tls.ca_file,
                tls_client_cert=tls.cert,
                tls_client_key=tls.key,
                require_encryption=True,
            )
            # reads and checks the files now, not at the first connection
            security.get_connection_args("client")
        except (OSError, ValueError) as error:
            raise ConfigError("--tls-cert", f"the TLS files cannot be used: {error}") from None
        return security
    security = distributed.Security()  # Dask's own distributed.comm.tls.* settings
    if security.get_connection_args("client").get("ssl_context") is None:
        raise ConfigError(
            "--cluster",
            f"{address} is tls:// but no certificates are set; expected --tls-ca-file, "
            "--tls-cert and --tls-key (or Dask's distributed.comm.tls.* settings)",
        )
    return security


@contextmanager
def _quiet_dask() -> Iterator[None]:
    """Dask's client logs its failures with tracebacks (a refused payload, a lost
    scheduler, from its own thread) before they reach us as exceptions; we say each in one
    line instead (DESIGN: never a traceback for the user), so its log is off meanwhile."""
    # a logger's own level and ``disabled`` are what count for its records (Dask sets
    # levels on children such as distributed.client), so each is switched off by name
    loggers = [
        logging.getLogger(name)
        for name in ["distributed", *logging.root.manager.loggerDict]
        if name == "distributed" or name.startswith("distributed.")
    ]
    before = [logger.disabled for logger in loggers]
    for logger in loggers:
        logger.disabled = True
    try:
        yield
    finally:
        for logger, disabled in zip(loggers, before, strict=True):
            logger.disabled = disabled


def run_on_cluster(
    address: str,
    jobs: Sequence[tuple[int, str, str, int]],
    on_result: Callable[[], None] | None = None,
    tls: ClusterTLS = ClusterTLS(),
) -> dict[int, dict[str, Any]]:
    """Run (id, yaml text, source, seed) jobs on the Dask cluster at ``address``; results
    by id, exactly as :func:`sim.sweep.run_sweep` gives them."""
    distributed = _dask()
    address = check_address(address)
    security = _security(distributed, address, tls)
    seeds = {ident: seed for ident, _, _, seed in jobs}
    results: dict[int, dict[str, Any]] = {}
    with _quiet_dask():
        try:
            client = distributed.Client(
                address,
                timeout=CONNECT_TIMEOUT_S,
                security=security,
                # task results are read as msgpack only: a pickled result or exception
                # from the cluster is refused (ours are JSON text)
                serializers=["msgpack"],
                deserializers=["msgpack"],
                set_as_default=False,
            )
        except (OSError, TimeoutError) as error:
            raise ConfigError(
                "--cluster",
                f"no Dask scheduler answered at {address} within {CONNECT_TIMEOUT_S:g} s "
                f"({type(error).__name__}); expected a running scheduler "
                "(`dask scheduler`, with workers)",
            ) from None
        try:
            try:
                client.wait_for_workers(1, timeout=WORKERS_TIMEOUT_S)
            except (OSError, TimeoutError):
                raise ConfigError(
                    "--cluster",
                    f"the scheduler at {address} has no worker after {WORKERS_TIMEOUT_S:g} s; "
                    "expected at least one (`dask worker ADDRESS`)",
                ) from None
            # one unique key per run: Dask would otherwise share equal runs between
            # clients, and keep a result another sweep asked for
            batch = uuid.uuid4().hex[:12]
            futures = [
                client.submit(
                    run_cell, job_text(*job), key=f"elastic-sweep-{batch}-{job[0]}", pure=False
                )
                for job in jobs
            ]
            for future in distributed.as_completed(futures, loop=client.loop):
                try:
                    answer = future.result()
                except Exception as error:  # a Dask failure (worker lost for good, refusal)
                    why = f"{type(error).__name__}: {error}"
                    if "only able to deserialize data with ['msgpack']" in str(error):
                        why = "a worker's answer was not JSON text (refused, not unpickled)"
                    elif "deserialization of the task graph" in str(error):
                        why = (
                            "the scheduler cannot load sim.sweep.run_cell; expected the same "
                            "elastic-sim-agent installed on the scheduler and every worker"
                        )
                    elif isinstance(error, OSError):
                        why = f"the connection to the scheduler was lost ({why})"
                    elif getattr(error, "reason", None) == "scheduler-connection-lost":
                        why = "the connection to the scheduler was lost (Dask cancelled the runs)"
                    raise SweepError(
                        f"--cluster {address}: a run failed on the cluster: {why}"
                    ) from None
                if not isinstance(answer, str):
                    raise SweepError(
                        f"--cluster {address}: a worker answered {str(answer)[:80]!r}; "
                        "expected JSON text"
                    )
                ident, figures = take_result(answer, seeds)
                results[ident] = figures
                if on_result is not None:
                    on_result()
        finally:
            client.close(timeout=CONNECT_TIMEOUT_S)
    missing = [ident for ident, *_ in jobs if ident not in results]
    if missing:
        raise SweepError(f"--cluster {address}: {len(missing)} runs gave no result")
    return results
