"""The clock's own environment (sim.clock._Env) against simpy's: a run stopped inside an
instant resumes in simpy's order, urgent entries included (they live outside the heap)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import simpy
from simpy.core import StopSimulation
from simpy.events import Event

from sim.clock import SimClock

ENVS: list[Callable[[], Any]] = [lambda: simpy.Environment(0.0), lambda: SimClock().env]


def _stopped_in_callbacks(env: Any) -> list[str]:
    log: list[str] = []
    stop = Event(env)
    second = Event(env)
    stop.callbacks += [lambda _e: log.append("a"), StopSimulation.callback]
    stop.callbacks.append(lambda _e: log.append("b"))
    stop.succeed("v")
    second.callbacks.append(lambda _e: log.append("second"))
    second.succeed()
    env.timeout(1.0).callbacks.append(lambda _e: log.append("t"))
    log.append(f"stopped {env.run(until=5.0)}")
    env.run(until=5.0)
    return log


def test_an_event_stopped_in_its_callbacks_runs_the_rest_first_when_resumed() -> None:
    want, got = (_stopped_in_callbacks(make()) for make in ENVS)
    assert want == ["a", "stopped v", "b", "second", "t"]
    assert got == want


async def _noted(log: list[str], what: str) -> None:
    log.append(what)


def _program(clock: SimClock) -> list[str]:
    """Tasks that sleep to shared instants and spawn (urgent starts) while one of them
    stops the run in the middle of an instant; the run is resumed twice."""
    log: list[str] = []
    stop = clock.env.event()

    async def worker(name: str, stops: bool) -> None:
        for i in range(3):
            await clock.sleep(1.0)
            log.append(f"{name}.{i}@{clock.now()}")
            clock.spawn(_noted(log, f"{name}.{i}.spawned"))
            if stops and i == 1:
                stop.succeed(name)
                clock.spawn(_noted(log, f"{name}.{i}.after-stop"))

    for k in range(4):
        clock.spawn(worker(f"w{k}", k == 1))
    log.append(f"stopped by {clock.env.run(until=stop)}")
    clock.env.run(until=10.0)
    return log


def test_stopping_inside_an_instant_keeps_simpys_order() -> None:
    want = _program(SimClock(simpy.Environment(0.0)))
    got = _program(SimClock())
    assert got == want
    assert "stopped by w1" in got
