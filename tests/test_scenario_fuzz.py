"""Junk in, ConfigError out: the loader never lets another exception (or a traceback) escape.

Whatever loads also writes back (``to_yaml``) to a scenario that loads equal.
"""

from __future__ import annotations

import textwrap

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elastic.errors import ConfigError
from sim.expect import Bound, Expectation, ExpectedState
from sim.scenario import (
    Agent,
    Cluster,
    Fault,
    FaultKind,
    Job,
    RateFault,
    RendezvousSpec,
    Scenario,
    StoreSpec,
    load_scenario_text,
)

VALID = textwrap.dedent(
    """\
    name: fuzz base
    seed: 3
    until: 2d
    cluster: {nodes: 3, nproc_per_node: 2, spare_nodes: 1}
    rendezvous: {min_nodes: 2, max_nodes: 3, join_timeout: 5m}
    job: {steps: 50, step_time: 2s, checkpoint_every: 10, timer: 30s}
    agent: {max_restarts: 2}
    faults:
      - {at: 10m, kind: worker_crash, node: 1, local_rank: 1}
      - {at: 20m, kind: node_join, count: 1}
      - {at: 30m, kind: network_partition, nodes: [0, 4], duration: 1m}
      - {kind: slow_node, every: 5h, factor: 2}
    expect: {state: SUCCEEDED, restarts: {min: 1}, goodput: {max: 1}}
    """
)

# characters YAML treats specially, plus a few it refuses or handles oddly (NUL, BOM, U+2028)
YAML_CHARS = [*"abcdefghijklmnopqrstuvwxyz_0123456789 .:-{}[],#&*!|>'\"%@`?\n\t\\"]
ODD_CHARS = ["\u00e9", "\u2028", "\x00", "\ufeff"]
YAMLISH = st.text(alphabet=st.sampled_from([*YAML_CHARS, *ODD_CHARS]), max_size=200)

KEYS = [
    "name", "seed", "until", "cluster", "job", "agent", "rendezvous", "store", "faults",
    "expect", "nodes", "nproc_per_node", "spare_nodes", "steps", "step_time", "at", "kind",
    "node", "local_rank", "every", "from", "to", "count", "min", "max", "state", "backend",
    "min_nodes", "max_nodes", "duration", "factor", "notice", "restart_after", "latency",
]  # fmt: skip
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-5, max_value=10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["10m", "1.5h", "-1s", "0s", "worker_crash", "node_join", "c10d", "static"]),
    st.sampled_from(["SUCCEEDED", "2d", "1:30", "500ms", "yes", "~", "", "x" * 100]),
    st.text(max_size=10),
)
TREES = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.sampled_from(KEYS), children, max_size=5),
    ),
    max_leaves=25,
)


def loads_or_refuses(text: str) -> Scenario | None:
    """Load ``text``; a refusal must be a one-line ConfigError naming where."""
    try:
        scenario = load_scenario_text(text, name="fuzz.yaml")
    except ConfigError as error:
        assert error.where.startswith("fuzz.yaml")
        assert "\n" not in str(error)
        return None
    again = load_scenario_text(scenario.to_yaml())
    assert again == scenario
    return scenario


@settings(max_examples=300, deadline=None)
@given(YAMLISH)
def test_arbitrary_text_raises_only_config_error(text: str) -> None:
    loads_or_refuses(text)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(KEYS), TREES, max_size=8))
def test_arbitrary_yaml_structures_raise_only_config_error(tree: dict[str, object]) -> None:
    loads_or_refuses(yaml.safe_dump(tree))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=len(VALID) - 1),
            st.integers(min_value=0, max_value=8),
            st.text(
                alphabet=st.sampled_from(list("0123456789-:{}[], abkmsh.#\n")),
                max_size=6,
            ),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_mutated_valid_scenarios_raise_only_config_error(
    edits: list[tuple[int, int, str]],
) -> None:
    text = VALID
    for position, length, replacement in edits:
        position = min(position, len(text))
        text = text[:position] + replacement + text[position + length :]
    loads_or_refuses(text)


