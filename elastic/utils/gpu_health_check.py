"""GPU health checks with NVML for programs and launchers: the names newer torch gives
``torch.distributed.elastic.utils.gpu_health_check`` (after NVIDIA's resiliency
extension): :class:`GPUHealthCheck`, :class:`PynvmlMixin`,
:func:`create_gpu_health_check` and :func:`quick_gpu_health_check`.

What a check decides is :mod:`elastic.gpu`'s, the same verdict the agent's pre-start
check gives: a GPU is unhealthy when NVML reports it lost, with retired pages or a row
remapping pending or failed, with uncorrectable ECC errors since the driver loaded, or
when the GPU Recovery API (driver r570 and later) asks for a recovery action (a reset, a
reboot, draining its peer-to-peer traffic…).  torch's version looks at the recovery
action only.

As torch's:

* the check is ``enabled`` only where ``pynvml`` imports and the driver is r570 or newer
  (``nvmlSystemGetDriverVersion``); a disabled check answers True (healthy) with a
  warning, so a CPU-only host is never held back;
* NVML is initialised and shut down around each check, under one process-wide
  re-entrant lock (``with_pynvml_lock``), so checks may run from several threads;
* an NVML error during a check makes it answer False (unhealthy), logged.

:meth:`GPUHealthCheck.async_check` waits ``interval`` seconds between checks (a sleep
on the event loop, not a busy loop: NVML offers no event for these conditions) and runs
each check in a worker thread, so the loop is never blocked by NVML; ``on_failure`` may
be a plain function or a coroutine function.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from types import ModuleType
from typing import Any, ParamSpec, TypeVar

from elastic import gpu as _gpu

__all__ = [
    "GPUHealthCheck",
    "PynvmlMixin",
    "create_gpu_health_check",
    "quick_gpu_health_check",
    "with_pynvml_lock",
]

logger = logging.getLogger(__name__)

#: the oldest driver with the GPU Recovery API (nvml.h: r570)
GPU_RECOVERY_API_MIN_DRIVER_VERSION = 570

# NVML is initialised and shut down around each use; one lock keeps two threads from
# shutting it down under each other
_nvml_lock = threading.RLock()

_P = ParamSpec("_P")
_R = TypeVar("_R")


def with_pynvml_lock(func: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``func`` holding the process's NVML lock."""

    @wraps(func)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with _nvml_lock:
            return func(*args, **kwargs)

    return wrapper


class PynvmlMixin:
    """``pynvml`` found on demand, and the platform facts read through it."""

    pynvml: ModuleType | None

    def __init__(self) -> None:
        self.pynvml = None

    def check_pynvml_availability(self) -> bool:
        """Import ``pynvml`` (kept in :attr:`pynvml`); False, with a warning, without it."""
        nv = _gpu._import_pynvml()
        if nv is None:
            logger.warning("Pynvml is not installed.")
            return False
        self.pynvml = nv
        return True

    @with_pynvml_lock
    def is_gb200_platform(self) -> bool:
        """Whether GPU 0 is a GB200 or B200 (the nodes of a job are alike, so GPU 0 speaks
        for all); False without NVML or GPUs."""
        nv = self.pynvml
        if nv is None:
            return False
        with _session(nv, logger.debug, "to detect GB200") as started:
            if not started:
                return False
            try:
                if int(nv.nvmlDeviceGetCount()) == 0:
                    return False
                name = _gpu._text(nv.nvmlDeviceGetName(nv.nvmlDeviceGetHandleByIndex(0)))
            except nv.NVMLError as e:
                logger.debug("NVML error while detecting GB200: %s", e)
                return False
            return any(kind in name.upper() for kind in ("GB200", "B200"))

    def get_gb200_static_mapping(self) -> dict[int, str]:
        """torch's static GPU (local rank) to NIC mapping of a GB200 node."""
        return {0: "mlx5_0", 1: "mlx5_1", 2: "mlx5_3", 3: "mlx5_4"}

    @with_pynvml_lock
    def get_gpu_pci_mapping(self) -> dict[int, str]:
        """GPU index → PCI bus id (lower case, the last 12 characters:
        ``0000:3b:00.0``); empty, logged, if NVML fails."""
        nv = self.pynvml
        if nv is None:
            raise RuntimeError("pynvml is not initialized: call check_pynvml_availability() first")
        mapping: dict[int, str] = {}
        with _session(nv, logger.error, "to read PCI bus ids") as started:
            if not started:
                return mapping
            try:
                for i in range(int(nv.nvmlDeviceGetCount())):
                    info = nv.nvmlDeviceGetPciInfo(nv.nvmlDeviceGetHandleByIndex(i))
                    mapping[i] = _gpu._text(info.busId).lower()[-12:]
            except nv.NVMLError as e:
                logger.error("NVML error while reading PCI bus ids: %s", e)
        return mapping


