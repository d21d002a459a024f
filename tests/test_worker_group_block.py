"""WorkerGroup's block: after a rendezvous the agent gives the group its workers as one
block (elastic.agent.server.api.WorkerGroup._set_block); the Worker objects are made
only when read, with the ranks and ids they would have had."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from elastic.agent.server.api import Worker, WorkerGroup
from elastic.workers import GroupLaunch
from tests.test_worker_events import _agent, _Group, _plain, _Port, _Records, _start_and_stop


class _GroupPort(_Port):
    """A port that takes the group's launch as one record (GroupWorkersPort)."""

    async def start_group(self, group: GroupLaunch) -> _Group:
        return _Group(group.launches(), self.exit_order)


@settings(max_examples=40, deadline=None)
@given(
    workers=st.integers(min_value=1, max_value=12),
    order=st.data(),
)
def test_a_block_gives_the_events_and_workers_the_worker_list_gives(
    workers: int, order: st.DataObject
) -> None:
    exits = order.draw(st.permutations(list(range(workers))), label="exit order")
    runs = []
    for block in (False, True):
        sink = _Records()
        agent, wg = _agent(sink, workers=workers, exit_order=exits)
        agent._workers_port = _GroupPort(exits)  # type: ignore[assignment]
        if block:  # the same workers as _agent's list, as a block
            wg._set_block(workers, workers, 10, 4 * workers, 8 * workers)
            assert wg._workers is None
        _start_and_stop(agent, wg)
        if block:
            assert wg._workers is None  # neither the start nor the stop made them
        runs.append((_plain(sink.events), [(str(w), w.id) for w in wg.workers]))
    assert runs[0] == runs[1]
    assert runs[1][1][0] == (str(Worker(0, workers, 10, 4 * workers, 8 * workers)), 100)


def test_workers_assigned_replace_the_block_and_its_ids() -> None:
    agent, wg = _agent(_Records(), workers=2)
    wg._set_block(2, 6, 0, 8, 8)
    wg._ids = {0: 50, 1: 51}
    assert [(w.global_rank, w.id) for w in wg.workers] == [(6, 50), (7, 51)]
    assert wg.workers is wg.workers and wg._size() == 2
    wg.workers = [Worker(0)]
    assert wg._block is None and wg._ids is None and wg._size() == 1
    assert isinstance(agent.get_worker_group(), WorkerGroup)
