"""Newer torch's GPU health-check names (``elastic.utils.gpu_health_check`` and
``GPUHealthCheckServer``) deciding with the agent's NVML verdict, against a fake pynvml
put in sys.modules."""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import threading
import time
import types
from collections.abc import Callable
from typing import Any

import pytest

from elastic.agent.server.health_check_server import (
    GPUHealthCheckServer,
    create_gpu_healthcheck_server,
)
from elastic.utils.gpu_health_check import (
    GPUHealthCheck,
    PynvmlMixin,
    create_gpu_health_check,
    quick_gpu_health_check,
)
from tests.test_gpu import GPU_IS_LOST, FakeGpu, NVMLError, fake_pynvml, install, two

__all__ = ["install"]  # the fixture, shared with tests/test_gpu.py

Install = Callable[[types.ModuleType | None], None]


def test_a_check_on_healthy_gpus_is_true_and_leaves_nvml_shut_down(install: Install) -> None:
    nv = fake_pynvml(two(), recovery_api=True)
    install(nv)
    check = create_gpu_health_check(device_index=None, interval=30)
    assert (check.enabled, check.pynvml_available) == (True, True)
    assert (check.device_index, check.interval) == (None, 30)
    assert check() is True
    assert quick_gpu_health_check() is True
    assert nv.calls["init"] == nv.calls["shutdown"] > 0


def test_an_unhealthy_gpu_fails_the_check_of_all_and_of_its_own_index_only(
    install: Install, caplog: pytest.LogCaptureFixture
) -> None:
    gpus = two()
    gpus[1].recovery = 2  # node reboot
    install(fake_pynvml(gpus, recovery_api=True))
    with caplog.at_level(logging.WARNING, logger="elastic.utils.gpu_health_check"):
        assert GPUHealthCheck()() is False
    assert "GPU 1 (GPU-bbbb-1111, 00000000:01:00.0)" in caplog.text
    assert "the node needs a reboot" in caplog.text
    assert GPUHealthCheck(device_index=0)() is True
    assert GPUHealthCheck(device_index=1)() is False
    assert quick_gpu_health_check(1) is False
    # an index NVML does not have is no healthy GPU
    assert GPUHealthCheck(device_index=5)() is False


def test_the_agents_other_verdicts_count_too(install: Install) -> None:
    """torch's check reads the recovery action only; this one also sees a lost GPU and
    uncorrectable ECC errors, as the agent's pre-start check does."""
    gpus = two()
    gpus[0].ecc = 2
    install(fake_pynvml(gpus, recovery_api=True))
    assert GPUHealthCheck(device_index=0)() is False
    gpus[0].ecc = 0
    gpus[1].handle_error = NVMLError(GPU_IS_LOST)
    assert GPUHealthCheck()() is False


def test_a_driver_older_than_r570_disables_the_check_which_then_says_healthy(
    install: Install, caplog: pytest.LogCaptureFixture
) -> None:
    gpus = two()
    gpus[0].recovery = 1
    install(fake_pynvml(gpus, recovery_api=True, driver="535.161.08"))
    with caplog.at_level(logging.WARNING, logger="elastic.utils.gpu_health_check"):
        check = GPUHealthCheck()
        assert check.enabled is False and check.pynvml_available is True
        assert check() is True
    assert "r535 is older than required r570" in caplog.text


@pytest.mark.parametrize("driver", [NVMLError(999), "not-a-version"])
def test_an_unreadable_driver_version_disables_the_check(install: Install, driver: Any) -> None:
    install(fake_pynvml(two(), recovery_api=True, driver=driver))
    assert GPUHealthCheck().enabled is False


def test_without_pynvml_or_nvml_the_check_is_disabled_and_healthy(install: Install) -> None:
    install(None)
    check = GPUHealthCheck()
    assert (check.pynvml_available, check.enabled, check()) == (False, False, True)
    assert quick_gpu_health_check() is True
    assert PynvmlMixin().check_pynvml_availability() is False
    install(fake_pynvml(two(), init_error=NVMLError(12)))  # no libnvidia-ml
    check = GPUHealthCheck()
    assert (check.pynvml_available, check.enabled, check()) == (True, False, True)


def test_nvml_failing_during_a_check_is_unhealthy(install: Install) -> None:
    nv = fake_pynvml(two(), recovery_api=True)
    install(nv)
    check = GPUHealthCheck()

    def broken() -> None:
        raise NVMLError(999)

    nv.nvmlInit = broken  # type: ignore[attr-defined]
    assert check() is False


