"""Failure generators (``failures:``, sim/failures.py): rates scaled by the cluster, the mix of
categories, repair times, planned maintenance apart, every draw from the scenario's seed."""

from __future__ import annotations

from collections import Counter

import pytest

from elastic.errors import ConfigError
from sim.failures import _LLAMA3_TABLE5, PRESETS, Distribution, Repair
from sim.run import simulate
from sim.scenario import (
    Fault,
    FaultKind,
    Scenario,
    expand_faults,
    fault_rng,
    load_scenario_text,
)

LLAMA3 = """
seed: {seed}
until: 54d
cluster: {{nodes: {nodes}, nproc_per_node: 8}}
job: {{steps: 100, step_time: 1}}
failures: llama3-405b
"""


def _llama3(seed: int = 0, nodes: int = 2048) -> Scenario:
    return load_scenario_text(LLAMA3.format(seed=seed, nodes=nodes))


def _drawn(sc: Scenario) -> list[Fault]:
    return expand_faults(sc, fault_rng(sc.seed))


def test_llama3_preset_reproduces_table_5_rates_and_mix_at_2048_nodes() -> None:
    totals: Counter[str] = Counter()
    planned = unexpected = 0
    seeds = 20
    for seed in range(seeds):
        for fault in _drawn(_llama3(seed)):
            assert fault.category is not None
            totals[fault.category] += 1
            if fault.category == "planned_maintenance":
                planned += 1
            else:
                unexpected += 1
    # Poisson counts: 419 and 47 per 54 days; over 20 seeds within 4 standard deviations
    assert abs(unexpected - 419 * seeds) < 4 * (419 * seeds) ** 0.5
    assert abs(planned - 47 * seeds) < 4 * (47 * seeds) ** 0.5
    for name, count, _kind, _repair in _LLAMA3_TABLE5:
        share = count / 419
        sd = (share * (1 - share) / unexpected) ** 0.5
        assert abs(totals[name] / unexpected - share) < 4 * sd + 1e-9, name


def test_rates_scale_with_the_cluster() -> None:
    big = sum(len(_drawn(_llama3(seed, nodes=2048))) for seed in range(8))
    small = sum(len(_drawn(_llama3(seed, nodes=256))) for seed in range(8))
    # 8x fewer GPUs and nodes: 8x fewer failures (466 vs 58.25 per run, on average)
    assert abs(small - big / 8) < 4 * (big / 8) ** 0.5


def test_categories_map_to_their_fault_kind_and_repair_time() -> None:
    kinds = {name: kind for name, _, kind, _ in _LLAMA3_TABLE5}
    kinds["planned_maintenance"] = FaultKind.NODE_CRASH
    for fault in _drawn(_llama3(3)):
        assert fault.category is not None
        assert fault.kind is kinds[fault.category]
        if fault.kind in (FaultKind.GPU_ERROR, FaultKind.NODE_CRASH):
            assert fault.restart_after is not None and fault.restart_after > 0
        if fault.category == "planned_maintenance":
            assert fault.restart_after == 7200.0
        if fault.kind is not FaultKind.NODE_JOIN:
            assert fault.node is not None and 0 <= fault.node < 2048


def test_same_seed_same_draws_and_a_stream_change_leaves_the_other_alone() -> None:
    assert _drawn(_llama3(5)) == _drawn(_llama3(5))
    assert _drawn(_llama3(5)) != _drawn(_llama3(6))
    text = LLAMA3.format(seed=5, nodes=64).replace(
        "failures: llama3-405b",
        "failures:\n"
        "  unexpected: {mtbf: 100d, per: gpu, categories: [{name: a, kind: worker_crash}]}\n"
        "  planned: {mtbf: PLANNED, per: node, categories: "
        "[{name: p, kind: node_crash, repair: 1h}]}\n",
    )
    one = _drawn(load_scenario_text(text.replace("PLANNED", "200d")))
    two = _drawn(load_scenario_text(text.replace("PLANNED", "50d")))
    assert [f for f in one if f.category == "a"] == [f for f in two if f.category == "a"]
    assert [f for f in one if f.category == "p"] != [f for f in two if f.category == "p"]


def test_repair_distributions_draw_around_their_parameters() -> None:
    import random

    rng = random.Random(1)
    for repair, mean in (
        (Repair(Distribution.FIXED, 60.0), 60.0),
        (Repair(Distribution.EXPONENTIAL, 3600.0), 3600.0),
        (Repair(Distribution.LOGNORMAL, 3600.0, 0.5), 3600.0 * 2.718281828 ** (0.125)),
        (Repair(Distribution.UNIFORM, 100.0, 300.0), 200.0),
    ):
        draws = [repair.draw(rng) for _ in range(4000)]
        assert abs(sum(draws) / len(draws) - mean) < 0.06 * mean, repair
        assert repair.mean == pytest.approx(mean, rel=1e-6)