def test_the_fuzz_base_itself_loads() -> None:
    assert loads_or_refuses(VALID) is not None


SECONDS = st.floats(min_value=0, max_value=1e7, allow_nan=False, allow_infinity=False)
POSITIVE = st.floats(min_value=1e-3, max_value=1e7, allow_nan=False, allow_infinity=False)


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    """Valid scenarios built as values, with every fault kind and odd strings and floats."""
    nodes = draw(st.integers(1, 6))
    spares = draw(st.integers(0, 2))
    nproc = draw(st.integers(1, 8))
    until = draw(POSITIVE)
    existing = nodes + spares
    node = st.integers(0, existing - 1)
    at = st.floats(min_value=0, max_value=until, allow_nan=False)
    fault = st.one_of(
        st.builds(
            Fault,
            at=at,
            kind=st.just(FaultKind.WORKER_CRASH),
            node=node,
            local_rank=st.integers(0, nproc - 1),
            exit_code=st.integers(-255, 255),
        ),
        st.builds(
            Fault,
            at=at,
            kind=st.just(FaultKind.NODE_CRASH),
            node=node,
            restart_after=st.none() | SECONDS,
        ),
        st.builds(
            Fault,
            at=at,
            kind=st.just(FaultKind.NETWORK_PARTITION),
            nodes=st.lists(node, min_size=1, unique=True).map(tuple),
            duration=POSITIVE,
        ),
        st.builds(
            Fault,
            at=at,
            kind=st.just(FaultKind.SLOW_NODE),
            node=node,
            factor=st.floats(min_value=1.001, max_value=100),
            duration=st.none() | POSITIVE,
        ),
        st.builds(
            RateFault,
            kind=st.just(FaultKind.GPU_ERROR),
            every=st.floats(min_value=until / 100, max_value=1e8, exclude_min=True),
            node=st.none() | node,
        ),
    )
    return Scenario(
        name=draw(st.text(max_size=20)),
        description=draw(st.text(max_size=20)),
        seed=draw(st.integers(0, 2**64)),
        until=until,
        cluster=Cluster(nodes=nodes, nproc_per_node=nproc, spare_nodes=spares),
        job=Job(
            steps=draw(st.integers(1, 10**6)),
            step_time=draw(POSITIVE),
            startup_time=draw(SECONDS),
            checkpoint_every=draw(st.integers(0, 1000)),
            timer=draw(st.none() | POSITIVE),
        ),
        rendezvous=RendezvousSpec(min_nodes=1, max_nodes=draw(st.integers(1, 10))),
        agent=Agent(max_restarts=draw(st.integers(0, 100)), monitor_interval=draw(POSITIVE)),
        store=StoreSpec(latency=draw(SECONDS)),
        faults=tuple(draw(st.lists(fault, max_size=5))),
        expect=Expectation(
            state=draw(st.none() | st.sampled_from(ExpectedState)),
            restarts=draw(st.none() | st.integers(0, 9).map(lambda n: Bound(exact=n))),
            goodput=draw(st.none() | st.floats(0, 1).map(lambda g: Bound(min=g))),
            recovery_s_max=draw(st.none() | SECONDS.map(lambda s: Bound(max=s))),
        ),
    )


@settings(max_examples=100, deadline=None)
@given(scenarios())
def test_any_valid_scenario_written_with_to_yaml_loads_back_equal(scenario: Scenario) -> None:
    assert load_scenario_text(scenario.to_yaml()) == scenario


def test_a_key_with_a_newline_is_named_on_one_line() -> None:
    from pathlib import Path

    from elastic.errors import ConfigError
    from sim.scenario import load_scenario_text

    root = Path(__file__).resolve().parent.parent
    text = (root / "scenarios" / "worker_crash_restarts.yaml").read_text()
    with pytest.raises(ConfigError) as e:  # an unknown top-level key, with a newline in it
        load_scenario_text(text + '"late\\n2": 1\n', name="s.yaml")
    assert "\n" not in str(e.value) and "late\\n2" in str(e.value)
