"""``elastic run --preload``: workers forked from a warm zygote, with real processes.

A forked worker must be indistinguishable from a cold one to its script (environment,
``__main__``, argv, ``sys.path``, signal dispositions and mask, stdin, its parent, its
``/proc`` environment); exits, restarts, the whole-tree stop and the agent's SIGKILL
behave as for cold workers (the ``tag`` fixture fails a test that leaves any process
behind, the zygote included); an unsafe zygote means a cold start and one line; and a
gloo DDP job trains and resumes from its checkpoint after a crash.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from elastic.errors import ConfigError
from elastic.real.workers import SITE_DIR
from elastic.real.zygote import python_command
from elastic.run_args import parse
from tests.test_run_cli import (
    ELASTIC_RUN,
    PY,
    _alive,
    elastic_run,
    env_for,
    gone_within,
    script,
    start_elastic_run,
    tag,
    wait_files,
)
from tests.test_run_ddp import EXAMPLE

__all__ = ["tag"]

# a stdlib module the probe never imports itself: present in a forked worker only
PRELOAD = "email.mime.text"

PROBE = """
    import json, os, signal, sys, threading
    import __main__
    out = os.environ["OUT_DIR"]
    with open("/proc/self/environ", "rb") as f:
        proc_env = [e.decode() for e in f.read().split(b"\\0") if e]
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
        parent = f.read().replace(b"\\0", b" ").decode()
    state = {
        "warm": "email.mime.text" in sys.modules,
        "env": dict(os.environ),
        "proc_env": sorted(proc_env),
        "argv": sys.argv,
        "orig_argv": sys.orig_argv,
        "path0": sys.path[0],
        "path": sys.path[1:],
        "name": __name__,
        "main_file": __main__.__file__,
        "main_spec": __spec__ and [__spec__.name, __spec__.origin, __spec__.parent],
        "main_loader": type(__main__.__loader__).__name__,
        "main_package": __main__.__package__,
        "main_cached": __main__.__cached__,
        "main_is_module": sys.modules["__main__"] is __main__,
        "dispositions": {
            s.name: str(signal.getsignal(s)) for s in signal.valid_signals()
            if isinstance(s, signal.Signals)
        },
        "mask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "stdin": sys.stdin.read(),
        "stdout": [type(sys.stdout.buffer).__name__, sys.stdout.write_through],
        "parent_is_agent": "elastic.cli run" in parent,
        "own_group": os.getpgid(0) == os.getpid(),
        "threads": threading.active_count(),
        "cwd": os.getcwd(),
        "umask": os.umask(0o22),
    }
    with open(os.path.join(out, "state." + os.environ["RANK"]), "w") as f:
        json.dump(state, f)
"""

# differ from run to run whatever starts the worker
_PER_RUN = ("TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_RUN_ID", "MASTER_PORT", "OUT_DIR")


def _probe(tmp_path: Path, tag: str, name: str, *flags: str, module: bool = False) -> Any:
    out = tmp_path / name
    out.mkdir()
    train = script(tmp_path, PROBE, "probe_mod.py" if module else "probe.py")
    target = ["-m", "probe_mod"] if module else [train]
    p = subprocess.run(
        [*ELASTIC_RUN, "--standalone", "--nproc-per-node", "1", *flags, *target, "x", "--y"],
        env=env_for(tag, OUT_DIR=str(out)),
        input="to stdin\n",
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    state = json.loads((out / "state.0").read_text())
    for key in _PER_RUN:
        state["env"].pop(key, None)
    # a cold worker's exec-time environment block (what /proc shows) carries the exit hook's
    # PYTHONPATH, which its sitecustomize takes out of os.environ; a zygote's fork never has
    # it (elastic/real/_site/sitecustomize.py)
    inherited = os.environ.get("PYTHONPATH")
    hooked = "PYTHONPATH=" + (SITE_DIR if not inherited else SITE_DIR + os.pathsep + inherited)
    unhooked = [] if inherited is None else [f"PYTHONPATH={inherited}"]
    state["proc_env"] = [
        v
        for e in state["proc_env"]
        if not e.startswith(_PER_RUN)
        for v in (unhooked if e == hooked else [e])
    ]
    return state, p.stderr


@pytest.mark.timeout(90)
@pytest.mark.parametrize("module", [False, True], ids=["script", "module"])
def test_a_forked_worker_is_indistinguishable_from_a_cold_one(
    tmp_path: Path, tag: str, module: bool
) -> None:
    cold, _ = _probe(tmp_path, tag, "cold", module=module)
    warm, err = _probe(tmp_path, tag, "warm", "--preload", PRELOAD, module=module)
    assert "start cold" not in err
    assert (cold.pop("warm"), warm.pop("warm")) == (False, True)
    for key in cold:
        if key == "env":
            diff = set(cold[key].items()) ^ set(warm[key].items())
            assert not diff, diff
        elif key == "proc_env":
            assert not set(cold[key]) ^ set(warm[key]), set(cold[key]) ^ set(warm[key])
        assert warm[key] == cold[key], key
    # and the environment the kernel shows (the agent's process-tree marker) is its own
    assert warm["proc_env"] == sorted(f"{k}={v}" for k, v in warm["env"].items())
    assert warm["parent_is_agent"] and warm["own_group"]
    assert warm["stdin"] == "to stdin\n"
    assert warm["argv"][1:] == ["x", "--y"]


EXITS = """
    import os, signal, sys, time
    rank = int(os.environ["RANK"])
    if rank == 0:
        sys.exit(3)
    time.sleep(60)
