"""Scenario files: valid ones load with defaults filled in; bad ones name file:line, key, value."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from elastic.errors import ConfigError
from sim.expect import Bound, ExpectedState
from sim.scenario import (
    MAX_EXPANDED_FAULTS,
    MAX_SCENARIO_BYTES,
    Agent,
    Cluster,
    Fault,
    FaultKind,
    RateFault,
    RendezvousBackendName,
    RendezvousSpec,
    Scenario,
    StoreSpec,
    load_scenario,
    load_scenario_text,
)

V1 = textwrap.dedent(
    """\
    name: one worker crashes and the group restarts
    seed: 1
    until: 6h                 # the simulation gives up at this simulated time
    cluster:
      nodes: 4
      nproc_per_node: 8
    job:
      steps: 2000
      step_time: 2s
      startup_time: 20s
      checkpoint_every: 100   # steps
      checkpoint_time: 5s
      collective_timeout: 10m # optional, default 600s
    agent:
      max_restarts: 3
      monitor_interval: 0.1s
    faults:
      - {at: 10m, kind: worker_crash, node: 2, local_rank: 5, exit_code: 1}
      - {at: 30m, kind: node_crash, node: 3, restart_after: 2m}
    expect:
      state: SUCCEEDED
      restarts: 1             # an integer, or {min: 1, max: 2}
    """
)

EXTENDED = textwrap.dedent(
    """\
    name: elastic membership
    cluster: {nodes: 3, nproc_per_node: 8, spare_nodes: 1}   # spares start with the job and wait
    rendezvous:
      backend: c10d
      min_nodes: 2
      max_nodes: 3
      join_timeout: 10m
      last_call_timeout: 30s
      heartbeat_timeout: 15s
      close_timeout: 30s
    job:
      steps: 1000
      step_time: 1s
      timer: 60s
      hang_timeout: 5m
    agent: {exit_barrier_timeout: 300s, shutdown_timeout: 30s}
    store: {latency: 2ms}
    faults:
      - {at: 5m, kind: node_join, count: 2}          # new nodes arrive
      - {at: 9m, kind: node_leave, node: 0}          # graceful
      - {at: 20m, kind: node_crash, node: 5}         # a joined node; never comes back
      - {at: 1h, kind: worker_hang, node: 0, local_rank: 3}
      - {at: 2h, kind: preemption, node: 1, notice: 30s}
      - {at: 3h, kind: store_outage, duration: 20s}
      - {at: 4h, kind: network_partition, nodes: [1, 2], duration: 1m}
      - {at: 5h, kind: slow_node, node: 2, factor: 1.5}
      - {at: 6h, kind: slow_node, node: 2, factor: 3, duration: 10m}
      - {at: 7h, kind: gpu_error, node: 3}
      - {at: 8h, kind: gpu_error, node: 3, local_rank: 7, restart_after: 15m}
      - {kind: worker_crash, every: 3h}
      - {kind: node_crash, every: 1d, from: 1h, to: 2d, restart_after: 10m}
    expect:
      world_size: 16
      rendezvous_rounds: {max: 4}
      membership_restarts: 2
      recovery_s_max: {max: 120}
      goodput: {min: 0.9}
      sim_time_s: {min: 1h, max: 2d}
      state: SUCCEEDED
    """
)

MINIMAL = "cluster: {nodes: 2, nproc_per_node: 1}\njob: {steps: 10, step_time: 1s}\n"


def line_of(text: str, marker: str) -> int:
    """The 1-based line of the first line of ``text`` containing ``marker``."""
    for number, line in enumerate(text.splitlines(), start=1):
        if marker in line:
            return number
    raise AssertionError(f"{marker!r} not in the text")


def load_error(text: str, name: str = "x.yaml") -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load_scenario_text(text, name=name)
    return caught.value


# ------------------------------------------------------------------ valid files


def test_v1_example_loads_with_durations_in_seconds() -> None:
    s = load_scenario_text(V1)
    assert s.name == "one worker crashes and the group restarts"
    assert s.seed == 1
    assert s.until == 6 * 3600.0
    assert s.cluster == Cluster(nodes=4, nproc_per_node=8, spare_nodes=0)
    assert s.job.step_time == 2.0
    assert s.job.startup_time == 20.0
    assert s.job.checkpoint_every == 100
    assert s.job.collective_timeout == 600.0
    assert s.agent.monitor_interval == 0.1
    assert s.faults == (
        Fault(at=600.0, kind=FaultKind.WORKER_CRASH, node=2, local_rank=5, exit_code=1),
        Fault(at=1800.0, kind=FaultKind.NODE_CRASH, node=3, restart_after=120.0),
    )
    assert s.expect.state is ExpectedState.SUCCEEDED
    assert s.expect.restarts == Bound(exact=1)


def test_v1_file_without_rendezvous_section_gets_c10d_with_min_and_max_equal_to_nodes() -> None:
    s = load_scenario_text(V1)
    assert s.rendezvous == RendezvousSpec(
        min_nodes=4,
        max_nodes=4,
        backend=RendezvousBackendName.C10D,
        join_timeout=600.0,
        last_call_timeout=30.0,
        heartbeat_timeout=15.0,
        close_timeout=30.0,
    )


def test_defaults_are_torchs_and_the_documented_ones() -> None:
    s = load_scenario_text(MINIMAL)
    assert s.seed == 0
    assert s.until == 7 * 86400.0
    assert s.agent == Agent(
        max_restarts=3, monitor_interval=0.1, exit_barrier_timeout=300.0, shutdown_timeout=30.0
    )
    assert s.job.collective_timeout == 600.0
    assert s.job.startup_time == 0.0
    assert s.job.checkpoint_every == 0
    assert s.job.checkpoint_time == 0.0
    assert s.job.timer is None
    assert s.job.hang_timeout is None
    assert s.store == StoreSpec(latency=0.001)
    assert s.faults == ()
    assert list(s.expect.items()) == []
    assert s.name == "unnamed"


def test_extended_example_loads_every_fault_kind_and_expectation() -> None:
    s = load_scenario_text(EXTENDED)
    assert s.cluster.spare_nodes == 1
    assert (s.rendezvous.min_nodes, s.rendezvous.max_nodes) == (2, 3)
    assert s.job.timer == 60.0
    assert s.job.hang_timeout == 300.0
    assert s.store.latency == 0.002
    kinds = {f.kind for f in s.faults}
    assert kinds == set(FaultKind) - {FaultKind.WORKER_CRASH} | {FaultKind.WORKER_CRASH}
    join = s.faults[0]
    assert isinstance(join, Fault)
    assert join.count == 2
    partition = s.faults[6]
    assert isinstance(partition, Fault)
    assert partition.nodes == (1, 2)
    assert partition.duration == 60.0
    slow = s.faults[7]
    assert isinstance(slow, Fault)
    assert (slow.factor, slow.duration) == (1.5, None)
    assert s.faults[11] == RateFault(kind=FaultKind.WORKER_CRASH, every=3 * 3600.0, exit_code=1)
    assert s.faults[12] == RateFault(
        kind=FaultKind.NODE_CRASH, every=86400.0, start=3600.0, end=2 * 86400.0, restart_after=600.0
    )
    assert s.expect.world_size == Bound(exact=16)
    assert s.expect.rendezvous_rounds == Bound(max=4)
    assert s.expect.goodput == Bound(min=0.9)
    assert s.expect.sim_time_s == Bound(min=3600.0, max=172800.0)


def test_node_join_defaults_to_one_node_and_worker_crash_to_exit_code_one() -> None:
    s = load_scenario_text(
        MINIMAL
        + "faults:\n  - {at: 1m, kind: node_join}\n"
        + "  - {at: 2m, kind: worker_crash, node: 2, local_rank: 0}\n"
    )
    assert s.faults == (
        Fault(at=60.0, kind=FaultKind.NODE_JOIN, count=1),
        Fault(at=120.0, kind=FaultKind.WORKER_CRASH, node=2, local_rank=0, exit_code=1),
    )


def test_min_nodes_alone_leaves_max_at_nodes_and_max_alone_caps_min() -> None:
    only_min = load_scenario_text(MINIMAL + "rendezvous: {min_nodes: 1}\n")
    assert (only_min.rendezvous.min_nodes, only_min.rendezvous.max_nodes) == (1, 2)
    only_max = load_scenario_text(MINIMAL + "rendezvous: {max_nodes: 1}\n")
    assert (only_max.rendezvous.min_nodes, only_max.rendezvous.max_nodes) == (1, 1)
    bigger = load_scenario_text(MINIMAL + "rendezvous: {min_nodes: 4}\n")
    assert (bigger.rendezvous.min_nodes, bigger.rendezvous.max_nodes) == (4, 4)


def test_null_sections_and_values_mean_defaults() -> None:
    s = load_scenario_text(MINIMAL + "agent:\nfaults:\nexpect:\nseed:\n")
    assert s.agent == Agent()
    assert s.faults == ()
    assert s.seed == 0


def test_load_scenario_reads_a_file_and_names_it_in_errors(tmp_path: Path) -> None:
    good = tmp_path / "crash.yaml"
    good.write_text(V1)
    s = load_scenario(good)
    assert s == load_scenario_text(V1)
    assert s.source == str(good)
    bad = tmp_path / "bad.yaml"
    bad.write_text(V1.replace("nodes: 4", "nodes: 0"))
    with pytest.raises(ConfigError) as caught:
        load_scenario(bad)
    assert caught.value.where == f"{bad}:{line_of(V1, 'nodes: 4')}"


def test_name_defaults_to_the_file_stem(tmp_path: Path) -> None:
    path = tmp_path / "two_nodes.yaml"
    path.write_text(MINIMAL)
    assert load_scenario(path).name == "two_nodes"


def test_with_seed_overrides_the_seed_and_refuses_negative() -> None:
    s = load_scenario_text(V1)
    assert s.with_seed(7).seed == 7
    assert s.with_seed(7).faults == s.faults
    with pytest.raises(ConfigError) as caught:
        s.with_seed(-1)
    assert str(caught.value) == "--seed: got -1; expected an integer ≥ 0"


# ------------------------------------------------------------------ round trip


@pytest.mark.parametrize("text", [V1, EXTENDED, MINIMAL], ids=["v1", "extended", "minimal"])
def test_to_yaml_round_trips_through_load_scenario_text(text: str) -> None:
    s = load_scenario_text(text)
    again = load_scenario_text(s.to_yaml())
    assert again == s
    assert again.to_yaml() == s.to_yaml()


def test_to_yaml_writes_one_fault_per_line_with_readable_durations() -> None:
    out = load_scenario_text(V1).to_yaml()
    assert "- {at: 10m, kind: worker_crash, node: 2, local_rank: 5, exit_code: 1}" in out
    assert "- {at: 30m, kind: node_crash, node: 3, restart_after: 2m}" in out
    assert "until: 6h" in out


def test_scenario_equality_ignores_the_source_file() -> None:
    assert load_scenario_text(V1, name="a.yaml") == load_scenario_text(V1, name="b.yaml")


def test_scenario_values_are_frozen() -> None:
    s: Scenario = load_scenario_text(V1)
    with pytest.raises(AttributeError):
        s.seed = 3  # type: ignore[misc]


# ------------------------------------------------------------------ errors: file:line, key, value


@pytest.mark.parametrize(
    ("old", "new", "marker", "fragments"),
    [
        pytest.param(
            "kind: node_crash",
            "kind: worker_crsh",
            "worker_crsh",
            [
                "faults[1].kind: got 'worker_crsh'",
                "expected one of worker_crash, worker_hang, node_crash,",
            ],
            id="unknown-fault-kind",
        ),
        pytest.param(
            "  nproc_per_node: 8",
            "  nproc_per_nod: 8",
            "nproc_per_nod",
            [
                "cluster.nproc_per_nod: unknown key 'nproc_per_nod'",
                "did you mean 'nproc_per_node'?",
            ],
            id="unknown-key-suggests-closest",
        ),
        pytest.param(
            "  monitor_interval: 0.1s",
            "  monitor_interval: 0.1s\n  steps: 5",
            "steps: 5",
            ["agent.steps: unknown key 'steps'", "it belongs under job:", "max_restarts"],
            id="key-in-wrong-section-names-its-home",
        ),
        pytest.param(
            "  step_time: 2s",
            "  step_time: -2s",
            "-2s",
            ["job.step_time: got '-2s'", "not negative"],
            id="negative-duration-string",
        ),
        pytest.param(
            "  checkpoint_time: 5s",
            "  checkpoint_time: -5",
            "-5",
            ["job.checkpoint_time: got -5", "not negative"],
            id="negative-duration-number",
        ),
        pytest.param(
            "  step_time: 2s",
            "  step_time: 2 parsecs",
            "parsecs",
            ["job.step_time: got '2 parsecs'", "expected a duration", "'1.5h'"],
            id="duration-with-unknown-unit",
        ),
        pytest.param(
            "  step_time: 2s",
            "  step_time: 0s",
            "0s",
            ["job.step_time: got '0s'", "greater than 0"],
            id="zero-step-time",
        ),
        pytest.param(
            "node: 3, restart_after",
            "node: 4, restart_after",
            "node: 4",
            ["faults[1].node: got 4", "from 0 to 3", "cluster.nodes 4", "numbered from 0"],
            id="node-out-of-range",
        ),
        pytest.param(
            "local_rank: 5",
            "local_rank: 8",
            "local_rank: 8",
            ["faults[0].local_rank: got 8", "expected an integer from 0 to 7"],
            id="local-rank-out-of-range",
        ),
        pytest.param(
            "  nodes: 4",
            "  nodes: four",
            "nodes: four",
            ["cluster.nodes: got 'four'", "expected an integer from 1"],
            id="wrong-type-string-for-int",
        ),
        pytest.param(
            "  nodes: 4",
            "  nodes: 4.5",
            "nodes: 4.5",
            ["cluster.nodes: got 4.5", "expected an integer"],
            id="wrong-type-float-for-int",
        ),
        pytest.param(
            "seed: 1",
            "seed: yes",
            "seed: yes",
            ["seed: got true", "expected an integer ≥ 0"],
            id="bool-is-not-an-int",
        ),
        pytest.param(
            "seed: 1",
            "seed: -1",
            "seed: -1",
            ["seed: got -1", "expected an integer ≥ 0"],
            id="negative-seed",
        ),
        pytest.param(
            "  restarts: 1 ",
            "  restart: 1 ",
            "restart: 1",
            ["expect.restart: unknown key 'restart'", "did you mean 'restarts'?", "goodput"],
            id="unknown-expect-key-lists-report-keys",
        ),
        pytest.param(
            "  restarts: 1 ",
            "  restarts: {min: 3, max: 2} ",
            "min: 3",
            ["expect.restarts.max: got 2", "expected ≥ min (3)"],
            id="expect-range-upside-down",
        ),
        pytest.param(
            "  state: SUCCEEDED",
            "  state: DONE",
            "DONE",
            ["expect.state: got 'DONE'", "SUCCEEDED, FAILED, UNHEALTHY, TIMEOUT"],
            id="expect-unknown-state",
        ),
        pytest.param(
            "  restarts: 1 ",
            "  restarts: {min: 1, most: 2} ",
            "most",
            ["expect.restarts.most: unknown key 'most'", "min, max"],
            id="expect-range-unknown-key",
        ),
        pytest.param(
            "restart_after: 2m}",
            "local_rank: 2}",
            "local_rank: 2}",
            [
                "faults[1].local_rank: unknown key",
                "node_crash fault: at, kind, node, restart_after",
            ],
            id="key-that-the-fault-kind-does-not-take",
        ),
        pytest.param(
            "at: 30m, ",
            "",
            "kind: node_crash",
            ["faults[1].at: missing", "every: for a rate"],
            id="fault-without-at",
        ),
        pytest.param(
            "at: 30m",
            "at: 7h",
            "at: 7h",
            ["faults[1].at: got '7h'", "expected ≤ until (6h)"],
            id="fault-after-until",
        ),
        pytest.param(
            "at: 30m",
            "at: 1:30",
            "at: 1:30",
            ["faults[1].at: got 1:30", "base-60 number 90"],
            id="yaml-sexagesimal",
        ),
        pytest.param(
            "  steps: 2000",
            "  steps: 2000\n  steps: 3",
            "steps: 3",
            ["job.steps: duplicate key (first given on line 8)"],
            id="duplicate-key",
        ),
        pytest.param(
            "seed: 1",
            "seed: !!python/name:os.system ''",
            "seed:",
            ["seed: got a python/name:os.system value", "expected an integer"],
            id="python-tag-refused",
        ),
        pytest.param(
            "seed: 1",
            "seed: !!int abc",
            "seed:",
            ["seed: got 'abc' tagged tag:yaml.org,2002:int"],
            id="explicit-tag-that-cannot-convert",
        ),
        pytest.param(
            "until: 6h ",
            "until: .inf ",
            "until:",
            ["until: got inf", "finite"],
            id="infinite-until",
        ),
        pytest.param(
            "  - {at: 10m",
            "  - [10m]\n  - {at: 10m",
            "[10m]",
            ["faults[0]: got a list; expected a fault mapping"],
            id="fault-not-a-mapping",
        ),
        pytest.param(
            "  monitor_interval: 0.1s",
            "  monitor_interval: 0.1s\n  agent: {}",
            "agent: {}",
            ["agent.agent: unknown key 'agent'", "it belongs at the top level"],
            id="section-nested-in-section",
        ),
    ],
)
def test_bad_value_names_file_line_key_value_and_expectation(
    old: str, new: str, marker: str, fragments: list[str]
) -> None:
    assert old in V1
    text = V1.replace(old, new, 1)
    error = load_error(text)
    assert error.where == f"x.yaml:{line_of(text, marker)}", str(error)
    for fragment in fragments:
        assert fragment in error.message, str(error)
    assert str(error) == f"{error.where}: {error.message}"
    assert "\n" not in str(error)


def test_missing_required_key_points_at_its_mapping() -> None:
    text = V1.replace("  nproc_per_node: 8\n", "")
    error = load_error(text)
    assert error.where == f"x.yaml:{line_of(text, 'nodes: 4')}"
    assert error.message == "cluster.nproc_per_node: missing; expected an integer from 1 to 4096"


def test_missing_required_section_is_named() -> None:
    error = load_error("cluster: {nodes: 1, nproc_per_node: 1}\n")
    assert error.where == "x.yaml:1"
    assert error.message.startswith("job: missing; expected a mapping with keys steps, step_time")


def test_yaml_syntax_error_gives_the_line_of_the_problem() -> None:
    text = V1.replace("  steps: 2000", "  steps: [2000")
    error = load_error(text)
    assert error.where == f"x.yaml:{line_of(text, 'step_time')}"
    assert error.message.startswith("YAML syntax error:")


def test_tab_indentation_is_a_syntax_error_with_its_line() -> None:
    text = MINIMAL + "agent:\n\tmax_restarts: 2\n"
    error = load_error(text)
    assert error.where == f"x.yaml:{line_of(text, 'max_restarts')}"
    assert "YAML syntax error" in error.message


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n"])
def test_empty_file_is_refused(text: str) -> None:
    error = load_error(text)
    assert error.where == "x.yaml:1"
    assert "the file is empty; expected a scenario mapping" in error.message


@pytest.mark.parametrize(
    ("text", "seen"),
    [("- a\n- b\n", "a list"), ("just words\n", "'just words'"), ("42\n", "'42'")],
)
def test_top_level_must_be_a_mapping(text: str, seen: str) -> None:
    error = load_error(text)
    assert error.where == "x.yaml:1"
    assert error.message.startswith(f"top level: got {seen}; expected a mapping of scenario keys")


def test_two_documents_are_refused() -> None:
    error = load_error(MINIMAL + "---\n" + MINIMAL)
    assert error.where == "x.yaml:3"
    assert "expected a single document" in error.message


def test_non_string_key_is_refused() -> None:
    error = load_error(MINIMAL + "1: x\n")
    assert error.where == "x.yaml:3"
    assert "top level: got key '1'" in error.message


def test_deep_nesting_is_refused_before_composing_with_the_line_where_it_goes_too_deep() -> None:
    # 100k levels crash libyaml's composer (C recursion) or exhaust Python's: never reached
    error = load_error("a: " + "[" * 100_000 + "]" * 100_000 + "\n")
    assert error.where == "x.yaml:1"
    assert "nests more than 64 levels deep" in error.message
    text = MINIMAL + "description:\n" + "".join(" " * i + "-\n" for i in range(1, 80))
    error = load_error(text)
    assert error.where == f"x.yaml:{3 + 64}"


def test_oversized_and_non_utf8_files_are_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (MAX_SCENARIO_BYTES + 1))
    with pytest.raises(ConfigError, match="larger than"):
        load_scenario(big)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"name: caf\xe9\n" + MINIMAL.encode())
    with pytest.raises(ConfigError) as caught:
        load_scenario(latin)
    assert caught.value.where == f"{latin}:1"
    assert "not UTF-8" in caught.value.message


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as caught:
        load_scenario(path)
    assert caught.value.where == str(path)
    assert "cannot read the scenario file" in caught.value.message


def test_node_index_may_name_a_node_that_joined_before_the_fault() -> None:
    faults = (
        "faults:\n  - {at: 1m, kind: node_join, count: 2}\n"
        "  - {at: 2m, kind: node_crash, node: 3}\n"
    )
    s = load_scenario_text(MINIMAL + faults)
    assert s.faults[1] == Fault(at=120.0, kind=FaultKind.NODE_CRASH, node=3)


def test_node_index_may_not_name_a_node_that_joins_later() -> None:
    text = (
        MINIMAL
        + "faults:\n  - {at: 2m, kind: node_crash, node: 2}\n  - {at: 3m, kind: node_join}\n"
    )
    error = load_error(text)
    assert error.where == "x.yaml:4"
    assert error.message.startswith("faults[0].node: got 2; expected a node index from 0 to 1")
    assert "that exist at 2m" in error.message


def test_spare_nodes_count_as_existing_nodes() -> None:
    text = (
        "cluster: {nodes: 2, nproc_per_node: 1, spare_nodes: 1}\njob: {steps: 1, step_time: 1s}\n"
    )
    s = load_scenario_text(text + "faults:\n  - {at: 1s, kind: node_leave, node: 2}\n")
    assert s.faults[0] == Fault(at=1.0, kind=FaultKind.NODE_LEAVE, node=2)


def test_rate_fault_node_is_checked_against_every_node_that_can_exist() -> None:
    text = MINIMAL + "faults:\n  - {kind: node_crash, every: 1h, node: 2}\n"
    error = load_error(text)
    assert "faults[0].node: got 2" in error.message
    assert "that can ever exist" in error.message


def test_network_partition_node_list_entries_are_checked_with_their_position() -> None:
    text = (
        MINIMAL
        + "faults:\n  - at: 1m\n    kind: network_partition\n    duration: 1m\n"
        + "    nodes:\n      - 0\n      - 5\n"
    )
    error = load_error(text)
    assert error.where == "x.yaml:9"
    assert error.message.startswith("faults[0].nodes[1]: got 5; expected a node index from 0 to 1")


@pytest.mark.parametrize(
    ("fault", "fragment"),
    [
        ("{at: 1m, kind: network_partition, nodes: [], duration: 1m}", "non-empty list"),
        ("{at: 1m, kind: network_partition, nodes: [0, 0], duration: 1m}", "got 0 twice"),
        ("{at: 1m, kind: network_partition, nodes: [0]}", "faults[0].duration: missing"),
        (
            "{at: 1m, kind: slow_node, node: 0, factor: 1}",
            "faults[0].factor: got 1; expected a number > 1",
        ),
        ("{at: 1m, kind: preemption, node: 0}", "faults[0].notice: missing"),
        ("{at: 1m, kind: store_outage, duration: 0s}", "greater than 0"),
        ("{at: 1m, kind: node_join, count: 0}", "faults[0].count: got 0"),
        (
            "{at: 1m, kind: worker_crash, node: 0, local_rank: 0, exit_code: x}",
            "expected an integer",
        ),
        ("{at: 1m, every: 1h, kind: worker_crash}", "faults[0].at: given with every:"),
        (
            "{kind: worker_crash, every: 1h, from: 2h, to: 1h}",
            "faults[0].from: got '2h'; expected before to",
        ),
        (
            "{kind: worker_crash, every: 1h, to: 8d}",
            "faults[0].to: got '8d'; expected ≤ until (7d)",
        ),
        ("{kind: worker_crash, every: 0s}", "faults[0].every: got '0s'"),
        ("{kind: worker_crash, every: 1ms}", f"expected at most {MAX_EXPANDED_FAULTS}"),
        ("{at: 1m}", "faults[0].kind: missing; expected one of worker_crash"),
    ],
)
def test_fault_fields_are_validated_per_kind(fault: str, fragment: str) -> None:
    error = load_error(MINIMAL + f"faults:\n  - {fault}\n")
    assert error.where == "x.yaml:4"
    assert fragment in error.message, str(error)


@pytest.mark.parametrize(
    ("rendezvous", "fragment"),
    [
        ("{min_nodes: 3, max_nodes: 2}", "rendezvous.max_nodes: got 2; expected ≥ min_nodes (3)"),
        ("{min_nodes: 0}", "rendezvous.min_nodes: got 0"),
        ("{backend: etcd}", "rendezvous.backend: got 'etcd'; expected one of c10d, static"),
        (
            "{backend: static, min_nodes: 1}",
            "rendezvous.min_nodes: got 1; expected 2 (cluster.nodes)",
        ),
        ("{join_timeout: 0}", "rendezvous.join_timeout: got 0"),
        ("{backend: static, max_nodes: 1}", "rendezvous.max_nodes: got 1; expected 2"),
    ],
)
def test_rendezvous_settings_are_validated(rendezvous: str, fragment: str) -> None:
    error = load_error(MINIMAL + f"rendezvous: {rendezvous}\n")
    assert error.where == "x.yaml:3"
    assert fragment in error.message, str(error)


def test_static_rendezvous_refuses_spares_and_node_joins() -> None:
    spares = (
        "cluster: {nodes: 2, nproc_per_node: 1, spare_nodes: 1}\njob: {steps: 1, step_time: 1s}\n"
    )
    error = load_error(spares + "rendezvous: {backend: static}\n")
    assert "rendezvous.backend: got 'static'; expected c10d" in error.message
    error = load_error(
        MINIMAL + "rendezvous: {backend: static}\nfaults: [{at: 1m, kind: node_join}]\n"
    )
    assert error.where == "x.yaml:4"
    assert "faults[0].kind: got 'node_join'" in error.message
    ok = load_scenario_text(MINIMAL + "rendezvous: {backend: static}\n")
    assert ok.rendezvous.backend is RendezvousBackendName.STATIC


@pytest.mark.parametrize(
    ("expect", "fragment"),
    [
        ("{goodput: 1.5}", "expect.goodput: got 1.5; expected a number ≥ 0 and ≤ 1"),
        ("{restarts: -1}", "expect.restarts: got -1; expected an integer ≥ 0"),
        ("{restarts: {}}", "expect.restarts: got an empty range"),
        ("{world_size: 2.5}", "expect.world_size: got 2.5"),
        ("{state: {min: 1}}", "expect.state: got a mapping; expected one of SUCCEEDED"),
        ("[1, 2]", "expect: got a list; expected a mapping of expected report values"),
    ],
)
def test_expectations_are_validated(expect: str, fragment: str) -> None:
    error = load_error(MINIMAL + f"expect: {expect}\n")
    assert error.where == "x.yaml:3"
    assert fragment in error.message, str(error)


def test_control_character_is_refused_with_its_line() -> None:
    error = load_error(MINIMAL + "name: a\x00b\n")
    assert error.where == "x.yaml:3"
    assert error.message == (
        "got the character U+0000, which YAML does not allow; expected printable text"
    )
