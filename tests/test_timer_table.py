"""The pure timer table: acquire/release, expiry, clearing, retry postponement."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from elastic.timer.api import TimerRequest
from elastic.timer.table import TimerTable


def acquire(worker: int, scope: str, at: float) -> TimerRequest:
    return TimerRequest(worker, scope, at)


def release(worker: int, scope: str) -> TimerRequest:
    return TimerRequest(worker, scope, -1)


def test_negative_expiration_releases_the_timer() -> None:
    t: TimerTable[TimerRequest] = TimerTable()
    t.register([acquire(1, "a", 5.0), release(1, "a")])
    assert len(t) == 0
    assert t.expired(100.0) == {}
    assert t.next_deadline() is None


def test_release_of_unknown_timer_is_ignored() -> None:
    t: TimerTable[TimerRequest] = TimerTable()
    t.register([release(1, "a")])
    assert len(t) == 0


def test_expired_at_exactly_the_deadline_and_not_before() -> None:
    t: TimerTable[TimerRequest] = TimerTable()
    t.register([acquire(1, "a", 5.0)])
    assert t.expired(4.999) == {}
    assert t.expired(5.0) == {1: [acquire(1, "a", 5.0)]}


def test_same_scope_reacquired_overwrites_the_deadline() -> None:
    t: TimerTable[TimerRequest] = TimerTable()
    t.register([acquire(1, "f.py#3", 5.0), acquire(1, "f.py#3", 9.0)])
    assert len(t) == 1
    assert t.next_deadline() == 9.0


def test_timers_are_per_worker_and_scope() -> None:
    t: TimerTable[TimerRequest] = TimerTable()
    t.register([acquire(1, "a", 5.0), acquire(2, "a", 6.0), acquire(1, "b", 3.0)])
    assert len(t) == 3
    due = t.expired(5.5)
    assert list(due) == [1]
    assert [r.scope_id for r in due[1]] == ["b", "a"]  # earliest first


def test_clear_drops_all_timers_of_the_worker_only() -> None:
    t: TimerTable[TimerRequest] = TimerTable()
    t.register([acquire(1, "a", 5.0), acquire(1, "b", 6.0), acquire(2, "a", 7.0)])
    t.clear([1])
    assert [r.worker_id for r in t.timers()] == [2]
    assert t.next_deadline() == 7.0


def test_postponed_worker_is_not_reported_before_its_retry_time() -> None:
    t: TimerTable[TimerRequest] = TimerTable()
    t.register([acquire(1, "a", 5.0), acquire(2, "a", 8.0)])
    t.postpone(1, 10.0)
    assert t.expired(9.0) == {2: [acquire(2, "a", 8.0)]}
    assert t.next_deadline() == 8.0
    t.clear([2])
    assert t.next_deadline() == 10.0  # never a past deadline: no spinning driver
    assert list(t.expired(10.0)) == [1]


def test_postponement_is_forgotten_once_the_worker_has_no_timers() -> None:
    t: TimerTable[TimerRequest] = TimerTable()
    t.register([acquire(1, "a", 5.0)])
    t.postpone(1, 100.0)
    t.register([release(1, "a")])
    t.register([acquire(1, "c", 7.0)])
    assert t.next_deadline() == 7.0
    assert list(t.expired(7.0)) == [1]


ops = st.lists(
    st.tuples(
        st.integers(0, 3), st.sampled_from("abc"), st.one_of(st.just(-1.0), st.floats(0, 100))
    ),
    max_size=40,
)


@given(ops, st.floats(0, 100))
def test_table_matches_a_dict_model(reqs: list[tuple[int, str, float]], now: float) -> None:
    t: TimerTable[TimerRequest] = TimerTable()
    model: dict[tuple[int, str], float] = {}
    for w, s, e in reqs:
        t.register([TimerRequest(w, s, e)])
        if e < 0:
            model.pop((w, s), None)
        else:
            model[(w, s)] = e
    assert {(r.worker_id, r.scope_id): r.expiration_time for r in t.timers()} == model
    due = {(r.worker_id, r.scope_id) for rs in t.expired(now).values() for r in rs}
    assert due == {k for k, e in model.items() if e <= now}
    assert t.next_deadline() == (min(model.values()) if model else None)
