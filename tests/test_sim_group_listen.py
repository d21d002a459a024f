"""A simulated group's listeners (``SimGroup.listen``, the agent's way to take exits):
a listener is called at the wake-up of an exit, in the place a waiting ``next_exit``
would resume, never synchronously; a cancelled one is not called; listeners and a waiting
``next_exit`` are called in the order they started to wait."""

from __future__ import annotations

from elastic.events import ListSink
from elastic.workers import WorkerLaunch
from sim.clock import SimClock
from sim.scenario.model import Job
from sim.workers import SimGroup, SimWorkers, Training


def _group(clock: SimClock) -> SimGroup:
    job = Job(steps=10**9, step_time=1.0, collective_timeout=1e6)
    port = SimWorkers("n0", Training(clock, job, ListSink()))
    launches = [WorkerLaunch(r, r, {"WORLD_SIZE": "2"}, "train.py") for r in range(2)]
    coro = port.start(launches)
    try:
        coro.send(None)
    except StopIteration as done:
        group: SimGroup = done.value
        return group
    raise AssertionError("start() waited")


def test_a_listener_is_called_at_the_exit_wake_up_and_a_cancelled_one_never() -> None:
    clock = SimClock()
    g = _group(clock)
    calls: list[str] = []
    cancel_a = g.listen(lambda: calls.append("a"))
    g.listen(lambda: calls.append("b"))
    cancel_a()
    assert g.exit(0, 1)
    assert calls == []  # not synchronously: at the wake-up
    clock.env.run(until=1.0)
    assert calls == ["b"]
    took = g.take_exit()
    assert took is not None and took.local_rank == 0 and took.exit_code == 1


def test_listeners_and_a_waiting_next_exit_resume_in_the_order_they_waited() -> None:
    clock = SimClock()
    g = _group(clock)
    order: list[str] = []
    g.listen(lambda: order.append("first listener"))

    async def wait() -> None:
        await g.next_exit()
        order.append("next_exit")

    clock.spawn(wait())
    clock.env.run(until=1.0)  # the task waits
    g.listen(lambda: order.append("second listener"))
    assert g.exit(0, 3)
    clock.env.run(until=2.0)
    assert order == ["first listener", "next_exit", "second listener"]
    assert not clock.unobserved
