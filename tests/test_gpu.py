"""GPU count and health through NVML, against a fake pynvml put in sys.modules."""

from __future__ import annotations

import logging
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from elastic import gpu
from elastic.gpu import NVML_UNAVAILABLE, check_node_health, device_count, visible_device_count

NOT_SUPPORTED, DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND, GPU_IS_LOST, UNKNOWN = 3, 9, 12, 15, 999


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return f"NVML error {self.value}"


@dataclass
class FakeGpu:
    uuid: str
    pending_pages: int | Exception = 0
    ecc: int | Exception = 0
    rows: tuple[int, int, int, int] | Exception = (0, 0, 0, 0)
    serial: str | Exception = field(default_factory=lambda: NVMLError(NOT_SUPPORTED))
    handle_error: Exception | None = None
    # the GPU Recovery API's field: an action (0: none), a per-field NVML return code
    # (("return", code)), or an exception from nvmlDeviceGetFieldValues
    recovery: int | tuple[str, int] | Exception = 0
    name: str = "NVIDIA H100 80GB HBM3"


@dataclass
class Pci:
    busId: bytes  # pynvml's field name


RECOVERY_ACTIONS = {
    "NVML_GPU_RECOVERY_ACTION_NONE": 0,
    "NVML_GPU_RECOVERY_ACTION_GPU_RESET": 1,
    "NVML_GPU_RECOVERY_ACTION_NODE_REBOOT": 2,
    "NVML_GPU_RECOVERY_ACTION_DRAIN_P2P": 3,
    "NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET": 4,
}


def fake_pynvml(
    gpus: list[FakeGpu],
    init_error: Exception | None = None,
    recovery_api: bool = False,
    driver: str | Exception = "570.86.10",
) -> types.ModuleType:
    """A pynvml over ``gpus``; ``recovery_api``: it has ``nvmlDeviceGetFieldValues`` and
    the GPU Recovery API's constants (pynvml 12.570 and later)."""
    nv = types.ModuleType("pynvml")
    calls: dict[str, int] = {"init": 0, "shutdown": 0}

    def answer(v: Any) -> Any:
        if isinstance(v, Exception):
            raise v
        return v

    def init() -> None:
        calls["init"] += 1
        if init_error is not None:
            raise init_error

    def shutdown() -> None:
        calls["shutdown"] += 1

    def handle(i: int) -> FakeGpu:
        g = gpus[i]
        if g.handle_error is not None:
            raise g.handle_error
        return g

    def ecc(h: FakeGpu, error_type: int, counter: int) -> int:
        assert (error_type, counter) == (1, 0), "uncorrected, volatile"
        return int(answer(h.ecc))

    ns: dict[str, Callable[..., Any] | Any] = {
        "NVMLError": NVMLError,
        "calls": calls,
        "nvmlInit": init,
        "nvmlShutdown": shutdown,
        "nvmlDeviceGetCount": lambda: len(gpus),
        "nvmlDeviceGetHandleByIndex": handle,
        "nvmlDeviceGetUUID": lambda h: h.uuid.encode(),
        "nvmlDeviceGetName": lambda h: h.name.encode(),
        "nvmlSystemGetDriverVersion": lambda: answer(driver),
        "nvmlDeviceGetPciInfo": lambda h: Pci(f"00000000:{gpus.index(h):02X}:00.0".encode()),
        "nvmlDeviceGetSerial": lambda h: answer(h.serial),
        "nvmlDeviceGetRetiredPagesPendingStatus": lambda h: answer(h.pending_pages),
        "nvmlDeviceGetTotalEccErrors": ecc,
        "nvmlDeviceGetRemappedRows": lambda h: answer(h.rows),
    }
    if recovery_api:

        def field_values(h: FakeGpu, ids: list[int]) -> list[Any]:
            assert ids == [230], ids  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
            v = answer(h.recovery)
            if isinstance(v, tuple):
                return [types.SimpleNamespace(nvmlReturn=v[1], value=None)]
            return [types.SimpleNamespace(nvmlReturn=0, value=types.SimpleNamespace(uiVal=v))]

        ns["nvmlDeviceGetFieldValues"] = field_values
        ns["NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"] = 230
        ns.update(RECOVERY_ACTIONS)
    for k, v in ns.items():
        setattr(nv, k, v)
    return nv


@pytest.fixture
def install(monkeypatch: pytest.MonkeyPatch) -> Callable[[types.ModuleType | None], None]:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def put(module: types.ModuleType | None) -> None:
        monkeypatch.setitem(sys.modules, "pynvml", module)  # None → ImportError

    return put


def two() -> list[FakeGpu]:
    return [FakeGpu("GPU-aaaa-0000"), FakeGpu("GPU-bbbb-1111", serial="1650922000123")]


