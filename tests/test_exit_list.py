"""ExitList: a stop's exits as records and as columns (elastic.workers)."""

from __future__ import annotations

import pytest

from elastic.workers import ExitCause, ExitList, WorkerExit


def _exits() -> list[WorkerExit]:
    return [
        WorkerExit(2, -15, 1.0, ExitCause.STOPPED_BY_AGENT, 102),
        WorkerExit(0, 1, 1.0, ExitCause.EXITED, 100),
    ]


def test_the_columns_are_the_records_fields_in_order() -> None:
    got = ExitList.of(_exits())
    assert got.local_ranks == [2, 0] and got.exit_codes == [-15, 1]
    assert list(got) == _exits() and got[1] == _exits()[1] and got[:1] == _exits()[:1]
    assert len(got) == 2 and _exits()[0] in got


def test_the_records_are_made_once_and_only_when_read() -> None:
    made: list[int] = []

    def make() -> list[WorkerExit]:
        made.append(1)
        return _exits()

    lazy = ExitList([2, 0], [-15, 1], make)
    assert lazy.local_ranks == [2, 0] and len(lazy) == 2 and made == []
    first = lazy[0]
    assert next(iter(lazy)) is first and lazy[1] == _exits()[1] and made == [1]


def test_it_equals_a_list_of_the_same_exits_and_no_other() -> None:
    assert ExitList.of(_exits()) == _exits() and _exits() == ExitList.of(_exits())
    assert ExitList.of(_exits()) == ExitList([2, 0], [-15, 1], _exits)
    assert ExitList([], [], list) == [] and ExitList.of(_exits()) != _exits()[:1]
    assert ExitList.of([]) != "x"


def test_columns_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="one per exit"):
        ExitList([0, 1], [0], list)
