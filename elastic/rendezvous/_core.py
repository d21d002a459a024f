"""The dynamic rendezvous, as pure decisions: no store, no clock, no I/O.

Rules that keep it that way
---------------------------
* Nothing here awaits, reads a clock or touches a store.  Time comes in as ``now``.
* Decisions are returned, never performed: the async driver (``dynamic.py``) does the
  store operations and feeds what it learns back in.
* A transition missing from the table is illegal: it raises
  :class:`IllegalTransition` and leaves the state unchanged (transitions are checked
  before anything is mutated).

Theory of operation
-------------------
A rendezvous goes through *rounds*.  A round is ``OPEN`` while nodes join, ``COMPLETE``
once its members and ranks are fixed, and the whole rendezvous is ``CLOSED`` for good
by :meth:`Rendezvous.close`.  The rules are torch's (``dynamic_rendezvous.py``):

* an open round completes at once when ``max_nodes`` have joined, or when at least
  ``min_nodes`` have joined and the *last-call deadline* has passed; the deadline is set
  ``last_call_timeout`` after the count reached ``min_nodes`` and cleared when the count
  drops below it again; completing is an act of a live joiner (torch: a participant
  marks the round complete), so a round whose joiners all crashed waits for a live one;
* a decision that falls due and cannot be made yet (a full round holding a pending
  seat, or fewer than ``min_nodes`` joiners when the last call ended) is held by one
  joiner, the *decider* (``decider``; which live joiner is a race in the driver, so the
  caller names it): while the decider is crashed the round waits, and when its lease
  expires (:meth:`Rendezvous.leave`) the decision passes to a live joiner at once;
* a node arriving at a complete round goes to the *wait list* if the round has room
  (fewer than ``max_nodes`` members; members then see ``nodes_waiting`` and restart), or
  else to the *redundancy list*, where it waits without a deadline for a place to free;
* a member asking for a new round (its group restarts), or a member's lease expiring,
  opens the next round; every live member, waiting and redundant node joins it at once;
* a node that crashed (:meth:`Rendezvous.crash`) stops acting at once — it joins no
  further round — but what it wrote stays until its lease expires (:meth:`Rendezvous.leave`):
  until then it still counts where it had joined, as its leased keys do in the store;
  a crashed node that the next round expects (a member, waiting or redundant node of the
  round that ended) is *pending* there until its lease expires: nobody can tell it from
  a live node that has not rejoined yet, so its seat is kept (see the rank rule);
* a node joining (a new incarnation after its old lease expired) is alive again;
* a node that joined an open round and is not in a complete one ``join_timeout`` later
  times out.

Two functions are shared with the distributed driver, so what the property tests pin
here is what the driver decides: :func:`choose_members` (who is admitted and in which
rank order, and whether a pending node's seat holds the round) and :func:`arrival_role`
(wait list or redundancy list).  The driver keeps the last-call deadline in the store
(a key on a lease of ``last_call_timeout`` that nobody renews), so it belongs to the
round, as here, and not to a joiner.

Rank rule: ranks are the members sorted by node id.  Same membership ⇒ same ranks, in
every round, on every node, with no history needed.  When more live nodes want in than
``max_nodes``, the members of the previous round are admitted first (a hot spare never
evicts a healthy member; a member lost in that round is one of them, should it come
back), then the others by node id; and while a node the round expects
is pending, a round that is full without it waits for it (it rejoins, or its lease
expires) if it would take one of the seats.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence

from elastic._records import Frozen, Record, set_fields

__all__ = [
    "Action",
    "ActionKind",
    "CoreSettings",
    "Trigger",
    "IllegalTransition",
    "NodeStatus",
    "Phase",
    "Rendezvous",
    "arrival_role",
    "choose_members",
]


class CoreSettings(Frozen):
    """The numbers the decisions depend on (seconds)."""

    __slots__ = ("join_timeout", "last_call_timeout", "max_nodes", "min_nodes")
    min_nodes: int
    max_nodes: int
    last_call_timeout: float
    join_timeout: float

    def __init__(
        self,
        min_nodes: int,
        max_nodes: int,
        last_call_timeout: float = 30.0,
        join_timeout: float = 600.0,
    ) -> None:
        if min_nodes < 1 or max_nodes < min_nodes:
            raise ValueError(f"need 1 <= min_nodes <= max_nodes, got {min_nodes}..{max_nodes}")
        set_fields(self, "min_nodes", min_nodes)
        set_fields(self, "max_nodes", max_nodes)
        set_fields(self, "last_call_timeout", last_call_timeout)
        set_fields(self, "join_timeout", join_timeout)


class Phase(enum.Enum):
    OPEN = "open"
    COMPLETE = "complete"
    CLOSED = "closed"


class NodeStatus(enum.Enum):
    ABSENT = "absent"
    JOINED = "joined"  # in the open round, not yet admitted
    PENDING = "pending"  # expected in the open round, crashed, lease not yet expired
    MEMBER = "member"  # admitted to the complete round
    WAITING = "waiting"  # wait list of the complete round (it has room)
    REDUNDANT = "redundant"  # redundancy list (the round is full)


class Trigger(enum.Enum):
    """What happens to a rendezvous: the input of one transition of the tables below."""

    JOIN = "join"  # a node calls next_rendezvous
    LEAVE = "leave"  # a node leaves gracefully, or its lease expired
    TICK = "tick"  # time passed
    CLOSE = "close"  # set_closed


class ActionKind(enum.Enum):
    JOINED = "joined"
    DEADLINE_SET = "deadline_set"
    DEADLINE_CLEARED = "deadline_cleared"
    COMPLETED = "completed"
    ROUND_OPENED = "round_opened"
    WAITING = "waiting"
    REDUNDANT = "redundant"
    PEER_LOST = "peer_lost"
    REMOVED = "removed"
    TIMED_OUT = "timed_out"
    CLOSED = "closed"
    ERROR_CLOSED = "error_closed"
    GRACEFUL_EXIT = "graceful_exit"


class Action(Frozen):
    """A decision for the caller: what happened and to whom."""

    __slots__ = ("at", "kind", "members", "node", "round")
    kind: ActionKind
    node: str | None
    round: int
    members: tuple[str, ...]
    at: float | None

    def __init__(
        self,
        kind: ActionKind,
        node: str | None = None,
        round: int = 0,
        members: tuple[str, ...] = (),
        at: float | None = None,
    ) -> None:
        set_fields(self, "kind", kind)
        set_fields(self, "node", node)
        set_fields(self, "round", round)
        set_fields(self, "members", members)
        set_fields(self, "at", at)


class IllegalTransition(RuntimeError):
    """An event that the current state does not allow; the state was not changed."""

    def __init__(self, phase: Phase, status: NodeStatus | None, event: Trigger, node: str | None):
        super().__init__(phase, status, event, node)
        self.phase, self.status, self.event, self.node = phase, status, event, node

    def __str__(self) -> str:
        who = f" by node {self.node!r} ({self.status.value})" if self.status else ""
        phase = self.phase.value
        return f"illegal rendezvous transition: {self.event.value}{who} in a {phase} round"


# -- decisions shared with the distributed driver ---------------------------------------


def choose_members(
    live: Iterable[str],
    previous: Sequence[str],
    settings: CoreSettings,
    *,
    last_call_passed: bool,
    pending: Iterable[str] = (),
) -> tuple[str, ...] | None:
    """The members of a round, in rank order, or ``None`` if it must not complete yet.

    Completes with ``max_nodes`` members as soon as that many are live; with every live
    node (at least ``min_nodes``) once the last call passed.  Previous members are
    admitted first, then the others by node id; ranks are the admitted sorted by id.
    ``pending`` are nodes the round expects that have not joined (they may be alive):
    a full round waits while one of them would take a seat.
    """
    nodes = set(live)
    if len(nodes) < settings.min_nodes:
        return None
    if len(nodes) < settings.max_nodes and not last_call_passed:
        return None
    prev_set = set(previous)
    waiting_for = set(pending) - nodes
    ordered = sorted(prev_set & (nodes | waiting_for)) + sorted((nodes | waiting_for) - prev_set)
    if len(nodes) >= settings.max_nodes and waiting_for & set(ordered[: settings.max_nodes]):
        return None
    return tuple(sorted([n for n in ordered if n in nodes][: settings.max_nodes]))


def arrival_role(members: int, settings: CoreSettings) -> NodeStatus:
    """Where a node arriving at a complete round of ``members`` goes."""
    return NodeStatus.WAITING if members < settings.max_nodes else NodeStatus.REDUNDANT


# -- the reference state machine ------------------------------------------------------


class Rendezvous(Record):
    """The whole rendezvous as one state machine (the semantics the driver implements).

    Feed it events with :meth:`join`, :meth:`leave`, :meth:`tick` and :meth:`close`; each
    returns the actions that follow.  ``joined`` maps a node of the open round to the
    time it joined (for ``join_timeout``).
    """

    __slots__ = (
        "closed_round_phase",
        "crashed",
        "deadline",
        "decider",
        "joined",
        "members",
        "pending",
        "phase",
        "previous",
        "redundancy_list",
        "round",
        "settings",
        "wait_list",
    )
    settings: CoreSettings
    round: int
    phase: Phase
    joined: dict[str, float]
    members: tuple[str, ...]
    previous: tuple[str, ...]
    wait_list: set[str]
    redundancy_list: set[str]
    deadline: float | None
    closed_round_phase: Phase | None
    crashed: set[str]
    pending: set[str]
    decider: str | None

    def __init__(
        self,
        settings: CoreSettings,
        round: int = 0,
        phase: Phase = Phase.OPEN,
        joined: dict[str, float] | None = None,
        members: tuple[str, ...] = (),
        previous: tuple[str, ...] = (),
        wait_list: set[str] | None = None,
        redundancy_list: set[str] | None = None,
        deadline: float | None = None,
        closed_round_phase: Phase | None = None,
        crashed: set[str] | None = None,
        pending: set[str] | None = None,
        decider: str | None = None,
    ) -> None:
        self.settings = settings
        self.round = round
        self.phase = phase
        self.joined = {} if joined is None else joined
        self.members = members
        self.previous = previous
        self.wait_list = set() if wait_list is None else wait_list
        self.redundancy_list = set() if redundancy_list is None else redundancy_list
        self.deadline = deadline
        self.closed_round_phase = closed_round_phase
        self.crashed = set() if crashed is None else crashed
        self.pending = set() if pending is None else pending
        self.decider = decider

    def status(self, node: str) -> NodeStatus:
        if node in self.joined:
            return NodeStatus.JOINED
        if node in self.pending:
            return NodeStatus.PENDING
        if node in self.wait_list:
            return NodeStatus.WAITING
        if node in self.redundancy_list:
            return NodeStatus.REDUNDANT
        if node in self.members and self.phase is not Phase.OPEN:
            return NodeStatus.MEMBER
        return NodeStatus.ABSENT

    # -- public events ----------------------------------------------------------------
    def join(self, node: str, now: float) -> list[Action]:
        return self._node_event(Trigger.JOIN, node, now)

    def leave(self, node: str, now: float) -> list[Action]:
        """``node`` left gracefully or its lease expired."""
        return self._node_event(Trigger.LEAVE, node, now)

    def crash(self, node: str, now: float) -> list[Action]:
        """``node`` died: it acts no more; its entries stay until :meth:`leave` (expiry)."""
        self.crashed.add(node)
        return []

    def tick(self, now: float) -> list[Action]:
        return _GLOBAL[(self.phase, Trigger.TICK)](self, now)

    def close(self, now: float) -> list[Action]:
        return _GLOBAL[(self.phase, Trigger.CLOSE)](self, now)

    def _node_event(self, event: Trigger, node: str, now: float) -> list[Action]:
        status = self.status(node)
        handler = _TABLE.get((self.phase, status, event))
        if handler is None:
            raise IllegalTransition(self.phase, status, event, node)
        if event is Trigger.LEAVE and node == self.decider:
            self.decider = None  # its claim expires with its lease: another takes over
        if event is Trigger.JOIN:
            # a node that joins is alive: a new incarnation after its old lease expired
            self.crashed.discard(node)
        out = handler(self, node, now)
        if event is Trigger.LEAVE:
            self.crashed.discard(node)  # gone for good: a new incarnation may join
        return out

    # -- transitions (only called through the tables) -------------------------------
    def _add(self, node: str, now: float) -> list[Action]:
        return self._add_all([node], now) + self._maybe_complete(now)

    def _add_all(self, nodes: Iterable[str], now: float) -> list[Action]:
        out = []
        for node in nodes:
            self.pending.discard(node)
            self.joined[node] = now
            out.append(Action(ActionKind.JOINED, node, self.round))
        if len(self.joined) >= self.settings.min_nodes and self.deadline is None:
            self.deadline = now + self.settings.last_call_timeout
            out.append(Action(ActionKind.DEADLINE_SET, round=self.round, at=self.deadline))
        return out

    def _maybe_complete(self, now: float) -> list[Action]:
        if not self.joined.keys() - self.crashed:
            return []  # completing is an act: no live joiner, nobody to do it
        if self.decider in self.crashed:
            return []  # the decider died holding the decision: it waits for its expiry
        passed = self.deadline is not None and now >= self.deadline
        chosen = choose_members(
            self.joined, self.previous, self.settings, last_call_passed=passed, pending=self.pending
        )
        if chosen is None:
            return []
        left_out = sorted(set(self.joined) - set(chosen))
        self.phase = Phase.COMPLETE
        self.members = chosen
        self.deadline = None
        self.joined = {}
        self.pending = set()
        self.decider = None
        out = [Action(ActionKind.COMPLETED, round=self.round, members=chosen)]
        for n in left_out:
            out += self._arrive_late(n, now)
        return out

    def _remove_joined(self, node: str, now: float) -> list[Action]:
        del self.joined[node]
        out = [Action(ActionKind.REMOVED, node, self.round)]
        if len(self.joined) < self.settings.min_nodes and self.deadline is not None:
            self.deadline = None
            out.append(Action(ActionKind.DEADLINE_CLEARED, round=self.round))
        return out

    def _leave_joined(self, node: str, now: float) -> list[Action]:
        # fewer joiners may unblock a full round that waited for a pending seat
        return self._remove_joined(node, now) + self._maybe_complete(now)

    def _arrive_late(self, node: str, now: float) -> list[Action]:
        if arrival_role(len(self.members), self.settings) is NodeStatus.WAITING:
            self.wait_list.add(node)
            return [Action(ActionKind.WAITING, node, self.round)]
        self.redundancy_list.add(node)
        return [Action(ActionKind.REDUNDANT, node, self.round)]

    def _open_next(self, now: float, rejoining: Iterable[str]) -> list[Action]:
        """The complete round ends; everyone still interested joins the next one, at once.

        The crashed among them are pending until their leases expire.
        """
        expected = set(rejoining) | self.wait_list | self.redundancy_list
        self.previous = self.members
        self.round += 1
        self.phase = Phase.OPEN
        self.members = ()
        self.wait_list = set()
        self.redundancy_list = set()
        self.deadline = None
        self.decider = None
        self.pending = expected & self.crashed
        out = [Action(ActionKind.ROUND_OPENED, round=self.round)]
        out += self._add_all(sorted(expected - self.crashed), now)
        return out + self._maybe_complete(now)

    def _member_restarts(self, node: str, now: float) -> list[Action]:
        return self._open_next(now, self.members)

    def _member_lost(self, node: str, now: float) -> list[Action]:
        # the lost member stays a *previous* member of the next round: if it comes back
        # (a new incarnation) it is admitted first, as the round's result still lists it
        survivors = [m for m in self.members if m != node]
        lost = Action(ActionKind.PEER_LOST, node, self.round)
        return [lost, *self._open_next(now, survivors)]

    def _unpend(self, node: str, now: float) -> list[Action]:
        self.pending.discard(node)
        return [Action(ActionKind.REMOVED, node, self.round), *self._maybe_complete(now)]

    def _unlist(self, node: str, now: float) -> list[Action]:
        self.wait_list.discard(node)
        self.redundancy_list.discard(node)
        return [Action(ActionKind.REMOVED, node, self.round)]

    def _closed_join(self, node: str, now: float) -> list[Action]:
        kind = ActionKind.GRACEFUL_EXIT if node in self.redundancy_list else ActionKind.ERROR_CLOSED
        return [Action(kind, node, self.round)]

    def _closed_leave(self, node: str, now: float) -> list[Action]:
        self.joined.pop(node, None)
        self.pending.discard(node)
        self.wait_list.discard(node)
        self.redundancy_list.discard(node)
        return [Action(ActionKind.REMOVED, node, self.round)]

    def _tick_open(self, now: float) -> list[Action]:
        out: list[Action] = []
        for n in sorted(self.joined):
            if now >= self.joined[n] + self.settings.join_timeout:
                out.append(Action(ActionKind.TIMED_OUT, n, self.round))
                out += self._remove_joined(n, now)[1:]
        return out + self._maybe_complete(now)

    def _noop(self, now: float) -> list[Action]:
        return []

    def _close(self, now: float) -> list[Action]:
        self.closed_round_phase = self.phase
        self.phase = Phase.CLOSED
        self.deadline = None
        return [Action(ActionKind.CLOSED, round=self.round)]


_NodeHandler = Callable[[Rendezvous, str, float], list[Action]]
_GlobalHandler = Callable[[Rendezvous, float], list[Action]]

# (phase, status of the node, event) -> transition.  Anything else is illegal.
_TABLE: dict[tuple[Phase, NodeStatus, Trigger], _NodeHandler] = {
    (Phase.OPEN, NodeStatus.ABSENT, Trigger.JOIN): Rendezvous._add,
    (Phase.OPEN, NodeStatus.JOINED, Trigger.LEAVE): Rendezvous._leave_joined,
    (Phase.OPEN, NodeStatus.PENDING, Trigger.JOIN): Rendezvous._add,
    (Phase.OPEN, NodeStatus.PENDING, Trigger.LEAVE): Rendezvous._unpend,
    (Phase.COMPLETE, NodeStatus.ABSENT, Trigger.JOIN): Rendezvous._arrive_late,
    (Phase.COMPLETE, NodeStatus.MEMBER, Trigger.JOIN): Rendezvous._member_restarts,
    (Phase.COMPLETE, NodeStatus.MEMBER, Trigger.LEAVE): Rendezvous._member_lost,
    (Phase.COMPLETE, NodeStatus.WAITING, Trigger.LEAVE): Rendezvous._unlist,
    (Phase.COMPLETE, NodeStatus.REDUNDANT, Trigger.LEAVE): Rendezvous._unlist,
    **{(Phase.CLOSED, s, Trigger.JOIN): Rendezvous._closed_join for s in NodeStatus},
    **{(Phase.CLOSED, s, Trigger.LEAVE): Rendezvous._closed_leave for s in NodeStatus},
}

_GLOBAL: dict[tuple[Phase, Trigger], _GlobalHandler] = {
    (Phase.OPEN, Trigger.TICK): Rendezvous._tick_open,
    (Phase.COMPLETE, Trigger.TICK): Rendezvous._noop,
    (Phase.CLOSED, Trigger.TICK): Rendezvous._noop,
    (Phase.OPEN, Trigger.CLOSE): Rendezvous._close,
    (Phase.COMPLETE, Trigger.CLOSE): Rendezvous._close,
    (Phase.CLOSED, Trigger.CLOSE): Rendezvous._noop,
}