def test_two_healthy_gpus(install: Callable[[types.ModuleType | None], None]) -> None:
    nv = fake_pynvml(two())
    install(nv)
    r = check_node_health(expected_devices=2)
    assert r.healthy and r.nvml_available
    assert r.message == "2 GPU(s) healthy"
    g0, g1 = r.gpus
    assert (g0.index, g0.uuid, g0.pci_bus_id, g0.serial) == (
        0,
        "GPU-aaaa-0000",
        "00000000:00:00.0",
        None,
    )
    assert g0.name == "NVIDIA H100 80GB HBM3"
    assert g1.serial == "1650922000123"
    assert nv.calls == {"init": 1, "shutdown": 1}


def test_pending_retired_pages_make_the_gpu_unhealthy(
    install: Callable[[types.ModuleType | None], None],
) -> None:
    gpus = two()
    gpus[1].pending_pages = 1
    install(fake_pynvml(gpus))
    r = check_node_health()
    assert not r.healthy
    assert [g.index for g in r.unhealthy] == [1]
    assert "GPU 1 (GPU-bbbb-1111, 00000000:01:00.0): retired pages pending" in r.message


def test_uncorrectable_ecc_errors_make_the_gpu_unhealthy(
    install: Callable[[types.ModuleType | None], None],
) -> None:
    gpus = two()
    gpus[0].ecc = 3
    install(fake_pynvml(gpus))
    r = check_node_health(2)
    assert not r.healthy
    assert "GPU 0 (GPU-aaaa-0000, 00000000:00:00.0): 3 uncorrectable ECC error(s)" in r.message
    assert "GPU 1" not in r.message


def test_row_remapping_failure_and_pending_are_unhealthy(
    install: Callable[[types.ModuleType | None], None],
) -> None:
    gpus = two()
    gpus[0].rows = (0, 2, 0, 1)
    gpus[1].rows = (1, 0, 1, 0)
    install(fake_pynvml(gpus))
    r = check_node_health()
    assert "row remapping failed" in r.gpus[0].problems[0]
    assert "row remapping pending" in r.gpus[1].problems[0]


def test_lost_gpu_on_handle_or_query_is_unhealthy(
    install: Callable[[types.ModuleType | None], None],
) -> None:
    gpus = two()
    gpus[0].handle_error = NVMLError(GPU_IS_LOST)
    gpus[1].ecc = NVMLError(UNKNOWN)
    install(fake_pynvml(gpus))
    r = check_node_health()
    assert not r.healthy
    assert r.gpus[0].problems == ("GPU is lost (NVML_ERROR_GPU_IS_LOST)",)
    assert r.gpus[0].uuid is None
    assert "NVML unknown error on uncorrectable ECC errors" in r.gpus[1].problems[0]
    assert r.message.startswith("unhealthy GPUs: GPU 0: GPU is lost")


def test_not_supported_is_unknown_not_unhealthy(
    install: Callable[[types.ModuleType | None], None],
) -> None:
    gpus = two()
    for g in gpus:
        g.pending_pages = NVMLError(NOT_SUPPORTED)
        g.rows = NVMLError(NOT_SUPPORTED)
        g.ecc = NVMLError(NOT_SUPPORTED)
    install(fake_pynvml(gpus))
    r = check_node_health(2)
    assert r.healthy
    assert r.gpus[0].unknown == (
        "retired pages pending: not supported",
        "uncorrectable ECC errors: not supported",
        "remapped rows: not supported",
    )
    assert "not checked, unsupported: remapped rows, retired pages pending" in r.message


@pytest.mark.parametrize(
    "absence",
    ["no module", LIBRARY_NOT_FOUND, DRIVER_NOT_LOADED],
    ids=["no-pynvml", "no-library", "no-driver"],
)
def test_nvml_absent_gives_the_cpu_only_report(
    install: Callable[[types.ModuleType | None], None], absence: str | int
) -> None:
    if absence == "no module":
        install(None)
    else:
        assert isinstance(absence, int)
        install(fake_pynvml([], init_error=NVMLError(absence)))
    r = check_node_health()
    assert r.healthy and not r.nvml_available and r.gpus == ()
    assert r.message.startswith(NVML_UNAVAILABLE)
    assert device_count() == 0 and visible_device_count() == 0
    need = check_node_health(expected_devices=8)
    assert not need.healthy and "needs 8 GPU(s)" in need.message


def test_other_nvml_init_failure_is_unhealthy_not_cpu_only(
    install: Callable[[types.ModuleType | None], None],
) -> None:
    install(fake_pynvml(two(), init_error=NVMLError(4)))
    r = check_node_health()
    assert not r.healthy and r.message.startswith("NVML failed to start")


def test_fewer_gpus_than_expected_is_unhealthy(
    install: Callable[[types.ModuleType | None], None],
) -> None:
    install(fake_pynvml(two()))
    r = check_node_health(expected_devices=4)
    assert not r.healthy and "the job needs 4 GPU(s) but 2 are visible" in r.message


