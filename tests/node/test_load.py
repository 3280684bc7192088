"""A node's load against its capacity: when the dispatcher, finding no room, is woken."""

from __future__ import annotations

from django_tasks_coord.node.config import NodeConfig
from django_tasks_coord.node.load import Load


def load(*, buffer: int = 2, burst: bool = False) -> tuple[Load, list[int]]:
    config = NodeConfig.from_settings(workers=2, buffer=buffer, batch_size=100, burst=burst)
    woken: list[int] = []
    result = Load(config, on_room=lambda: woken.append(result.count))
    return result, woken


def test_a_full_node_wakes_the_dispatcher_once_a_task_leaves():
    node, woken = load()
    node.claimed(4)
    assert node.room() == 0  # the dispatcher found it full: it sleeps
    node.left(1)
    assert woken == [3]
    node.left(1)  # it was woken already: no claim round per completion
    assert woken == [3]


def test_a_node_not_found_full_wakes_nobody():
    node, woken = load()
    node.claimed(3)
    assert node.room() == 1
    node.left(3)
    assert woken == []


def test_room_made_while_the_capacity_grew_still_wakes_the_dispatcher():
    """Fast tasks and slow claims (a pooler between node and database) grow the buffer
    after the dispatcher found the node full: the task that leaves then must still wake it,
    or the node idles with room until the next poll."""
    node, woken = load()
    node.claimed(4)
    assert node.room() == 0
    node.claim_seconds.add(0.05)  # a claim takes 50 ms...
    node.task_seconds.add(0.001)  # ...a task 1 ms: the buffer grows to 200
    assert node.capacity == 202
    node.left(1)
    assert woken == [3]


def test_a_shrinking_capacity_waits_for_real_room():
    node, woken = load()
    node.claim_seconds.add(0.05)
    node.task_seconds.add(0.001)
    node.claimed(202)
    assert node.room() == 0
    node.task_seconds.value = 10.0  # tasks turned slow: the buffer is back to 2
    node.left(1)
    assert woken == []  # 201 held, capacity 4: still no room
    node.left(198)
    assert woken == [3]


def test_a_burst_looks_for_more_after_every_task():
    node, woken = load(burst=True)
    node.claimed(2)
    node.left(1)
    node.left(1)
    assert woken == [1, 0]


def test_one_task_paused_by_another_thread_barely_shrinks_the_buffer():
    """A fast task's wall time includes the GIL's turns of other threads (5 ms each): one
    such task among fast ones must not shrink the buffer the workers live on."""
    node, _ = load()
    node.claim_seconds.add(0.05)
    for _ in range(100):
        node.task_seconds.add(0.001)
    before = node.capacity
    node.task_seconds.add(0.015)  # paused for three turns of other threads
    assert node.capacity >= 0.75 * before
