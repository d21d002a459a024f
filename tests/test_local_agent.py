"""The real agent's integrations: file timers, hang detection, /health, GPU checks, events."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from elastic.agent.server import local_elastic_agent as lae
from elastic.agent.server.api import WorkerSpec, WorkerState
from elastic.agent.server.local_elastic_agent import LocalElasticAgent
from elastic.events import AgentEvent, ListSink, kinds, read_events
from elastic.gpu import GpuHealth, NodeGpuReport
from elastic.memstore import MemoryStore
from elastic.multiprocessing.api import DefaultLogsSpecs
from elastic.real.clock import AsyncioClock
from elastic.rendezvous.api import RendezvousParameters
from elastic.rendezvous.registry import get_rendezvous_handler
from tests.test_gpu import FakeGpu, fake_pynvml
from tests.test_run_cli import TAG, elastic_run, script, start_elastic_run, tag, wait_files

__all__ = ["tag"]


def _events(path: Path) -> list[AgentEvent]:
    return read_events(path.read_text().splitlines())


def _kinds(events: list[AgentEvent]) -> list[str]:
    return [e.kind for e in events]


# -- file timers -------------------------------------------------------------------------

STUCK_IN_TIMER = """
    import os, time
    from elastic.timer import FileTimerClient, configure, expires
    out, rank = os.environ["OUT_DIR"], os.environ["RANK"]
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    open(os.path.join(out, f"start.{rank}.{attempt}"), "w").write(repr(time.time()))
    configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
    if rank == "1" and attempt == "0":
        with expires(after=1):
            open(os.path.join(out, "stuck"), "w").write(repr(time.time()))
            time.sleep(120)
    with expires(after=30):
        pass
"""


@pytest.mark.timeout(60)
def test_worker_stuck_past_its_timer_is_killed_and_the_group_restarts(
    tmp_path: Path, tag: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    events = tmp_path / "events.jsonl"
    train = script(tmp_path, STUCK_IN_TIMER)
    p = elastic_run(
        ["--nproc-per-node", "2", "--max-restarts", "1", "--event-log", str(events), train],
        tag,
        OUT_DIR=str(out),
        TORCHELASTIC_ENABLE_FILE_TIMER="1",
    )
    assert p.returncode == 0, p.stderr  # a normal restart: the agent did not kill itself
    stuck_at = float((out / "stuck").read_text())
    restarted_at = float((out / "start.1.1").read_text())
    # expiry after 1 s, reaped at once (the server wakes at the deadline), then a restart
    assert restarted_at - stuck_at < 1.0 + 0.1 + 2.0, restarted_at - stuck_at
    log = _events(events)
    kills = [e for e in log if e.fields.get("watchdog_event") == "kill worker process"]
    assert len(kills) == 1 and kills[0].fields["signal"] == 9
    failed = [e for e in log if e.kind == "torchelastic.worker.status.FAILED"]
    assert [(e.rank, e.fields["exit_code"]) for e in failed] == [(1, -9)]
    assert _kinds(log).count("agent.group_started") == 2


@pytest.mark.timeout(60)
def test_timer_file_is_given_to_workers_even_when_timers_are_off(tmp_path: Path, tag: str) -> None:
    train = script(
        tmp_path,
        "import os, sys\nsys.stdout.write(os.environ['TORCHELASTIC_TIMER_FILE'] + '\\n')\n",
    )
    p = elastic_run(["--nproc-per-node", "1", train], tag, TORCHELASTIC_TIMER_FILE="/x/pipe")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "/x/pipe"


# -- hangs ---------------------------------------------------------------------------------

HANG_ONCE = """
    import os, time
    import elastic.progress
    out, rank = os.environ["OUT_DIR"], os.environ["RANK"]
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    for step in range(5):
        elastic.progress.beat()
        time.sleep(0.05)
    open(os.path.join(out, f"beating.{rank}.{attempt}"), "w").write("1")
    hold = os.environ.get("HOLD")  # beat on until the test has seen what it looks for
    if hold and rank == "1" and attempt == "0":
        while not os.path.exists(os.path.join(out, "seen")):
            elastic.progress.beat()
            time.sleep(0.05)
    if rank == "1" and attempt == "0":
        time.sleep(float(os.environ.get("HANG_FOR", "120")))  # hung: no more beats
    while hold and attempt != "0" and not os.path.exists(os.path.join(out, "release")):
        elastic.progress.beat()
        time.sleep(0.05)
    for step in range(5):
        elastic.progress.beat()
        time.sleep(0.05)
