"""SimClock's shared wake-ups: sleeps that end at the same time share one simpy event, and
everything happens in exactly the order one simpy Timeout per sleep gives."""

from __future__ import annotations

import contextlib
import random

import pytest
import simpy

from elastic.clock import Cancelled, Task
from sim.clock import SimClock


class _Counting(simpy.Environment):
    """simpy's own environment (one queue entry per event), counting what it schedules."""

    def __init__(self) -> None:
        super().__init__(0.0)
        self.scheduled = 0

    def schedule(
        self,
        event: simpy.Event,
        priority: simpy.events.EventPriority = simpy.events.NORMAL,
        delay: float = 0,
    ) -> None:
        self.scheduled += 1
        super().schedule(event, priority, delay)


async def _fail_after(clock: SimClock, seconds: float) -> None:
    await clock.sleep(seconds)
    raise ValueError(f"failed at {clock.now()}")


def _program(clock: SimClock, seed: int) -> list[tuple[float, str]]:
    """Random tasks that sleep, spawn, cancel each other, set events and race timeouts on
    a few delays (so many sleeps end at the same instant); returns what happened, when."""
    rng = random.Random(seed)
    log: list[tuple[float, str]] = []
    tasks: list[Task[None]] = []
    ev = clock.event()
    delays = [0.0, 0.5, 1.0, 1.5]
    # one-shots waited for with a deadline (timeout() of a one-shot's wait has a path of
    # its own on the clock's own environment), set by other tasks, some never
    shots = [clock.event() for _ in range(4)]

    async def worker(name: str, depth: int) -> None:
        try:
            for i in range(rng.randint(1, 6)):
                choice = rng.random()
                if choice < 0.5:
                    await clock.sleep(rng.choice(delays))
                elif choice < 0.6 and depth < 2:
                    tasks.append(clock.spawn(worker(f"{name}.{i}", depth + 1), name=name))
                elif choice < 0.7 and tasks:
                    victim = rng.choice(tasks)
                    if not victim.done():
                        with contextlib.suppress(RuntimeError):  # itself
                            victim.cancel()
                elif choice < 0.75:
                    ev.set(name)
                elif choice < 0.8:
                    k = rng.randrange(len(shots))
                    if rng.random() < 0.4:
                        shots[k].set(f"{name}.{i}")
                        if rng.random() < 0.5:
                            shots[k] = clock.event()  # a fresh one for later waits
                    else:
                        try:
                            got = await clock.timeout(rng.choice(delays), shots[k].wait())
                            log.append((clock.now(), f"{name} got {got}"))
                        except TimeoutError:
                            log.append((clock.now(), f"{name} waited {k} in vain"))
                elif choice < 0.9:
                    try:
                        await clock.timeout(rng.choice(delays), clock.sleep(rng.choice(delays)))
                    except TimeoutError:
                        log.append((clock.now(), f"{name} timed out"))
                elif choice < 0.93:
                    # first() of a sleeping task and the shared event (fired or not yet)
                    # (or of a failing task: first() raises its error)
                    racer = clock.spawn(
                        clock.sleep(rng.choice(delays))
                        if rng.random() < 0.7
                        else _fail_after(clock, rng.choice(delays)),
                        name=f"{name}.r",
                    )
                    try:
                        won, _ = await clock.first(racer, ev)
                        log.append((clock.now(), f"{name} first {won}"))
                    except ValueError as e:
                        log.append((clock.now(), f"{name} first raised {e}"))
                    racer.cancel()
                elif choice < 0.96:
                    # a failing task, joined: its error comes back through join()
                    failing = clock.spawn(_fail_after(clock, rng.choice(delays)), name=name)
                    try:
                        await failing.join()
                    except ValueError as e:
                        log.append((clock.now(), f"{name} joined {e}"))
                else:
                    # a raw simpy timeout at a shared instant: sleeps after it resume after it
                    clock.env.timeout(rng.choice(delays)).callbacks.append(
                        lambda _e, n=name: log.append((clock.now(), f"{n} raw"))
                    )
                log.append((clock.now(), f"{name} step {i}"))
        except Cancelled:
            log.append((clock.now(), f"{name} cancelled"))
            raise

    for k in range(8):
        tasks.append(clock.spawn(worker(f"t{k}", 0), name=f"t{k}"))
    clock.env.run(until=50)
    return log


@pytest.mark.parametrize("seed", range(60))
def test_shared_wake_ups_keep_the_order_of_one_timeout_per_sleep(seed: int) -> None:
    reference = _Counting()
    plain = SimClock(reference)  # simpy's own queue, one simpy Timeout per sleep
    shared = SimClock()
    want = _program(plain, seed)
    got = _program(shared, seed)
    assert got == want
    assert shared.events() <= reference.scheduled


def test_sleeps_to_the_same_instant_cost_one_queue_entry() -> None:
    clock = SimClock()
    woke: list[int] = []

    async def sleeper(i: int) -> None:
        await clock.sleep(1.0)
        woke.append(i)

    for i in range(100):
        clock.spawn(sleeper(i))
    before = clock.events()
    clock.env.run()
    # one wake-up and one entry for the 100 process ends, not 100 timeouts and 100 ends
    assert clock.events() - before == 2
    assert woke == list(range(100))


def test_a_cancelled_sleeper_leaves_the_shared_wake_up_to_the_others() -> None:
    clock = SimClock()
    woke: list[str] = []

    async def sleeper(name: str) -> None:
        await clock.sleep(2.0)
        woke.append(name)

    a = clock.spawn(sleeper("a"))
    b = clock.spawn(sleeper("b"))

    async def killer() -> None:
        await clock.sleep(1.0)
        a.cancel()

    clock.spawn(killer())
    clock.env.run()
    assert woke == ["b"]
    assert a.done() and b.done()


def test_progress_ticks_change_neither_the_order_nor_the_event_count() -> None:
    quiet = SimClock()
    want = _program(quiet, 7)
    watched = SimClock()
    ticks: list[float] = []
    watched.every(0.5, ticks.append)
    got = _program(watched, 7)
    assert got == want
    assert watched.events() == quiet.events()
    assert ticks[:3] == [0.5, 1.0, 1.5]
