"""Several real agents of one job meeting through the agent-hosted network store (c10d).

Each test starts real ``elastic run`` processes on loopback (one machine, several
"nodes"), has a time limit, and leaves no process behind (the ``tag`` fixture).  The
first agent is started alone and becomes the store's host; the others join as clients,
so which agent hosts is known.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.multinode import Job, free_port, listening, worlds
from tests.test_run_cli import elastic_run, script, tag

__all__ = ["tag"]  # the fixture, re-exported for pytest

FAST = "last_call_timeout=1,heartbeat_timeout=3,join_timeout=60,close_timeout=5"


def c10d(port: int, nnodes: str, nproc: int = 1, conf: str = FAST, run_id: str = "j") -> list[str]:
    return [
        "--nnodes", nnodes, "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id, "--rdzv-conf", conf,
        "--local-addr", "127.0.0.1", "--max-restarts", "3",
    ]  # fmt: skip


def start_host_first(job: Job, port: int, names: list[str], flags: list[str]) -> None:
    job.start(names[0], flags)
    listening("127.0.0.1", port)
    for n in names[1:]:
        job.start(n, flags)


def in_world(names: str, size: int) -> Callable[[list[dict[str, Any]]], bool]:
    """Each agent of ``names`` runs a group in a world of ``size`` (its newest group: an
    agent that joined after the last call first makes the others re-form, on a slow
    machine, and that is not what these tests are about)."""
    return lambda s: all(worlds(s, n)[-1:] == [size] for n in names)


def restarted(before: list[dict[str, Any]], names: str) -> Callable[[list[dict[str, Any]]], bool]:
    """Each agent of ``names`` started a group since the starts ``before``."""
    counts = {n: len(worlds(before, n)) for n in names}
    return lambda s: all(len(worlds(s, n)) > counts[n] for n in names)


@pytest.mark.timeout(90)
def test_two_agents_form_one_world_and_agree_on_rank_0s_address(tmp_path: Path, tag: str) -> None:
    port = free_port()
    with Job(tmp_path, tag) as job:
        start_host_first(job, port, ["a", "b"], c10d(port, "2", nproc=2))
        starts = job.wait_for(lambda s: len(s) == 4, what="4 workers")
        assert sorted(int(e["RANK"]) for e in starts) == [0, 1, 2, 3]
        assert {e["WORLD_SIZE"] for e in starts} == {"4"}
        # every worker was told the same rank-0 address, and that it is no agent's store
        assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in starts}) == 1
        assert {e["TORCHELASTIC_USE_AGENT_STORE"] for e in starts} == {"False"}
        assert {e["GROUP_WORLD_SIZE"] for e in starts} == {"2"}
        job.stop_workers()
        assert job.wait("a") == 0 and job.wait("b") == 0, job.collect()


@pytest.mark.timeout(90)
def test_agents_of_different_local_world_sizes_get_torchs_contiguous_rank_blocks(
    tmp_path: Path, tag: str
) -> None:
    """The ranks come with the round's result (the c10d rendezvous's decider computes
    them from each agent's local world size): blocks in group-rank order, as torch's
    exchange assigns them."""
    port = free_port()
    with Job(tmp_path, tag) as job:
        job.start("a", c10d(port, "2", nproc=3))
        listening("127.0.0.1", port)
        job.start("b", c10d(port, "2", nproc=1))
        starts = job.wait_for(lambda s: len(s) == 4, what="4 workers")
        assert {e["WORLD_SIZE"] for e in starts} == {"4"}
        by_group: dict[int, list[int]] = {}
        for e in starts:
            by_group.setdefault(int(e["GROUP_RANK"]), []).append(int(e["RANK"]))
        sizes = {int(e["GROUP_RANK"]): 3 if e["agent"] == "a" else 1 for e in starts}
        first = 0
        for g in sorted(by_group):
            assert sorted(by_group[g]) == list(range(first, first + sizes[g])), by_group
            first += sizes[g]
        job.stop_workers()
        assert job.wait("a") == 0 and job.wait("b") == 0, job.collect()


GLOO = """
    import os, torch, torch.distributed as dist
    dist.init_process_group("gloo", init_method="env://")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    with open(os.path.join(os.environ["OUT_DIR"], "sum." + os.environ["RANK"]), "w") as f:
        f.write(str(int(t.item())))
    dist.destroy_process_group()