"""


@pytest.mark.timeout(60)
def test_exit_codes_and_stop_of_the_rest_as_for_cold_workers(tmp_path: Path, tag: str) -> None:
    train = script(tmp_path, EXITS)
    p = elastic_run(
        ["--standalone", "--nproc-per-node", "2", "--preload", PRELOAD, train], tag, timeout=50
    )
    assert p.returncode == 1
    assert "exitcode  : 3" in p.stderr
    assert "start cold" not in p.stderr


TREE = """
    import json, os, sys, time
    out, rank = os.environ["OUT_DIR"], os.environ["RANK"]
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    child = os.fork()  # a descendant that only forks: it inherits the worker's /proc env
    if child == 0:
        time.sleep(300)
        os._exit(0)
    with open(os.path.join(out, f"pids.{rank}.{attempt}.tmp"), "w") as f:
        json.dump([os.getpid(), child], f)
    os.rename(os.path.join(out, f"pids.{rank}.{attempt}.tmp"),
              os.path.join(out, f"pids.{rank}.{attempt}"))
    if rank == "1" and attempt == "0":
        # rank 0's tree must be there (and written down) before this attempt fails
        while not os.path.exists(os.path.join(out, "pids.0.0")):
            time.sleep(0.01)
        time.sleep(0.2)
        raise SystemExit(7)
    time.sleep(300)
"""


@pytest.mark.timeout(90)
def test_restart_stops_the_whole_tree_and_agent_sigkill_leaves_no_orphan(
    tmp_path: Path, tag: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    train = script(tmp_path, TREE)
    flags = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1"]
    p = start_elastic_run(
        [*flags, "--preload", PRELOAD, train],
        tag,
        OUT_DIR=str(out),
    )
    try:
        first = [out / f"pids.{r}.0" for r in (0, 1)]
        second = [out / f"pids.{r}.1" for r in (0, 1)]
        wait_files(first + second, timeout=60)
        old = {pid for f in first for pid in json.loads(f.read_text())}
        assert gone_within(old, 10.0) is not None, "the first attempt's tree outlived it"
        new = {pid for f in second for pid in json.loads(f.read_text())}
        assert all(_alive(pid) for pid in new)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
        # workers by their death signal, their forked children by the reaper sidecar
        # (the marker in their /proc environment), the zygote by its death signal
        assert gone_within(new, 10.0) is not None, "workers outlived their agent"
    finally:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=10)


KILL_ZYGOTE = """
    import json, os, sys
    out, rank = os.environ["OUT_DIR"], os.environ["RANK"]
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    name = os.path.join(out, f"warm.{rank}.{attempt}")
    with open(name + ".tmp", "w") as f:
        json.dump("email.mime.text" in sys.modules, f)
    os.rename(name + ".tmp", name)
    if attempt == "0" and rank == "1":
        # rank 0 must have written its file before this attempt fails and stops it
        import time
        while not os.path.exists(os.path.join(out, "warm.0.0")):
            time.sleep(0.01)
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    title = f.read()
            except OSError:
                continue
            if title.startswith(b"elastic-zygote") and f"agent {os.getppid()}".encode() in title:
                os.kill(int(pid), 9)
        sys.exit(1)
