"""The agent's decision core (``elastic.agent.server._decide``): its written rules, over
generated outcomes and budgets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elastic.agent.server._decide import (
    CLOSED,
    CLOSED_AFTER_SUCCESS,
    FREE_EXIT_CODES,
    GroupAction,
    IllegalDecision,
    Outcome,
    OutcomeKind,
    WorkerState,
    decide,
    settled,
)
from elastic.workers import ExitCause, WorkerExit

RUNNING = [WorkerState.HEALTHY, WorkerState.UNHEALTHY]
IDLE = [WorkerState.INIT, WorkerState.STOPPED]
budgets = st.integers(min_value=0, max_value=5)
codes = st.one_of(st.just(0), st.sampled_from([1, 2, 137, 143, -9, -15, -6]), st.integers(-64, 255))
causes = st.sampled_from(list(ExitCause))
reasons = st.one_of(
    st.sampled_from(
        [CLOSED, CLOSED_AFTER_SUCCESS, "nodes_waiting", "member_lost", "lease_expired", ""]
    ),
    st.text(max_size=12),
)


@st.composite
def exit_sets(draw: st.DrawFn) -> Outcome:
    """Some exits (distinct local ranks, in a random order) of a group of some size."""
    size = draw(st.integers(min_value=1, max_value=8))
    ranks = draw(st.permutations(range(size)))
    n = draw(st.integers(min_value=0, max_value=size))
    exits = tuple(
        WorkerExit(local_rank=r, exit_code=draw(codes), time=float(i), cause=draw(causes))
        for i, r in enumerate(ranks[:n])
    )
    return Outcome.of_exits(exits, size)


outcomes = st.one_of(
    exit_sets(),
    reasons.map(Outcome.health),
    reasons.map(Outcome.membership),
    st.just(Outcome.timeout()),
)


def _legal(state: WorkerState, outcome: Outcome) -> bool:
    if WorkerState.is_running(state):
        return outcome.kind is not OutcomeKind.TIMEOUT
    return outcome.kind in (OutcomeKind.MEMBERSHIP, OutcomeKind.TIMEOUT)


@given(st.sampled_from(list(WorkerState)), outcomes, budgets)
def test_the_budget_never_goes_negative_and_only_a_spending_restart_lowers_it_by_one(
    state: WorkerState, outcome: Outcome, budget: int
) -> None:
    if not _legal(state, outcome):
        with pytest.raises(IllegalDecision):
            decide(state, outcome, budget)
        return
    d = decide(state, outcome, budget)
    assert d.remaining >= 0
    if d.spent:
        assert d.action is GroupAction.RESTART and d.remaining == budget - 1
    else:
        assert d.remaining == budget


@given(st.sampled_from(RUNNING), exit_sets(), budgets)
def test_success_only_when_every_worker_of_the_group_exited_0(
    state: WorkerState, outcome: Outcome, budget: int
) -> None:
    d = decide(state, outcome, budget)
    all_zero = {ex.local_rank for ex in outcome.exits if ex.exit_code == 0} == set(
        range(outcome.group_size)
    )
    assert (d.action is GroupAction.SUCCEED) == all_zero
    if d.action is GroupAction.SUCCEED:
        assert d.state is WorkerState.SUCCEEDED and d.result is WorkerState.SUCCEEDED
        assert d.failed == () and not d.spent


@given(st.sampled_from(RUNNING), exit_sets(), budgets)
def test_exits_wait_until_a_failure_or_every_worker_exited(
    state: WorkerState, outcome: Outcome, budget: int
) -> None:
    d = decide(state, outcome, budget)
    failed = [ex for ex in outcome.exits if ex.exit_code != 0]
    if not failed and len(outcome.exits) < outcome.group_size:
        assert d.action is GroupAction.WAIT and d.state is None and d.notice is None
        assert not settled(outcome.exits, outcome.group_size)
    else:
        assert d.action is not GroupAction.WAIT
        assert settled(outcome.exits, outcome.group_size)


@given(st.sampled_from(RUNNING), exit_sets(), budgets)
def test_a_failure_records_every_failed_exit_in_the_order_seen(
    state: WorkerState, outcome: Outcome, budget: int
) -> None:
    failed = tuple(ex.local_rank for ex in outcome.exits if ex.exit_code != 0)
    d = decide(state, outcome, budget)
    if not failed:
        return
    assert d.failed == failed
    assert d.state is WorkerState.FAILED and d.reason in ("failure", "restarts_exhausted")
    free = all(ex.exit_code in FREE_EXIT_CODES for ex in outcome.exits if ex.exit_code != 0)
    if free:
        assert d.action is GroupAction.RESTART and not d.spent
    elif budget > 0:
        assert d.action is GroupAction.RESTART and d.spent and d.reason == "failure"
    else:
        assert d.action is GroupAction.FAIL and d.reason == "restarts_exhausted"
        assert d.result is WorkerState.FAILED


@given(st.sampled_from(RUNNING), reasons, budgets)
def test_an_unhealthy_group_spends_a_restart_or_stops_unhealthy(
    state: WorkerState, reason: str, budget: int
) -> None:
    d = decide(state, Outcome.health(reason), budget)
    assert d.state is WorkerState.UNHEALTHY
    assert d.notice == "agent.unhealthy" and d.detail == reason
    if budget > 0:
        assert (d.action, d.reason, d.spent) == (GroupAction.RESTART, "unhealthy", True)
    else:
        assert (d.action, d.reason) == (GroupAction.FAIL, "restarts_exhausted")
        assert d.result is WorkerState.UNHEALTHY  # torch's RunResult value


@given(st.sampled_from(list(WorkerState)), reasons, budgets)
def test_a_membership_change_never_spends(state: WorkerState, reason: str, budget: int) -> None:
    d = decide(state, Outcome.membership(reason), budget)
    assert not d.spent and d.remaining == budget and d.state is None
    if not WorkerState.is_running(state):
        # no group runs: join the next round, whatever the reason (a closed rendezvous
        # then refuses the join)
        assert d.action is GroupAction.REJOIN and d.notice == "agent.membership_change"
    elif reason == CLOSED:
        assert (d.action, d.reason, d.notice) == (GroupAction.CLOSE, "rendezvous_closed", None)
        assert d.result is WorkerState.FAILED
    elif reason == CLOSED_AFTER_SUCCESS:
        # a peer succeeded and closed it: the workers run on, nothing is stopped
        assert (d.action, d.result, d.reason) == (GroupAction.DETACH, None, "")
        assert (d.notice, d.detail) == ("agent.rendezvous_closed", CLOSED_AFTER_SUCCESS)
    else:
        assert (d.action, d.reason) == (GroupAction.RESTART, "membership")
        assert d.notice == "agent.membership_change" and d.detail == reason


@given(st.sampled_from(IDLE), budgets)
def test_a_rank_exchange_timeout_rejoins_without_spending(state: WorkerState, budget: int) -> None:
    d = decide(state, Outcome.timeout(), budget)
    assert (d.action, d.remaining, d.spent) == (GroupAction.REJOIN, budget, False)
    assert (d.notice, d.detail) == ("agent.membership_change", "rank_exchange_timeout")


@given(st.sampled_from(list(WorkerState)), outcomes, budgets)
def test_the_agent_finishes_only_by_succeed_fail_or_close_and_says_with_what(
    state: WorkerState, outcome: Outcome, budget: int
) -> None:
    if not _legal(state, outcome):
        return
    d = decide(state, outcome, budget)
    finishing = d.action in (GroupAction.SUCCEED, GroupAction.FAIL, GroupAction.CLOSE)
    assert (d.result is not None) == finishing
    if d.action is GroupAction.FAIL:
        assert budget == 0  # only an exhausted budget stops a failed or unhealthy group


@pytest.mark.parametrize(
    ("state", "outcome"),
    [
        (WorkerState.INIT, Outcome.of_exits((), 1)),
        (WorkerState.STOPPED, Outcome.health("gpu")),
        (WorkerState.HEALTHY, Outcome.timeout()),
    ],
)
def test_an_outcome_the_state_does_not_allow_is_refused(
    state: WorkerState, outcome: Outcome
) -> None:
    with pytest.raises(IllegalDecision, match="illegal agent outcome"):
        decide(state, outcome, 1)


def test_a_negative_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="remaining restarts must be >= 0, got -1"):
        decide(WorkerState.HEALTHY, Outcome.health("x"), -1)


def test_the_table_as_torch_documents_it() -> None:
    """The spelled-out cases the agent's torch-compatibility relies on."""
    h = WorkerState.HEALTHY
    crash = WorkerExit(local_rank=1, exit_code=1, time=0.0)
    ok = WorkerExit(local_rank=0, exit_code=0, time=0.0)
    d = decide(h, Outcome.of_exits((ok, crash), 2), 3)
    assert (d.action, d.remaining, d.failed, d.reason) == (GroupAction.RESTART, 2, (1,), "failure")
    d = decide(h, Outcome.of_exits((crash,), 2), 0)
    assert (d.action, d.result, d.reason) == (
        GroupAction.FAIL,
        WorkerState.FAILED,
        "restarts_exhausted",
    )
    d = decide(h, Outcome.of_exits((ok,), 1), 0)
    assert (d.action, d.result) == (GroupAction.SUCCEED, WorkerState.SUCCEEDED)


def test_exit_143_spends_a_restart_as_in_torch() -> None:
    sigterm = WorkerExit(local_rank=0, exit_code=143, time=0.0)
    d = decide(WorkerState.HEALTHY, Outcome.of_exits((sigterm,), 2), 3)
    assert (d.action, d.spent, d.remaining) == (GroupAction.RESTART, True, 2)
