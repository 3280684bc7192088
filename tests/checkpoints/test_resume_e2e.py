"""End to end: a task of 100 durable steps (``running.step``), its node SIGKILLed once step 60
is recorded, resumes at step 61 on another ``runscheduler`` node.

Each step's side effect is a Run row (``tests.testapp.consumers.durable``). What must hold
(docs/guarantees.md): steps 1..60 ran once, on the first node, in its first attempt; steps
61..100 ran once, on the second node, in the second attempt; no step ran twice.

At least once, exactly: a node killed *inside* a step, after its side effect and before its
checkpoint, leaves that one step to run again on the next node; every other step still runs
once (the second test).
"""

from __future__ import annotations

import signal

import pytest
from django.db import connection

from django_tasks_coord import queue
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Checkpoint, Task
from tests.processes import reap, runscheduler, wait_for
from tests.testapp.models import Run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.multiprocess,
    pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite runs one node"),
]

SETTINGS = {
    "HEARTBEAT_FREQUENCY": 0.2,
    "LIVENESS_INTERVAL": 1.5,
    "REAP_INTERVAL": 0.5,
    "POLL_INTERVAL": 0.1,
    "STATUS_INTERVAL": 0,
    "SHUTDOWN_MAX_WAIT": 2,
}
STEPS, KILL_AFTER = 100, 60


def node(name: str):
    return runscheduler("--node-id", name, "--topic", "durable", settings=SETTINGS)


def killed_then_resumed(task: Task, killed_when) -> dict[int, list[Run]]:
    """Run ``task`` on a first node, SIGKILL it once ``killed_when()``, finish it on a second
    node; return each step's runs."""
    first = node("first")
    try:
        wait_for(killed_when, timeout=60)
    finally:
        reap(first, signal.SIGKILL)
    assert Task.objects.get(pk=task.pk).state == TaskState.ACTIVE  # the dead node's claim
    second = node("second")
    try:
        wait_for(lambda: Task.objects.get(pk=task.pk).state == TaskState.SUCCEEDED, timeout=60)
    finally:
        out, err = reap(second, signal.SIGTERM)
    assert second.returncode == 0, err + out
    assert Task.objects.get(pk=task.pk).attempts == 2
    return steps_run()


def steps_run() -> dict[int, list[Run]]:
    found: dict[int, list[Run]] = {}
    for row in Run.objects.filter(identifier__startswith="newsletter:step-").order_by("id"):
        found.setdefault(int(row.identifier.rsplit("-", 1)[1]), []).append(row)
    return found


def test_a_task_killed_after_step_60_resumes_at_step_61_on_another_node(transactional_db):
    queue.register_topic("durable")
    task = queue.push("durable", "newsletter", {"steps": STEPS, "hold_after": KILL_AFTER})
    checkpointed = Checkpoint.objects.filter(task_id=task.pk, name=f"step-{KILL_AFTER}")
    ran = killed_then_resumed(task, checkpointed.exists)
    assert sorted(ran) == list(range(1, STEPS + 1))
    twice = {n: len(rows) for n, rows in ran.items() if len(rows) != 1}
    assert twice == {}, f"steps run more than once: {twice}"
    for n, (row,) in ran.items():
        expected = ("first", 1) if n <= KILL_AFTER else ("second", 2)
        assert (row.node, row.attempt) == expected, (n, row.node, row.attempt)
    written = dict(Checkpoint.objects.filter(task_id=task.pk).values_list("name", "attempt"))
    assert written == {f"step-{n}": 1 if n <= KILL_AFTER else 2 for n in range(1, STEPS + 1)}


def test_killed_inside_step_60_only_step_60_runs_again(transactional_db):
    queue.register_topic("durable")
    task = queue.push("durable", "newsletter", {"steps": STEPS, "hold_in": KILL_AFTER})
    effect = Run.objects.filter(identifier=f"newsletter:step-{KILL_AFTER}")
    ran = killed_then_resumed(task, effect.exists)
    assert sorted(ran) == list(range(1, STEPS + 1))
    nodes = {n: [(row.node, row.attempt) for row in rows] for n, rows in ran.items()}
    for n in range(1, STEPS + 1):
        if n < KILL_AFTER:
            assert nodes[n] == [("first", 1)], n
        elif n == KILL_AFTER:  # its side effect done, its checkpoint not: at least once
            assert nodes[n] == [("first", 1), ("second", 2)]
        else:
            assert nodes[n] == [("second", 2)], n