def test_platform_facts(install: Install) -> None:
    install(fake_pynvml(two()))
    mixin = PynvmlMixin()
    assert mixin.is_gb200_platform() is False  # not asked before pynvml is found
    assert mixin.check_pynvml_availability() is True
    assert mixin.is_gb200_platform() is False
    assert mixin.get_gpu_pci_mapping() == {0: "0000:00:00.0", 1: "0000:01:00.0"}
    mapping = mixin.get_gb200_static_mapping()
    assert all(isinstance(k, int) and isinstance(v, str) for k, v in mapping.items())
    install(fake_pynvml([FakeGpu("GPU-cccc", name="NVIDIA GB200")]))
    gb = PynvmlMixin()
    gb.check_pynvml_availability()
    assert gb.is_gb200_platform() is True
    with pytest.raises(RuntimeError, match="check_pynvml_availability"):
        PynvmlMixin().get_gpu_pci_mapping()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("coroutine_callback", [False, True])
def test_async_check_calls_on_failure_after_each_failed_check(
    install: Install, coroutine_callback: bool
) -> None:
    gpus = two()
    gpus[0].recovery = 1
    install(fake_pynvml(gpus, recovery_api=True))
    failures: list[float] = []
    enough = asyncio.Event()

    def note() -> None:
        failures.append(time.monotonic())
        if len(failures) == 2:
            enough.set()

    async def anote() -> None:
        note()

    async def main() -> None:
        check = GPUHealthCheck(interval=0, on_failure=anote if coroutine_callback else note)
        assert callable(check.async_check) and callable(check._check_health)
        task = asyncio.create_task(check.async_check())
        await asyncio.wait_for(enough.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert len(failures) == 2


def test_async_check_returns_at_once_when_disabled(install: Install) -> None:
    install(None)
    asyncio.run(asyncio.wait_for(GPUHealthCheck(interval=3600).async_check(), 5))


def _get(port: int, path: str = "/health") -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def _wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@pytest.mark.timeout(30)
def test_the_server_reports_an_unhealthy_gpu_as_503_and_recovers(install: Install) -> None:
    gpus = two()
    gpus[1].recovery = 1
    install(fake_pynvml(gpus, recovery_api=True))
    server = create_gpu_healthcheck_server(
        alive_callback=time.time,
        port=0,
        timeout=30,
        gpu_device_index=None,
        gpu_check_interval=0.05,
        enable_gpu_monitoring=True,
    )
    assert isinstance(server, GPUHealthCheckServer)
    assert (server._gpu_device_index, server._gpu_check_interval) == (None, 0.05)
    assert server._gpu_monitoring_enabled and server._timeout == 30
    server.start()
    try:
        _wait_for(lambda: server.get_gpu_health_status()["last_check_time"] is not None)
        status = server.get_gpu_health_status()
        assert status["enabled"] is True and status["is_healthy"] is False
        assert status["pynvml_available"] is True and status["device_index"] is None
        code, body = _get(server.port)
        assert code == 503 and body["status"] == "gpu_unhealthy"
        assert body["gpu_health"]["is_healthy"] is False
        summary = server.get_health_summary()
        assert summary["process_health"]["alive"] is True
        assert summary["overall_healthy"] is False
        gpus[1].recovery = 0  # reset done
        _wait_for(lambda: server.get_gpu_health_status()["is_healthy"] is True)
        code, body = _get(server.port)
        assert code == 200 and body["status"] == "ok"
        assert server.get_health_summary()["overall_healthy"] is True
    finally:
        server.stop()
    assert not [t for t in threading.enumerate() if t.name == "gpu-health-monitor"]


@pytest.mark.timeout(30)
def test_stop_ends_the_gpu_thread_at_once_however_long_the_interval(install: Install) -> None:
    install(fake_pynvml(two(), recovery_api=True))
    server = GPUHealthCheckServer(time.time, 0, 30, gpu_check_interval=3600)
    server.start()
    _wait_for(lambda: server.get_gpu_health_status()["last_check_time"] is not None)
    t0 = time.monotonic()
    server.stop()
    assert time.monotonic() - t0 < 2.0
    assert not [t for t in threading.enumerate() if t.name == "gpu-health-monitor"]


def test_without_nvml_or_monitoring_the_server_serves_process_health(install: Install) -> None:
    install(None)
    server = GPUHealthCheckServer(time.time, 0, 30)
    server.start()
    try:
        status = server.get_gpu_health_status()
        assert (status["enabled"], status["is_healthy"], status["pynvml_available"]) == (
            False,
            True,
            False,
        )
        assert _get(server.port)[0] == 200
    finally:
        server.stop()
    off = GPUHealthCheckServer(lambda: time.time() - 100, 0, 30, enable_gpu_monitoring=False)
    assert off.get_gpu_health_status() == {"error": "GPU monitoring not enabled"}
    summary = off.get_health_summary()
    assert summary["process_health"]["alive"] is False  # stalled for 100 s > 30 s
    assert summary["overall_healthy"] is False


def test_a_bad_interval_is_a_value_error_naming_it() -> None:
    with pytest.raises(ValueError, match="gpu_check_interval: got 0"):
        GPUHealthCheckServer(time.time, 0, 30, gpu_check_interval=0)
