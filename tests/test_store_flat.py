"""Issue 15: an agent's embedded store is flat over restarts.

Before: every round's store (``s/<r>/``: MASTER_ADDR, MASTER_PORT and the agents' rank
exchange) stayed forever, and the mutation log kept 100,000 entries however few keys
were live, so a crash-looping agent's RSS grew ≈1 KB per restart.  Now a round's store
is deleted once the round after it is complete, and the log is bounded by the live keys.
"""

from __future__ import annotations

from elastic.clock import Clock
from elastic.memstore import LOG_MIN, LOG_PER_KEY, MemoryStore
from tests.test_rendezvous_dynamic import join_all, make
from tests.worlds import run_in


def test_a_restarting_rendezvous_keeps_the_store_and_its_log_flat(world: str) -> None:
    ids = ["a", "b", "c"]

    async def body(clock: Clock) -> list[tuple[int, int]]:
        store = MemoryStore(clock)
        hs = make(clock, store, ids, 3, 3)
        sizes = []
        for _ in range(150):
            infos = await join_all(clock, hs)
            for info in infos:  # the agents' rank exchange, as elastic.agent.ranks does
                await info.store.set(f"torchelastic/role_info/{info.rank}", b"r" * 50)
                await info.store.set(f"torchelastic/assigned_ranks/{info.rank}", b"0,1")
            await clock.sleep(0.01)  # the previous round's store is dropped off the path
            sizes.append((len(store.keys()), len(store._log_revs)))
        return sizes

    sizes = run_in(world, body)
    keys = [k for k, _ in sizes]
    assert max(keys[5:]) == keys[5], keys  # it was +11 keys per round
    log = [n for _, n in sizes]
    assert max(log) <= LOG_MIN + LOG_MIN // 4, log  # was one entry per mutation, to 100,000


def test_the_log_keeps_more_history_for_more_keys_and_a_compacted_watch_rereads(
    world: str,
) -> None:
    async def body(clock: Clock) -> tuple[int, int, int, int, int]:
        store = MemoryStore(clock)
        old = store.revision
        for i in range(5000):  # few live keys, many mutations
            await store.set(f"k/{i % 7}", b"v")
        small = len(store._log_revs)
        compacted = await store.watch("k/", old)  # older than the log: re-read
        recent = store.revision
        await store.set("k/x", b"v")
        seen = await store.watch("k/", recent)  # within the log: that very change
        for i in range(2000):  # many live keys: a longer history
            await store.set(f"big/{i}", b"v")
        return small, compacted, recent, seen, len(store._log_revs)

    small, compacted, recent, seen, large = run_in(world, body)
    assert small <= LOG_MIN + LOG_MIN // 4
    assert compacted == recent  # the current revision, as etcd answers a compacted one
    assert seen == recent + 1
    assert large >= min(2000 + 7, LOG_PER_KEY * 2000) // 2


def test_delete_prefix_drops_a_round_in_one_revision_and_only_that_round(world: str) -> None:
    # the one-operation delete the rendezvous uses where the store has it: one revision,
    # one wake-up for a watcher, leased keys leave their lease, r1/ is not r10/
    async def body(clock: Clock) -> tuple[int, int, list[str], int, int]:
        store = MemoryStore(clock)
        lease = await store.grant_lease(30.0)
        await store.set("c/r1/m/a", b"1", lease=lease)
        await store.set("c/r1/m/b", b"2", lease=lease)
        await store.set("c/r1/ev/lost", b"b")
        await store.set("c/r10/m/a", b"1", lease=lease)
        await store.set("c/r2/m/a", b"1")
        rev, _ = await store.snapshot("")
        watch = clock.spawn(store.watch("c/", rev), name="w")
        await clock.sleep(0)
        gone = await store.delete_prefix("c/r1/")
        woken = await watch.join()
        after, _ = await store.snapshot("")
        again = await store.delete_prefix("c/r1/")
        return gone, after - rev, sorted(store.keys()), woken - rev, again

    gone, revisions, keys, woken, again = run_in(world, body)
    assert gone == 3 and revisions == 1 and woken == 1 and again == 0
    assert keys == ["c/r10/m/a", "c/r2/m/a"]
