"""Where torch's launcher tests reach into the launcher: the module's ``LocalElasticAgent``
and ``events`` names, a patched or overridden ``run`` of the agent, and the handler's
``shutdown`` -- as torch's own ``launcher/api_test.py`` patches them -- and torch's device
counts behind ``--nproc-per-node gpu|xpu|auto`` where NVML finds nothing."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import types
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

import elastic.events
import elastic.launcher.api as launcher_api
from elastic.agent.server import local_elastic_agent
from elastic.agent.server.api import RunResult, WorkerState
from elastic.errors import ConfigError
from elastic.gpu import torch_devices
from elastic.launcher.api import LaunchConfig, launch_agent
from elastic.multiprocessing.api import SignalException
from elastic.rendezvous import registry
from elastic.run_args import determine_local_world_size
from tests.test_run_cli import TAG, tag

__all__ = ["tag"]

GET_HANDLER = "elastic.rendezvous.registry.get_rendezvous_handler"


def _config(tmp_path: Path) -> LaunchConfig:
    return LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=1,
        run_id="torch-hooks",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.1,
        log_dir=str(tmp_path / "logs"),
    )


def one() -> int:
    return 1


@pytest.fixture
def tagged(tag: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(TAG, tag)  # workers inherit it: the sweep finds leftovers
    return tag


def _handler_mock() -> mock.MagicMock:
    handler = mock.MagicMock()
    handler.get_run_id.return_value = "torch-hooks"
    handler.get_backend.return_value = "c10d"
    return handler


def test_the_agent_class_and_events_are_names_of_the_launcher_module() -> None:
    assert launcher_api.LocalElasticAgent is local_elastic_agent.LocalElasticAgent
    assert launcher_api.events is elastic.events
    with pytest.raises(AttributeError, match="no_such_name"):
        launcher_api.no_such_name  # noqa: B018


def test_a_patch_of_the_lazy_names_is_undone_on_exit() -> None:
    with mock.patch("elastic.launcher.api.LocalElasticAgent") as cls:
        assert launcher_api.LocalElasticAgent is cls
    with mock.patch("elastic.launcher.api.events") as events:
        assert launcher_api.events is events
    assert launcher_api.LocalElasticAgent is local_elastic_agent.LocalElasticAgent
    assert launcher_api.events is elastic.events


@pytest.mark.timeout(60)
def test_importing_the_launcher_does_not_import_the_agent() -> None:
    """The hostname helpers other modules import from here stay cheap."""
    code = (
        "import sys, elastic.launcher.api\n"
        "print('elastic.agent.server.local_elastic_agent' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.timeout(60)
def test_a_patched_agent_class_is_run_and_the_rendezvous_shut_down_once(tmp_path: Path) -> None:
    handler = mock.Mock()
    with (
        mock.patch("elastic.launcher.api.LocalElasticAgent") as agent_cls,
        mock.patch(GET_HANDLER, return_value=handler),
    ):
        agent = agent_cls.return_value
        agent.run.return_value = RunResult(WorkerState.SUCCEEDED, return_values={0: "mocked"})
        assert launch_agent(_config(tmp_path), sys.executable, ["-c", "pass"]) == {0: "mocked"}
    agent_cls.assert_called_once()
    agent.run.assert_called_once_with()
    handler.shutdown.assert_called_once_with()


def _launch_with_a_run_raising(
    tmp_path: Path, error: BaseException
) -> tuple[mock.MagicMock, mock.MagicMock, mock.MagicMock]:
    """``launch_agent`` with the agent's ``run`` patched to raise ``error`` (raised here
    too) and a mock handler; the run mock, the handler and the events recorder."""
    handler = _handler_mock()
    with (
        mock.patch("elastic.launcher.api.LocalElasticAgent.run") as run,
        mock.patch(GET_HANDLER, return_value=handler),
        mock.patch("elastic.launcher.api.events.record") as record,
    ):
        run.side_effect = error
        with pytest.raises(type(error), match=re.escape(str(error))):
            launch_agent(_config(tmp_path), one, [])
    return run, handler, record


@pytest.mark.timeout(60)
def test_a_patched_run_that_fails_closes_the_rendezvous_and_records_one_failure(
    tmp_path: Path,
) -> None:
    run, handler, record = _launch_with_a_run_raising(tmp_path, RuntimeError("any other exception"))
    run.assert_called_once()
    handler.shutdown.assert_called_once_with()
    record.assert_called_once()
    assert record.call_args.args[0].name == "torchelastic.worker.status.FAILED"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_patched_run_stopped_by_a_signal_leaves_the_rendezvous_open(
    tmp_path: Path, sig: signal.Signals
) -> None:
    _, handler, record = _launch_with_a_run_raising(tmp_path, SignalException("test", sig))
    handler.shutdown.assert_not_called()
    record.assert_called_once()


class _AgentWithItsOwnRun(local_elastic_agent.LocalElasticAgent):
    """torch style: the subclass's synchronous run() is what a launch runs."""

    def run(self, role: str = "default") -> RunResult | None:
        return RunResult(WorkerState.SUCCEEDED, return_values={0: "overridden"})


