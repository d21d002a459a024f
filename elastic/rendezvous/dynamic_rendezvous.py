"""The dynamic rendezvous (torch's ``c10d`` backend semantics) over the store port.

The rules are torch's and live in :mod:`elastic.rendezvous._core`; this module performs
them with store operations, awaiting only the clock and store ports.

Protocol (keys under ``elastic/rdzv/<run_id>/c/``)
---------------------------------------------------
* ``state`` — JSON ``{"version": 1, "round": r, "closed": bool}``, changed with
  ``compare_set`` only when a round ends or the rendezvous closes.  Never per heartbeat.
* ``alive/<node>`` — attached to the node's lease: liveness without heartbeat writes.
* ``r<r>/m/<node>`` (leased) and ``r<r>/count`` — joining round ``r`` is one ``set`` and
  one ``add``; ``add`` tells the joiner its arrival index ``n``.
* ``state/r<r>/result`` — the members of round ``r`` in rank order, written once with
  ``compare_set(None → …)`` by the *decider*: the joiner whose ``n`` reaches
  ``max_nodes`` (at once) or whose last call ends with ``≥ min_nodes`` live joiners
  (the ``min_nodes``-th joiner holds torch's last-call deadline; later joiners are
  fail-overs in case it dies).  Everyone else waits on this one key: a rendezvous of
  N nodes costs O(N) store operations and bytes in total, O(1) per node.
* ``r<r>/ev/w/<node>`` (leased) — a late arrival on the wait list; ``r<r>/x/<node>`` —
  on the redundancy list; ``r<r>/ev/lost`` — a member saw its ring successor's lease
  expire.  ``state/r<r>/next`` — the round is over (next round number, or closed): what
  waiting and redundant nodes wait on.

Ending a round (or closing) is two writes: the ``state``, then the end marker.  The
markers live under the ``state`` key's own prefix, and a node waiting for one
(:meth:`DynamicRendezvousHandler._wait_end`) watches that prefix: it wakes on the marker
*or* on the state moving on, so a node that dies between its two writes strands nobody.
The prefix changes only when a round is decided, ends or closes: O(1) wake-ups per
waiter per round.

Members of a complete round watch the control prefix; each checks only its successor
in rank order (a ring), so a death costs O(N) wake-ups in total, and the one who sees
it writes ``ev/lost`` for the others.  Nothing polls; nothing is pickled; every value
read is checked against its schema and a corrupt one raises
:class:`RendezvousStateError` naming the key.

A round may be decided with a member that has just died: its leased keys outlive it by
the lease's time-to-live.  So while a member exchanges the round's master address (and
while the agent exchanges ranks, :meth:`DynamicRendezvousHandler.watch_members_async`),
it also runs the ring check above: when a member's lease expires, the round ends
(``peer_lost``) and the survivors join the next one, instead of waiting for the dead
member's address until their join timeout.

Each round has its own store, ``elastic/rdzv/<run_id>/s/<r>/`` (a :class:`PrefixStore`),
where rank 0 publishes MASTER_ADDR/MASTER_PORT.  Round ``r``'s keys (``r<r>/``,
``state/r<r>/``) and its store are deleted once round ``r + 1`` is complete and a new
round opens (nobody reads them then): the store does not grow with restarts.

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

import functools
import json
import logging
import math
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from elastic._records import Frozen, set_fields
from elastic.clock import Clock, Task
from elastic.errors import ConfigError
from elastic.rendezvous._core import (
    CoreSettings,
    NodeStatus,
    arrival_role,
    choose_members,
    first_attempt_at,
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
)
from elastic.rendezvous.prefix_store import PrefixStore
from elastic.store import Lease, Store

if TYPE_CHECKING:
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
    """Node ids in rank order, with an O(1) rank lookup (``in`` uses it too)."""

    rank: dict[str, int]

    def __new__(cls, ids: list[str]) -> _Members:
        self = super().__new__(cls, ids)
        self.rank = {m: i for i, m in enumerate(self)}
        return self

    def __contains__(self, node: object) -> bool:
        return node in self.rank


@functools.lru_cache(maxsize=32)
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
    return _Members(members)


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
        self._addr = node_addr
        self._settings = settings
        self._backend_name = backend_name
        self._store = store
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
        self._lease: Lease | None = None
        self._round: int | None = None
        self._members = _Members([])
        self._redundant = False
        self._round_watch: Task[str | Exception] | None = None

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
        if isinstance(store, SyncStore):
            sync_runner = sync_runner or store._run
            store = store.port
        if clock is None or node_id is None:
            # real mode: the process-wide loop thread, its clock and torch's node id
            from elastic.launcher.api import fqdn
            from elastic.real.rdzv_context import node_id as make_node_id
            from elastic.real.rdzv_context import shared_loop

            if clock is None:
                # leases in a backend compare times across nodes, as torch's heartbeats
                from elastic.timer.wallclock import WallClock

                clock = WallClock()
                sync_runner = sync_runner or shared_loop().run
            local_addr = local_addr or fqdn()
            node_id = node_id or make_node_id(local_addr)
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
        while True:
            raw_state, st = await self._read_state()
            if st.closed:
                self._raise_closed()
            r = st.round
            raw = await self._store.try_get(self._ek(r, "result"))
            members: _Members | None
            if raw is None:
                members = await self._join_open_round(r, deadline)
            else:
                members = self._decode_result(r, raw)
                if members is not None and self._node in members:
                    # A member asking again wants a new round (its group restarts).
                    await self._advance(raw_state, r)
                    continue
            if members is None:  # closed while we joined: re-read the state
                continue
            if self._node in members:
                info = await self._finish(r, members, deadline)
                if info is None:  # a member died: this round is over, ask for the next
                    continue
                return info
            deadline = await self._park(r, members, deadline)

    async def watch_async(self) -> str:
        if self._round is None:
            raise RuntimeError("watch_async() needs a completed next_rendezvous_async() first")
        if self._round_watch is not None:
            # the round's ring check already runs (started when the round was decided)
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
        i = members.rank[self._node]
        succ = members[(i + 1) % len(members)] if len(members) > 1 else None
        ev = self._rk(r, "ev/")
        while True:
            # Take the revision first: any change after it wakes the watch below.
            rev, events = await self._store.snapshot(ev)
            waiting = waiting_ends and any(k.startswith(ev + "w/") for k in events)
            lost = ev + "lost" in events
            _, st = await self._read_state()
            if st.closed:
                return "closed"
            if st.round != r:  # someone already ended our round
                return "nodes_waiting" if waiting else "peer_lost" if lost else "restarted"
            if waiting:
                return "nodes_waiting"
            if lost:
                return "peer_lost"
            if succ is not None and await self._store.try_get(self._k("alive", succ)) is None:
                await self._store.set(ev + "lost", succ.encode())
                return "peer_lost"
            await self._store.watch(self._c, rev)

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
        ev = self._rk(self._round, "ev/")
        _, events = await self._store.snapshot(ev + "w/")
        return len(events)

    async def shutdown_async(self) -> bool:
        """torch's semantics: close the rendezvous for every node; then drop the lease."""
        try:
            await self.set_closed_async()
        except RendezvousError:
            return False
        await self.leave_async()
        return True

    async def leave_async(self) -> None:
        """Leave without closing: revoke the lease so the others see this node gone now."""
        self._drop_round_watch()
        if self._lease is not None:
            await self._lease.revoke()
            self._lease = None

    # -- steps ------------------------------------------------------------------------
    async def _ensure_lease(self) -> None:
        if self._lease is not None and self._lease.alive():
            return
        self._lease = await self._store.grant_lease(self._ttl)
        await self._store.set(
            self._k("alive", self._node), _dump({"addr": self._addr}), lease=self._lease
        )

    async def _read_state(self) -> tuple[bytes, _State]:
        key = self._k("state")
        raw = await self._store.try_get(key)
        if raw is None:
            raw = await self._store.compare_set(
                key, None, _dump({"version": _VERSION, "round": 0, "closed": False})
            )
        return raw, self._parse_state(raw)

    def _parse_state(self, raw: bytes) -> _State:
        key = self._k("state")
        obj = _load(key, raw)
        st = _State(_field(key, obj, "round", int), _field(key, obj, "closed", bool))
        if st.round < 0:
            raise _corrupt(key, f"negative round {st.round}")
        return st

    async def _wait_end(self, r: int, part: str, timeout: float | None) -> bytes | None:
        """Wait for round ``r``'s ``part`` marker (``result`` or ``next``); return it.

        Returns ``None`` if the state moved past round ``r`` (or closed) without the
        marker — its writer died between its two writes; the caller re-reads the state.
        Raises :class:`TimeoutError` after ``timeout`` seconds.
        """
        clock, store = self._clock, self._store
        # the state key is also the prefix of every end marker (see the module docstring)
        state_key, key = self._k("state"), self._ek(r, part)
        deadline = None if timeout is None else clock.now() + timeout
        while True:
            rev, snap = await store.snapshot(state_key)
            if key in snap:
                return snap[key]
            raw = snap.get(state_key)
            if raw is not None:
                st = self._parse_state(raw)
                if st.closed or st.round != r:
                    return None
            left = None if deadline is None else deadline - clock.now()
            if left is not None and left <= 0:
                raise TimeoutError(f"{key} was not written within {timeout}s")
            await store.watch(state_key, rev, left)

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

    async def _join_open_round(self, r: int, deadline: float) -> _Members | None:
        """Join open round ``r``; decide it if it falls to us; return its members."""
        clock, store = self._clock, self._store
        mprefix = self._rk(r, "m/")
        result_key = self._ek(r, "result")
        await store.set(mprefix + self._node, b"", lease=self._lease)
        n = await store.add(self._rk(r, "count"), 1)
        logger.info(
            "The node '%s' added itself to the participants of round %s of the rendezvous "
            "'%s'. Pending sync.",
            self._node,
            r,
            self._settings.run_id,
        )
        joined_at = clock.now()
        attempt = first_attempt_at(n, joined_at, self._core)
        last_call_end = joined_at + self._core.last_call_timeout
        previous: tuple[str, ...] | None = None
        while True:
            now = clock.now()
            if now >= deadline:
                await store.delete(mprefix + self._node)
                raise self._timeout_error(r, n)
            until = deadline if attempt is None else min(deadline, attempt)
            try:
                # The one wait of a joiner, woken by the decider (or by a close).
                raw = await self._wait_end(r, "result", until - now)
                return None if raw is None else self._decode_result(r, raw)
            except TimeoutError:
                pass
            if attempt is None or clock.now() < attempt:
                continue
            if previous is None:
                previous = await self._previous_members(r)
            rev, live = await store.snapshot(mprefix)
            ids = [k[len(mprefix) :] for k in live]
            chosen = choose_members(
                ids, previous, self._core, last_call_passed=clock.now() >= last_call_end
            )
            if chosen is not None:
                mine = _dump({"version": _VERSION, "round": r, "members": list(chosen)})
                # First writer wins; a racing decider adopts the winner's result.
                return self._decode_result(r, await store.compare_set(result_key, None, mine))
            if len(ids) >= self._core.min_nodes:
                attempt = last_call_end  # enough nodes; the last call is still on
                continue
            # Joiners died below min_nodes: wait for another to arrive, then a fresh last
            # call (torch clears the deadline below min and sets it again at min).  The
            # whole control prefix, so that a close (the state key) wakes us too.
            try:
                await store.watch(self._c, rev, max(0.0, deadline - clock.now()))
            except TimeoutError:
                continue
            attempt = clock.now()
            last_call_end = attempt + self._core.last_call_timeout

    async def _finish(self, r: int, members: _Members, deadline: float) -> RendezvousInfo | None:
        """Exchange round ``r``'s master address; ``None`` if a member was lost meanwhile."""
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
        store = PrefixStore(self._round_store, f"{self._base}/s/{r}/")
        port = 0
        if rank == 0:
            port = self._master_port or (
                int(self._port_chooser()) if self._port_chooser else DEFAULT_MASTER_PORT
            )
        wait = max(deadline - self._clock.now(), self._ttl)
        clock = self._clock
        # Performance: the ring check of the round starts here and is the same task that
        # watch_async() later joins, so guarding the exchanges costs no store operation
        # beyond the watch the agent runs anyway (measured with bench/bench_sim.py).
        self._drop_round_watch()
        watch = self._round_watch = clock.spawn(
            self._round_watch_body(r, members), name="rdzv-round-watch"
        )
        # Performance: most members find rank 0's address already published (rank 0 never
        # waits): read it inline first, and race only a read that would block.
        try:
            return RendezvousInfo(
                store,
                rank,
                len(members),
                await RendezvousStoreInfo.build_async(rank, store, self._addr, port, 0.0),
                round=r,
            )
        except TimeoutError:
            pass
        build = clock.spawn(
            RendezvousStoreInfo.build_async(rank, store, self._addr, port, wait),
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
        return RendezvousInfo(store, rank, len(members), info, round=r)

    async def _park(self, r: int, members: tuple[str, ...], deadline: float) -> float:
        """Wait, on the wait or redundancy list of complete round ``r``, for it to end."""
        role = arrival_role(len(members), self._core)
        self._redundant = role is NodeStatus.REDUNDANT
        key = self._rk(r, "x", self._node) if self._redundant else self._rk(r, "ev/w", self._node)
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
            await self._wait_end(r, "next", timeout)
        except TimeoutError:
            await self._store.delete(key)
            raise self._timeout_error(r, None) from None
        return self._clock.now() + self._core.join_timeout if self._redundant else deadline

    async def _advance(self, raw_state: bytes, r: int) -> None:
        """End complete round ``r``: open ``r + 1`` (unless someone already did)."""
        desired = _dump({"version": _VERSION, "round": r + 1, "closed": False})
        if await self._store.compare_set(self._k("state"), raw_state, desired) != desired:
            return
        await self._store.set(self._ek(r, "next"), _dump({"version": _VERSION, "round": r + 1}))
        if r >= 1:  # nobody reads round r-1 any more (round r+1's decider reads round r)
            removed = [
                await self._store.delete(key)
                for key in (
                    self._ek(r - 1, "result"),
                    self._rk(r - 1, "count"),
                    self._ek(r - 1, "next"),
                )
            ]
            # and the rest of round r-1, off the join's path, by the one node whose
            # delete removed the result (every member asking again gets here:
            # compare_set returns the desired state to them too)
            if removed[0]:
                self._drop_task = self._clock.spawn(self._drop_round(r - 1), name="rdzv-drop-round")

    async def _drop_round(self, r: int) -> None:
        """Delete round ``r``: its keys (members, wait and redundancy lists, events) and
        its store ``s/<r>/`` (addresses, the agents' ranks), which nobody reads once round
        ``r + 1`` is complete, so the store stays flat however many times the job
        restarts.  Best effort: a store that is gone or cannot list keys keeps them."""
        try:
            await _delete_under(self._store, self._rk(r, ""))
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
        await self._store.set(self._ek(r, "next"), _dump(closed))  # members, waiting, redundant

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