@contextmanager
def _session(nv: ModuleType, log: Callable[..., None], why: str) -> Iterator[bool]:
    """NVML started for one use, shut down after; False (logged with ``log``) when it
    would not start."""
    try:
        nv.nvmlInit()
    except Exception as e:
        log("NVML could not start %s: %s", why, e)
        yield False
        return
    try:
        yield True
    finally:
        try:
            nv.nvmlShutdown()
        except Exception as e:
            logger.debug("nvmlShutdown failed: %s", e)


class GPUHealthCheck(PynvmlMixin):
    """A GPU health check: call it for a verdict (True: healthy), or run
    :meth:`async_check` to check every ``interval`` seconds and call ``on_failure``
    when a check fails.

    ``device_index``: one GPU (NVML's index) or None for every GPU on the host.
    """

    def __init__(
        self,
        device_index: int | None = None,
        interval: int = 60,
        on_failure: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__()
        self.device_index = device_index
        self.interval = interval
        self.on_failure = on_failure
        self.pynvml_available = self.check_pynvml_availability()
        self.enabled = self._check_driver_version()

    @with_pynvml_lock
    def _check_driver_version(self) -> bool:
        """Whether the driver has the GPU Recovery API (r570 or newer)."""
        nv = self.pynvml
        if not self.pynvml_available or nv is None:
            logger.warning("GPU health checks are disabled because pynvml is not available.")
            return False
        with _session(nv, logger.warning, "(GPU health checks disabled)") as started:
            if not started:
                return False
            try:
                version = _gpu._text(nv.nvmlSystemGetDriverVersion())
                major = int(version.split(".")[0])
            except Exception as e:
                logger.warning(
                    "GPU health checks disabled: unable to determine the driver version (%s)", e
                )
                return False
        if major < GPU_RECOVERY_API_MIN_DRIVER_VERSION:
            logger.warning(
                "GPU health checks disabled: GPU driver version r%d is older than "
                "required r%d for the GPU Recovery API.",
                major,
                GPU_RECOVERY_API_MIN_DRIVER_VERSION,
            )
            return False
        return True

    def __call__(self) -> bool:
        """Check now: True if every GPU checked is healthy (and when disabled)."""
        if not self.enabled:
            logger.warning("Health checks are disabled; skipping synchronous check.")
            return True
        return self._perform_health_check()

    async def async_check(self) -> None:
        """Check every ``interval`` seconds, for ever; ``on_failure`` after each failed
        check.  Returns at once when the check is disabled."""
        if not self.enabled:
            return
        while True:
            await asyncio.sleep(self.interval)
            if not await self._check_health() and self.on_failure is not None:
                outcome = self.on_failure()
                if inspect.isawaitable(outcome):
                    await outcome

    async def _check_health(self) -> bool:
        """One check, in a worker thread (NVML calls block)."""
        return await asyncio.to_thread(self._perform_health_check)

    @with_pynvml_lock
    def _perform_health_check(self) -> bool:
        nv = self.pynvml
        if nv is None:
            return True
        with _session(nv, logger.warning, "for a health check") as started:
            if not started:
                return False
            try:
                count = int(nv.nvmlDeviceGetCount())
                if self.device_index is not None:
                    if not 0 <= self.device_index < count:
                        logger.warning(
                            "GPU %s: no such device (NVML sees %d)", self.device_index, count
                        )
                        return False
                    devices: list[int] = [self.device_index]
                else:
                    devices = list(range(count))
                return all(self._check_gpu_health(i) for i in devices)
            except Exception as e:
                logger.warning("NVML error: %s", e)
                return False

    def _check_gpu_health(self, device_id: int) -> bool:
        """One GPU's verdict (NVML initialised by the caller); its problems are logged."""
        nv = self.pynvml
        if nv is None:
            return True
        health = _gpu._check_gpu(nv, device_id)
        for problem in health.problems:
            logger.warning("%s: %s", health.label(), problem)
        return health.healthy


def create_gpu_health_check(
    device_index: int | None = None,
    interval: int = 60,
    on_failure: Callable[[], Any] | None = None,
) -> GPUHealthCheck:
    """A :class:`GPUHealthCheck` (torch's factory)."""
    return GPUHealthCheck(device_index=device_index, interval=interval, on_failure=on_failure)


def quick_gpu_health_check(device_index: int | None = None) -> bool:
    """One check without keeping a :class:`GPUHealthCheck`; False if it raised."""
    try:
        return create_gpu_health_check(device_index=device_index)()
    except Exception as e:
        logger.error("Quick GPU health check failed: %s", e)
        return False