@pytest.mark.timeout(60)
def test_an_agent_overriding_run_is_run_through_it_and_the_real_rendezvous_closed(
    tmp_path: Path,
) -> None:
    calls: list[str] = []
    real_get = registry.get_rendezvous_handler

    def spy(*args: Any) -> Any:
        handler = real_get(*args)
        real_shutdown_async = handler.shutdown_async

        async def shutdown_async() -> bool:
            calls.append("shutdown_async")
            return await real_shutdown_async()

        handler.shutdown_async = shutdown_async  # type: ignore[method-assign]
        return handler

    with (
        mock.patch("elastic.launcher.api.LocalElasticAgent", _AgentWithItsOwnRun),
        mock.patch(GET_HANDLER, side_effect=spy),
    ):
        assert launch_agent(_config(tmp_path), one, []) == {0: "overridden"}
    # the handler is elastic's own: closed through its asynchronous face
    assert calls == ["shutdown_async"]


@pytest.mark.timeout(120)
def test_a_handler_whose_shutdown_is_overridden_has_it_called_in_a_thread(
    tmp_path: Path, tagged: str
) -> None:
    seen: list[str] = []
    real_get = registry.get_rendezvous_handler

    def spy(*args: Any) -> Any:
        handler = real_get(*args)

        def shutdown() -> bool:
            seen.append(threading.current_thread().name)
            return True

        handler.shutdown = shutdown  # type: ignore[method-assign]
        return handler

    with mock.patch(GET_HANDLER, side_effect=spy):
        assert launch_agent(_config(tmp_path), one, []) == {0: 1}
    assert len(seen) == 1 and seen[0] != threading.main_thread().name


# --- --nproc-per-node gpu|xpu|auto: NVML first, then torch ---------------------------------


def _fake_torch(
    cuda: int | None = None,
    xpu: int | None = None,
    accelerator: tuple[int, str] | None = None,
    broken: bool = False,
) -> types.ModuleType:
    """A torch whose device kinds have the given counts (None: not available)."""

    def kind(n: int | None) -> types.SimpleNamespace:
        def count() -> int:
            if broken:
                raise RuntimeError("driver exploded")
            return n or 0

        return types.SimpleNamespace(is_available=lambda: n is not None, device_count=count)

    torch = types.ModuleType("torch")
    torch.cuda = kind(cuda)  # type: ignore[attr-defined]
    torch.xpu = kind(xpu)  # type: ignore[attr-defined]
    acc = kind(None if accelerator is None else accelerator[0])
    acc.current_accelerator = lambda: types.SimpleNamespace(
        type=accelerator[1] if accelerator else None
    )
    torch.accelerator = acc  # type: ignore[attr-defined]
    return torch


def _world(value: str, nvml: int = 0, cpus: int = 8) -> int:
    return determine_local_world_size(
        value, gpu_count=lambda: nvml, cpu_count=lambda: cpus, torch_count=torch_devices
    )


def test_gpu_is_counted_by_nvml_without_asking_torch() -> None:
    asked: list[str] = []
    n = determine_local_world_size("gpu", gpu_count=lambda: 2, torch_count=asked.append)
    assert n == 2 and asked == []


def test_gpu_where_nvml_finds_none_asks_torch_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(cuda=3))  # a ROCm host, say
    assert _world("gpu") == 3


