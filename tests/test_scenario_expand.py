"""Rate faults expand to timed faults deterministically per seed, independent of other sections."""

from __future__ import annotations

import random
import textwrap

from sim.scenario import (
    Fault,
    FaultKind,
    RateFault,
    Scenario,
    expand_faults,
    fault_rng,
    load_scenario_text,
)

BASE = textwrap.dedent(
    """\
    name: rates
    seed: 5
    until: 1000h
    cluster: {nodes: 4, nproc_per_node: 8, spare_nodes: 1}
    job: {steps: 100, step_time: 1s}
    """
)


def scenario(faults: str, extra: str = "") -> Scenario:
    return load_scenario_text(BASE + extra + "faults:\n" + textwrap.indent(faults, "  "))


def expand(s: Scenario, seed: int | None = None) -> list[Fault]:
    return expand_faults(s, fault_rng(s.seed if seed is None else seed))


def test_same_seed_gives_the_same_faults_and_another_seed_different_ones() -> None:
    s = scenario("- {kind: worker_crash, every: 10h}\n")
    first = expand(s)
    assert first == expand(s)
    assert first == expand(load_scenario_text(s.to_yaml()))
    assert first != expand(s, seed=6)
    assert len(first) > 10


def test_fault_rng_is_stable_across_runs_and_platforms() -> None:
    # replaying a recorded seed must give the recorded faults: this pins the algorithm.
    s = scenario("- {kind: worker_crash, every: 100h}\n")
    faults = expand(s)
    assert [(f.at, f.node, f.local_rank) for f in faults[:3]] == GOLDEN_FIRST_THREE
    assert fault_rng(5).random() == random.Random("elastic/faults/5").random()


GOLDEN_FIRST_THREE = [(883163.654, 1, 0), (1604726.113, 2, 3), (1820703.121, 3, 3)]


def test_draws_do_not_depend_on_other_sections() -> None:
    faults = "- {kind: worker_crash, every: 10h}\n"
    plain = expand(scenario(faults))
    other = scenario(
        faults,
        extra=(
            "agent: {max_restarts: 9}\nstore: {latency: 5ms}\n"
            "rendezvous: {min_nodes: 1, max_nodes: 8}\n"
            "expect: {restarts: 2}\ndescription: other sections changed\n"
        ),
    )
    assert expand(other) == plain


def test_adding_a_fault_does_not_shift_another_faults_draws() -> None:
    one = expand(scenario("- {kind: worker_crash, every: 10h}\n"))
    two = expand(
        scenario(
            "- {kind: worker_crash, every: 10h}\n"
            "- {kind: worker_hang, every: 30h}\n"
            "- {at: 3h, kind: store_outage, duration: 1m}\n"
        )
    )
    assert [f for f in two if f.kind is FaultKind.WORKER_CRASH] == one
    assert Fault(at=3 * 3600.0, kind=FaultKind.STORE_OUTAGE, duration=60.0) in two


def test_expanded_faults_are_sorted_by_time_then_file_index() -> None:
    s = scenario(
        "- {at: 2h, kind: node_leave, node: 1}\n"
        "- {kind: worker_crash, every: 5h}\n"
        "- {at: 1h, kind: store_outage, duration: 1m}\n"
        "- {at: 1h, kind: node_crash, node: 0}\n"
    )
    faults = expand(s)
    times = [f.at for f in faults]
    assert times == sorted(times)
    same_time = [f.kind for f in faults if f.at == 3600.0]
    assert same_time == [FaultKind.STORE_OUTAGE, FaultKind.NODE_CRASH]


def test_rate_faults_stay_in_their_window_at_about_their_rate() -> None:
    s = scenario("- {kind: node_crash, every: 1h, from: 100h, to: 900h, restart_after: 5m}\n")
    faults = expand(s)
    assert all(100 * 3600.0 <= f.at < 900 * 3600.0 for f in faults)
    # 800 expected; a Poisson count is within ±15% with overwhelming probability
    assert 680 <= len(faults) <= 920
    assert all(f.restart_after == 300.0 for f in faults)
    assert all(round(f.at, 3) == f.at for f in faults)


def test_targets_are_drawn_uniformly_unless_given() -> None:
    s = scenario(
        "- {kind: worker_crash, every: 1h, exit_code: 137}\n"
        "- {kind: worker_hang, every: 1h, node: 2}\n"
    )
    faults = expand(s)
    crashes = [f for f in faults if f.kind is FaultKind.WORKER_CRASH]
    hangs = [f for f in faults if f.kind is FaultKind.WORKER_HANG]
    assert {f.node for f in crashes} == {0, 1, 2, 3, 4}  # 4 nodes + 1 spare
    assert {f.local_rank for f in crashes} == set(range(8))
    assert all(f.exit_code == 137 for f in crashes)
    assert {f.node for f in hangs} == {2}
    assert {f.local_rank for f in hangs} == set(range(8))


def test_drawn_nodes_include_nodes_joined_before_the_fault_only() -> None:
    s = scenario("- {at: 500h, kind: node_join, count: 3}\n- {kind: node_leave, every: 1h}\n")
    faults = expand(s)
    leaves = [f for f in faults if f.kind is FaultKind.NODE_LEAVE]
    assert max(f.node or 0 for f in leaves if f.at < 500 * 3600.0) <= 4
    assert max(f.node or 0 for f in leaves if f.at > 500 * 3600.0) == 7


def test_rate_node_joins_count_for_later_draws() -> None:
    s = scenario("- {kind: node_join, every: 50h}\n- {kind: node_crash, every: 1h}\n")
    faults = expand(s)
    existing = 5
    for fault in faults:
        if fault.kind is FaultKind.NODE_JOIN:
            existing += fault.count or 1
        else:
            assert fault.node is not None and fault.node < existing
    assert existing > 10


def test_network_partition_draws_one_node_when_none_are_given() -> None:
    faults = expand(scenario("- {kind: network_partition, every: 10h, duration: 1m}\n"))
    assert faults
    assert all(f.nodes is not None and len(f.nodes) == 1 for f in faults)


def test_expanded_scenario_writes_back_as_explicit_yaml_that_replays_identically() -> None:
    s = scenario(
        "- {kind: worker_crash, every: 20h}\n"
        "- {kind: slow_node, every: 100h, factor: 2, duration: 1h}\n"
        "- {at: 1h, kind: gpu_error, node: 1}\n"
    )
    explicit = s.with_faults(expand(s))
    assert s.has_rate_faults
    assert not explicit.has_rate_faults
    reloaded = load_scenario_text(explicit.to_yaml())
    assert reloaded == explicit
    assert expand(reloaded) == list(explicit.faults)
    assert all("every" not in fault for fault in explicit.to_dict()["faults"])


def test_a_scenario_without_rate_faults_expands_to_its_own_faults_in_time_order() -> None:
    s = scenario("- {at: 2h, kind: node_crash, node: 0}\n- {at: 1h, kind: node_crash, node: 1}\n")
    assert [f.node for f in expand(s)] == [1, 0]
    assert all(isinstance(f, Fault) and not isinstance(f, RateFault) for f in expand(s))