"""


@pytest.mark.torch
@pytest.mark.timeout(120)
def test_gloo_env_init_spans_two_agents(tmp_path: Path, tag: str) -> None:
    pytest.importorskip("torch")
    port = free_port()
    with Job(tmp_path, tag, GLOO) as job:
        start_host_first(job, port, ["a", "b"], c10d(port, "2", nproc=2))
        assert job.wait("a", 100) == 0 and job.wait("b", 100) == 0, job.collect()
    sums = {(job.out / f"sum.{r}").read_text() for r in range(4)}
    assert sums == {"10"}  # 1 + 2 + 3 + 4: one process group of four ranks


@pytest.mark.timeout(120)
def test_kill_9_of_one_agent_of_three_the_survivors_reform(tmp_path: Path, tag: str) -> None:
    port = free_port()
    with Job(tmp_path, tag) as job:
        start_host_first(job, port, ["a", "b", "c"], c10d(port, "2:3"))
        before = job.wait_for(in_world("abc", 3), what="3 workers in a world of 3")
        t_kill = time.time()
        job.signal("c", signal.SIGKILL)
        starts = job.wait_for(restarted(before, "ab"), what="a and b restarted")
        assert worlds(starts, "a")[-1] == worlds(starts, "b")[-1] == 2
        again = [e for e in starts if e["t"] > t_kill]
        # the dead node is noticed when its lease expires (heartbeat_timeout=3), not later
        assert max(e["t"] for e in again) - t_kill < 3 + 10
        assert {e["TORCHELASTIC_RESTART_COUNT"] for e in again} == {"0"}  # no budget spent
        job.stop_workers()
        assert job.wait("a") == 0 and job.wait("b") == 0, job.collect()


@pytest.mark.timeout(120)
def test_a_fourth_agent_scales_the_job_up_in_one_round(tmp_path: Path, tag: str) -> None:
    port = free_port()
    with Job(tmp_path, tag) as job:
        flags = c10d(port, "2:4")
        start_host_first(job, port, ["a", "b", "c"], flags)
        before = job.wait_for(in_world("abc", 3), what="3 workers in a world of 3")
        job.start("d", flags)
        starts = job.wait_for(
            lambda s: restarted(before, "abc")(s) and bool(worlds(s, "d")),
            what="every agent in the new round",
        )
        for n in "abc":
            # one restart, straight to the new world
            assert worlds(starts, n)[len(worlds(before, n)) - 1 :] == [3, 4]
        assert worlds(starts, "d") == [4]
        job.stop_workers()
        for n in "abcd":
            assert job.wait(n) == 0, job.collect()


@pytest.mark.timeout(120)
def test_sigterm_leaves_and_the_others_reform_without_waiting_for_the_lease(
    tmp_path: Path, tag: str
) -> None:
    port = free_port()
    slow_lease = "last_call_timeout=1,heartbeat_timeout=60,join_timeout=60,close_timeout=5"
    with Job(tmp_path, tag) as job:
        start_host_first(job, port, ["a", "b", "c"], c10d(port, "2:3", conf=slow_lease))
        before = job.wait_for(in_world("abc", 3), what="3 workers in a world of 3")
        t_term = time.time()
        job.signal("c", signal.SIGTERM)
        starts = job.wait_for(restarted(before, "ab"), timeout=40, what="a and b restarted")
        again = [e for e in starts if e["t"] > t_term]
        assert max(e["t"] for e in again) - t_term < 15  # far less than the 60 s lease
        assert job.wait("c") == 1
        job.stop_workers()
        assert job.wait("a") == 0 and job.wait("b") == 0, job.collect()


@pytest.mark.timeout(120)
def test_when_the_store_host_dies_the_others_stop_with_one_line_naming_the_store(
    tmp_path: Path, tag: str
) -> None:
    port = free_port()
    conf = FAST + ",read_timeout=5"
    with Job(tmp_path, tag) as job:
        start_host_first(job, port, ["a", "b"], c10d(port, "2", conf=conf))
        job.wait_for(lambda s: len(s) == 2, what="2 workers")
        job.signal("a", signal.SIGKILL)
        assert job.wait("b", 60) == 1
        err = job.outputs["b"][1]
        assert "Traceback" not in err
        assert f"127.0.0.1:{port}" in err, err


@pytest.mark.timeout(90)
def test_a_store_host_told_to_stop_does_not_wait_for_the_others_to_leave(
    tmp_path: Path, tag: str
) -> None:
    port = free_port()
    conf = FAST + ",read_timeout=5,close_timeout=30"
    with Job(tmp_path, tag) as job:
        start_host_first(job, port, ["a", "b"], c10d(port, "2", conf=conf))
        job.wait_for(lambda s: len(s) == 2, what="2 workers")
        t0 = time.time()
        job.signal("a", signal.SIGTERM)
        assert job.wait("a", 30) == 1
        assert time.time() - t0 < 10  # not the 30 s a finished host lingers for the others
        assert job.wait("b", 60) == 1
        assert "Traceback" not in job.outputs["b"][1]


@pytest.mark.timeout(60)
def test_a_wrong_token_is_refused_with_one_line(tmp_path: Path, tag: str) -> None:
    port = free_port()
    with Job(tmp_path, tag) as job:
        job.start("a", c10d(port, "2", conf=FAST + ",token=Qx7right"))
        listening("127.0.0.1", port)
        job.start("b", c10d(port, "2", conf=FAST + ",read_timeout=5"), ELASTIC_RDZV_TOKEN="Zq9bad")
        assert job.wait("b", 40) == 1
        err = job.outputs["b"][1]
        lines = [ln for ln in err.splitlines() if ln.strip() and "WARNING" not in ln]
        assert len(lines) == 1 and "token" in lines[0], err
        assert "Qx7right" not in err and "Zq9bad" not in err  # a token is never printed
        job.signal("a", signal.SIGTERM)
        job.wait("a")
        assert "Qx7right" not in job.outputs["a"][1]


@pytest.mark.timeout(120)
@pytest.mark.torch
def test_static_rendezvous_of_two_nodes_runs_gloo(tmp_path: Path, tag: str) -> None:
    pytest.importorskip("torch")
    port = free_port()
    with Job(tmp_path, tag, GLOO) as job:
        common = ["--nnodes", "2", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                  "--master-port", str(port), "--rdzv-conf", "timeout=60"]  # fmt: skip
        job.start("a", [*common, "--node-rank", "0"])
        listening("127.0.0.1", port)
        job.start("b", [*common, "--node-rank", "1"])
        assert job.wait("a", 100) == 0 and job.wait("b", 100) == 0, job.collect()
    assert {(job.out / f"sum.{r}").read_text() for r in range(4)} == {"10"}


@pytest.mark.timeout(30)
def test_several_nodes_on_an_any_port_endpoint_is_one_line_and_exit_2(
    tmp_path: Path, tag: str
) -> None:
    train = script(tmp_path, "print('never')")
    p = elastic_run(
        ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", train], tag
    )
    assert p.returncode == 2
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--rdzv-endpoint" in lines[0], p.stderr


# -- etcd: no single point of failure ---------------------------------------------------


def etcd_flags(endpoints: list[str], nnodes: str, conf: str = FAST) -> list[str]:
    return [
        "--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-backend", "etcd-v2",
        "--rdzv-endpoint", ",".join(endpoints), "--rdzv-id", "j", "--rdzv-conf", conf,
        "--local-addr", "127.0.0.1", "--max-restarts", "3",
    ]  # fmt: skip


@pytest.mark.timeout(150)
@pytest.mark.parametrize("binary", ["debian", "distro"])
def test_on_etcd_two_agents_form_one_world(tmp_path: Path, tag: str, binary: str) -> None:
    from tests.etcd_servers import EtcdCluster, etcd_binary

    with EtcdCluster(etcd_binary(binary)) as cluster, Job(tmp_path, tag) as job:
        for n in "ab":
            job.start(n, etcd_flags(cluster.endpoints, "2"))
        starts = job.wait_for(lambda s: len(s) == 2, what="2 workers")
        assert sorted(int(e["RANK"]) for e in starts) == [0, 1]
        job.stop_workers()
        assert job.wait("a") == 0 and job.wait("b") == 0, job.collect()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_on_a_3_member_etcd_the_job_survives_losing_the_etcd_leader_and_an_agent(
    tmp_path: Path, tag: str
) -> None:
    """Any one machine may go: here the etcd leader's and an agent's, one after the other."""
    from tests.etcd_servers import EtcdCluster, etcd_binary

    with EtcdCluster(etcd_binary("distro"), members=3) as cluster, Job(tmp_path, tag) as job:
        for n in "abc":
            job.start(n, etcd_flags(cluster.endpoints, "2:3"))
        before = job.wait_for(in_world("abc", 3), timeout=90, what="3 workers in a world of 3")
        cluster.kill(cluster.leader())
        job.signal("a", signal.SIGKILL)
        starts = job.wait_for(
            restarted(before, "bc"),
            timeout=90,
            what="b and c re-formed without a and without etcd's old leader",
        )
        assert worlds(starts, "b")[-1] == worlds(starts, "c")[-1] == 2
        job.stop_workers()
        assert job.wait("b", 90) == 0 and job.wait("c", 90) == 0, job.collect()


# -- hosts in network namespaces: a real partition ----------------------------------------


@pytest.mark.timeout(150)
def test_a_host_cut_off_the_network_loses_its_place_and_the_others_reform(
    tmp_path: Path, tag: str
) -> None:
    from tests import netns

    why = netns.available()
    if why is not None:
        pytest.skip(why)
    with netns.Hosts(3) as hosts, Job(tmp_path, tag) as job:
        endpoint = f"{hosts.addr(0)}:29400"

        def flags(i: int) -> list[str]:
            return [
                "--nnodes", "2:3", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", endpoint, "--rdzv-id", "j", "--local-addr", hosts.addr(i),
                "--rdzv-conf", FAST + ",read_timeout=5", "--max-restarts", "3",
            ]  # fmt: skip

        job.start("a", flags(0), prefix=hosts.prefix(0))
        listening(hosts.addr(0), 29400, prefix=hosts.prefix(1))
        job.start("b", flags(1), prefix=hosts.prefix(1))
        job.start("c", flags(2), prefix=hosts.prefix(2))
        before = job.wait_for(in_world("abc", 3), what="3 workers in a world of 3")
        assert {e["MASTER_ADDR"] for e in before} == {hosts.addr(0)}
        t_cut = time.time()
        hosts.cut(2)
        starts = job.wait_for(
            restarted(before, "ab"),
            what="a and b re-formed without the cut-off host",
        )
        assert worlds(starts, "a")[-1] == worlds(starts, "b")[-1] == 2
        # its lease expired on the store host 3 s after the cut: no later than that + slack
        assert max(e["t"] for e in starts if e["t"] > t_cut) - t_cut < 3 + 10
        # the cut-off agent gives up on its unreachable store after read_timeout, one line
        assert job.wait("c", 60) == 1
        assert "Traceback" not in job.outputs["c"][1]
        hosts.heal(2)
        job.stop_workers()
        assert job.wait("a") == 0 and job.wait("b") == 0, job.collect()