def test_the_default_sources_are_nvml_then_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    import elastic.gpu

    monkeypatch.setattr(elastic.gpu, "visible_device_count", lambda: 0)
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(cuda=5, accelerator=(5, "cuda")))
    assert determine_local_world_size("gpu") == 5
    assert determine_local_world_size("auto") == 5


def test_gpu_with_neither_nvml_nor_cuda_is_torchs_error_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "torch", _fake_torch())
    with pytest.raises(ConfigError) as info:
        _world("gpu")
    assert info.value.where == "--nproc-per-node"
    assert "no GPU is visible" in info.value.message
    assert "Cuda is not available." in info.value.message
    assert isinstance(info.value, ValueError) and "\n" not in str(info.value)


def test_gpu_without_torch_installed_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ConfigError, match="torch is not installed"):
        _world("gpu")


def test_xpu_is_accepted_and_counted_by_torch_xpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(xpu=2))
    assert _world("xpu", nvml=8) == 2
    monkeypatch.setitem(sys.modules, "torch", _fake_torch())
    with pytest.raises(ConfigError, match=r"Xpu is not available\."):
        _world("xpu")


def test_auto_is_nvml_then_torchs_accelerator_then_the_cpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(accelerator=(4, "xpu")))
    assert _world("auto", nvml=2) == 2
    assert _world("auto") == 4
    monkeypatch.setitem(sys.modules, "torch", _fake_torch())
    assert _world("auto", cpus=6) == 6
    monkeypatch.setitem(sys.modules, "torch", None)
    assert _world("auto", cpus=6) == 6


def test_a_torch_that_fails_to_count_is_no_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        sys.modules, "torch", _fake_torch(cuda=1, accelerator=(1, "cuda"), broken=True)
    )
    assert _world("auto", cpus=3) == 3
    with pytest.raises(ConfigError, match="driver exploded"):
        _world("gpu")


def test_patches_of_the_real_torch_cuda_are_seen_as_in_torchs_launcher_test() -> None:
    pytest.importorskip("torch")
    with (
        mock.patch("torch.cuda.is_available", return_value=True),
        mock.patch("torch.cuda.device_count", return_value=3),
    ):
        assert _world("gpu") == 3


# -- the exit barrier's timeout: argument, TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT, 300 ------------


def test_the_exit_barrier_timeout_comes_from_the_config_the_environment_or_300(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT", raising=False)
    assert _config(tmp_path).exit_barrier_timeout == 300.0
    monkeypatch.setenv("TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT", "30")
    assert _config(tmp_path).exit_barrier_timeout == 30.0
    explicit = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, exit_barrier_timeout=0)
    assert explicit.exit_barrier_timeout == 0.0
    with pytest.raises(ValueError, match="exit_barrier_timeout must be non-negative"):
        LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, exit_barrier_timeout=-1)
    monkeypatch.setenv("TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT", "soon")
    with pytest.raises(ConfigError) as e:
        _config(tmp_path)
    assert e.value.where == "TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT" and "'soon'" in e.value.message


def test_the_launcher_hands_the_exit_barrier_timeout_to_the_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT", "42")
    with (
        mock.patch("elastic.launcher.api.LocalElasticAgent") as agent_cls,
        mock.patch(GET_HANDLER, return_value=mock.Mock()),
    ):
        agent_cls.return_value.run.return_value = RunResult(WorkerState.SUCCEEDED)
        launch_agent(_config(tmp_path), sys.executable, ["-c", "pass"])
    assert agent_cls.call_args.kwargs["exit_barrier_timeout"] == 42.0


def test_an_agent_built_without_a_timeout_reads_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from elastic.agent.server.api import WorkerSpec

    spec = WorkerSpec(role="r", local_world_size=1, rdzv_handler=mock.Mock(), entrypoint="x")
    monkeypatch.setenv("TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT", "750")
    agent = local_elastic_agent.LocalElasticAgent(spec, reaper=False)
    assert agent._exit_barrier_timeout == 750.0
    agent = local_elastic_agent.LocalElasticAgent(spec, exit_barrier_timeout=200, reaper=False)
    assert agent._exit_barrier_timeout == 200.0
    monkeypatch.delenv("TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT")
    assert local_elastic_agent.LocalElasticAgent(spec, reaper=False)._exit_barrier_timeout == 300.0
