"""The agent's decisions, as a pure function: what an outcome does to the worker group.

Rules that keep it that way
---------------------------
* Nothing here awaits, reads a clock, touches a store or emits an event.  The facts come
  in (the group's state, the outcome, the remaining restart budget); a :class:`Decision`
  comes out.  The driver (``SimpleElasticAgent._invoke_run`` and ``_rendezvous``) only
  awaits the outcome, calls :func:`decide` and applies the decision.
* A (state, outcome) pair missing from the table is illegal: :func:`decide` raises
  :class:`IllegalDecision` and decides nothing.
* Whether a failure spends the budget is decided in one place (:func:`_spend_or_stop`),
  for every kind of outcome.

Theory of operation
-------------------
The agent watches a running group (state ``HEALTHY``) for the first of four
:class:`OutcomeKind` s:

``EXITS``
    the exits of the group's workers seen so far (all of them, in the order seen, each
    with its exit code and :class:`~elastic.workers.ExitCause`), and the group's size;
``HEALTH``
    a health watch's verdict (NVML, a hang, …), with its reason;
``MEMBERSHIP``
    the rendezvous changed (a node joined, left, or its lease expired), with its reason;
    the reason ``"closed"`` means the rendezvous was closed for good, and
    ``"closed_after_success"`` that it was closed after a peer of the round reached the
    exit barrier (the driver reads that fact from the round's store before deciding);
``TIMEOUT``
    waiting for the round's peers timed out (the rank exchange); only while no group runs.

The table, by whether a group is running (``HEALTHY``/``UNHEALTHY``) and the kind:

=============  ============  ===========================================================
running        outcome       decision
=============  ============  ===========================================================
yes            EXITS         no failure and some worker still running → ``WAIT``;
                             every worker exited 0 → ``SUCCEED`` (state ``SUCCEEDED``);
                             any failure → state ``FAILED``, then *spend or stop*
                             (reason ``failure``), every failed exit recorded
yes            HEALTH        state ``UNHEALTHY``, notice ``agent.unhealthy``, then
                             *spend or stop* (reason ``unhealthy``); stopping finishes
                             with result ``UNHEALTHY`` (torch's value), group ``FAILED``
yes            MEMBERSHIP    ``"closed"`` → ``CLOSE`` (stop, finish ``FAILED``);
                             ``"closed_after_success"`` → notice
                             ``agent.rendezvous_closed`` and ``DETACH`` (the workers
                             run on; their exits decide, as in torch); else notice
                             ``agent.membership_change`` and ``RESTART`` without
                             spending (reason ``membership``)
no             MEMBERSHIP    notice ``agent.membership_change``, ``REJOIN`` (no spend);
                             even ``"closed"``: the next rendezvous then raises
                             ``RendezvousClosedError`` and the agent finishes ``FAILED``
no             TIMEOUT       notice ``agent.membership_change`` (reason
                             ``rank_exchange_timeout``), ``REJOIN`` (no spend)
=============  ============  ===========================================================

*Spend or stop*: a failure whose every failed exit has a code in
:data:`FREE_EXIT_CODES` restarts without spending; otherwise, with budget left, one
restart is spent (``RESTART``, budget - 1); with none left the agent stops the group
(reason ``restarts_exhausted``) and finishes (``FAIL``).

Guarantees (pinned by ``tests/test_decide.py`` over generated outcomes and budgets):
the budget never goes below zero and only a spending ``RESTART`` lowers it, by exactly
one; ``SUCCEED`` only when every worker of the group exited 0; a membership change or a
timeout never spends; an exhausted budget ends ``FAIL`` with every failed exit recorded;
a closed rendezvous never stops a group after a peer succeeded (``DETACH``).

What each action asks of the driver:

* ``WAIT``: keep waiting for the next exit;
* ``SUCCEED``: exit barrier, then finish with the workers' return values;
* ``RESTART``: stop the group (``reason``), start a new one after a new rendezvous;
* ``REJOIN``: no group runs: join the next round;
* ``FAIL``: stop the group (``reason``), record the other workers' failures, finish with
  ``result``;
* ``CLOSE``: stop the group (``reason``), emit ``agent.rendezvous_closed``, finish ``FAILED``;
* ``DETACH``: keep the group running and stop watching the closed rendezvous: the next
  outcome can only be the workers' exits or a health verdict.  A peer that succeeded
  closed it (torch's launcher shuts the rendezvous down when its agent finishes, after
  the exit barrier, which may time out while this node's workers still run); stopping
  these workers would fail a job that is finishing.  If they fail now, the restart's
  rendezvous is refused (closed) and the agent finishes ``FAILED``, as torch's does.

Before any of these the driver sets the group's state to ``state`` (when not ``None``)
and emits ``notice`` (when not ``None``) with ``reason=detail``.
"""

from __future__ import annotations

import enum

from elastic._records import Frozen, slot_setters
from elastic.events import kinds
from elastic.workers import WorkerExit

