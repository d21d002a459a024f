"""``elastic sweep --cluster``: the same sweep on a local Dask cluster (a scheduler and two
workers, as processes on 127.0.0.1) gives the local results exactly, over TLS too; a
missing Dask, a malformed or silent address, a scheduler without workers and a worker
running other code are refused in one line."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import sim.cluster
import sim.sweep
from sim.sweep import SweepError, job_text, main, run_cell, take_result
from tests.leftovers import no_leftover_processes
from tests.test_sweep import SCENARIO

pytest.importorskip("distributed", reason="the cluster extra: pip install -e '.[cluster]'")

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO, encoding="utf-8")
    return path


def _tls_files(where: Path) -> dict[str, str]:
    """A throw-away CA and one certificate (for 127.0.0.1) that it signed, as PEM files."""
    if not any((Path(d) / "openssl").exists() for d in os.environ["PATH"].split(os.pathsep)):
        pytest.skip("openssl is not installed (tests/install.sh installs it)")
    where.mkdir(parents=True, exist_ok=True)
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=where, check=True, capture_output=True, timeout=60)

    run("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
        "-subj", "/CN=elastic-test-ca")  # fmt: skip
    (where / "ext").write_text(
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"
    )
    run("req", *key, "-keyout", "node.key", "-out", "node.csr", "-subj", "/CN=node")
    run("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "node.pem", "-days", "1", "-extfile", "ext")  # fmt: skip
    return {
        "--tls-ca-file": str(where / "ca.pem"),
        "--tls-cert": str(where / "node.pem"),
        "--tls-key": str(where / "node.key"),
    }


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@contextlib.contextmanager
def dask_cluster(
    where: Path, workers: int, tls: dict[str, str] | None = None, started: list[Any] | None = None
) -> Iterator[str]:
    """A Dask scheduler and ``workers`` workers (one thread each, no nanny) on 127.0.0.1;
    yields the scheduler's address once every worker has joined (``started`` gets the
    processes, the scheduler first).  Everything is stopped
    (SIGTERM, then SIGKILL after 20 s) on the way out; the scheduler also ends by itself
    after 5 idle minutes and the workers 60 s after losing it, should this process die."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    flags = [x for kv in (tls or {}).items() for x in kv]
    where.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = [] if started is None else started
    drains: list[threading.Thread] = []
    with no_leftover_processes():
        try:
            scheduler = subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                 "--port", "0", "--no-dashboard", "--idle-timeout", "300",
                 *(["--protocol", "tls"] if tls else []), *flags],
                stderr=subprocess.PIPE, env=env, cwd=where,
            )  # fmt: skip
            procs.append(scheduler)
            assert scheduler.stderr is not None
            lines: list[str] = []
            address = ""
            for raw in scheduler.stderr:  # the test's time limit bounds this
                line = raw.decode(errors="replace")
                lines.append(line)
                if "Scheduler at:" in line:
                    address = line.split("Scheduler at:", 1)[1].strip()
                    break
            assert address, "the scheduler did not start:\n" + "".join(lines)
            # keep draining its log, or it blocks once the pipe is full
            stderr = scheduler.stderr
            drains.append(threading.Thread(target=stderr.read, daemon=True))
            drains[0].start()
            for i in range(workers):
                with (where / f"worker{i}.log").open("wb") as log:
                    procs.append(
                        subprocess.Popen(
                            [sys.executable, "-m", "distributed.cli.dask_worker", address,
                             "--nthreads", "1", "--no-nanny", "--no-dashboard",
                             "--host", "127.0.0.1", "--death-timeout", "60",
                             "--local-directory", str(where / f"w{i}"), *flags],
                            stdout=subprocess.DEVNULL, stderr=log, env=env, cwd=where,
                        )
                    )  # fmt: skip
            if workers:
                _wait_for_workers(address, workers, tls)
            yield address
        finally:
            _stop(procs[1:])
            _stop(procs[:1])
            if drains:
                drains[0].join(timeout=20)
            if procs and procs[0].stderr is not None:
                procs[0].stderr.close()


