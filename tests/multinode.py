"""Helpers for tests that run several real ``elastic run`` agents of one job.

A worker script (:data:`WORKER`) records each start as a JSON file
``start.<agent>.<RANK>.<n>`` (its environment's torch variables) in ``OUT_DIR`` and then
waits until ``OUT_DIR/stop`` exists, so a test can see every round's world and end the
job when it wants.  ``Job`` starts and stops agents and collects what they printed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.test_run_cli import ELASTIC_RUN, env_for, script

WORKER = """
    import json, os, sys, time
    out = os.environ["OUT_DIR"]
    keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR",
            "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_USE_AGENT_STORE",
            "TORCHELASTIC_RUN_ID"]
    env = {k: os.environ.get(k) for k in keys}
    env["agent"] = os.environ["AGENT_NAME"]
    env["t"] = time.time()
    name = "start.%s.%s.%d" % (env["agent"], env["RANK"], os.getpid())
    with open(os.path.join(out, name + ".tmp"), "w") as f:
        json.dump(env, f)
    os.rename(os.path.join(out, name + ".tmp"), os.path.join(out, name))
    stop = os.path.join(out, "stop")
    while not os.path.exists(stop):
        time.sleep(0.05)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(host: str, port: int, timeout: float = 20.0, prefix: list[str] | None = None) -> None:
    """Wait (test side) until something accepts connections at host:port."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if prefix:
            code = f"import socket; socket.create_connection(({host!r}, {port}), timeout=0.5)"
            r = subprocess.run([*prefix, "python3", "-c", code], capture_output=True)
            if r.returncode == 0:
                return
        else:
            with contextlib.suppress(OSError), socket.create_connection((host, port), 0.5):
                return
        time.sleep(0.05)
    raise AssertionError(f"nothing listened at {host}:{port} within {timeout}s")


class Job:
    """The agents of one job, started by a test; every agent is killed on exit."""

    def __init__(self, tmp_path: Path, tag: str, code: str = WORKER) -> None:
        self.tmp = tmp_path
        self.tag = tag
        self.out = tmp_path / "out"
        self.out.mkdir(exist_ok=True)
        self.train = script(tmp_path, code)
        self.agents: dict[str, subprocess.Popen[str]] = {}
        self.outputs: dict[str, tuple[str, str]] = {}

    def start(
        self, name: str, flags: list[str], prefix: list[str] | None = None, **env: str
    ) -> subprocess.Popen[str]:
        p = subprocess.Popen(
            [*(prefix or []), *ELASTIC_RUN, *flags, self.train],
            env=env_for(self.tag, OUT_DIR=str(self.out), AGENT_NAME=name, **env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.agents[name] = p
        return p

    def starts(self) -> list[dict[str, Any]]:
        """Every worker start so far, oldest first."""
        found = []
        for f in self.out.glob("start.*"):
            if f.name.endswith(".tmp"):
                continue
            with contextlib.suppress(ValueError, OSError):
                found.append(json.loads(f.read_text()))
        return sorted(found, key=lambda e: e["t"])

    def wait_for(self, pred: Any, timeout: float = 60.0, what: str = "") -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.starts()
            if pred(s):
                return s
            dead = {n: p.returncode for n, p in self.agents.items() if p.poll() is not None}
            if dead and not getattr(self, "_expect_deaths", False):
                pass
            time.sleep(0.05)
        raise AssertionError(
            f"timed out waiting for {what}: starts={self.starts()} outputs={self.collect()}"
        )

    def stop_workers(self) -> None:
        (self.out / "stop").write_text("")

    def wait(self, name: str, timeout: float = 60.0) -> int:
        p = self.agents[name]
        out, err = p.communicate(timeout=timeout)
        self.outputs[name] = (out, err)
        return int(p.returncode)

    def signal(self, name: str, sig: int) -> None:
        os.kill(self.agents[name].pid, sig)

    def collect(self) -> dict[str, str]:
        res = {}
        for n, p in self.agents.items():
            if n in self.outputs:
                res[n] = self.outputs[n][1][-2000:]
            elif p.poll() is not None:
                out, err = p.communicate()
                self.outputs[n] = (out, err)
                res[n] = err[-2000:]
        return res

    def close(self) -> None:
        for p in self.agents.values():
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                p.communicate(timeout=10)

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def worlds(starts: list[dict[str, Any]], agent: str) -> list[int]:
    """The WORLD_SIZE of each group ``agent`` started (one entry per group, in order)."""
    seen: list[tuple[str, int]] = []
    for e in starts:
        if e["agent"] == agent and e["LOCAL_RANK"] == "0":
            seen.append((e["MASTER_PORT"], int(e["WORLD_SIZE"])))
    return [w for _, w in seen]