__all__ = [
    "FREE_EXIT_CODES",
    "GroupAction",
    "Decision",
    "IllegalDecision",
    "Outcome",
    "OutcomeKind",
    "WorkerState",
    "decide",
    "settled",
]


class WorkerState(str, enum.Enum):
    """State of the WorkerGroup (torch's values)."""

    UNKNOWN = "UNKNOWN"
    INIT = "INIT"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    @staticmethod
    def is_running(state: WorkerState) -> bool:
        """True if the workers are still running (HEALTHY or UNHEALTHY)."""
        return state in {WorkerState.HEALTHY, WorkerState.UNHEALTHY}


#: Exit codes whose failure restarts the group without spending the restart budget
#: (torch has none: any failed exit spends one restart).
FREE_EXIT_CODES: frozenset[int] = frozenset()

CLOSED = kinds.MEMBERSHIP_CLOSED
CLOSED_AFTER_SUCCESS = kinds.MEMBERSHIP_CLOSED_AFTER_SUCCESS
RANK_EXCHANGE_TIMEOUT = kinds.RANK_EXCHANGE_TIMEOUT


class OutcomeKind(enum.Enum):
    EXITS = "exits"
    HEALTH = "health"
    MEMBERSHIP = "membership"
    TIMEOUT = "timeout"


class Outcome(Frozen):
    """What the agent learned: exits seen so far, a health verdict, a membership change
    or a timeout (see the module docstring)."""

    __slots__ = ("exits", "group_size", "kind", "reason")
    kind: OutcomeKind
    exits: tuple[WorkerExit, ...]
    group_size: int
    reason: str

    def __init__(
        self,
        kind: OutcomeKind,
        exits: tuple[WorkerExit, ...] = (),
        group_size: int = 0,
        reason: str = "",
    ) -> None:
        _o_kind(self, kind)
        _o_exits(self, exits)
        _o_group_size(self, group_size)
        _o_reason(self, reason)

    @classmethod
    def of_exits(cls, exits: tuple[WorkerExit, ...], group_size: int) -> Outcome:
        return cls(OutcomeKind.EXITS, exits, group_size)

    @classmethod
    def health(cls, reason: str) -> Outcome:
        return cls(OutcomeKind.HEALTH, reason=reason)

    @classmethod
    def membership(cls, reason: str) -> Outcome:
        return cls(OutcomeKind.MEMBERSHIP, reason=reason)

    @classmethod
    def timeout(cls, reason: str = RANK_EXCHANGE_TIMEOUT) -> Outcome:
        return cls(OutcomeKind.TIMEOUT, reason=reason)


# one outcome and one decision per node per job restart: the slots' setters directly
# (elastic._records.slot_setters)
_o_kind, _o_exits, _o_group_size, _o_reason = slot_setters(
    Outcome, "kind", "exits", "group_size", "reason"
)


class GroupAction(enum.Enum):
    WAIT = "wait"
    SUCCEED = "succeed"
    RESTART = "restart"
    REJOIN = "rejoin"
    FAIL = "fail"
    CLOSE = "close"
    DETACH = "detach"


class Decision(Frozen):
    """What to do about an outcome (see the module docstring for each action)."""

    __slots__ = (
        "action",
        "detail",
        "failed",
        "notice",
        "reason",
        "remaining",
        "result",
        "spent",
        "state",
    )
    action: GroupAction
    #: the group's state the outcome shows, set before acting (``None``: unchanged)
    state: WorkerState | None
    #: the event kind emitted before acting, with ``reason=detail`` (``None``: none)
    notice: str | None
    #: the restart's reason (``failure``/``unhealthy``/``membership``) or the stop's
    reason: str
    #: the outcome's own reason (health verdict, membership change), ``""`` for exits
    detail: str
    #: the restart budget after this decision
    remaining: int
    #: True if this decision spends one restart (``remaining`` is one less than before)
    spent: bool
    #: local ranks of the failed exits, in the order seen (the root cause first)
    failed: tuple[int, ...]
    #: the state of the run's result when the agent finishes (``None``: it goes on)
    result: WorkerState | None

    def __init__(
        self,
        action: GroupAction,
        state: WorkerState | None,
        notice: str | None,
        reason: str,
        detail: str,
        remaining: int,
        spent: bool = False,
        failed: tuple[int, ...] = (),
        result: WorkerState | None = None,
    ) -> None:
        _d_action(self, action)
        _d_state(self, state)
        _d_notice(self, notice)
        _d_reason(self, reason)
        _d_detail(self, detail)
        _d_remaining(self, remaining)
        _d_spent(self, spent)
        _d_failed(self, failed)
        _d_result(self, result)


(
    _d_action,
    _d_state,
    _d_notice,
    _d_reason,
    _d_detail,
    _d_remaining,
    _d_spent,
    _d_failed,
    _d_result,
) = slot_setters(
    Decision,
    "action",
    "state",
    "notice",
    "reason",
    "detail",
    "remaining",
    "spent",
    "failed",
    "result",
)