def _client(address: str, tls: dict[str, str] | None) -> Any:
    import distributed

    security = None
    if tls:
        security = distributed.Security(
            tls_ca_file=tls["--tls-ca-file"],
            tls_client_cert=tls["--tls-cert"],
            tls_client_key=tls["--tls-key"],
            require_encryption=True,
        )
    return distributed.Client(address, timeout=30, security=security, set_as_default=False)


def _wait_for_workers(address: str, count: int, tls: dict[str, str] | None) -> None:
    with _client(address, tls) as client:
        client.wait_for_workers(count, timeout=60)


def _runs_per_worker(address: str, tls: dict[str, str] | None = None) -> list[int]:
    """How many tasks each worker of the cluster has run (the test's own probe)."""
    with _client(address, tls) as client:
        counts = client.run(lambda dask_worker: dask_worker.state.executed_count)
    return sorted(counts.values())


class _Pickled:
    """What a hostile or mismatched worker might answer: unpickling it runs code here."""

    loaded = False

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (_mark_loaded, ())


def _mark_loaded() -> _Pickled:
    _Pickled.loaded = True
    return _Pickled()


def pickled_answer(text: str) -> _Pickled:
    """Run on a Dask worker in place of run_cell (it imports this module by name)."""
    return _Pickled()


def _sweep_json(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(list(argv))
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


ARGV = ["--seeds", "3", "--set", "job.checkpoint_every=50,300", "--json"]


@pytest.mark.timeout(180)
def test_a_sweep_on_a_dask_cluster_prints_the_local_results_exactly(
    scenario: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    local = _sweep_json(capsys, str(scenario), *ARGV, "--jobs", "1")
    with dask_cluster(tmp_path / "cluster", workers=2) as address:
        assert address.startswith("tcp://127.0.0.1:")
        remote = _sweep_json(capsys, str(scenario), *ARGV, "--cluster", address)
        # a bare host:port means tcp://
        bare = _sweep_json(capsys, str(scenario), *ARGV, "--cluster", address[len("tcp://") :])
        ran = _runs_per_worker(address)
        # a worker whose answer is a pickled object, not JSON text, is refused, not loaded
        monkeypatch.setattr(sim.cluster, "run_cell", pickled_answer)
        assert main([str(scenario), *ARGV, "--cluster", address]) == 1
        err = capsys.readouterr().err
        assert "a worker's answer was not JSON text (refused, not unpickled)" in err, err
        assert err.count("\n") == 1 and not _Pickled.loaded, err
    assert remote == local  # the printed JSON, byte for byte
    assert bare == local
    out = json.loads(remote)
    assert [len(row["runs"]) for row in out["settings"]] == [3, 3]
    # the runs were the cluster's: 2 sweeps x 6 runs, on its 2 workers (more only if
    # Dask ran one twice, after a worker it thought lost)
    assert len(ran) == 2 and sum(ran) >= 12, ran


@pytest.mark.timeout(180)
def test_a_sweep_over_tls_gives_the_same_results_and_needs_the_certificates(
    scenario: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tls = _tls_files(tmp_path / "tls")
    local = _sweep_json(capsys, str(scenario), *ARGV, "--jobs", "1")
    with dask_cluster(tmp_path / "cluster", workers=2, tls=tls) as address:
        assert address.startswith("tls://127.0.0.1:")
        flags = [x for kv in tls.items() for x in kv]
        assert _sweep_json(capsys, str(scenario), *ARGV, "--cluster", address, *flags) == local
        assert main([str(scenario), *ARGV, "--cluster", address]) == 2
        err = capsys.readouterr().err
        assert "is tls:// but no certificates are set" in err and err.count("\n") == 1, err


@pytest.mark.timeout(120)
def test_a_scheduler_without_workers_is_refused_in_one_line(
    scenario: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sim.cluster, "WORKERS_TIMEOUT_S", 1.0)
    with dask_cluster(tmp_path / "cluster", workers=0) as address:
        assert main([str(scenario), *ARGV, "--cluster", address]) == 2
    err = capsys.readouterr().err
    assert "has no worker after 1 s" in err and err.count("\n") == 1, err


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.mark.timeout(60)
def test_an_address_where_nothing_answers_is_refused_within_the_connect_timeout(
    scenario: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sim.cluster, "CONNECT_TIMEOUT_S", 1.0)
    start = time.monotonic()
    code = main([str(scenario), *ARGV, "--cluster", f"tcp://127.0.0.1:{_closed_port()}"])
    took = time.monotonic() - start
    err = capsys.readouterr().err
    assert code == 2
    assert "no Dask scheduler answered at tcp://127.0.0.1:" in err and "within 1 s" in err
    assert err.count("\n") == 1, err
    assert took < 30  # bounded: 1 s to connect, with a generous margin for a busy machine


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--cluster", "http://127.0.0.1:8786"], "scheme 'http' is not tcp or tls"),
        (["--cluster", "127.0.0.1"], "no host and port"),
        (["--cluster", "tcp://127.0.0.1:99999"], "Port out of range"),
        (["--cluster", "tcp://127.0.0.1:0"], "no host and port"),
        (["--cluster", "tcp://127.0.0.1:8786/x"], "more than host:port"),
        (["--cluster", "tcp://a b:8786"], "not a host name"),
        (["--cluster", "tcp://127.0.0.1:8786", "--jobs", "2"], "--jobs: the cluster's workers"),
        (["--tls-cert", "x.pem"], "TLS files are for --cluster tls://"),
        (
            ["--cluster", "tcp://127.0.0.1:8786", "--tls-ca-file", "ca.pem"],
            "is not tls://",
        ),
        (
            ["--cluster", "tls://127.0.0.1:8786", "--tls-ca-file", "ca.pem"],
            "expected all three of --tls-ca-file, --tls-cert and --tls-key",
        ),
        (
            [
                "--cluster",
                "tls://127.0.0.1:8786",
                "--tls-ca-file",
                "/nonexistent/ca.pem",
                "--tls-cert",
                "/nonexistent/c.pem",
                "--tls-key",
                "/nonexistent/c.key",
            ],
            "--tls-cert: the TLS files cannot be used",
        ),
    ],
)
def test_bad_cluster_flags_are_refused_in_one_line(
    scenario: Path, capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str
) -> None:
    assert main([str(scenario), *ARGV, *argv]) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1, err


def test_without_dask_the_cluster_flag_says_how_to_install_it(
    scenario: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # `import distributed` fails
    assert main([str(scenario), *ARGV, "--cluster", "tcp://127.0.0.1:8786"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'elastic-sim-agent[cluster]'" in err and err.count("\n") == 1, err


def test_a_result_of_other_code_or_a_crash_is_refused() -> None:
    answer = run_cell(job_text(7, SCENARIO, "s.yaml", 11))
    assert take_result(answer, {7: 11})[0] == 7
    other = json.dumps({**json.loads(answer), "code": "0" * 12})
    with pytest.raises(SweepError, match="other elastic/sim code"):
        take_result(other, {7: 11})
    crash = json.dumps({"id": 7, "crash": "KeyError: 'x'"})
    with pytest.raises(SweepError, match="seed 11 crashed: KeyError"):
        take_result(crash, {7: 11})
    for answer in ("[]", "not json", json.dumps({"id": 7, "figures": "x"}), " " * (2 << 20)):
        with pytest.raises(SweepError, match="expected a result"):
            take_result(answer, {7: 11})
    assert len(sim.sweep.code_fingerprint()) == 12


@pytest.mark.timeout(180)
def test_a_scheduler_lost_mid_sweep_ends_it_in_one_line(
    scenario: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    procs: list[Any] = []
    take = sim.cluster.take_result

    def kill_the_scheduler_first(text: str, seeds: dict[int, int]) -> Any:
        if procs[0].poll() is None:
            procs[0].kill()
            procs[0].wait()
        return take(text, seeds)

    monkeypatch.setattr(sim.cluster, "take_result", kill_the_scheduler_first)
    with dask_cluster(tmp_path / "cluster", workers=1, started=procs) as address:
        code = main([str(scenario), "--seeds", "40", "--json", "--cluster", address])
    err = capsys.readouterr().err
    assert code == 1
    assert "the connection to the scheduler was lost" in err and err.count("\n") == 1, err
