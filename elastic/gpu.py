"""GPU discovery and health through NVML (the ``pynvml`` module of nvidia-ml-py).

The agent calls :func:`check_node_health` before every (re)start of its workers: a GPU
that NVML reports as lost, with uncorrectable memory errors, or waiting for a reset,
would crash the next attempt too, so the node should not rejoin with it.

What makes a GPU unhealthy (each a documented NVML query):

* the GPU is lost — ``NVML_ERROR_GPU_IS_LOST`` (or ``NVML_ERROR_UNKNOWN``) from any
  query on it, including getting its handle;
* retired pages pending — ``nvmlDeviceGetRetiredPagesPendingStatus`` is
  ``NVML_FEATURE_ENABLED`` (pre-Ampere; the GPU needs a reset);
* uncorrectable ECC errors since the last driver load —
  ``nvmlDeviceGetTotalEccErrors(h, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC)``
  > 0;
* row remapping failed or pending — ``nvmlDeviceGetRemappedRows`` (Ampere and later);
* a recovery action the driver asks for — the field
  ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` of ``nvmlDeviceGetFieldValues`` (driver r570
  and later: NVIDIA's GPU Recovery API) is not ``NVML_GPU_RECOVERY_ACTION_NONE``: the GPU
  needs a reset, the node a reboot, its peer-to-peer traffic draining, and so on.  Only
  asked of a ``pynvml`` that has ``nvmlDeviceGetFieldValues``.

``NVML_ERROR_NOT_SUPPORTED`` (and other refusals such as missing permission or a driver
too old for the call) means "unknown", never "unhealthy": the check is listed in
``GpuHealth.unknown``.  When NVML is absent (no ``pynvml``, no ``libnvidia-ml``, no
driver) the report says ``NVML not available: CPU only``; log it once with
:func:`say_once`.

``pynvml`` is imported inside the functions, so importing this module costs nothing on a
CPU-only host and tests can put a fake module in ``sys.modules``.  The count for
``--nproc-per-node gpu`` comes from NVML and ``CUDA_VISIBLE_DEVICES``
(:func:`visible_device_count`), without torch.  Only where NVML finds nothing (a ROCm or
XPU host, or no NVML) does the launcher ask torch, through :func:`torch_devices`, which
imports torch only then, and only if it is installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from elastic.once import say_once  # re-exported: its home before elastic.once

__all__ = [
    "NVML_UNAVAILABLE",
    "GpuHealth",
    "NodeGpuReport",
    "TorchDevices",
    "check_node_health",
    "device_count",
    "say_once",
    "torch_devices",
    "visible_device_count",
]

logger = logging.getLogger(__name__)

#: The message of a report on a host without NVML.
NVML_UNAVAILABLE = "NVML not available: CPU only"

# NVML return codes (nvml.h); kept here so that a fake module need not define them all.
_NOT_SUPPORTED = 3
_DRIVER_NOT_LOADED = 9
_LIBRARY_NOT_FOUND = 12
_GPU_IS_LOST = 15
_UNKNOWN = 999
_FEATURE_ENABLED = 1
_MEMORY_ERROR_TYPE_UNCORRECTED = 1
_VOLATILE_ECC = 0
# the GPU Recovery API (nvml.h, driver r570+): the field and the actions it reports
_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
RECOVERY_ACTIONS: dict[int, str] = {
    1: "the GPU needs a reset (NVML_GPU_RECOVERY_ACTION_GPU_RESET)",
    2: "the node needs a reboot (NVML_GPU_RECOVERY_ACTION_NODE_REBOOT)",
    3: "its peer-to-peer traffic must be drained (NVML_GPU_RECOVERY_ACTION_DRAIN_P2P)",
    4: "it runs at reduced capacity: drain it and reset it "
    "(NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET)",
    5: "its IMEX domain must be recovered (NVML_GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN)",
    6: "the GPU needs a bus reset (NVML_GPU_RECOVERY_ACTION_BUS_RESET)",
    7: "the system needs a reboot (NVML_GPU_RECOVERY_ACTION_SYSTEM_REBOOT)",
}


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """One GPU: who it is and whether it is fit to train on.

    ``healthy`` is False iff ``problems`` is not empty.  ``unknown`` lists the checks
    NVML could not answer on this GPU (not supported, no permission…).  Identity fields
    are None where NVML did not give them (serial numbers are absent on many boards).
    """

    index: int
    uuid: str | None
    name: str | None
    pci_bus_id: str | None
    serial: str | None
    problems: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()

    @property
    def healthy(self) -> bool:
        return not self.problems

    def label(self) -> str:
        """``GPU 1 (GPU-8f…, 00000000:3B:00.0)``: index plus what identifies the board."""
        ids = ", ".join(x for x in (self.uuid, self.pci_bus_id) if x)
        return f"GPU {self.index} ({ids})" if ids else f"GPU {self.index}"


@dataclass(frozen=True, slots=True)
class NodeGpuReport:
    """This node's GPUs and the verdict: ``healthy`` and a message naming what is wrong.

    ``nvml_available`` is False on a CPU-only host (``gpus`` empty).  ``expected_devices``
    is what the caller asked for; fewer visible GPUs than that makes the node unhealthy.
    """

    nvml_available: bool
    gpus: tuple[GpuHealth, ...]
    expected_devices: int | None
    healthy: bool
    message: str

    @property
    def unhealthy(self) -> tuple[GpuHealth, ...]:
        return tuple(g for g in self.gpus if not g.healthy)


def _import_pynvml() -> ModuleType | None:
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


def _code(err: BaseException) -> int | None:
    value = getattr(err, "value", None)
    return value if isinstance(value, int) else None


def _text(value: Any) -> str:
    # Older pynvml returns bytes for strings, newer returns str.
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


@contextmanager
def _nvml_session() -> Iterator[tuple[ModuleType | None, str | None, bool]]:
    """Yield (pynvml, problem, absent); shut NVML down after, whatever happens.

    ``absent`` is True when NVML is simply not there (CPU-only host).
    """
    nv = _import_pynvml()
    if nv is None:
        yield None, "the pynvml module is not installed", True
        return
    try:
        nv.nvmlInit()
    except nv.NVMLError as e:
        code = _code(e)
        absent = code in (_LIBRARY_NOT_FOUND, _DRIVER_NOT_LOADED)
        yield None, f"nvmlInit failed: {e}", absent
        return
    except OSError as e:  # the library loaded but could not be used
        yield None, f"nvmlInit failed: {e}", True
        return
    try:
        yield nv, None, False
    finally:
        try:
            nv.nvmlShutdown()
        except nv.NVMLError as e:
            logger.debug("nvmlShutdown failed: %s", e)


class _Gpu:
    """Collects the answers of NVML queries on one GPU into problems and unknowns."""

    def __init__(self, nv: ModuleType, index: int) -> None:
        self.nv = nv
        self.index = index
        self.problems: list[str] = []
        self.unknown: list[str] = []

    def query(self, what: str, call: Callable[[], Any], *, identity: bool = False) -> Any:
        """Run one NVML call; None if it failed (recording why, unless ``identity``)."""
        try:
            return call()
        except self.nv.NVMLError as e:
            code = _code(e)
            if code == _GPU_IS_LOST:
                self._problem("GPU is lost (NVML_ERROR_GPU_IS_LOST)")
            elif code == _UNKNOWN:
                self._problem(f"NVML unknown error on {what} (GPU may be lost)")
            elif not identity:
                reason = "not supported" if code == _NOT_SUPPORTED else str(e)
                self.unknown.append(f"{what}: {reason}")
            return None

    def _problem(self, text: str) -> None:
        if text not in self.problems:
            self.problems.append(text)


def _check_gpu(nv: ModuleType, index: int) -> GpuHealth:
    gpu = _Gpu(nv, index)
    handle = gpu.query("handle", lambda: nv.nvmlDeviceGetHandleByIndex(index))
    if handle is None:
        if not gpu.problems:
            gpu._problem("NVML could not get a handle: " + "; ".join(gpu.unknown))
        return GpuHealth(index, None, None, None, None, tuple(gpu.problems), ())

    def ident(what: str, call: Callable[[], Any]) -> str | None:
        v = gpu.query(what, call, identity=True)
        return None if v is None else _text(v)

    uuid = ident("uuid", lambda: nv.nvmlDeviceGetUUID(handle))
    name = ident("name", lambda: nv.nvmlDeviceGetName(handle))
    pci = gpu.query("pci", lambda: nv.nvmlDeviceGetPciInfo(handle), identity=True)
    bus_id = None if pci is None else _text(getattr(pci, "busId", "")) or None
    serial = ident("serial", lambda: nv.nvmlDeviceGetSerial(handle))

    pending = gpu.query(
        "retired pages pending", lambda: nv.nvmlDeviceGetRetiredPagesPendingStatus(handle)
    )
    if pending == _FEATURE_ENABLED:
        gpu._problem("retired pages pending (the GPU needs a reset)")
    ecc = gpu.query(
        "uncorrectable ECC errors",
        lambda: nv.nvmlDeviceGetTotalEccErrors(
            handle, _MEMORY_ERROR_TYPE_UNCORRECTED, _VOLATILE_ECC
        ),
    )
    if isinstance(ecc, int) and ecc > 0:
        gpu._problem(f"{ecc} uncorrectable ECC error(s) since the driver loaded")
    rows = gpu.query("remapped rows", lambda: nv.nvmlDeviceGetRemappedRows(handle))
    if isinstance(rows, tuple) and len(rows) == 4:
        _corrected, _uncorrected, is_pending, failure = rows
        if failure:
            gpu._problem("row remapping failed (the GPU should be replaced)")
        elif is_pending:
            gpu._problem("row remapping pending (the GPU needs a reset)")
    action = _recovery_action(gpu, handle)
    if action:
        gpu._problem(f"NVML asks for recovery: {_recovery_text(nv, action)}")
    return GpuHealth(index, uuid, name, bus_id, serial, tuple(gpu.problems), tuple(gpu.unknown))


def _recovery_action(gpu: _Gpu, handle: Any) -> int | None:
    """The GPU Recovery API's action for this GPU (0: none), or None where it cannot be
    asked (a ``pynvml`` without field values, a driver older than r570)."""
    nv = gpu.nv
    get = getattr(nv, "nvmlDeviceGetFieldValues", None)
    if get is None:
        return None
    field = getattr(nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", _FI_DEV_GET_GPU_RECOVERY_ACTION)
    what = "GPU recovery action"
    values = gpu.query(what, lambda: get(handle, [field]))
    if values is None:
        return None
    try:
        value = values[0]
        status = getattr(value, "nvmlReturn", 0)
        if isinstance(status, int) and status != 0:
            reason = "not supported" if status == _NOT_SUPPORTED else f"NVML return {status}"
            gpu.unknown.append(f"{what}: {reason}")
            return None
        action = value.value.uiVal
    except (AttributeError, IndexError, TypeError):
        gpu.unknown.append(f"{what}: no value")
        return None
    return action if isinstance(action, int) else None


def _recovery_text(nv: ModuleType, action: int) -> str:
    """What a recovery action asks for, in words; an action newer than this table by the
    ``pynvml`` constant that names it."""
    known = RECOVERY_ACTIONS.get(action)
    if known is not None:
        return known
    prefix = "NVML_GPU_RECOVERY_ACTION_"
    names = [n for n in dir(nv) if n.startswith(prefix) and getattr(nv, n) == action]
    return names[0] if names else f"unknown recovery action {action}"


def _visible_indices(nv: ModuleType, count: int, environ: Mapping[str, str]) -> list[int] | None:
    """NVML indices of the devices ``CUDA_VISIBLE_DEVICES`` lets CUDA see, or None if unset.

    Follows CUDA's rules: entries are indices or UUID prefixes (``GPU-…``); the list ends
    at the first entry that names no device (so ``"-1"`` or ``""`` hide everything) and
    duplicates end it too.  Indices are taken in NVML's (PCI bus) order, which is CUDA's
    only with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; counts are right either way.
    """
    raw = environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    uuids: dict[int, str] = {}
    if any(tok.strip().startswith(("GPU-", "MIG-")) for tok in raw.split(",")):
        for i in range(count):
            try:
                uuids[i] = _text(nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(i)))
            except nv.NVMLError:
                continue
    chosen: list[int] = []
    for tok in (t.strip() for t in raw.split(",")):
        index: int | None = None
        if tok.isdigit():
            index = int(tok) if int(tok) < count else None
        elif tok.startswith("GPU-"):
            matches = [i for i, u in uuids.items() if u.startswith(tok)]
            index = matches[0] if len(matches) == 1 else None
        if index is None or index in chosen:
            break
        chosen.append(index)
    return chosen


def device_count() -> int:
    """How many GPUs NVML sees on this host (all of them); 0 without NVML."""
    with _nvml_session() as (nv, _problem, _absent):
        if nv is None:
            return 0
        try:
            return int(nv.nvmlDeviceGetCount())
        except nv.NVMLError as e:
            logger.warning("nvmlDeviceGetCount failed: %s", e)
            return 0


def visible_device_count(environ: Mapping[str, str] | None = None) -> int:
    """How many GPUs a worker would see (what ``torch.cuda.device_count()`` says).

    NVML's count filtered by ``CUDA_VISIBLE_DEVICES`` (``environ`` defaults to
    ``os.environ``); 0 without NVML.
    """
    env = os.environ if environ is None else environ
    with _nvml_session() as (nv, _problem, _absent):
        if nv is None:
            return 0
        try:
            count = int(nv.nvmlDeviceGetCount())
        except nv.NVMLError as e:
            logger.warning("nvmlDeviceGetCount failed: %s", e)
            return 0
        visible = _visible_indices(nv, count, env)
        return count if visible is None else len(visible)


def check_node_health(
    expected_devices: int | None = None, environ: Mapping[str, str] | None = None
) -> NodeGpuReport:
    """Check the GPUs visible to workers (``CUDA_VISIBLE_DEVICES``) and give a verdict.

    ``expected_devices`` is how many GPUs the job needs on this node (None or 0: the job
    does not need GPUs, so a host without NVML is healthy).  Never raises for NVML
    errors.  The message names each failing GPU (index, UUID, PCI bus id) and the reason.
    """
    env = os.environ if environ is None else environ
    need = expected_devices or 0
    with _nvml_session() as (nv, problem, absent):
        if nv is None:
            if absent:
                msg = f"{NVML_UNAVAILABLE} ({problem})"
            else:
                msg = f"NVML failed to start ({problem})"
            if need > 0:
                return NodeGpuReport(
                    False, (), expected_devices, False, f"{msg}; the job needs {need} GPU(s)"
                )
            return NodeGpuReport(False, (), expected_devices, absent, msg)
        try:
            count = int(nv.nvmlDeviceGetCount())
        except nv.NVMLError as e:
            return NodeGpuReport(
                True, (), expected_devices, False, f"nvmlDeviceGetCount failed: {e}"
            )
        visible = _visible_indices(nv, count, env)
        indices = list(range(count)) if visible is None else visible
        gpus = tuple(_check_gpu(nv, i) for i in indices)
    bad = [g for g in gpus if not g.healthy]
    reasons = [f"{g.label()}: {'; '.join(g.problems)}" for g in bad]
    if need > len(gpus):
        reasons.append(f"the job needs {need} GPU(s) but {len(gpus)} are visible")
    if reasons:
        return NodeGpuReport(
            True, gpus, expected_devices, False, "unhealthy GPUs: " + " | ".join(reasons)
        )
    unknown = sorted({u.split(":")[0] for g in gpus for u in g.unknown})
    note = f" (not checked, unsupported: {', '.join(unknown)})" if unknown else ""
    return NodeGpuReport(True, gpus, expected_devices, True, f"{len(gpus)} GPU(s) healthy{note}")


@dataclass(frozen=True, slots=True)
class TorchDevices:
    """What torch says of one kind of device: how many, of which type, or why none.

    ``count`` is 0 when torch says the kind is not available (``why`` says so, in torch's
    words where it has them, e.g. ``Cuda is not available.``).
    """

    count: int
    type: str
    why: str = ""


# torch's own words when a kind is not available (torch.distributed.run)
_NOT_AVAILABLE = {"cuda": "Cuda is not available.", "xpu": "Xpu is not available."}


def _torch() -> ModuleType | None:
    """torch: the module already imported, else imported now if installed, else None."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch
    try:
        if importlib.util.find_spec("torch") is None:
            return None
        return importlib.import_module("torch")
    except (ImportError, ValueError) as e:
        logger.warning("torch is installed but cannot be imported: %s", e)
        return None