def test_failures_round_trip_and_the_explicit_scenario_carries_categories() -> None:
    text = LLAMA3.format(seed=2, nodes=128).replace(
        "failures: llama3-405b",
        "failures:\n"
        "  unexpected:\n"
        "    mtbf: 30d\n"
        "    per: node\n"
        "    categories:\n"
        "      - {name: gpu, weight: 3, kind: gpu_error,"
        " repair: {dist: lognormal, median: 2h, sigma: 0.5}}\n"
        "      - {name: link, kind: network_partition, repair: {dist: uniform, min: 1m, max: 5m}}\n"
        "      - {name: pre, kind: preemption, notice: 30s}\n"
        "      - {name: slow, kind: slow_node, factor: 1.5,"
        " repair: {dist: exponential, mean: 1h}}\n"
        "      - {name: bug, kind: worker_crash, exit_code: 3}\n",
    )
    sc = load_scenario_text(text)
    assert load_scenario_text(sc.to_yaml()) == sc
    assert load_scenario_text(_llama3(1).to_yaml()) == _llama3(1)
    drawn = _drawn(sc)
    assert {f.category for f in drawn} == {"gpu", "link", "pre", "slow", "bug"}
    explicit = sc.with_faults(drawn)
    assert explicit.failures is None
    again = load_scenario_text(explicit.to_yaml())
    assert again == explicit
    assert _drawn(again) == drawn


@pytest.mark.parametrize(
    ("failures", "fragment"),
    [
        ("llama4", "failures: got 'llama4'; expected a preset (llama3-405b)"),
        ("{}", "expected unexpected:, planned: or both"),
        ("{unexpected: {mtbf: 1d}}", "failures.unexpected.categories: got nothing"),
        (
            "{unexpected: {mtbf: 1d, categories: [{name: x, kind: worker_crash, repair: 1h}]}}",
            "categories[0].repair: given for a worker_crash failure, which takes none",
        ),
        (
            "{unexpected: {mtbf: 1d, categories: [{name: x, kind: preemption}]}}",
            "categories[0].notice: missing",
        ),
        (
            "{unexpected: {mtbf: 1d, categories: [{name: x, kind: node_join}]}}",
            "categories[0].kind: got 'node_join'",
        ),
        (
            "{unexpected: {mtbf: 1d, per: rack, categories: [{name: x, kind: node_crash}]}}",
            "per: got 'rack'; expected one of gpu, node, cluster",
        ),
        (
            "{unexpected: {mtbf: 1s, per: gpu, categories: [{name: x, kind: node_crash}]}}",
            "expected at most 10000",
        ),
        (
            "{unexpected: {mtbf: 1d, categories: [{name: x, kind: node_crash,"
            " repair: {dist: weibull, k: 1}}]}}",
            "repair.dist: got 'weibull'",
        ),
    ],
)
def test_bad_failures_are_refused_in_one_line(failures: str, fragment: str) -> None:
    text = LLAMA3.format(seed=0, nodes=16).replace("failures: llama3-405b", f"failures: {failures}")
    with pytest.raises(ConfigError) as info:
        load_scenario_text(text, name="x.yaml")
    message = str(info.value)
    assert fragment in message and "\n" not in message, message
    assert message.startswith("x.yaml:")


def test_a_run_records_each_failures_category_in_its_event_log() -> None:
    sc = load_scenario_text(
        """
seed: 4
until: 2d
cluster: {nodes: 4, nproc_per_node: 2, spare_nodes: 1}
job: {steps: 20000, step_time: 4s, startup_time: 30s, checkpoint_every: 100, checkpoint_time: 5s}
rendezvous: {min_nodes: 3, max_nodes: 4}
agent: {max_restarts: 100}
failures:
  unexpected:
    mtbf: 4d
    per: gpu
    categories:
      - {name: gpu, weight: 2, kind: gpu_error, repair: 1h}
      - {name: bug, kind: worker_crash}
"""
    )
    result = simulate(sc, keep_events=True)
    faults = [e for e in result.events if e.kind == "sim.fault"]
    assert faults, "the failure rate should draw a few faults in the run"
    assert {e.fields["category"] for e in faults} <= {"gpu", "bug"}
    assert all("category" in e.fields for e in faults)


def test_presets_are_valid_models() -> None:
    for name, model in PRESETS.items():
        assert model.preset == name
        assert model.unexpected is not None and model.planned is not None
