"""torch's synchronous ``LocalElasticAgent`` hooks, for subclasses written against them.

A user's subclass of torch's ``LocalElasticAgent`` typically overrides one hook and calls
the base class for the rest, synchronously::

    class Mine(LocalElasticAgent):
        def _monitor_workers(self, wg):
            result = super()._monitor_workers(wg)
            ...
            return result

elastic's ``LocalElasticAgent`` is event-driven: its ``_start_workers`` is a coroutine,
and its ``_monitor_workers``, ``_stop_workers`` and ``_shutdown`` (torch's, kept for
torch's driver) are never called by its own run.  So a subclass that overrides any of
torch's hooks with a plain (synchronous) method is given, when the class is created,
:class:`TorchLocalElasticAgent` as its base in place of ``LocalElasticAgent``
(:func:`adopt_local`): ``super()`` then reaches torch's synchronous hooks, step for step
torch 2.13's.  A plain ``LocalElasticAgent`` with one of those hooks patched on the
instance (torch's tests: ``patch.object(agent, "_monitor_workers")``) becomes one when it
runs.

* ``run``, ``_invoke_run``, the rendezvous, the rank exchange, the exit barrier, metrics
  and events are torch's driver (:mod:`elastic.agent.server._torch_style`);
* ``_start_workers(wg) -> {local_rank: pid}`` starts the group with
  ``start_processes`` (looked up in ``local_elastic_agent``, where torch's tests patch
  it; ``self._pcontext``), each worker's
  environment made by elastic's agent (torch's keys, plus the timer file and
  ``extra_env``); the file-timer watchdog and the health-check server are set up there,
  as torch does;
* ``_monitor_workers(wg)`` is one ``pcontext.wait(0)``: ``UNKNOWN`` when the group's
  pids are not the context's, ``FAILED`` / ``SUCCEEDED`` keyed by global rank, else
  ``HEALTHY``;
* ``_stop_workers(wg)`` is ``_shutdown()``; ``_shutdown(death_sig, timeout)`` stops the
  watchdog and the health-check server and closes the context.

Invariants: a class is switched only when it names ``LocalElasticAgent`` as a direct base
(a user's intermediate class is never changed under its other subclasses); the switch
adds no state, so the instance is the same object torch's tests poke
(``_pcontext``, ``_worker_group``, ``_remaining_restarts``).  What such an agent does not
get is elastic's own event-driven machinery (the simulator, ``elastic run``'s process
trees and reaper sidecar, hang detection, the NVML pre-start check): it polls, as torch.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from string import Template
from typing import Any

from elastic.agent.server._torch_style import _PROVIDED, _TorchStyle
from elastic.agent.server.api import RunResult, WorkerGroup
from elastic.agent.server.local_elastic_agent import LocalElasticAgent

__all__ = ["TorchLocalElasticAgent", "adopt_local"]

logger = logging.getLogger("elastic.agent.server.local_elastic_agent")


class TorchLocalElasticAgent(LocalElasticAgent):
    """``LocalElasticAgent`` with torch's synchronous hooks and driver (see the module)."""

    _torch_style = True

    # -- torch's LocalElasticAgent hooks ----------------------------------------------------
    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:  # type: ignore[override]
        from elastic.agent.server import local_elastic_agent as lea

        spec = worker_group.spec
        if worker_group.store is None:
            raise AssertionError("the worker group has no store: rendezvous first")
        if spec.entrypoint is None:
            raise AssertionError("the worker spec has no entrypoint")
        # torch's _setup_local_watchdog and _setup_healthcheck
        self._start_timer_server()
        self._start_health_check_server()
        envs: dict[int, dict[str, str]] = {}
        args: dict[int, tuple[Any, ...]] = {}
        template = self._log_line_prefix_template
        prefixes: dict[int, str] | None = {} if template else None
        for worker, env in zip(worker_group.workers, self._worker_envs(worker_group), strict=True):
            local_rank = worker.local_rank
            envs[local_rank] = env
            args[local_rank] = self._worker_args(spec, local_rank)
            if prefixes is not None and template:
                prefixes[local_rank] = Template(template).safe_substitute(
                    role_name=spec.role, rank=worker.global_rank, local_rank=local_rank
                )
        # the context handles the agent's termination signals (torch's launch_agent puts
        # them in the agent's environment, where the context reads them)
        handled = ",".join(sig.name for sig in self._signals)
        with _environ("TORCHELASTIC_SIGNALS_TO_HANDLE", handled):
            self._pcontext = lea.start_processes(
                name=spec.role,
                entrypoint=spec.entrypoint,
                args=args,
                envs=envs,
                logs_specs=self._logs_specs,
                log_line_prefixes=prefixes,
                start_method=self._start_method,
                numa_options=spec.numa_options,
                duplicate_stdout_filters=getattr(spec, "duplicate_stdout_filters", None),
                duplicate_stderr_filters=getattr(spec, "duplicate_stderr_filters", None),
            )
        pids: dict[int, Any] = self._pcontext.pids()
        if self._timer_server is not None:
            self._timer_server.set_worker_pids(pids.values())
        return pids

    def run(self, role: str = "default") -> RunResult | None:
        if self._clock is None:
            # the agent's events are stamped with it (it needs no running loop)
            from elastic.real.clock import AsyncioClock

            self._clock = AsyncioClock()
        if self._hang is not None:
            logger.warning(
                "%s overrides torch's synchronous hooks: hang detection (hang_timeout) is "
                "not available to it and is off",
                type(self).__qualname__,
            )
        return _TorchStyle.run(self, role)


# torch's driver, where this class does not define the name itself (a base class listed
# beside LocalElasticAgent would change the instances' layout, and a user's class could
# then not be given this one as its base)
for _name in _PROVIDED:
    if _name not in vars(TorchLocalElasticAgent):
        setattr(TorchLocalElasticAgent, _name, vars(_TorchStyle)[_name])
del _name


@contextlib.contextmanager
def _environ(name: str, value: str) -> Iterator[None]:
    """``os.environ[name]`` set to ``value`` for the block, then as it was."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def _sync_overrides(cls: type, base: type) -> list[str]:
    """torch's hooks that ``cls`` (or a class between it and ``base``) defines as plain
    methods."""
    from elastic.agent.server._torch_style import _SYNC_HOOKS

    found: list[str] = []
    for klass in cls.__mro__:
        if klass is base:
            break
        for name in (*_SYNC_HOOKS, "_invoke_run"):
            fn = vars(klass).get(name)
            if callable(fn) and not _is_async(fn) and name not in found:
                found.append(name)
    return found


def _is_async(fn: Any) -> bool:
    import inspect

    return inspect.iscoroutinefunction(fn)


def adopt_local(cls: type) -> bool:
    """Give ``cls`` torch's synchronous ``LocalElasticAgent`` if it is written against it
    (overrides a torch hook synchronously) and names ``LocalElasticAgent`` as a direct
    base; True if it did."""
    if getattr(cls, "_torch_style", False) or LocalElasticAgent not in cls.__bases__:
        return False
    if not _sync_overrides(cls, LocalElasticAgent):
        return False
    cls.__bases__ = tuple(
        TorchLocalElasticAgent if b is LocalElasticAgent else b for b in cls.__bases__
    )
    return True
