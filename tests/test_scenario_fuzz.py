"""Junk in, ConfigError out: the loader never lets another exception (or a traceback) escape.

Whatever loads also writes back (``to_yaml``) to a scenario that loads equal.
"""

from __future__ import annotations

import textwrap

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elastic.errors import ConfigError
from sim.scenario import Scenario, load_scenario_text

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


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
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