def torch_devices(kind: str) -> TorchDevices | None:
    """How many devices torch sees of ``kind``: ``"cuda"`` (ROCm's GPUs too), ``"xpu"``, or
    ``"accelerator"`` (``torch.accelerator``'s current one, whatever its type); None when
    torch is not installed.

    torchrun's sources for ``--nproc-per-node gpu``, ``xpu`` and ``auto``.  Imports torch
    when it is not imported yet (a second or so), so the launcher asks only where NVML
    found nothing.  A torch too old for ``kind``, or one failing to answer, counts as
    "not available" (logged).
    """
    torch = _torch()
    if torch is None:
        return None
    try:
        if kind == "accelerator":
            acc = getattr(torch, "accelerator", None)
            if acc is None or not acc.is_available():
                return TorchDevices(0, kind, "torch.accelerator is not available.")
            current = acc.current_accelerator()
            return TorchDevices(int(acc.device_count()), str(getattr(current, "type", kind)))
        mod = getattr(torch, kind, None)
        if mod is None or not mod.is_available():
            return TorchDevices(0, kind, _NOT_AVAILABLE.get(kind, f"{kind} is not available."))
        return TorchDevices(int(mod.device_count()), kind)
    except Exception as e:  # a broken driver or runtime: the same as none for a count
        logger.warning("torch could not count its %s devices: %s", kind, e)
        return TorchDevices(0, kind, f"torch could not count its {kind} devices: {e}")
