"""The dynamic rendezvous (torch's ``c10d`` backend semantics) over the store port.

The rules are torch's and live in :mod:`elastic.rendezvous._core`; this module performs
them with store operations, awaiting only the clock and store ports.

Protocol (keys under ``elastic/rdzv/<run_id>/c/``)
---------------------------------------------------
* ``state`` — JSON ``{"version": 1, "round": r, "closed": bool}``, changed with
  ``compare_set`` only when a round ends (then with ``"by": node``, the node that ended
  it, so that only that node's ``compare_set`` gets its own value back) or the
  rendezvous closes.  Never per heartbeat.
* ``alive/<node>`` — attached to the node's lease: liveness without heartbeat writes.
* ``r<r>/m/<node>`` (leased) and ``r<r>/ev//n`` — joining round ``r`` is one ``arrive``
  where the store has it (:class:`~elastic.store.ArriveStore`: the ``add`` that gives
  the arrival index ``n``, the leased ``set`` and a count of the keys under ``m/``, as
  one operation — so every live key it counts is a joiner that came before, exactly,
  whatever is in flight: an arrival past ``min_nodes`` learns how many live joiners
  came before it in O(1), where reading every joiner's key made a round O(N^2) keys
  read).  A store without it (a network store host of an older version) gets the steps
  apart: one ``set`` and one ``add`` (with ``min_nodes < max_nodes`` the add comes
  first and the ``m/`` value is ``n``, so an arrival past ``min_nodes`` can count the
  live joiners before it with one read).  A joiner whose agent gave its member info
  (:meth:`DynamicRendezvousHandler.set_member_info`) writes JSON ``[n, role,
  local_world_size, port, addr]`` instead (``n`` = 0 where nobody reads it: an
  ``arrive``'s, or without a last call, where the key is written before the count;
  a joiner of an older version reading it counts such a joiner as arrived first), for
  the decider's rank blocks and
  rank 0's address: ``addr`` is the node's address and ``port`` the master port it would
  use if it were rank 0, by the rules rank 0 applied after the decision before
  (``--master-port`` if given, else the port chooser's — real mode: a free port — else
  :data:`DEFAULT_MASTER_PORT`), but chosen at the join: a free port may be taken in the
  longer window between the join and the workers' start, as it could before between the
  decision and the start.  The address is last: the decider parses the rest once for
  all the values equal without it, and decodes rank 0's address only.  (``[n, role,
  local_world_size]``, a joiner of another version's, is read too: no address.)
* ``state/r<r>/lc`` — round ``r``'s last call, running: set by the arrival that brings
  the live joiners to ``min_nodes``, on a lease of ``last_call_timeout`` that nobody
  renews, so the deadline is the round's (torch's ``state.deadline``) and the store ends
  it at one instant for everyone.  A drop below ``min_nodes`` clears it in effect: the
  arrival that brings the count back arms a new one.  The arrival that arms it writes
  it after its join, so a later arrival that counts ``min_nodes`` live joiners before
  it may find no ``lc`` key yet: it takes the last call as over only once it has seen
  it run, or a last call's length after its own arrival (a missing key is not an ended
  call; taking it so decided rounds at once with whoever had arrived).
* ``state/r<r>/dec`` — the round's one *decider*: the live joiner that won
  ``compare_set(None → node)`` when a decision fell due (the last call ended) or was
  held (a full round keeping a pending seat, or below ``min_nodes`` after the last
  call), attached to its lease by that same operation (``compare_set(lease=)``: a
  claim never exists without its owner's lease, even if the owner dies right after).
  Only it reads the joiners and decides; if it dies the key goes with its lease and
  the next live joiner takes it over, so a dead decider delays the round by at most its
  lease.
* ``state/r<r>/result`` — the members of round ``r`` in rank order, written once with
  ``compare_set(None → …)`` by the decider, or at once by the arrival that brings the
  live joiners to ``max_nodes``.  Before writing it the decider deletes the ``m/`` keys
  of the joiners it left out (all at once), so from then on ``r<r>/m/`` holds the
  members only, and records in it (``"clean"``) the store's revision after those
  deletes: the members watch the round from there, with no read first.  The winner of
  the result deletes round ``r - 1``'s result (read by round ``r``'s decider only).
  When every member's ``m/`` value (read with its key, in the same snapshot) carries
  its role and local world size, the result also holds ``"ranks"``: each member's
  ``[base_global, world, base_role, role_world]`` in rank order, by torch's rules
  (:func:`~elastic.rendezvous.assignment.rank_blocks`, what the agents' store exchange
  computes), run-length encoded (:func:`~elastic.rendezvous.assignment.rank_runs`: one
  ``[count, lws, base_global, world, base_role, role_world]`` per run of members of the
  same role and local world size, so a uniform job's is O(1), not O(N) bytes more in
  a value every member reads), and each member's :attr:`RendezvousInfo.assignment` is
  its block: the
  agent starts its workers without torch's rank exchange (a ``set`` and a ``get`` per
  agent, an O(N) ``multi_get`` and ``multi_set`` on rank 0, and a task raced against
  the member watch, at every restart).  With ``"ranks"``, when rank 0's value carries
  its address, the result also holds ``"master": [addr, port]`` (rank 0's only: O(1)),
  and every member's :attr:`RendezvousInfo.bootstrap_store_info` is built from it, with
  no store operation and no yield: nobody publishes MASTER_ADDR/MASTER_PORT in the
  round's store then (nothing else reads them).  One joiner without member info (another
  version, a test driving the handler): no ``"ranks"``, every member exchanges its
  ranks; no ``"master"`` (that, or rank 0 of another version): rank 0 publishes its
  address in the round's store and every member reads it back (below).
* ``r<r>/ev/<node>`` (leased) — a late arrival on the wait list; ``x/r<r>/<node>``
  (leased) — on the redundancy list.  ``r<r>/ev//n`` is the round's arrival counter
  (no node id: ids hold no ``/``): under ``ev/`` so that the read answering a member's
  wake carries it too.  The decider reads it with the joiners (one snapshot of
  ``r<r>/``) and records it in the result (``"arrivals"``): a joiner that read the round
  open but arrived after that read puts its ``m/`` key into the running round, and the
  members' wake on it is told from a member lost by the counter having moved (then, and
  only then, one O(N) read checks that every member's key is still there).
* ``r<r>/m/`` itself (the members' prefix, no node: node ids are never empty) — the end
  marker: the round is over; its value is the state that ended it (the next round, or
  closed).  ``r<r>/ev/`` holds a copy, written in the same ``multi_set``, so the one
  read of ``r<r>/ev/`` that answers a member's wake finds both the wait list and the
  marker.

Invariants (each O(1) per node per round; the decider's reads are O(N), once)
------------------------------------------------------------------------------
* A wake costs one round trip: every wait of a node is a watch answered, at its wake,
  with the read that follows it (``watch_snapshot``,
  :class:`~elastic.store.WatchSnapshotStore`: the store reads when the watch wakes and
  sends the keys with the wake-up); a store without it gets a watch then a snapshot
  (:func:`~elastic.store.watch_snapshot_op`, looked up once per handler), the same
  answer in two round trips.
* A round costs a member four store round trips (five with the join's steps apart,
  eight with a watch and a read per wake and rank 0's address exchanged, ~14 before):
  the state (a ``compare_set`` that opens the next round, or is answered by the one
  who did), the round's own keys ``state/r<r>/`` (O(1)), one ``arrive`` to join (else
  ``set`` + ``add``), one watch of the ``state`` prefix
  answered with ``state/r<r>/`` (the result), one watch of the round answered with
  ``r<r>/ev/`` when it wakes — and none for rank 0's address or its ranks when the
  round carries them (one more for the address: rank 0's ``multi_set``, everyone's
  ``multi_get``; two more for the ranks, and rank 0's O(N) pair, when the agent must
  exchange them).  The O(N) result is read once, from ``state/r<r>/`` only.
* A joiner waits on the ``state`` key's prefix (state, result, lc, dec): O(1) keys, and
  it changes O(1) times a round (the state moves on only once the round has a result,
  and the previous round's result goes only after this one's).  At the last call's end
  every live joiner makes one ``compare_set``; one decides.
* A member watches ``r<r>/`` (``r<r>/m/`` alone while the ranks are exchanged), a wait
  or redundant node ``r<r>/m/``: after the decision those prefixes change only when a
  member's key goes (its lease expired, or it left), a node arrives on the wait list,
  or the round ends — and by a joiner that read the round open and arrived after the
  decider read the joiners (its key lands in the running round's ``m/``; the arrival
  counter under ``ev/`` moves with it).  So a wake that neither the end marker nor a
  wait-list key explains, with the counter where the result left it, *is* a member
  lost: no member check, no ring (a moved counter costs one O(N) read of the round,
  once per late arrival, to tell which) — every member's expiry is
  seen by every live node at once, whoever else is dead, and a wait or redundant node
  ends the round itself (every member may be dead).  A node parking on a complete round
  reads ``r<r>/m/`` once (a member may have died before it came).
* Ending a round (or closing) is two writes: the ``state``, then the end marker.  A node
  that dies between them strands nobody for longer than a lease: the others wake when
  its own ``m/`` key goes (``peer_lost``: a member reads the marker, not the state), and
  their next join finds the state moved on.
* A store that compacts its history may wake a watch spuriously ("maybe changed", as
  etcd reports a compacted revision); a member then reads that as a member lost and the
  round restarts once.  The in-memory store keeps at least 16 mutations per live key.

Nothing polls; nothing is pickled; every value read is checked against its schema and a
corrupt one raises :class:`RendezvousStateError` naming the key.  The decisions are the
model's (:mod:`elastic.rendezvous._core`): ``tests/test_rendezvous_model_vs_driver.py``
runs both side by side — crashes anywhere, restarts, full rounds and spares, closes —
and fails on any difference.

A round may be decided with a member that has just died: its leased keys outlive it by
the lease's time-to-live.  So while a member exchanges the round's master address (a
round whose result does not carry it; and
while an agent whose round carries no ranks exchanges them,
:meth:`DynamicRendezvousHandler.watch_members_async`), it also watches the members as
above: when a member's lease expires, the round ends
(``peer_lost``) and the survivors join the next one, instead of waiting for the dead
member's address until their join timeout.  A round whose result carries the ranks and
rank 0's address exchanges nothing: its members start their workers at once, dead
member or not (a dead rank 0 included), and learn of the death from the same member
watch (:meth:`DynamicRendezvousHandler.watch_async`) once its lease expires, as of any
death after the start (``scenarios/node_crash_while_round_forms.yaml``).

Each round has its own store, ``elastic/rdzv/<run_id>/s/<r>/`` (a :class:`PrefixStore`,
the :attr:`RendezvousInfo.store`), where rank 0 publishes MASTER_ADDR/MASTER_PORT when
the result does not carry them.  Round ``r``'s keys (``r<r>/``,
``x/r<r>/``, ``state/r<r>/``) and its store are deleted once nobody reads them — its
result when round ``r + 1`` has one, the rest when round ``r + 2`` opens: the store
does not grow with restarts.

Two ways to build the handler
-----------------------------
* over the store port (:func:`create_port_handler`, what ``elastic run`` and the
  simulator use): watches and leases, no polling;
* torch's way, over a :class:`RendezvousBackend` (:meth:`DynamicRendezvousHandler.from_backend`,
  :func:`create_handler`): the backend's one blob becomes a store port
  (:class:`~elastic.rendezvous.backend_store.BackendStore`), polled every
  ``poll_interval`` (torch polls too), and the same code above runs over it — the same
  decisions on the same membership history.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import json
import logging
import math
import os
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from elastic._records import Frozen, set_fields
from elastic.clock import Clock, Task
from elastic.errors import ConfigError, StoreError, StoreUnsupportedError
from elastic.rendezvous._core import (
    CoreSettings,
    NodeStatus,
    arrival_role,
    choose_members,
)
from elastic.rendezvous.api import (
    RendezvousClosedError,
    RendezvousContext,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStateError,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
    SyncRunner,
    SyncStore,
    ThreadedStore,
    _is_store_port,
    sync_store_of,
)
from elastic.rendezvous.assignment import AgentAssignment, rank_runs
from elastic.rendezvous.prefix_store import PrefixStore
from elastic.store import ArriveOp, Lease, Store, arrive_op, watch_snapshot_op

if TYPE_CHECKING:
    from collections.abc import Callable

    from elastic.rendezvous.backend_store import RendezvousBackend, Token

__all__ = [
    "DEFAULT_MASTER_PORT",
    "DynamicRendezvousHandler",
    "RendezvousBackend",
    "RendezvousSettings",
    "RendezvousTimeout",
    "Token",
    "create_handler",
    "create_port_handler",
]

logger = logging.getLogger(__name__)

DEFAULT_MASTER_PORT = 29500


def __getattr__(name: str) -> Any:
    """torch's ``RendezvousBackend`` and ``Token`` (defined in :mod:`.backend_store`).

    Imported on first use: ``elastic run`` builds the store-port handler and never
    needs them (they are off the launch's import path).
    """
    if name in ("RendezvousBackend", "Token"):
        from elastic.rendezvous import backend_store

        return getattr(backend_store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: Values we read back are small; anything bigger is not ours.
MAX_STATE_BYTES = 4 * 1024 * 1024
_VERSION = 1


class RendezvousTimeout:
    """The timeouts of the rendezvous (torch's class; seconds or :class:`timedelta`).

    ``join`` (600 s) bounds a whole :meth:`next_rendezvous_async`; ``last_call`` (30 s)
    is how long a round stays open for more nodes once ``min_nodes`` joined;
    ``close`` (30 s) bounds :meth:`set_closed_async`; ``heartbeat`` (5 s) is torch's
    keep-alive timeout, kept for compatibility (liveness here is a lease, see
    :class:`DynamicRendezvousHandler`).
    """

    _ZERO = timedelta(0)
    _DEFAULT_TIMEOUTS: ClassVar[dict[str, timedelta]] = {
        "join": timedelta(seconds=600),
        "last_call": timedelta(seconds=30),
        "close": timedelta(seconds=30),
        "heartbeat": timedelta(seconds=5),
    }

    __slots__ = ("_close", "_heartbeat", "_join", "_last_call")
    _join: timedelta
    _last_call: timedelta
    _close: timedelta
    _heartbeat: timedelta

    def __init__(
        self,
        join: timedelta | float | None = None,
        last_call: timedelta | float | None = None,
        close: timedelta | float | None = None,
        heartbeat: timedelta | float | None = None,
    ) -> None:
        for name, value in (
            ("join", join),
            ("last_call", last_call),
            ("close", close),
            ("heartbeat", heartbeat),
        ):
            td = self._DEFAULT_TIMEOUTS[name] if value is None else _as_timedelta(value)
            if td <= self._ZERO:
                raise ValueError(f"The {name} timeout ({td}) must be positive.")
            setattr(self, "_" + name, td)

    @property
    def join(self) -> timedelta:
        """Get the join timeout."""
        return self._join

    @property
    def last_call(self) -> timedelta:
        """Get the last call timeout."""
        return self._last_call

    @property
    def close(self) -> timedelta:
        """Get the close timeout."""
        return self._close

    @property
    def heartbeat(self) -> timedelta:
        """Get the keep-alive heartbeat timeout."""
        return self._heartbeat


def _as_timedelta(value: timedelta | float) -> timedelta:
    return value if isinstance(value, timedelta) else timedelta(seconds=value)


@dataclass(repr=False, eq=False, frozen=True)  # as torch's (and cheaper to make)
class RendezvousSettings:
    """The settings of the rendezvous (torch's fields)."""

    run_id: str
    min_nodes: int
    max_nodes: int
    timeout: RendezvousTimeout
    keep_alive_interval: timedelta = timedelta(seconds=5)
    keep_alive_max_attempt: int = 3

    @property
    def dead_after(self) -> float:
        """torch's dead-node threshold: ``keep_alive_interval * keep_alive_max_attempt``."""
        return self.keep_alive_interval.total_seconds() * self.keep_alive_max_attempt


class _State(Frozen):
    """The round counter and the closed flag, as read from the store."""

    __slots__ = ("closed", "round")
    round: int
    closed: bool

    def __init__(self, round: int, closed: bool) -> None:
        set_fields(self, "round", round)
        set_fields(self, "closed", closed)


def _dump(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


def _corrupt(key: str, why: str) -> RendezvousStateError:
    return RendezvousStateError(
        f"The rendezvous state at key '{key}' is corrupt: {why}. "
        "Another program may be using this run id; use another --rdzv-id or delete the key."
    )


def _load(key: str, raw: bytes) -> dict[str, Any]:
    if len(raw) > MAX_STATE_BYTES:
        raise _corrupt(key, f"{len(raw)} bytes exceeds the {MAX_STATE_BYTES}-byte limit")
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise _corrupt(key, f"not JSON ({raw[:40]!r})") from None
    if not isinstance(obj, dict) or obj.get("version") != _VERSION:
        raise _corrupt(key, f"expected a JSON object with version {_VERSION}")
    return obj


def _field(key: str, obj: dict[str, Any], name: str, kind: type) -> Any:
    value = obj.get(name)
    # bool is an int in Python; an int field must not accept it
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _corrupt(key, f"field {name!r} must be {kind.__name__}, got {value!r}")
    return value


def _unwrap(outcome: str | Exception) -> str:
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


class _Corrupt(Exception):
    """Why a value is not a valid rendezvous value (the caller adds the key)."""


# Performance: in the simulator every node reads the same result value (the same bytes
# object from the in-memory store), and decoding an N-member list on each of N nodes is
# O(N^2) on one CPU.  bytes cache their hash, so this cache makes the repeat reads O(1);
# the value is still checked in full, once.
class _Members(tuple[str, ...]):
    """Node ids in rank order, with an O(1) rank lookup (``in`` uses it too), the
    revision from which the members watch the round (``clean``; None: not recorded), and
    the members' rank blocks as runs (``runs``, the result's ``ranks``: see
    :func:`~elastic.rendezvous.assignment.rank_runs`; None: the round carries none, the
    agents exchange them) and rank 0's address and master port (``master``, the
    result's ``master``; None: the members exchange them through the round's store), and
    the round's arrival count when it was decided (``arrivals``; None: not recorded)."""

    rank: dict[str, int]
    clean: int | None
    runs: list[list[int]] | None
    master: tuple[str, int] | None
    arrivals: int | None
    starts: list[int]  # the first member's rank of each run

    def __new__(
        cls,
        ids: list[str],
        clean: int | None = None,
        runs: list[list[int]] | None = None,
        master: tuple[str, int] | None = None,
        arrivals: int | None = None,
    ) -> _Members:
        self = super().__new__(cls, ids)
        self.rank = {m: i for i, m in enumerate(self)}
        self.clean = clean
        self.runs = runs
        self.master = master
        self.arrivals = arrivals
        self.starts = []
        first = 0
        for run in runs or ():
            self.starts.append(first)
            first += run[0]
        return self

    def assignment(self, rank: int) -> AgentAssignment | None:
        """Member ``rank``'s assignment, if the round carries them (from its run)."""
        if self.runs is None:
            return None
        j = bisect.bisect_right(self.starts, rank) - 1
        _, lws, bg, world, br, rw = self.runs[j]
        k = rank - self.starts[j]
        return AgentAssignment(bg + k * lws, world, br + k * lws, rw)

    def __contains__(self, node: object) -> bool:
        return node in self.rank


# Performance: every arrival past ``min_nodes`` reads the index of every joiner before
# it (O(N) each, O(N^2) a round: bench_rendezvous's 4,000 nodes make 6 million calls).
# In the simulator they are the same bytes objects (the in-memory store's values, whose
# hash is cached), so a cache answers faster than int() would parse; bounded, it holds
# ~1 MiB at most, and past 8,192 joiners a round it only misses.
@functools.lru_cache(maxsize=8192)
def _index(raw: bytes) -> int:
    """A joiner's arrival index (its ``m/`` value: ``n``, or ``[n,role,lws,port,addr]``
    whose first number is cut out without decoding the JSON); unreadable counts as first (the
    decider, which reads the value in full, rejects it)."""
    if raw[:1] == b"[":
        raw = raw[1 : raw.find(b",")]
    try:
        return int(raw)
    except ValueError:
        return 0


#: a joiner's ``m/`` value is tiny (an index, a role name, a count, a port, an address)
MAX_JOINER_BYTES = 1024


def _split_joiner(raw: bytes) -> tuple[bytes, bytes | None]:
    """A joiner's ``m/`` value cut in two: ``[n,role,lws,port]`` (or ``[n,role,lws]``)
    and its address's JSON string (``None`` if it has none: it ends with a number).

    The address is last so that the rest is the same for most joiners of a round (the
    decider parses it once, not once per member).  Inside a JSON string every quote is
    escaped, so the last ``,"`` of the value opens the address."""
    if raw[-2:] != b'"]':
        return raw, None
    cut = raw.rfind(b',"')
    if cut < 0:
        return raw, None
    return raw[:cut] + b"]", raw[cut + 1 : -1]


def _parse_joiner(raw: bytes, address: bool) -> tuple[str, int, int | None] | None:
    """A joiner's role, local world size and master port from its ``m/`` value without
    the address (:func:`_split_joiner`: ``[n,role,lws,port]`` if ``address``, else
    ``[n,role,lws]``, a joiner of another version's: no port), or ``None`` if it
    published none (``b""`` or a bare arrival index: its agent gave no member info)."""
    if not raw or raw.isdigit():
        return None
    if len(raw) > MAX_JOINER_BYTES:
        raise _Corrupt(f"{len(raw)} bytes exceeds the {MAX_JOINER_BYTES}-byte limit")
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise _Corrupt(f"not JSON ({raw[:40]!r})") from None
    if (
        not isinstance(obj, list)
        or len(obj) != (4 if address else 3)
        or type(obj[0]) is not int
        or obj[0] < 0
        or not isinstance(obj[1], str)
        or not obj[1]
        or type(obj[2]) is not int
        or obj[2] <= 0
        or (address and _bad_port(obj[3]))
    ):
        raise _Corrupt(
            "expected [arrival index >= 0, role (non-empty string), local world size > 0"
            f"[, master port 0..65535, address (non-empty string)]], got {raw[:80]!r}"
        )
    return obj[1], obj[2], obj[3] if address else None


def _parse_address(raw: bytes) -> str:
    """A joiner's address from its JSON string (:func:`_split_joiner`)."""
    try:
        addr = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        addr = None
    if not isinstance(addr, str) or not addr:
        raise _Corrupt(f"expected an address (non-empty string) last, got {raw[:80]!r}")
    return addr


def _bad_port(port: Any) -> bool:
    return type(port) is not int or not 0 <= port <= 65535


def _bad_master(addr: Any, port: Any) -> bool:
    """Whether ``addr``/``port`` is no master address and port."""
    return not isinstance(addr, str) or not addr or _bad_port(port)


def _check_ranks(runs: Any, size: int) -> list[list[int]]:
    """The result's ``ranks`` field (:func:`~elastic.rendezvous.assignment.rank_runs`):
    runs ``[count, lws, base_global, world, base_role, role_world]`` covering ``size``
    members, their global blocks contiguous from 0 to the world size, each role block
    inside its role's world."""
    if not isinstance(runs, list) or not runs:
        raise _Corrupt("field 'ranks' must be a non-empty list of rank runs")
    world = runs[0][3] if isinstance(runs[0], list) and len(runs[0]) == 6 else None
    members = next_global = 0
    for run in runs:
        if (
            not isinstance(run, list)
            or len(run) != 6
            or not all(type(x) is int for x in run)
            or run[0] < 1
            or run[1] < 1
            or run[2] != next_global
            or run[3] != world
            or not 0 <= run[4] <= run[4] + run[0] * run[1] <= run[5] <= run[3]
        ):
            raise _Corrupt(
                "field 'ranks' must hold runs [count, lws, base_global, world, base_role, "
                f"role_world], contiguous and inside their worlds, got {str(run)[:80]}"
            )
        members += run[0]
        next_global += run[0] * run[1]
    if members != size or next_global != world:
        raise _Corrupt(
            f"field 'ranks' covers {members} members and {next_global} ranks, expected "
            f"{size} members and the world size {world}"
        )
    return runs


# a round's members are read by every member of it, once: the current round's and the
# last one's suffice (32 held ~10 MiB of member lists at 2,048 nodes, for nothing)
@functools.lru_cache(maxsize=4)
def _parse_result(raw: bytes, max_nodes: int) -> _Members | None:
    try:
        obj = _load("result", raw)
    except RendezvousStateError as e:
        raise _Corrupt(str(e).split(": ", 1)[1].split(". Another", 1)[0]) from None
    if obj.get("closed") is True:
        return None
    members = obj.get("members")
    if not isinstance(members, list) or not members:
        raise _Corrupt("field 'members' must be a non-empty list of node ids")
    if not all(isinstance(m, str) for m in members):
        raise _Corrupt("field 'members' must be a non-empty list of node ids")
    if len(set(members)) != len(members) or len(members) > max_nodes:
        raise _Corrupt(f"{len(members)} members is not a valid membership")
    clean = obj.get("clean")
    if clean is not None and (not isinstance(clean, int) or isinstance(clean, bool) or clean < 0):
        raise _Corrupt(f"field 'clean' must be a non-negative int, got {clean!r}")
    runs = obj.get("ranks")
    if runs is not None:
        runs = _check_ranks(runs, len(members))
    master = obj.get("master")
    if master is not None:
        if not isinstance(master, list) or len(master) != 2 or _bad_master(*master):
            raise _Corrupt(
                "field 'master' must be [address (non-empty string), port 0..65535], "
                f"got {str(master)[:80]}"
            )
        master = (master[0], master[1])
    arrivals = obj.get("arrivals")
    if arrivals is not None and (
        not isinstance(arrivals, int) or isinstance(arrivals, bool) or arrivals < 0
    ):
        raise _Corrupt(f"field 'arrivals' must be a non-negative int, got {arrivals!r}")
    return _Members(members, clean, runs, master, arrivals)


# Performance: every node reads the same few state values (the same bytes objects from
# the in-memory store) several times a round: decoded once each, as the result is.
@functools.lru_cache(maxsize=32)
def _parse_state(raw: bytes) -> _State:
    try:
        obj = _load("state", raw)
        st = _State(_field("state", obj, "round", int), _field("state", obj, "closed", bool))
    except RendezvousStateError as e:
        raise _Corrupt(str(e).split(": ", 1)[1].split(". Another", 1)[0]) from None
    if st.round < 0:
        raise _Corrupt(f"negative round {st.round}")
    return st


class _RoundKeys:
    """Round ``r``'s keys under the control prefix ``c`` (see the module doc)."""

    __slots__ = (
        "count",
        "dec",
        "ev",
        "lc",
        "m",
        "master",
        "number",
        "own",
        "result",
        "round",
        "store",
    )

    def __init__(self, base: str, r: int) -> None:
        self.number = r
        c = f"{base}/c/"
        self.round = f"{c}r{r}/"  # the round's prefix, ``r<r>/``
        self.m = self.round + "m/"  # the joiners', then the members', keys; the end marker
        self.ev = self.round + "ev/"  # the wait list, and a copy of the end marker
        self.count = self.ev + "/n"  # the arrival counter: no node id has a '/'
        self.own = f"{c}state/r{r}/"  # the round's own keys, under the state key's prefix
        self.result = self.own + "result"
        self.lc = self.own + "lc"
        self.dec = self.own + "dec"
        # the round's store (a PrefixStore's prefix) and rank 0's address in it
        self.store = f"{base}/s/{r}/"
        self.master = [
            self.store + RendezvousStoreInfo.MASTER_ADDR_KEY,
            self.store + RendezvousStoreInfo.MASTER_PORT_KEY,
        ]


# Performance: every member of a round used to build each of these a few times a round
# (12 f-strings per member per round); they are the same strings for every node of the
# run, built once a round here (the current round's and the last one's suffice).
@functools.lru_cache(maxsize=4)
def _round_keys(base: str, r: int) -> _RoundKeys:
    return _RoundKeys(base, r)


@dataclass(eq=True, order=True, frozen=True)
class _NodeDesc:
    """A node of a rendezvous, torch's way: its address, process id and a number unique
    in the process.  ``repr`` is the node id (``addr_pid_localid``) the rounds use."""

    addr: str
    pid: int
    local_id: int

    def __repr__(self) -> str:
        return f"{self.addr}_{self.pid}_{self.local_id}"


class _NodeDescGenerator:
    """Node descriptors unique in this process: ``local_id`` counts from 0 (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._local_id = 0

    def generate(self, local_addr: str | None = None) -> _NodeDesc:
        """The next descriptor, for ``local_addr`` (default: this host's FQDN)."""
        with self._lock:
            local_id = self._local_id
            self._local_id += 1
        if not local_addr:  # a real host's name: only real mode asks for it
            from elastic.launcher.api import fqdn

            local_addr = fqdn()
        return _NodeDesc(local_addr, os.getpid(), local_id)


class DynamicRendezvousHandler(RendezvousHandler):
    """torch's ``DynamicRendezvousHandler`` over the store and clock ports.

    Guarantees:

    * every node that returns from :meth:`next_rendezvous_async` for round ``r`` gets the
      same members, the same world size and rank = its index among the members sorted
      by node id (same membership ⇒ same ranks);
    * a round completes at once when ``max_nodes`` nodes joined, or once ``min_nodes``
      live nodes joined and the last call (``last_call_timeout``) ended;
    * a node is dead when its lease expires: ``lease_ttl`` seconds after it stopped
      renewing (default ``keep_alive_interval * keep_alive_max_attempt`` = 15 s, torch's
      dead-node threshold; the ``heartbeat_timeout`` config key sets it directly).
      Members of a complete round learn of it from :meth:`watch_async` (``peer_lost``),
      and members still exchanging the round's addresses or ranks end that round and
      join the next one (a round is never held for a member whose lease expired);
    * nothing is written to the store while a round runs and nobody joins or dies.
    """

    # real mode's node ids (torch's: one generator per process, on this class)
    _node_desc_generator: ClassVar[_NodeDescGenerator] = _NodeDescGenerator()

    def __init__(
        self,
        node_id: str,
        node_addr: str,
        settings: RendezvousSettings,
        backend_name: str,
        store: Store,
        clock: Clock,
        *,
        lease_ttl: float | None = None,
        master_port: int | None = None,
        port_chooser: Any = None,
        round_store: Store | None = None,
    ) -> None:
        if not settings.run_id:
            raise ValueError("The run id must be a non-empty string.")
        if settings.min_nodes < 1:
            raise ValueError(
                f"The minimum number of nodes ({settings.min_nodes}) must be greater than zero."
            )
        if settings.max_nodes < settings.min_nodes:
            raise ValueError(
                f"The maximum number of nodes ({settings.max_nodes}) must be greater than or "
                f"equal to the minimum number of nodes ({settings.min_nodes})."
            )
        if not node_id or "/" in node_id:
            raise ValueError(f"The node id {node_id!r} must be non-empty and contain no '/'.")
        self._node = node_id
        self._by = json.dumps(node_id)  # as it appears in the state a node writes
        self._addr = node_addr
        self._settings = settings
        self._backend_name = backend_name
        self._store = store
        # a wake and the read after it, in one round trip where the store can (else a
        # watch then a snapshot): looked up once, here
        self._watch_snapshot = watch_snapshot_op(store)
        # a join in one operation where the store can (else add, read, set: module doc)
        self._arrive: ArriveOp | None = arrive_op(store)
        self._clock = clock
        self._ttl = lease_ttl if lease_ttl is not None else settings.dead_after
        if self._ttl <= 0:
            raise ValueError(f"The lease time-to-live ({self._ttl}) must be positive.")
        self._master_port = master_port
        self._port_chooser = port_chooser
        # where each round's store lives (torch's ``store`` of from_backend); else ``store``
        self._round_store = store if round_store is None else round_store
        # the background delete of a past round (referenced while it runs)
        self._drop_task: Task[None] | None = None
        self._core = CoreSettings(
            settings.min_nodes,
            settings.max_nodes,
            settings.timeout.last_call.total_seconds(),
            settings.timeout.join.total_seconds(),
        )
        self._base = f"elastic/rdzv/{settings.run_id}"
        self._c = f"{self._base}/c/"
        self._state_key = self._c + "state"
        self._round_keys = _round_keys(self._base, 0)  # the last round's (see _keys)
        self._lease: Lease | None = None
        self._round: int | None = None
        self._members = _Members([])
        self._redundant = False
        self._round_watch: Task[str | Exception] | None = None
        # (round, revision) from which a member's watch of that round has seen no change
        self._clean: tuple[int, int] = (-1, 0)
        # the state round ``_round`` was joined under, until this member asks again
        self._member_state: bytes | None = None
        # the state this node's compare_set just ended a round with (used at once)
        self._known_state: bytes | None = None
        # what follows the arrival index in this joiner's ``m/`` value: ``,role,lws,``
        # (set_member_info), then the port it would use as rank 0 and ``,addr]``;
        # None: its value is the bare index, and no round it joins carries ranks or rank
        # 0's address
        self._member_tail: bytes | None = None
        self._addr_tail = ("," + json.dumps(node_addr) + "]").encode()
        # the port and address part of the value when it is the same at every join:
        # --master-port given, or no port chooser (None: the chooser picks one per join)
        self._port_tail: bytes | None = (
            str(master_port or DEFAULT_MASTER_PORT).encode() + self._addr_tail
            if master_port or port_chooser is None
            else None
        )
        self._member_info: tuple[str, int] | None = None  # what _member_tail encodes

    @classmethod
    def from_backend(
        cls,
        run_id: str,
        store: Store | SyncStore,
        backend: RendezvousBackend,
        min_nodes: int,
        max_nodes: int,
        local_addr: str | None = None,
        timeout: RendezvousTimeout | None = None,
        keep_alive_interval: int = 5,
        keep_alive_max_attempt: int = 3,
        *,
        clock: Clock | None = None,
        node_id: str | None = None,
        poll_interval: float = 1.0,
        sync_runner: SyncRunner | None = None,
    ) -> DynamicRendezvousHandler:
        """Create a new :class:`DynamicRendezvousHandler` over ``backend`` (torch's API).

        Args (torch's):
            run_id: the run id of the rendezvous.
            store: where each round's store lives (MASTER_ADDR/MASTER_PORT): the store
                port or a :class:`SyncStore`.
            backend: holds the rendezvous state — any :class:`RendezvousBackend`, a
                user's own included.
            min_nodes, max_nodes: the bounds of the rendezvous.
            local_addr: this node's address (default: this host's FQDN).
            timeout: the :class:`RendezvousTimeout`.
            keep_alive_interval, keep_alive_max_attempt: a node is dead after
                ``interval * max_attempt`` seconds without a keep-alive.

        Extras (keyword-only): ``clock`` and ``node_id`` (default: real mode's wall clock
        — lease expiry in a backend compares times across nodes, as torch does — and
        torch's ``addr_pid_localid``); ``poll_interval`` — how often a waiting node
        re-reads the backend (torch: 1 s); ``sync_runner`` for the blocking API.
        """
        sync = sync_store_of(store)
        if sync is not None:
            sync_runner = sync_runner or sync._run
            store = sync.port
        assert not isinstance(store, SyncStore)  # sync_store_of found any
        port_chooser: Callable[[], int] | None = None
        if clock is None or node_id is None:
            # real mode: the process-wide loop thread, its clock and torch's node id; rank
            # 0 publishes a free port as MASTER_PORT, as torch's does (a fixed 29500 would
            # collide with a second job on the host)
            from elastic.launcher.api import fqdn, free_port
            from elastic.real.rdzv_context import node_id as make_node_id
            from elastic.real.rdzv_context import shared_loop

            if clock is None:
                # leases in a backend compare times across nodes, as torch's heartbeats
                from elastic.timer.wallclock import WallClock

                clock = WallClock()
                sync_runner = sync_runner or shared_loop().run
            local_addr = local_addr or fqdn()
            node_id = node_id or make_node_id(local_addr)
            port_chooser = free_port
        if not _is_store_port(store):
            # torch's own Store (HashStore, TCPStore, FileStore): blocking, called in threads
            run_in_thread = getattr(clock, "run_in_thread", None)
            if run_in_thread is None:
                raise TypeError(
                    f"store: a blocking {type(store).__name__} needs a clock that runs "
                    "calls in threads (real mode's); give the store port instead"
                )
            store = ThreadedStore(store, run_in_thread)
        settings = RendezvousSettings(
            run_id,
            min_nodes,
            max_nodes,
            timeout or RendezvousTimeout(),
            timedelta(seconds=keep_alive_interval),
            keep_alive_max_attempt,
        )
        from elastic.rendezvous.backend_store import BackendStore

        handler = cls(
            node_id,
            local_addr or node_id,
            settings,
            backend.name,
            BackendStore(backend, clock, poll_interval=poll_interval),
            clock,
            round_store=store,
            port_chooser=port_chooser,
        )
        handler.sync_runner = sync_runner or backend.sync_runner
        return handler

    # -- keys ---------------------------------------------------------------------
    def _k(self, *parts: str) -> str:
        return self._c + "/".join(parts)

    def _rk(self, r: int, *parts: str) -> str:
        return self._c + f"r{r}/" + "/".join(parts)

    def _ek(self, r: int, part: str) -> str:
        """Round ``r``'s ``result`` or ``next`` key, under the state key's prefix."""
        return self._c + f"state/r{r}/{part}"

    def _keys(self, r: int) -> _RoundKeys:
        keys = self._round_keys
        if keys.number != r:
            keys = self._round_keys = _round_keys(self._base, r)
        return keys

    # -- torch's API ------------------------------------------------------------------
    @property
    def settings(self) -> RendezvousSettings:
        """The settings of the rendezvous."""
        return self._settings

    @property
    def node_id(self) -> str:
        return self._node

    @property
    def lease(self) -> Lease | None:
        """This node's liveness lease (``None`` before the first rendezvous)."""
        return self._lease

    def get_backend(self) -> str:
        return self._backend_name

    def set_member_info(self, role: str, local_world_size: int) -> None:
        """Publish ``role`` and ``local_world_size`` with each join from now on, so that
        the round's decider writes every member's rank block in the result (module doc)
        and :attr:`RendezvousInfo.assignment` carries this member's."""
        if type(local_world_size) is int and self._member_info == (role, local_world_size):
            return  # the agent tells it before every round: encoded once
        if not isinstance(role, str) or not role:
            raise ValueError(f"The role {role!r} must be a non-empty string.")
        if type(local_world_size) is not int or local_world_size <= 0:
            raise ValueError(
                f"The local world size ({local_world_size!r}) must be a positive integer."
            )
        # ``,"role",lws,`` (the port and address follow, see _joiner_value)
        tail = "," + json.dumps([role, local_world_size], separators=(",", ":"))[1:-1] + ","
        if len(tail) + len(self._addr_tail) + 30 > MAX_JOINER_BYTES:
            raise ValueError(
                f"The role {role[:40]!r} and address {self._addr[:40]!r} are too long for "
                "the rendezvous."
            )
        self._member_tail = tail.encode()
        self._member_info = (role, local_world_size)

    def get_run_id(self) -> str:
        return self._settings.run_id

    async def next_rendezvous_async(self) -> RendezvousInfo:
        deadline = self._clock.now() + self._core.join_timeout
        logger.info(
            "The node '%s' attempts to join the next round of the rendezvous '%s'.",
            self._node,
            self._settings.run_id,
        )
        self._drop_round_watch()
        await self._ensure_lease()
        store = self._store
        while True:
            raw_state, st = await self._current_state()
            if st.closed:
                self._raise_closed()
            r = st.round
            # the round's own keys (result, last call, claim): O(1) keys, and the revision
            # from which a joiner waits for them
            keys = self._keys(r)
            rev, snap = await store.snapshot(keys.own)
            raw = snap.get(keys.result)
            members: _Members | None
            if raw is None:
                members = await self._join_open_round(r, deadline, rev, snap)
            else:
                members = self._decode_result(r, raw)
                if members is not None and self._node in members:
                    # A member asking again wants a new round (its group restarts).
                    self._known_state = await self._advance(raw_state, r) or None
                    continue
            del snap
            if members is None:  # closed while we joined: re-read the state
                continue
            if self._node in members:
                info = await self._finish(r, members, deadline, raw_state)
                if info is None:  # a member died: this round is over, ask for the next
                    continue
                return info
            deadline = await self._park(r, members, deadline)

    async def _current_state(self) -> tuple[bytes, _State]:
        """The state now, at the cost of one operation or none.

        A member of round ``r`` asks again for a new round, which it opens itself unless
        someone did: one ``compare_set`` from the state it joined round ``r`` under (it
        was written once) returns the state either way.  A state that ended this member's
        round (:meth:`_advance` just now) is taken as it is.  Anyone else reads the state.
        (Not the end marker's value: read when the round ended, it may be a round or two
        behind by the time the agent asks again, and that round's keys may be gone.)
        """
        known, self._known_state = self._known_state, None
        joined, self._member_state = self._member_state, None
        if known is not None:
            return known, self._parse_state(known)
        if joined is not None and self._round is not None:
            now = await self._advance(joined, self._round)
            if now:
                return now, self._parse_state(now)
        return await self._read_state()

    async def watch_async(self) -> str:
        if self._round is None:
            raise RuntimeError("watch_async() needs a completed next_rendezvous_async() first")
        if self._round_watch is not None:
            # the round's member watch already runs (started when the round was decided)
            return _unwrap(await self._round_watch.join())
        return await self._watch_round(self._round, self._members, waiting_ends=True)

    async def watch_members_async(self) -> str:
        """Wait until a member of the current round is lost or the round ends; return why.

        Late arrivals do not end this wait (they wait for the round to run first): it is
        what a member awaits beside the round's rank exchange, so that a member whose lease
        expires while the ranks are exchanged ends the round at once (``"peer_lost"``)
        instead of stranding the others until their join timeout.
        """
        if self._round is None:
            raise RuntimeError(
                "watch_members_async() needs a completed next_rendezvous_async() first"
            )
        if self._round_watch is not None:
            why = _unwrap(await self._round_watch.join())
            if why != "nodes_waiting":
                return why
        return await self._watch_round(self._round, self._members, waiting_ends=False)

    def _drop_round_watch(self) -> None:
        task, self._round_watch = self._round_watch, None
        if task is not None:
            task.cancel()

    async def _round_watch_body(self, r: int, members: _Members) -> str | Exception:
        # An error is returned, not raised: whoever joins re-raises it, and a watch that
        # nobody joins (the group failed first) leaves no unretrieved task error behind.
        try:
            return await self._watch_round(r, members, waiting_ends=True)
        except Exception as e:
            return e

    async def _watch_round(self, r: int, members: _Members, *, waiting_ends: bool) -> str:
        """Wait until round ``r`` ends, a member's key goes, or (``waiting_ends``) a node
        arrives on the wait list; return why.

        After the decision ``r<r>/m/`` holds exactly the members' leased keys (the
        decider removed the left-out joiners' before writing the result) and the end
        marker, so one watch of it wakes this node, O(1), on every member's expiry —
        whoever else is dead — and a wake that no end marker or wait-list key explains is
        a member lost, unless the round's arrival counter moved since the decision: then
        one read of ``r<r>/`` tells a late joiner's key (every member's is there: the watch
        goes on from that read) from a loss (:meth:`_late_arrivals_only`).  The watch runs
        from the round's clean revision (``_clean``: the
        one the decider recorded in the result, after which ``r<r>/`` changes only by a
        member's loss, a late arrival or the round's end), so a second call (after
        ``nodes_waiting``) misses no expiry, and the watch needs no read before it.  A
        wake costs one round trip: the watch is answered with ``r<r>/ev/`` as it was at
        the wake (``watch_snapshot``), the wait list and a copy of the end marker.
        """
        rk = self._keys(r)
        mkey, ev = rk.m, rk.ev
        prefix = rk.round if waiting_ends else mkey
        clean = self._clean[1] if self._clean[0] == r else None
        woke = False
        keys: dict[str, bytes] | None = None
        if clean is None:
            # Take the revision first: any change after it wakes the watch below.
            rev, keys = await self._store.snapshot(ev)
        count_key = rk.count
        while True:
            if keys is not None:
                end = keys.get(ev)
                # the wait list: r<r>/ev/ but the end marker's copy and the arrival counter
                waiting = waiting_ends and len(keys) > (end is not None) + (count_key in keys)
                if end is not None:
                    if self._end_closed(r, end):
                        return "closed"
                    return "nodes_waiting" if waiting else "restarted"
                if waiting:
                    return "nodes_waiting"
                if woke:
                    late = await self._late_arrivals_only(rk, members, keys.get(count_key))
                    if late is None:
                        return "peer_lost"  # a member's key went, and nothing else explains it
                    # only joiners that came late changed r<r>/m/: go on from this read
                    rev, keys = late
                    self._clean = (r, rev)
                    woke = False
                    continue
                # no recorded clean revision: the state may have moved before this read
                _, st = await self._read_state()
                if st.closed:
                    return "closed"
                if st.round != r:
                    return "restarted"
                clean = rev
                self._clean = (r, rev)
            assert clean is not None
            # the wake and its read of r<r>/ev/ in one round trip (module doc)
            rev, keys = await self._watch_snapshot(prefix, clean, ev, None)
            woke = True

    async def _late_arrivals_only(
        self, rk: _RoundKeys, members: _Members, counter: bytes | None
    ) -> tuple[int, dict[str, bytes]] | None:
        """After a wake of round ``rk``'s members that neither its end marker nor its wait
        list explains: the revision and ``r<r>/ev/`` read with every member's key still
        under ``r<r>/m/`` (the change was joiners that read the round open and arrived
        after the decider read the joiners: their keys, in the running round), or None
        (a member's key went: a member lost).

        Costs nothing unless the arrival counter moved since the decision (``counter``,
        read with the wake, against the result's ``arrivals``); then one O(N) read of
        ``r<r>/``.  A result without ``arrivals`` (another version's) counts as a loss.
        With the join's steps apart (a store without ``arrive``) a joiner's key comes
        before its count when there is no last call, so the counter cannot tell: every
        such wake pays the O(N) read (those stores are torch's and backends, not the
        simulator's or our servers', which have ``arrive``).
        """
        if self._arrive is not None:
            now = _count_value(counter)
            if members.arrivals is None or now is None or now <= members.arrivals:
                return None
        rev, every = await self._store.snapshot(rk.round)
        m = rk.m
        if any(m + node not in every for node in members):
            return None
        ev = rk.ev
        return rev, {k: v for k, v in every.items() if k.startswith(ev)}

    def _end_closed(self, r: int, raw: bytes) -> bool:
        """Whether round ``r``'s end marker says the rendezvous was closed."""
        return _load(self._keys(r).ev, raw).get("closed") is True

    async def is_closed_async(self) -> bool:
        _, st = await self._read_state()
        return st.closed

    async def set_closed_async(self) -> None:
        try:
            await self._clock.timeout(self._settings.timeout.close.total_seconds(), self._close())
        except TimeoutError:
            raise RendezvousTimeoutError(
                f"The rendezvous '{self.get_run_id()}' could not be closed within the close "
                f"timeout ({self._settings.timeout.close}); is the store reachable?"
            ) from None

    async def num_nodes_waiting_async(self) -> int:
        if self._round is None:
            return 0
        keys = self._keys(self._round)
        _, events = await self._store.snapshot(keys.ev)
        # the round's end marker and its arrival counter are no node
        return len(events.keys() - {keys.ev, keys.count})

    async def shutdown_async(self) -> bool:
        """torch's semantics: close the rendezvous for every node; then drop the lease."""
        try:
            await self.set_closed_async()
        except RendezvousError:
            return False
        try:
            await self.leave_async()
        except (RendezvousError, StoreError, OSError, TimeoutError) as e:
            # closed already; the store went away before the lease could be revoked (its
            # host shut down first): it expires a heartbeat later, as torch's does
            logger.warning("The rendezvous is closed; its lease could not be revoked: %s", e)
            if self._lease is not None:
                self._lease.abandon()  # on the loop already: stop renewing it
                self._lease = None
        return True

    async def leave_async(self) -> None:
        """Leave without closing: revoke the lease so the others see this node gone now."""
        self._drop_round_watch()
        if self._lease is not None:
            await self._lease.revoke()
            self._lease = None

    def _stop_heartbeats(self) -> None:
        """torch's name: stop this node's keep-alive.  Its lease is no longer renewed and
        expires a ``heartbeat`` later, as a node whose keep-alive stopped does; nothing
        is written now (a graceful leave is :meth:`leave_async`).  Called from torch's
        synchronous side, it runs on the handler's loop, where the lease's renewal runs."""
        lease = self._lease
        if lease is None:
            return
        if self.sync_runner is None:
            lease.abandon()
            return

        async def stop() -> None:
            lease.abandon()

        self._run(stop())

    # -- steps ------------------------------------------------------------------------
    async def _ensure_lease(self) -> None:
        if self._lease is not None and self._lease.alive():
            return
        self._lease = await self._store.grant_lease(self._ttl)
        await self._store.set(
            self._k("alive", self._node), _dump({"addr": self._addr}), lease=self._lease
        )

    async def _read_state(self) -> tuple[bytes, _State]:
        key = self._state_key
        raw = await self._store.try_get(key)
        if raw is None:
            raw = await self._store.compare_set(
                key, None, _dump({"version": _VERSION, "round": 0, "closed": False})
            )
        return raw, self._parse_state(raw)

    def _parse_state(self, raw: bytes) -> _State:
        try:
            return _parse_state(raw)
        except _Corrupt as e:
            raise _corrupt(self._state_key, str(e)) from None

    def _decode_result(self, r: int, raw: bytes) -> _Members | None:
        """The members of round ``r`` in rank order, or ``None`` if it was closed."""
        try:
            members = _parse_result(raw, self._core.max_nodes)
        except _Corrupt as e:
            raise _corrupt(self._ek(r, "result"), str(e)) from None
        return members

    async def _previous_members(self, r: int) -> tuple[str, ...]:
        if r == 0:
            return ()
        raw = await self._store.try_get(self._ek(r - 1, "result"))
        return (self._decode_result(r - 1, raw) or ()) if raw is not None else ()

    async def _join_open_round(
        self, r: int, deadline: float, rev: int, snap: dict[str, bytes]
    ) -> _Members | None:
        """Join open round ``r``; decide it when the rules say so; return its members.

        The last call is the round's, as torch's ``state.deadline``: the arrival that brings the
        live joiners to ``min_nodes`` arms it — the ``lc`` key on a lease of ``last_call_timeout``
        that nobody renews, so the store ends it at one instant for everyone.  At its end ONE joiner
        decides: every live joiner that sees it end claims the ``dec`` key (``compare_set`` on the
        claimer's lease, first wins: one operation, so no claim outlives its owner) and only the
        winner reads the joiners and writes the result.  A joiner whose arrival index reaches
        ``max_nodes`` decides at once.  A decision that cannot be made yet (a full round holding a
        seat for a pending node, or fewer than ``min_nodes`` live joiners when the last call ended)
        is held by the claim's holder alone, which watches the control prefix until it can; if the
        holder dies its claim expires with its lease and the next live joiner takes it over.  Cost:
        O(1) store operations and wake-ups per joiner per round, one O(N) read by the decider (plus,
        on a store without ``arrive``, one O(N) read per arrival past ``min_nodes`` when
        ``min_nodes < max_nodes``, to count the live joiners before it).
        """
        clock, store, core, wsnap = self._clock, self._store, self._core, self._watch_snapshot
        keys = self._keys(r)
        mprefix = keys.m
        state_key, result_key = self._state_key, keys.result
        lc_key, dec_key = keys.lc, keys.dec
        self._redundant = False  # a spare that joins a round is a joiner (torch)
        seen = False  # a last call of this round was seen running (or started here)
        # An earlier arrival started a last call (min_nodes live joiners came before this
        # one): until it is seen running it is taken as over only a last call's length
        # from now.  Its key may still be on its way (the arrival that starts it writes it
        # after its join), and a key not there yet is no last call ended.
        told: float | None = None
        my_call: float | None = None  # the end of the last call this node started
        token = self._node.encode()
        elastic = core.min_nodes < core.max_nodes
        arrival: tuple[int, int, int, bool] | None = None
        if self._arrive is not None:
            try:
                arrival = await self._arrive(
                    keys.count,
                    mprefix + self._node,
                    self._joiner_value(None),
                    mprefix,
                    lease=self._lease,
                )
            except StoreUnsupportedError:
                self._arrive = None  # a store host without it: the steps apart from now on
        # ``before``: the live joiners that arrived before this one (read only past
        # min_nodes with a last call, past max_nodes without)
        if arrival is not None:
            # Counted, written and the live joiners counted in one operation: every live
            # key under m/ is a joiner that arrived before this one, or this one, so the
            # count is exact (module doc, ``r<r>/m/<node>``).
            n, _, present, marked = arrival
            before = present - marked - 1
        elif elastic:
            n = await store.add(keys.count, 1)
            before = await self._live_before(mprefix, n) if core.min_nodes <= n else 0
        else:  # no last call: the key first, so the max_nodes-th arrival finds every key
            await store.set(mprefix + self._node, self._joiner_value(None), lease=self._lease)
            n = await store.add(keys.count, 1)
            before = n - 1
            if n > core.max_nodes:
                # past max_nodes only if joiners died (or the round is decided already)
                _, count, marked = await _count_under(store, mprefix)
                before = count - marked - 1
        # the arrival that brings the live joiners to max_nodes decides at once, once
        direct = n == core.max_nodes or (n > core.max_nodes and before + 1 == core.max_nodes)
        if elastic and core.min_nodes <= n:
            # Does this arrival bring the live joiners to min_nodes?  Then it arms the
            # round's last call (again, if the count dropped below min_nodes since the
            # last one: torch clears the deadline then).  With min_nodes live joiners
            # before it, one was armed already (running, or over).
            if before >= core.min_nodes:
                told = clock.now() + core.last_call_timeout
            direct = direct or before + 1 == core.max_nodes
            # The min_nodes-th arrival always arms it: with the steps apart, the joiners
            # before it may not have written their keys yet (add, then set), and if it
            # saw fewer than min_nodes - 1 of them, no later arrival need see exactly that
            # many: a round of min_nodes live joiners (and fewer than max_nodes) would then
            # wait for a last call nobody started, until the join timeout.
            if before + 1 == core.min_nodes or n == core.min_nodes:
                my_call = await self._arm_last_call(r, token)
                seen = True
        if elastic and arrival is None:
            # the value is the arrival index: who came before whom, for the last call
            await store.set(mprefix + self._node, self._joiner_value(n), lease=self._lease)
        logger.info(
            "The node '%s' added itself to the participants of round %s of the rendezvous "
            "'%s'. Pending sync.",
            self._node,
            r,
            self._settings.run_id,
        )
        seen_claim = False  # a decision was due (a claim existed): take over if it goes
        round_prefix = keys.own
        # Performance: without a last call, a joiner that does not decide at once needs no
        # read after joining: the one before it (``rev``, ``snap``: the round's keys) is as
        # good, since nothing this node did since is under them; its wait starts from it.
        fresh = direct or core.min_nodes < core.max_nodes
        last: dict[str, bytes] | None = None
        while True:
            if clock.now() >= deadline:
                _, count, marked = await _count_under(store, mprefix)
                await store.delete(mprefix + self._node)
                if await store.try_get(dec_key) == token:
                    await store.delete(dec_key)
                raise self._timeout_error(r, count - marked)
            if fresh:
                rev, snap = await store.snapshot(round_prefix)
            if snap == last:
                # Nothing of the round changed: the state did (the state moves on only
                # once the round has a result; a close writes one too — unless its
                # closer died in between), or a past round's key, or a timeout.
                st_raw = await store.try_get(state_key)
                if st_raw is not None:
                    st = self._parse_state(st_raw)
                    if st.closed or st.round != r:
                        return None  # closed, or the round ended
            fresh = True
            last = snap
            raw = snap.get(result_key)
            if raw is not None:
                return self._decode_result(r, raw)
            call = snap.get(lc_key)
            running = call is not None
            seen = seen or running
            if my_call is not None and call not in (None, token):
                my_call = None  # another arrival re-armed the last call: it is theirs now
            now = clock.now()
            passed = (
                (seen and not running)
                or (my_call is not None and now >= my_call)
                or (told is not None and not seen and now >= told)
            )
            claim = snap.get(dec_key)
            holder = claim == token
            if claim is not None and not holder:
                seen_claim = True
            due = direct or passed or seen_claim
            if not holder and (claim is not None or not due):
                # The one wait of most joiners: for the result, the last call's end or a
                # claim's expiry (all under the state key's prefix).
                until = deadline if my_call is None or passed else min(deadline, my_call)
                if told is not None and not seen and not passed:
                    until = min(until, told)
                with contextlib.suppress(TimeoutError):  # a timeout: read afresh above
                    # the wake and its read of the round's keys in one round trip
                    rev, snap = await wsnap(
                        state_key, rev, round_prefix, max(0.0, until - clock.now())
                    )
                    fresh = False
                continue
            if not holder and not direct:
                # one decider: the first live joiner to claim (the claim dies with it)
                if await store.compare_set(dec_key, None, token, lease=self._lease) != token:
                    continue
                holder = True
            # the joiners, and with them (one read of r<r>/) the arrival count they make
            rev, every = await store.snapshot(keys.round)
            arrivals = _count_value(every.get(keys.count))
            live = {k: v for k, v in every.items() if k.startswith(mprefix)}
            del every
            ids = [k[len(mprefix) :] for k in live if k != mprefix]
            previous: tuple[str, ...] = ()
            if len(ids) >= core.max_nodes:
                # the previous members matter only to a full round (admitted first)
                previous = await self._previous_members(r)
            pending = await self._pending(r, ids, previous)
            chosen = choose_members(ids, previous, core, last_call_passed=passed, pending=pending)
            # the members' rank blocks and rank 0's address, from the values read with
            # their keys (module doc)
            ranks, master = (
                (None, None) if chosen is None else self._rank_runs(mprefix, live, chosen)
            )
            del live  # Performance: no N-key dict kept alive across the waits below
            if chosen is not None:
                # After the decision r<r>/m/ holds the members' keys only (module doc)
                left_out = sorted(set(ids).difference(chosen))
                if left_out:
                    await self._delete_all([mprefix + node for node in left_out])
                    # the members watch from after these deletes
                    rev, _ = await store.snapshot(keys.ev)
                decided: dict[str, Any] = {
                    "version": _VERSION,
                    "round": r,
                    "members": list(chosen),
                    "clean": rev,
                }
                if arrivals is not None:
                    decided["arrivals"] = arrivals
                if ranks is not None:
                    decided["ranks"] = ranks
                    if master is not None:
                        decided["master"] = master
                mine = _dump(decided)
                # First writer wins; a racing decider adopts the winner's result.
                won = await store.compare_set(result_key, None, mine)
                if holder:
                    await store.delete(dec_key)  # the round is decided: the claim is spent
                if won == mine and r >= 1:
                    # round r-1's result was read by this round's decider only; deleted
                    # now, after this round's result, it wakes no joiner of the state
                    await store.delete(self._ek(r - 1, "result"))
                return self._decode_result(r, won)
            if direct:
                direct = False  # held: from now on only the claim's holder decides
                if claim is None:
                    await store.compare_set(dec_key, None, token, lease=self._lease)
                continue
            # Held (a pending seat, or below min_nodes after the last call): the holder
            # alone waits for a joiner to arrive or die, a pending node to rejoin or
            # expire, a new last call to end, or the round to end.
            with contextlib.suppress(TimeoutError):  # the join timeout: the loop raises it
                rev, snap = await wsnap(
                    self._c, rev, round_prefix, max(0.0, deadline - clock.now())
                )
                fresh = False

    async def _live_before(self, mprefix: str, n: int) -> int:
        """The live joiners that arrived before arrival ``n`` and wrote their keys (the
        join's steps apart: every joiner's key read, O(N))."""
        _, live = await self._store.snapshot(mprefix)
        # Performance: counted in C (map, the cached _index, n.__gt__), not a generator
        # per key
        before = sum(map(n.__gt__, map(_index, live.values())))
        marker = live.get(mprefix)  # the end marker is no joiner
        if marker is not None and _index(marker) < n:
            before -= 1
        return before

    def _joiner_value(self, n: int | None) -> bytes:
        """This joiner's ``m/`` value: its arrival index ``n`` (``None``: not known
        when the key is written, without a last call), with its member info if it has
        some: ``[n,role,lws,port,addr]`` (n = 0 when unknown), where ``port`` is the
        master port it would use as rank 0, chosen now, at the join, by the rules rank 0
        applied after the decision before (:meth:`_choose_port`)."""
        tail = self._member_tail
        if tail is None:
            return b"" if n is None else str(n).encode()
        port = self._port_tail or str(self._choose_port()).encode() + self._addr_tail
        return b"[" + str(n or 0).encode() + tail + port

    def _choose_port(self) -> int:
        """The master port this node uses as rank 0: ``--master-port`` if given, else
        the port chooser's (real mode: a free port), else :data:`DEFAULT_MASTER_PORT`."""
        return self._master_port or (
            int(self._port_chooser()) if self._port_chooser else DEFAULT_MASTER_PORT
        )

    def _rank_runs(
        self, mprefix: str, live: dict[str, bytes], chosen: tuple[str, ...] | list[str]
    ) -> tuple[list[list[int]] | None, list[Any] | None]:
        """The chosen members' rank blocks in rank order, from the joiners' ``m/`` values
        (``live``), as runs (:func:`rank_runs`), and rank 0's ``[address, port]``;
        ``(None, None)`` if one of them published no member info, no address if rank 0
        published none (a joiner of another version)."""
        # Performance: without the address, most values are equal (n = 0 without a last
        # call, the same port): parsed once; only rank 0's address is decoded (the
        # others' are not used, and only checked to be there)
        seen: dict[bytes, tuple[str, int, int | None] | None] = {}
        infos: list[tuple[str, int]] = []
        master: list[Any] | None = None
        for node in chosen:
            raw = live[mprefix + node]
            head, addr = _split_joiner(raw)
            try:
                if len(raw) > MAX_JOINER_BYTES:
                    raise _Corrupt(f"{len(raw)} bytes exceeds the {MAX_JOINER_BYTES}-byte limit")
                if head in seen:
                    info = seen[head]
                else:
                    info = seen[head] = _parse_joiner(head, addr is not None)
                if info is not None and addr is not None and not infos:
                    master = [_parse_address(addr), info[2]]
                elif addr is not None and len(addr) < 3:
                    raise _Corrupt(f"expected an address (non-empty string) last, got {raw!r}")
            except _Corrupt as e:
                raise _corrupt(mprefix + node, str(e)) from None
            if info is None:
                return None, None
            infos.append((info[0], info[1]))
        return rank_runs(infos), master

    async def _delete_all(self, keys: list[str]) -> None:
        """Delete ``keys`` at once: one round trip's time for all of them, not one each
        (a round that leaves spares out deletes one key per spare before its result)."""
        clock, store = self._clock, self._store
        tasks = [clock.spawn(store.delete(key), name="rdzv-left-out") for key in keys]
        try:
            for task in tasks:
                await task.join()
        finally:
            for task in tasks:
                task.cancel()

    async def _arm_last_call(self, r: int, token: bytes) -> float:
        """Start round ``r``'s last call; return when it ends on this node's clock."""
        ends = self._clock.now() + self._core.last_call_timeout
        lease = await self._store.grant_lease(self._core.last_call_timeout)
        await self._store.set(self._ek(r, "lc"), token, lease=lease)
        lease.abandon()  # nobody renews it: the store expires it, and the key, at the deadline
        return ends

    async def _pending(self, r: int, ids: list[str], previous: tuple[str, ...]) -> tuple[str, ...]:
        """Nodes round ``r`` expects (round ``r - 1``'s members, waiting and redundant
        nodes, with a live lease) that have not joined it yet — only when they matter.

        They matter only for a full round with a joiner that was not a member before
        (``choose_members``); otherwise no store operation is spent.
        """
        if r == 0 or len(ids) < self._core.max_nodes or set(ids) <= set(previous):
            return ()
        store = self._store
        before = self._keys(r - 1)
        _, wait = await store.snapshot(before.ev)
        wait.pop(before.count, None)  # the arrival counter is no node
        _, spare = await store.snapshot(self._k(f"x/r{r - 1}/"))
        _, alive = await store.snapshot(self._k("alive/"))
        expected = set(previous)
        expected.update(k.rsplit("/", 1)[1] for k in wait if not k.endswith("/"))
        expected.update(k.rsplit("/", 1)[1] for k in spare)
        base = self._k("alive/")
        joined = set(ids)
        return tuple(sorted(e for e in expected if e not in joined and base + e in alive))

    async def _finish(
        self, r: int, members: _Members, deadline: float, raw_state: bytes
    ) -> RendezvousInfo | None:
        """Round ``r``'s rendezvous info for this member: rank 0's address and master port
        from the result when it carries them (no store operation), else exchanged
        through the round's store; ``None`` if a member was lost meanwhile."""
        rank = members.rank[self._node]
        logger.info(
            "The node '%s' has joined round %s of the rendezvous '%s' as rank %s in a world "
            "of size %s.",
            self._node,
            r,
            self._settings.run_id,
            rank,
            len(members),
        )
        self._round, self._members, self._redundant = r, members, False
        self._member_state = raw_state
        if members.clean is not None:
            self._clean = (r, members.clean)
        keys = self._keys(r)
        store = PrefixStore(self._round_store, keys.store)
        master = members.master
        if master is not None:
            # the decider put rank 0's address and port (chosen at its join) in the result
            self._drop_round_watch()
            return RendezvousInfo(
                store,
                rank,
                len(members),
                RendezvousStoreInfo(master[0], master[1]),
                round=r,
                assignment=members.assignment(rank),
            )
        port = self._choose_port() if rank == 0 else 0
        wait = max(deadline - self._clock.now(), self._ttl)
        clock = self._clock
        self._drop_round_watch()
        # Performance: most members find rank 0's address already published: read it
        # inline first, and race only a read that would block (a task, an AnyOf and a
        # timer each, in the simulator).  Every member learns of the result at the same
        # instant as rank 0, so the others first yield once (no time passes): rank 0's
        # publish, sent in that instant, then reaches the store before their reads.
        if rank != 0:
            await clock.sleep(0)
        try:
            return RendezvousInfo(
                store,
                rank,
                len(members),
                await self._master_info(rank, keys, port, 0.0),
                round=r,
                assignment=members.assignment(rank),
            )
        except TimeoutError:
            pass
        # The member watch of the round starts here only if the read would block (it
        # watches from the round's clean revision, so starting it later misses nothing),
        # and is the same task that watch_async() later joins, so guarding the exchange
        # costs no store operation beyond the watch the agent runs anyway.
        watch = self._round_watch = clock.spawn(
            self._round_watch_body(r, members), name="rdzv-round-watch"
        )
        build = clock.spawn(
            self._master_info(rank, keys, port, wait),
            name="rdzv-master-addr",
        )
        # Rank 0 may be dead already (its lease outlived it while the round was decided):
        # wait for its address only as long as every member is alive (see module doc).
        lost: Task[str] | None = None
        try:
            idx, value = await clock.first(build, watch)
            if idx == 1 and _unwrap(value) == "nodes_waiting":
                # late arrivals wait for this round to run: keep guarding against deaths
                lost = clock.spawn(
                    self._watch_round(r, members, waiting_ends=False), name="rdzv-members"
                )
                idx, value = await clock.first(build, lost)
        except TimeoutError:
            raise RendezvousTimeoutError(
                f"Rank 0 of round {r} of the rendezvous '{self.get_run_id()}' did not publish "
                f"MASTER_ADDR/MASTER_PORT within {wait:g}s; it may have died."
            ) from None
        finally:
            build.cancel()
            if lost is not None:
                lost.cancel()
        if idx == 1:
            self._round_watch = None
            logger.info(
                "The node '%s' leaves round %s of the rendezvous '%s' before its ranks were "
                "exchanged: %s.",
                self._node,
                r,
                self._settings.run_id,
                _unwrap(value),
            )
            return None
        info: RendezvousStoreInfo = value
        return RendezvousInfo(
            store, rank, len(members), info, round=r, assignment=members.assignment(rank)
        )

    async def _master_info(
        self, rank: int, keys: _RoundKeys, port: int, timeout: float
    ) -> RendezvousStoreInfo:
        """:meth:`RendezvousStoreInfo.build_async` in round ``keys``' store: rank 0
        publishes its address and ``port``, every member reads them back.  The same
        operations, on the round store's own keys, built once a round (not a
        :class:`PrefixStore`'s per call: every member of every round runs this)."""
        store = self._round_store
        addr_key, port_key = keys.master
        if rank == 0:
            await store.multi_set({addr_key: self._addr.encode(), port_key: str(port).encode()})
        addr, raw_port = await store.multi_get(keys.master, timeout)
        return RendezvousStoreInfo(addr.decode(), int(raw_port.decode()))

    async def _park(self, r: int, members: tuple[str, ...], deadline: float) -> float:
        """Wait, on the wait or redundancy list of complete round ``r``, for it to end."""
        role = arrival_role(len(members), self._core)
        self._redundant = role is NodeStatus.REDUNDANT
        if self._redundant:
            key = self._k("x", f"r{r}", self._node)
        else:
            key = self._rk(r, "ev", self._node)
        await self._store.set(key, b"", lease=self._lease)
        logger.info(
            "The node '%s' added itself to the %s of round %s of the rendezvous '%s'. "
            "Pending sync.",
            self._node,
            "redundancy list" if self._redundant else "wait list",
            r + 1,
            self._settings.run_id,
        )
        # Redundant nodes wait without a deadline (torch); waiting ones within join.
        timeout = None if self._redundant else max(0.0, deadline - self._clock.now())
        try:
            await self._wait_round_end(r, len(members), timeout)
        except TimeoutError:
            await self._store.delete(key)
            raise self._timeout_error(r, None) from None
        return self._clock.now() + self._core.join_timeout if self._redundant else deadline

    async def _wait_round_end(self, r: int, size: int, timeout: float | None) -> None:
        """Wait, off the members of complete round ``r``, until the round ends.

        It ends with its end marker (``r<r>/m/``), the state moving on — or a member's
        key going (its lease expired): then this node ends the round itself
        (``_core``: a member's expiry opens the next round), since every member may be
        dead.  One read of ``r<r>/m/`` on arrival (a member may have died before it
        came), then one watch of it, answered with the state: O(1) wake-ups per round.
        """
        clock, store = self._clock, self._store
        state_key, mkey = self._state_key, self._keys(r).m
        end = None if timeout is None else clock.now() + timeout
        clean: int | None = None
        woke = False
        snap: dict[str, bytes] | None = None
        while True:
            if snap is None:
                _, snap = await store.snapshot(state_key)
            raw = snap.get(state_key)
            if raw is not None:
                st = self._parse_state(raw)
                if st.closed or st.round != r:
                    return
            if clean is None:
                # the members' keys, once: are they all there?  (counted, not copied)
                clean, count, ended = await _count_under(store, mkey)
                if ended:
                    return
                woke = count < size
            elif await store.try_get(mkey) is not None:
                return
            if woke and raw is not None:
                await self._advance(raw, r)  # a member's key went: the round is over
                return
            left = None if end is None else end - clock.now()
            if left is not None and left <= 0:
                raise TimeoutError(f"{mkey} was not written within {timeout}s")
            # the wake and its read of the state in one round trip
            _, snap = await self._watch_snapshot(mkey, clean, state_key, left)
            woke = True

    async def _advance(self, raw_state: bytes, r: int) -> bytes:
        """End complete round ``r``: open ``r + 1`` (unless someone already did); return
        the state afterwards (empty if there is none).

        The new state names the node that wrote it (``by``), so only the one whose
        ``compare_set`` won gets its own value back and ends the round: the others (every
        member asks again) spend that one operation, which is also their read of the state.
        """
        # Performance: every member builds this once a round; _dump's output, spelled out
        desired = (
            f'{{"by":{self._by},"closed":false,"round":{r + 1},"version":{_VERSION}}}'.encode()
        )
        now = await self._store.compare_set(self._state_key, raw_state, desired)
        if now != desired:
            return now
        await self._end_round(r, desired)
        # nobody reads round r-1 any more (round r+1's decider reads round r; round r-1's
        # result went when round r was decided): drop it, off the join's path
        if r >= 1:
            self._drop_task = self._clock.spawn(self._drop_round(r - 1), name="rdzv-drop-round")
        return now

    async def _drop_round(self, r: int) -> None:
        """Delete round ``r``: its keys (members, wait and redundancy lists, events) and
        its store ``s/<r>/`` (addresses, the agents' ranks), which nobody reads once round
        ``r + 1`` is complete, so the store stays flat however many times the job
        restarts.  Best effort: a store that is gone or cannot list keys keeps them."""
        try:
            # gone already, unless round r+1's decider died right after writing its result
            await self._store.delete(self._ek(r, "result"))
            await _delete_under(self._store, self._rk(r, ""))
            await _delete_under(self._store, self._k(f"x/r{r}/"))
            await _delete_under(self._round_store, f"{self._base}/s/{r}/")
        except Exception as e:  # nobody joins this task: log, not raise
            logger.debug("round %s's keys were not deleted: %s", r, e)

    async def _close(self) -> None:
        while True:
            raw, st = await self._read_state()
            if st.closed:
                return
            desired = _dump({"version": _VERSION, "round": st.round, "closed": True})
            if await self._store.compare_set(self._k("state"), raw, desired) == desired:
                break
        logger.info(
            "The node '%s' has closed the rendezvous '%s'.", self._node, self._settings.run_id
        )
        r = st.round
        closed = {"version": _VERSION, "round": r, "closed": True}
        await self._store.compare_set(self._ek(r, "result"), None, _dump(closed))  # joiners
        await self._end_round(r, _dump(closed))  # members, waiting, redundant

    async def _end_round(self, r: int, marker: bytes) -> None:
        """Write round ``r``'s end marker, as one revision: under the members' keys (what
        members and parked nodes watch) and on the wait list's prefix (so a member's one
        read after a wake, of ``r<r>/ev/``, finds both the marker and the wait list)."""
        keys = self._keys(r)
        await self._store.multi_set({keys.m: marker, keys.ev: marker})

    def _raise_closed(self) -> None:
        if self._redundant:
            raise RendezvousGracefulExitError(
                f"The rendezvous '{self.get_run_id()}' was closed while node '{self._node}' "
                "was a spare (redundancy list); it ends without error."
            )
        raise RendezvousClosedError(
            f"The rendezvous '{self.get_run_id()}' is closed; start a new job with another "
            "--rdzv-id to run again."
        )

    def _timeout_error(self, r: int, n: int | None) -> RendezvousTimeoutError:
        joined = f" ({n} joined so far, min_nodes={self._core.min_nodes})" if n else ""
        return RendezvousTimeoutError(
            f"The node '{self._node}' timed out in round {r} of the rendezvous "
            f"'{self.get_run_id()}' after join_timeout={self._core.join_timeout:g}s{joined}; "
            "start more nodes or raise join_timeout in --rdzv-conf."
        )


def _count_value(raw: bytes | None) -> int | None:
    """The integer an arrival counter holds (``add``'s decimal bytes; absent: 0); None
    for a value that is not one (another writer's: then nothing is inferred from it)."""
    if raw is None:
        return 0
    try:
        return int(raw)
    except ValueError:
        return None


async def _count_under(store: Store, prefix: str) -> tuple[int, int, bool]:
    """(revision, how many keys are under ``prefix``, whether ``prefix`` itself is one):
    in one operation that copies nothing where the store can (``count_prefix``: the
    in-memory store and the simulator's client), else from a snapshot."""
    count = getattr(store, "count_prefix", None)
    if count is not None:
        rev, n, marked = await count(prefix)
        return rev, n, marked
    rev, keys = await store.snapshot(prefix)
    return rev, len(keys), prefix in keys


async def _delete_under(store: Store, prefix: str) -> None:
    """Delete every key under ``prefix``: in one operation where the store can
    (``delete_prefix``: the in-memory store and the simulator's client, where one
    delete per key cost 38 % of bench_sim's events), else one delete per key."""
    drop = getattr(store, "delete_prefix", None)
    if drop is not None:
        await drop(prefix)
        return
    _, keys = await store.snapshot(prefix)
    for key in sorted(keys):
        await store.delete(key)


def _get_timeout(params: RendezvousParameters, key: str) -> timedelta | None:
    # seconds, fractions allowed (torch takes whole seconds only): ``elastic real
    # --time-scale`` divides a scenario's timeouts, and a simulated 1.5 s last call
    # must not be truncated to 1
    value = params.get(key + "_timeout")
    if value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"The rendezvous configuration option '{key}_timeout' does not represent a "
            "valid number of seconds."
        ) from None
    if not math.isfinite(seconds):
        raise ValueError(
            f"The rendezvous configuration option '{key}_timeout' does not represent a "
            "valid number of seconds."
        )
    return timedelta(seconds=seconds)


def _required_int(params: RendezvousParameters, key: str, default: int) -> int:
    if key in params.config and params.config[key] is None:
        raise TypeError(f"You passed '{key}=None' as a rendezvous configuration option")
    value = params.get_as_int(key, default)
    assert value is not None
    return value


def create_handler(
    store: Store | SyncStore, backend: RendezvousBackend, params: RendezvousParameters
) -> DynamicRendezvousHandler:
    """Create a new :class:`DynamicRendezvousHandler` from ``params`` (torch's API).

    torch's keys: ``join_timeout`` (600), ``last_call_timeout`` (30), ``close_timeout``
    (30), ``keep_alive_interval`` (5), ``keep_alive_max_attempt`` (3); a bad value raises
    torch's ``ValueError`` / ``TypeError``.  Real mode (see :meth:`from_backend`).
    """
    timeout = RendezvousTimeout(
        _get_timeout(params, "join"),
        _get_timeout(params, "last_call"),
        _get_timeout(params, "close"),
    )
    interval = _required_int(params, "keep_alive_interval", 5)
    attempts = _required_int(params, "keep_alive_max_attempt", 3)
    return DynamicRendezvousHandler.from_backend(
        params.run_id,
        store,
        backend,
        params.min_nodes,
        params.max_nodes,
        params.local_addr,
        timeout,
        keep_alive_interval=interval,
        keep_alive_max_attempt=attempts,
    )


def create_port_handler(
    params: RendezvousParameters, ctx: RendezvousContext
) -> DynamicRendezvousHandler:
    """Build the ``c10d`` handler from ``--rdzv-conf`` keys (torch's, plus ``master_port``).

    Keys: ``join_timeout`` (600), ``last_call_timeout`` (30), ``close_timeout`` (30),
    ``heartbeat_timeout`` (lease time-to-live; default ``keep_alive_interval *
    keep_alive_max_attempt`` = 15 s), ``keep_alive_interval`` (5), ``keep_alive_max_attempt``
    (3), ``master_port``.  A bad value raises :class:`ConfigError` naming ``--rdzv-conf``.
    """
    try:
        timeout = RendezvousTimeout(
            _get_timeout(params, "join"),
            _get_timeout(params, "last_call"),
            _get_timeout(params, "close"),
            _get_timeout(params, "heartbeat"),
        )
        interval = _required_int(params, "keep_alive_interval", 5)
        attempts = _required_int(params, "keep_alive_max_attempt", 3)
        if interval <= 0 or attempts <= 0:
            raise ValueError(
                "The rendezvous configuration options 'keep_alive_interval' and "
                f"'keep_alive_max_attempt' must be positive (got {interval} and {attempts})."
            )
        settings = RendezvousSettings(
            params.run_id,
            params.min_nodes,
            params.max_nodes,
            timeout,
            timedelta(seconds=interval),
            attempts,
        )
        explicit_ttl = params.get("heartbeat_timeout") is not None
        handler = DynamicRendezvousHandler(
            ctx.node_id,
            ctx.node_addr if params.local_addr is None else params.local_addr,
            settings,
            params.backend,
            ctx.store,
            ctx.clock,
            lease_ttl=timeout.heartbeat.total_seconds() if explicit_ttl else None,
            master_port=params.get_as_int("master_port"),
            port_chooser=ctx.port_chooser,
        )
        handler.sync_runner = ctx.sync_runner
        return handler
    except ConfigError:  # a ValueError too, already naming its flag
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError("--rdzv-conf", str(e)) from None