"""


@pytest.mark.timeout(60)
def test_hang_timeout_restarts_a_group_whose_worker_stopped_beating(
    tmp_path: Path, tag: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    events = tmp_path / "events.jsonl"
    train = script(tmp_path, HANG_ONCE)
    t0 = time.monotonic()
    p = elastic_run(
        [
            *("--nproc-per-node", "2", "--max-restarts", "1", "--hang-timeout", "2"),
            *("--event-log", str(events), train),
        ],
        tag,
        OUT_DIR=str(out),
    )
    took = time.monotonic() - t0
    assert p.returncode == 0, p.stderr
    assert took < 30, took
    log = _events(events)
    (hang,) = [e for e in log if e.kind == "agent.hang"]
    assert hang.fields["local_ranks"] == [1] and hang.fields["ranks"] == [1]
    (unhealthy,) = [e for e in log if e.kind == "agent.unhealthy"]
    assert "local rank(s) 1" in unhealthy.fields["reason"]
    assert (out / "beating.1.1").exists()


@pytest.mark.timeout(60)
def test_hang_with_restarts_exhausted_fails_the_job_with_exit_1(tmp_path: Path, tag: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    train = script(tmp_path, HANG_ONCE)
    p = elastic_run(
        ["--nproc-per-node", "2", "--max-restarts", "0", "--hang-timeout", "1", train],
        tag,
        OUT_DIR=str(out),
    )
    assert p.returncode == 1  # torch would exit 0 here (UNHEALTHY is not "failed")
    assert "UNHEALTHY" in p.stderr and "Traceback" not in p.stderr


# -- /health -----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _health(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        body = json.loads(e.read())
        e.close()
        return e.code, body
    except OSError:
        return 0, {}


def _wait_status(port: int, want: int, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        code, body = _health(port)
        if code == want:
            return body
        assert time.monotonic() < deadline, f"/health never became {want} (last {code} {body})"
        time.sleep(0.05)


@pytest.mark.timeout(60)
def test_health_flips_to_503_when_progress_stalls_and_back_after_the_restart(
    tmp_path: Path, tag: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    port = _free_port()
    train = script(tmp_path, HANG_ONCE)
    agent = start_elastic_run(
        ["--nproc-per-node", "2", "--max-restarts", "1", "--hang-timeout", "4", train],
        tag,
        OUT_DIR=str(out),
        HANG_FOR="120",
        HOLD="1",
        TORCHELASTIC_HEALTH_CHECK_PORT=str(port),
        ELASTIC_HEALTH_CHECK_TIMEOUT="1.5",
    )
    try:
        wait_files([out / "beating.1.0"])
        body = _wait_status(port, 200, 10)
        assert body["restart_count"] == 0
        (out / "seen").touch()  # rank 1 now stops beating
        body = _wait_status(port, 503, 10)
        assert body["status"] == "stalled"
        body = _wait_status(port, 200, 15)  # the hang restarted the group
        assert body["restart_count"] == 1
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            assert "elastic_restarts_total" in r.read().decode()
        (out / "release").touch()  # the second attempt may end
        _, err = agent.communicate(timeout=30)
    finally:
        agent.kill()
        agent.communicate()
    assert agent.returncode == 0, err


# -- GPU checks, in process (a fake NVML verdict) -----------------------------------------


def _agent(tmp_path: Path, events: ListSink, **kw: Any) -> LocalElasticAgent:
    clock = AsyncioClock()
    params = RendezvousParameters("c10d", "localhost:0", "gpu-test", 1, 1)
    handler = get_rendezvous_handler(params, store=MemoryStore(clock), clock=clock, node="n0")
    spec = WorkerSpec(
        role="default",
        local_world_size=1,
        entrypoint="/bin/true",
        rdzv_handler=handler,
        max_restarts=0,
    )
    return LocalElasticAgent(spec, DefaultLogsSpecs(str(tmp_path / "logs")), events=events, **kw)


@pytest.mark.timeout(30)
def test_unhealthy_gpu_refuses_the_start(
    tmp_path: Path, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TAG, tag)
    monkeypatch.setattr(lae, "NVIDIA_CONTROL_DEVICE", __file__)  # "a driver is present"
    gpu = GpuHealth(0, "GPU-x", "A100", "00000000:3B:00.0", None, problems=("lost",))
    verdict = NodeGpuReport(True, (gpu,), None, False, "unhealthy GPUs: GPU 0 (GPU-x): lost")
    monkeypatch.setattr("elastic.gpu.check_node_health", lambda *a, **k: verdict)
    events = ListSink()
    agent = _agent(tmp_path, events)
    result = asyncio.run(agent.run_async())
    assert result is not None and result.state == WorkerState.FAILED
    assert agent.refused_start == "unhealthy GPUs: GPU 0 (GPU-x): lost"
    assert "torchelastic.worker.status.START" not in _kinds(events.events)


@pytest.mark.timeout(30)
def test_without_nvml_the_cpu_path_runs_and_says_so_once(
    tmp_path: Path, tag: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(TAG, tag)
    monkeypatch.setattr(lae, "NVIDIA_CONTROL_DEVICE", __file__)  # reach NVML itself
    calls: list[int] = []

    def absent(*a: object, **k: object) -> NodeGpuReport:
        calls.append(1)
        return NodeGpuReport(False, (), None, True, "NVML not available: CPU only (test)")

    monkeypatch.setattr("elastic.gpu.check_node_health", absent)
    monkeypatch.setattr("elastic.once._said", set())
    caplog.set_level("INFO", logger="elastic.agent.server.local_elastic_agent")
    agent = _agent(tmp_path, ListSink())
    agent._worker_group.spec.max_restarts = 1
    agent._remaining_restarts = 1
    agent._worker_group.spec.entrypoint = "/bin/false"  # fail once, so it starts twice
    result = asyncio.run(agent.run_async())
    assert result is not None and result.state == WorkerState.FAILED
    assert agent.restart_count == 1
    assert calls == [1]  # not asked again: NVML does not appear while the agent runs
    said = [r.message for r in caplog.records if "NVML not available" in r.message]
    assert said == ["NVML not available: CPU only (test); GPU health checks are off"]


@pytest.mark.timeout(30)
def test_without_a_driver_device_nvml_is_not_even_imported(
    tmp_path: Path, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TAG, tag)
    monkeypatch.setattr(lae, "NVIDIA_CONTROL_DEVICE", str(tmp_path / "no-such-device"))
    monkeypatch.setattr("elastic.gpu.check_node_health", lambda *a, **k: pytest.fail("called"))
    result = asyncio.run(_agent(tmp_path, ListSink()).run_async())
    assert result is not None and result.state == WorkerState.SUCCEEDED


@pytest.mark.timeout(60)
def test_event_log_holds_the_agents_json_lines(tmp_path: Path, tag: str) -> None:
    events = tmp_path / "events.jsonl"
    p = elastic_run(
        ["--nproc-per-node", "2", "--no-python", "--event-log", str(events), "/bin/true"], tag
    )
    assert p.returncode == 0, p.stderr
    kinds = _kinds(_events(events))
    assert kinds[0] == "agent.start" and kinds[-1] == "agent.finish"
    assert kinds.count("torchelastic.worker.status.START") >= 2
    assert "RENDEZVOUS" in kinds


@pytest.mark.timeout(60)
def test_a_launch_with_a_number_of_workers_and_no_driver_imports_no_gpu_module(
    tmp_path: Path,
) -> None:
    # --nproc-per-node 2 needs no device count, and without /dev/nvidiactl there is no
    # health to read: elastic.gpu (and pynvml) stay out of the launch
    code = (
        "import sys; from elastic.agent.server import local_elastic_agent as lae; "
        f"lae.NVIDIA_CONTROL_DEVICE = {str(tmp_path / 'no-such-device')!r}; "
        "from elastic.run import cli_main; "
        "code = cli_main(['--standalone', '--nproc-per-node', '2', "
        f"'--log-dir', {str(tmp_path)!r}, '--no-python', '/bin/true']); "
        "print(code, 'elastic.gpu' in sys.modules, 'pynvml' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=50, check=False
    )
    assert out.stdout.split() == ["0", "False", "False"], out.stderr


FAIL_FAST_PEER_STUBBORN = """
    import os, signal, sys, time
    out, rank = os.environ["OUT_DIR"], os.environ["RANK"]
    if rank == "1":
        open(os.path.join(out, "failed_at"), "w").write(repr(time.time()))
        sys.exit(3)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the stop waits the whole grace
    time.sleep(60)
