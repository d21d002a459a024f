"""Property tests of the pure rendezvous core: safety invariants after every step, and liveness."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from elastic.rendezvous._core import (
    ActionKind,
    CoreSettings,
    IllegalTransition,
    NodeStatus,
    Phase,
    Rendezvous,
    Trigger,
    choose_members,
)

NODES = [f"n{i}" for i in range(8)]
TTL = 15.0
LAST_CALL = 30.0
JOIN = 600.0


class RendezvousMachine(RuleBasedStateMachine):
    """Joins, leaves, crashes (lease expiry ``TTL`` later), time and close, in any order."""

    def __init__(self) -> None:
        super().__init__()
        self.rdzv: Rendezvous | None = None
        self.now = 0.0
        self.dying: dict[str, float] = {}  # crashed node -> when its lease expires
        self.dead: set[str] = set()
        self.completions: dict[int, tuple[str, ...]] = {}
        self.was_closed = False

    @initialize(lo=st.integers(1, 3), extra=st.integers(0, 3))
    def setup(self, lo: int, extra: int) -> None:
        self.rdzv = Rendezvous(CoreSettings(lo, lo + extra, LAST_CALL, JOIN))

    @property
    def r(self) -> Rendezvous:
        assert self.rdzv is not None
        return self.rdzv

    def _record(self, actions: list[object]) -> None:
        for a in actions:
            kind = getattr(a, "kind", None)
            if kind is ActionKind.COMPLETED:
                rnd, members = a.round, a.members  # type: ignore[attr-defined]
                assert rnd not in self.completions, f"round {rnd} completed twice"
                self.completions[rnd] = members

    def _acting(self) -> list[str]:
        return [n for n in NODES if n not in self.dying and n not in self.dead]

    # -- rules ------------------------------------------------------------------------
    @rule(data=st.data())
    def join(self, data: st.DataObject) -> None:
        allowed = {NodeStatus.ABSENT, NodeStatus.MEMBER}
        if self.r.phase is Phase.CLOSED:
            allowed = set(NodeStatus)
        nodes = [n for n in self._acting() if self.r.status(n) in allowed]
        if not nodes:
            return
        node = data.draw(st.sampled_from(nodes))
        actions = self.r.join(node, self.now)
        self._record(actions)
        if self.r.phase is Phase.CLOSED:
            assert {a.kind for a in actions} <= {ActionKind.ERROR_CLOSED, ActionKind.GRACEFUL_EXIT}

    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        nodes = [n for n in self._acting() if self.r.status(n) is not NodeStatus.ABSENT]
        if not nodes:
            return
        node = data.draw(st.sampled_from(nodes))
        self._record(self.r.leave(node, self.now))
        self.dead.add(node)  # a node that left stays away: ids are not reused

    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        nodes = self._acting()
        if not nodes:
            return
        node = data.draw(st.sampled_from(nodes))
        self.dying[node] = self.now + TTL

    @rule(dt=st.sampled_from([0.0, 1.0, 5.0, 14.0, 29.0, 31.0, 100.0, 700.0]))
    def advance(self, dt: float) -> None:
        self._advance_to(self.now + dt)

    def _advance_to(self, t: float) -> None:
        for node, at in sorted(self.dying.items(), key=lambda kv: (kv[1], kv[0])):
            if at > t:
                continue
            del self.dying[node]
            self.dead.add(node)
            self.now = max(self.now, at)
            self._record(self.r.tick(self.now))
            if self.r.status(node) is not NodeStatus.ABSENT:
                self._record(self.r.leave(node, self.now))
        self.now = t
        self._record(self.r.tick(self.now))

    @precondition(lambda self: self.rdzv is not None)
    @rule()
    def close(self) -> None:
        self._record(self.r.close(self.now))
        self.was_closed = True

    @rule(node=st.sampled_from(NODES), event=st.sampled_from([Trigger.JOIN, Trigger.LEAVE]))
    def illegal_transitions_raise_and_change_nothing(self, node: str, event: Trigger) -> None:
        status = self.r.status(node)
        legal = {
            (Phase.OPEN, NodeStatus.ABSENT, Trigger.JOIN),
            (Phase.OPEN, NodeStatus.JOINED, Trigger.LEAVE),
            (Phase.COMPLETE, NodeStatus.ABSENT, Trigger.JOIN),
            (Phase.COMPLETE, NodeStatus.MEMBER, Trigger.JOIN),
            (Phase.COMPLETE, NodeStatus.MEMBER, Trigger.LEAVE),
            (Phase.COMPLETE, NodeStatus.WAITING, Trigger.LEAVE),
            (Phase.COMPLETE, NodeStatus.REDUNDANT, Trigger.LEAVE),
        }
        if self.r.phase is Phase.CLOSED or (self.r.phase, status, event) in legal:
            return
        before = copy.deepcopy(self.r)
        with pytest.raises(IllegalTransition):
            if event is Trigger.JOIN:
                self.r.join(node, self.now)
            else:
                self.r.leave(node, self.now)
        assert self.r == before

    @precondition(lambda self: self.rdzv is not None)
    @rule()
    def faults_stop_then_a_round_completes_within_join_timeout(self) -> None:
        """Liveness: with faults over and >= min_nodes live, a round completes in time."""
        if self.r.phase is Phase.CLOSED:
            return
        self._advance_to(self.now + TTL)  # every pending crash has expired
        live = self._acting()
        if len(live) < self.r.settings.min_nodes:
            return
        start = self.now
        for n in live:
            if self.r.status(n) is NodeStatus.ABSENT:
                self._record(self.r.join(n, self.now))
        if self.r.phase is Phase.OPEN:
            self._advance_to(self.now + LAST_CALL)
        assert self.r.phase is Phase.COMPLETE
        assert self.now - start <= JOIN
        assert set(self.r.members) <= set(live)
        for n in live:  # every live node is in the round or parked beside it
            assert self.r.status(n) in {
                NodeStatus.MEMBER,
                NodeStatus.WAITING,
                NodeStatus.REDUNDANT,
            }

    # -- invariants ---------------------------------------------------------------------
    @invariant()
    def completed_rounds_have_one_valid_membership(self) -> None:
        if self.rdzv is None:
            return
        s = self.r.settings
        for members in self.completions.values():
            assert s.min_nodes <= len(members) <= s.max_nodes
            assert len(set(members)) == len(members)  # ranks unique ...
            assert members == tuple(sorted(members))  # ... and given by node id, 0..n-1
        if self.r.phase is Phase.COMPLETE:
            assert self.completions[self.r.round] == self.r.members

    @invariant()
    def no_node_in_two_lists(self) -> None:
        if self.rdzv is None:
            return
        members = set(self.r.members) if self.r.phase is not Phase.OPEN else set()
        lists = [set(self.r.joined), self.r.wait_list, self.r.redundancy_list, members]
        for i, a in enumerate(lists):
            for b in lists[i + 1 :]:
                assert not (a & b), (a, b)

    @invariant()
    def closed_stays_closed(self) -> None:
        if self.was_closed:
            assert self.r.phase is Phase.CLOSED

    @invariant()
    def open_round_deadline_follows_the_count(self) -> None:
        if self.rdzv is None or self.r.phase is not Phase.OPEN:
            return
        assert len(self.r.joined) < self.r.settings.max_nodes
        if len(self.r.joined) >= self.r.settings.min_nodes:
            assert self.r.deadline is not None
        else:
            assert self.r.deadline is None

    @invariant()
    def wait_list_only_when_round_has_room(self) -> None:
        if self.rdzv is None or self.r.phase is not Phase.COMPLETE:
            return
        if self.r.wait_list:
            assert len(self.r.members) < self.r.settings.max_nodes


RendezvousMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestRendezvousCore = RendezvousMachine.TestCase


# -- the shared decisions, pinned directly ------------------------------------------


def test_round_completes_at_once_when_max_nodes_joined() -> None:
    r = Rendezvous(CoreSettings(2, 3))
    r.join("a", 0.0)
    r.join("b", 1.0)
    assert r.phase is Phase.OPEN and r.deadline == 31.0
    r.join("c", 2.0)
    assert r.phase is Phase.COMPLETE and r.members == ("a", "b", "c")


def test_round_completes_after_last_call_with_min_nodes() -> None:
    r = Rendezvous(CoreSettings(2, 4))
    r.join("b", 0.0)
    r.join("a", 5.0)
    assert r.tick(34.9) == [] and r.phase is Phase.OPEN
    actions = r.tick(35.0)
    assert actions[-1].kind is ActionKind.COMPLETED and actions[-1].members == ("a", "b")


def test_dropping_below_min_clears_the_deadline_and_reaching_it_sets_a_new_one() -> None:
    r = Rendezvous(CoreSettings(2, 4))
    r.join("a", 0.0)
    r.join("b", 0.0)
    r.leave("b", 10.0)
    assert r.deadline is None
    r.join("c", 20.0)
    assert r.deadline == 50.0


def test_late_arrival_waits_if_the_round_has_room_else_is_redundant() -> None:
    r = Rendezvous(CoreSettings(1, 2))
    r.join("a", 0.0)
    r.tick(30.0)
    assert [a.kind for a in r.join("b", 31.0)] == [ActionKind.WAITING]
    full = Rendezvous(CoreSettings(1, 1))
    full.join("a", 0.0)
    assert [a.kind for a in full.join("b", 1.0)] == [ActionKind.REDUNDANT]


def test_closed_rendezvous_gives_redundant_nodes_a_graceful_exit() -> None:
    r = Rendezvous(CoreSettings(1, 1))
    r.join("a", 0.0)
    r.join("b", 0.0)
    r.close(1.0)
    assert [a.kind for a in r.join("b", 2.0)] == [ActionKind.GRACEFUL_EXIT]
    assert [a.kind for a in r.join("c", 2.0)] == [ActionKind.ERROR_CLOSED]


def test_member_death_opens_a_round_and_a_spare_takes_the_place() -> None:
    r = Rendezvous(CoreSettings(2, 2))
    r.join("a", 0.0)
    r.join("b", 0.0)
    r.join("c", 0.0)  # redundant
    actions = r.leave("a", 20.0)
    assert actions[0].kind is ActionKind.PEER_LOST
    assert r.phase is Phase.COMPLETE and r.members == ("b", "c") and r.round == 1


def test_previous_members_are_admitted_before_spares() -> None:
    s = CoreSettings(1, 2)
    got = choose_members(["a", "x", "y"], ["y", "x"], s, last_call_passed=False)
    assert got == ("x", "y")
    assert choose_members(["a", "x", "y"], [], s, last_call_passed=False) == ("a", "x")


def test_same_membership_gives_same_ranks_whatever_the_arrival_order() -> None:
    s = CoreSettings(3, 3)
    assert choose_members(["c", "a", "b"], [], s, last_call_passed=False) == ("a", "b", "c")
    assert choose_members(["b", "c", "a"], ["c"], s, last_call_passed=False) == ("a", "b", "c")


def test_a_pending_node_keeps_its_seat_in_a_full_round() -> None:
    s = CoreSettings(1, 2)
    # x was a member; its seat is kept while it may still rejoin
    assert choose_members(["a", "y"], ["x", "y"], s, last_call_passed=True, pending=["x"]) is None
    # a pending node that would not get a seat holds nothing
    assert choose_members(["x", "y"], ["x", "y"], s, last_call_passed=False, pending=["a"]) == (
        "x",
        "y",
    )
    # below max_nodes the last call admits who joined; the pending node comes late
    assert choose_members(["y"], ["x", "y"], s, last_call_passed=True, pending=["x"]) == ("y",)


def test_a_crashed_member_is_pending_in_the_next_round_until_its_lease_expires() -> None:
    r = Rendezvous(CoreSettings(1, 2, last_call_timeout=30.0))
    r.join("a", 0.0)
    r.join("b", 0.0)  # full: complete
    r.join("c", 1.0)  # redundant
    r.crash("b", 2.0)
    r.join("a", 3.0)  # a restarts its group: a, c join; b is pending, its seat kept
    assert r.phase is Phase.OPEN and r.status("b") is NodeStatus.PENDING
    assert sorted(r.joined) == ["a", "c"]
    actions = r.leave("b", 17.5)  # b's lease expires: the spare takes its seat
    assert actions[-1].kind is ActionKind.COMPLETED and actions[-1].members == ("a", "c")
    r.join("b", 20.0)  # a new incarnation of b: alive again, redundant
    assert r.status("b") is NodeStatus.REDUNDANT and "b" not in r.crashed


def test_illegal_transition_names_the_event_node_and_phase() -> None:
    r = Rendezvous(CoreSettings(1, 2))
    r.join("a", 0.0)
    with pytest.raises(IllegalTransition, match=r"join by node 'a' \(joined\) in a open round"):
        r.join("a", 0.0)