class IllegalDecision(RuntimeError):
    """An outcome the group's state does not allow (e.g. exits while no group runs)."""

    def __init__(self, state: WorkerState, kind: OutcomeKind) -> None:
        super().__init__(state, kind)
        self.state, self.kind = state, kind

    def __str__(self) -> str:
        return f"illegal agent outcome: {self.kind.value} while the group is {self.state.value}"


def settled(exits: tuple[WorkerExit, ...], group_size: int) -> bool:
    """True once the exits seen so far decide the group: a failure, or all exited."""
    return any(ex.failed for ex in exits) or len({ex.local_rank for ex in exits}) >= group_size


def _spend_or_stop(
    remaining: int,
    free: bool,
    state: WorkerState,
    notice: str | None,
    reason: str,
    detail: str,
    failed: tuple[int, ...],
    result: WorkerState,
) -> Decision:
    """The one place a failure spends a restart, restarts for free, or stops the agent."""
    if free:
        return Decision(
            GroupAction.RESTART, state, notice, reason, detail, remaining, False, failed
        )
    if remaining > 0:
        return Decision(
            GroupAction.RESTART, state, notice, reason, detail, remaining - 1, True, failed
        )
    return Decision(
        GroupAction.FAIL,
        state,
        notice,
        kinds.STOP_RESTARTS_EXHAUSTED,
        detail,
        remaining,
        False,
        failed,
        result,
    )


def _on_exits(outcome: Outcome, remaining: int) -> Decision:
    exits = outcome.exits
    if not settled(exits, outcome.group_size):
        return Decision(GroupAction.WAIT, None, None, "", "", remaining)
    failed = tuple(ex.local_rank for ex in exits if ex.failed)
    if not failed:
        return Decision(
            GroupAction.SUCCEED,
            WorkerState.SUCCEEDED,
            None,
            "",
            "",
            remaining,
            result=WorkerState.SUCCEEDED,
        )
    free = all(ex.exit_code in FREE_EXIT_CODES for ex in exits if ex.failed)
    return _spend_or_stop(
        remaining,
        free,
        WorkerState.FAILED,
        None,
        kinds.RESTART_FAILURE,
        "",
        failed,
        WorkerState.FAILED,
    )


def _on_health(outcome: Outcome, remaining: int) -> Decision:
    return _spend_or_stop(
        remaining,
        False,
        WorkerState.UNHEALTHY,
        kinds.AGENT_UNHEALTHY,
        kinds.RESTART_UNHEALTHY,
        outcome.reason,
        (),
        WorkerState.UNHEALTHY,
    )


def _on_membership(outcome: Outcome, remaining: int) -> Decision:
    if outcome.reason == CLOSED:
        return Decision(
            GroupAction.CLOSE,
            None,
            None,
            kinds.STOP_RENDEZVOUS_CLOSED,
            outcome.reason,
            remaining,
            result=WorkerState.FAILED,
        )
    if outcome.reason == CLOSED_AFTER_SUCCESS:
        return Decision(
            GroupAction.DETACH, None, kinds.AGENT_RENDEZVOUS_CLOSED, "", outcome.reason, remaining
        )
    return Decision(
        GroupAction.RESTART,
        None,
        kinds.AGENT_MEMBERSHIP_CHANGE,
        kinds.RESTART_MEMBERSHIP,
        outcome.reason,
        remaining,
    )


def _rejoin(outcome: Outcome, remaining: int) -> Decision:
    return Decision(
        GroupAction.REJOIN,
        None,
        kinds.AGENT_MEMBERSHIP_CHANGE,
        "membership",
        outcome.reason,
        remaining,
    )


#: (a group is running, outcome kind) → the rule; a pair not here is illegal
_TABLE = {
    (True, OutcomeKind.EXITS): _on_exits,
    (True, OutcomeKind.HEALTH): _on_health,
    (True, OutcomeKind.MEMBERSHIP): _on_membership,
    (False, OutcomeKind.MEMBERSHIP): _rejoin,
    (False, OutcomeKind.TIMEOUT): _rejoin,
}


#: ``_TABLE`` keyed by each kind's value
_BY_VALUE = {(running, kind._value_): rule for (running, kind), rule in _TABLE.items()}
_HEALTHY, _UNHEALTHY = WorkerState.HEALTHY, WorkerState.UNHEALTHY


def decide(state: WorkerState, outcome: Outcome, remaining: int) -> Decision:
    """The decision for ``outcome`` with the group in ``state`` and ``remaining`` restarts.

    Raises :class:`IllegalDecision` for an outcome the state does not allow, and
    ``ValueError`` for a negative budget.
    """
    if remaining < 0:
        raise ValueError(f"remaining restarts must be >= 0, got {remaining}")
    # Performance (once per node per job restart): a member is tested by identity and
    # the table read by the kind's value; hashing an enum member is a Python call
    running = state is _HEALTHY or state is _UNHEALTHY
    if not running and type(state) is not WorkerState:
        running = WorkerState.is_running(state)
    rule = _BY_VALUE.get((running, outcome.kind._value_))
    if rule is None:
        raise IllegalDecision(state, outcome.kind)
    return rule(outcome, remaining)