"""


@pytest.mark.timeout(60)
def test_the_report_gives_the_time_of_the_failure_not_of_the_end_of_the_stop(
    tmp_path: Path, tag: str
) -> None:
    # the failure record is made for the result returned, after the group was stopped;
    # a worker that wrote no error file is still reported at the time it exited
    from datetime import datetime

    out = tmp_path / "out"
    out.mkdir()
    train = script(tmp_path, FAIL_FAST_PEER_STUBBORN)
    p = elastic_run(
        ["--nproc-per-node", "2", "--max-restarts", "0", "--shutdown-timeout", "3", train],
        tag,
        OUT_DIR=str(out),
    )
    assert p.returncode == 1, p.stderr
    failed_at = float((out / "failed_at").read_text())
    times = [ln.split(":", 1)[1].strip() for ln in p.stderr.splitlines() if "time      :" in ln]
    assert times, p.stderr
    reported = datetime.strptime(times[-1], "%Y-%m-%d_%H:%M:%S").timestamp()
    assert abs(reported - failed_at) <= 1.0, (times, failed_at)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fault", ["ecc", "recovery_action"])
def test_monitor_interval_is_the_period_of_the_nvml_health_check_while_the_group_runs(
    tmp_path: Path, tag: str, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    monkeypatch.setenv(TAG, tag)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(lae, "NVIDIA_CONTROL_DEVICE", __file__)  # "a driver is present"
    gpus = [FakeGpu("GPU-aaaa-0000"), FakeGpu("GPU-bbbb-1111")]
    nv = fake_pynvml(gpus, recovery_api=True)
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    events = ListSink()
    agent = _agent(tmp_path, events)
    spec = agent._worker_group.spec
    spec.entrypoint = "/bin/sleep"
    spec.args = ("30",)
    spec.monitor_interval = 0.5
    flipped: list[float] = []

    async def main() -> Any:
        run = asyncio.ensure_future(agent.run_async())
        # counted over 2 s from the group's start (a busy machine starts it late)
        while not any(e.kind == kinds.WORKER_START for e in events.events):
            assert not run.done(), run
            await asyncio.sleep(0.01)
        before = nv.calls["init"]
        await asyncio.sleep(2.0)
        checks_while_healthy = nv.calls["init"] - before
        assert agent._health_status()["gpu"] == {"healthy": True, "message": "2 GPU(s) healthy"}
        if fault == "ecc":
            gpus[1].ecc = 3  # an uncorrectable memory error appears while the group runs
        else:
            gpus[1].recovery = 2  # the driver asks for a node reboot
        flipped.append(time.monotonic())
        result = await run
        return result, checks_while_healthy

    result, checks = asyncio.run(main())
    assert agent._health_status()["gpu"]["healthy"] is False  # what /health shows
    noticed = time.monotonic() - flipped[0]
    assert result is not None and result.state == WorkerState.UNHEALTHY
    # one every 0.5 s while the group runs: about 4 in 2 s
    assert 3 <= checks <= 5, checks
    assert noticed < 0.5 + 5.0  # the next sample, with a generous margin for a busy host
    unhealthy = [e for e in events.events if e.kind == "agent.unhealthy"]
    assert len(unhealthy) == 1 and "GPU 1" in str(unhealthy[0].fields["reason"])
    checks_logged = [e for e in events.events if e.kind == "agent.gpu_check"]
    assert [e.fields["healthy"] for e in checks_logged] == [True, False]