"""


@pytest.mark.timeout(60)
def test_when_the_zygote_dies_the_restart_is_cold_with_one_line(tmp_path: Path, tag: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    train = script(tmp_path, KILL_ZYGOTE)
    flags = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1"]
    p = elastic_run(
        [*flags, "--preload", PRELOAD, train],
        tag,
        OUT_DIR=str(out),
    )
    assert p.returncode == 0, p.stderr
    warm = {f.name: json.loads(f.read_text()) for f in out.iterdir()}
    assert warm == {"warm.0.0": True, "warm.1.0": True, "warm.0.1": False, "warm.1.1": False}
    lines = [ln for ln in p.stderr.splitlines() if "start cold" in ln]
    assert len(lines) == 1 and "the zygote exited" in lines[0], p.stderr


THREADS = """
    import threading, time
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("preload", "why"),
    [
        ("threadmod", "the preloaded modules started 1 thread(s)"),
        ("no_such_module_xyz", "cannot import no_such_module_xyz: ModuleNotFoundError"),
    ],
)
def test_an_unsafe_or_failed_preload_starts_cold_with_one_line(
    tmp_path: Path, tag: str, preload: str, why: str
) -> None:
    (tmp_path / "threadmod.py").write_text(textwrap.dedent(THREADS))
    out = tmp_path / "out"
    out.mkdir()
    train = script(tmp_path, PROBE)
    p = elastic_run(
        ["--standalone", "--nproc-per-node", "1", "--preload", preload, train],
        tag,
        OUT_DIR=str(out),
    )
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if "start cold" in ln]
    assert len(lines) == 1 and why in lines[0], p.stderr
    assert json.loads((out / "state.0").read_text())["threads"] == 1  # a cold worker


@pytest.mark.timeout(60)
def test_no_python_keeps_the_cold_path(tmp_path: Path, tag: str) -> None:
    exe = tmp_path / "job.sh"
    exe.write_text('#!/bin/sh\necho "pid $$ ok"\n')
    exe.chmod(0o755)
    p = elastic_run(
        ["--standalone", "--nproc-per-node", "1", "--preload", PRELOAD, "--no-python", str(exe)],
        tag,
    )
    assert p.returncode == 0, p.stderr
    assert "ok" in p.stdout
    assert "start cold" in p.stderr  # said once, and the job ran as without --preload


def test_bad_preload_names_are_refused_with_one_line(tmp_path: Path, tag: str) -> None:
    with pytest.raises(ConfigError, match=r"--preload: got 'torch nn'"):
        parse(["--preload", "torch nn", "train.py"])
    assert parse(["--preload", "torch, torch._dynamo", "t.py"])[0].preload == (
        "torch",
        "torch._dynamo",
    )
    p = elastic_run(["--preload", "a-b", "train.py"], tag)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "elastic run: error: --preload: got 'a-b'; expected module names like "
        "torch,torch.nn.parallel"
    ]


def test_python_command_recognises_what_elastic_run_builds() -> None:
    exe = os.path.realpath(PY)
    assert python_command([exe, PY, "-u", "t.py", "a"]) == ("script", "t.py", ["a"])
    assert python_command([exe, PY, "-u", "-m", "pkg.mod", "-x"]) == ("module", "pkg.mod", ["-x"])
    assert python_command([exe, PY, "t.py"]) is None  # not elastic run's command
    assert python_command([exe, PY, "-u", "-c", "pass"]) is None
    assert python_command(["/bin/sh", "sh", "-u", "t.py"]) is None  # another program


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_gloo_ddp_forked_from_a_torch_zygote_resumes_after_a_crash(
    tmp_path: Path, tag: str
) -> None:
    pytest.importorskip("torch", reason="the DDP example needs torch (CPU)")

    def train(
        name: str, flags: list[str], *extra: str
    ) -> tuple[str, subprocess.CompletedProcess[str]]:
        ckpt = tmp_path / name
        ckpt.mkdir()
        p = subprocess.run(
            [
                *(*ELASTIC_RUN, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1"),
                *(*flags, EXAMPLE, "--ckpt-dir", str(ckpt), "--steps", "30"),
                *("--out", str(ckpt / "final"), *extra),
            ],
            env=env_for(tag),
            capture_output=True,
            text=True,
            timeout=200,
        )
        assert p.returncode == 0, p.stderr
        return (ckpt / "final").read_text().strip(), p

    clean, _ = train("clean", [])
    warm, p = train("warm", ["--preload", "torch,torch._dynamo"], "--crash-once-at", "13")
    assert "start cold" not in p.stderr
    assert (tmp_path / "warm" / "crashed").exists()  # rank 1 really died once
    assert "rank 0: resumed at step 10" in p.stdout and "rank 1: resumed at step 10" in p.stdout
    assert warm == clean


@pytest.mark.timeout(60)
def test_a_function_entrypoint_keeps_todays_path(
    tmp_path: Path, tag: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from elastic.launcher.api import elastic_launch
    from tests.test_launcher import TAG, _config, square_of_rank

    monkeypatch.setenv(TAG, tag)
    config = _config(tmp_path, preload=("json",))
    with caplog.at_level("WARNING"):
        values = elastic_launch(config, square_of_rank)(10)
    assert values == {0: {"rank": 0, "value": 10}, 1: {"rank": 1, "value": 11}}
    assert "--preload: ignored for a function entrypoint" in caplog.text