def test_count_for_nproc_per_node_gpu_follows_cuda_visible_devices(
    install: Callable[[types.ModuleType | None], None],
) -> None:
    gpus = [FakeGpu(f"GPU-{i}{i}{i}-x") for i in range(4)]
    install(fake_pynvml(gpus))
    assert device_count() == 4
    assert visible_device_count({}) == 4
    assert visible_device_count({"CUDA_VISIBLE_DEVICES": "1,3"}) == 2
    assert visible_device_count({"CUDA_VISIBLE_DEVICES": "2,7,0"}) == 1  # stops at 7
    assert visible_device_count({"CUDA_VISIBLE_DEVICES": "-1"}) == 0
    assert visible_device_count({"CUDA_VISIBLE_DEVICES": ""}) == 0
    assert visible_device_count({"CUDA_VISIBLE_DEVICES": "GPU-222,GPU-000-x"}) == 2
    r = check_node_health(environ={"CUDA_VISIBLE_DEVICES": "3"})
    assert [g.index for g in r.gpus] == [3]


def test_health_check_only_looks_at_visible_gpus(
    install: Callable[[types.ModuleType | None], None],
) -> None:
    gpus = two()
    gpus[0].ecc = 5
    install(fake_pynvml(gpus))
    assert not check_node_health(environ={}).healthy
    assert check_node_health(environ={"CUDA_VISIBLE_DEVICES": "1"}).healthy


def test_say_once_logs_a_message_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("elastic.once._said", set())
    seen: list[str] = []
    assert gpu.say_once(NVML_UNAVAILABLE, seen.append)
    assert not gpu.say_once(NVML_UNAVAILABLE, seen.append)
    assert seen == [NVML_UNAVAILABLE]
    with caplog.at_level(logging.INFO, logger="elastic.gpu"):
        assert gpu.say_once("other")
    assert "other" in caplog.text


def test_real_pynvml_on_this_host_does_not_raise() -> None:
    r = check_node_health()
    assert isinstance(r.healthy, bool) and r.message


@pytest.mark.parametrize(
    ("action", "says"),
    [
        (1, "the GPU needs a reset (NVML_GPU_RECOVERY_ACTION_GPU_RESET)"),
        (2, "the node needs a reboot (NVML_GPU_RECOVERY_ACTION_NODE_REBOOT)"),
        (3, "peer-to-peer traffic must be drained"),
        (4, "reduced capacity"),
        (99, "unknown recovery action 99"),
    ],
)
def test_a_recovery_action_makes_the_gpu_unhealthy(
    install: Callable[[types.ModuleType | None], None], action: int, says: str
) -> None:
    gpus = two()
    gpus[1].recovery = action
    install(fake_pynvml(gpus, recovery_api=True))
    r = check_node_health(expected_devices=2)
    assert not r.healthy
    assert [g.index for g in r.unhealthy] == [1]
    assert "GPU 1 (GPU-bbbb-1111, 00000000:01:00.0): NVML asks for recovery: " in r.message
    assert says in r.message


def test_no_recovery_action_or_no_recovery_api_is_healthy(
    install: Callable[[types.ModuleType | None], None],
) -> None:
    install(fake_pynvml(two(), recovery_api=True))
    assert check_node_health(expected_devices=2).message == "2 GPU(s) healthy"
    # an older pynvml (no field values): not asked, nothing to report
    install(fake_pynvml(two(), recovery_api=False))
    assert check_node_health(expected_devices=2).message == "2 GPU(s) healthy"


@pytest.mark.parametrize(
    "answer", [NVMLError(NOT_SUPPORTED), ("return", NOT_SUPPORTED)], ids=["call", "field"]
)
def test_a_driver_without_the_recovery_api_is_unknown_not_unhealthy(
    install: Callable[[types.ModuleType | None], None], answer: Any
) -> None:
    gpus = two()
    for g in gpus:
        g.recovery = answer
    install(fake_pynvml(gpus, recovery_api=True))
    r = check_node_health(expected_devices=2)
    assert r.healthy
    assert "GPU recovery action" in r.message  # listed as not checked
    assert all(any("GPU recovery action" in u for u in g.unknown) for g in r.gpus)


def test_a_gpu_lost_while_asking_its_recovery_action_is_unhealthy(
    install: Callable[[types.ModuleType | None], None],
) -> None:
    gpus = two()
    gpus[0].recovery = NVMLError(GPU_IS_LOST)
    install(fake_pynvml(gpus, recovery_api=True))
    r = check_node_health()
    assert not r.healthy
    assert "GPU 0 (GPU-aaaa-0000, 00000000:00:00.0): GPU is lost" in r.message


def test_a_recovery_action_newer_than_the_table_is_named_by_pynvml(
    install: Callable[[types.ModuleType | None], None],
) -> None:
    gpus = two()
    gpus[0].recovery = 9
    nv = fake_pynvml(gpus, recovery_api=True)
    nv.NVML_GPU_RECOVERY_ACTION_SOMETHING_NEW = 9  # type: ignore[attr-defined]
    install(nv)
    r = check_node_health()
    assert not r.healthy
    assert "NVML asks for recovery: NVML_GPU_RECOVERY_ACTION_SOMETHING_NEW" in r.message
