"""Cooperative cancel and progress of running tasks, in a node run in this process."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections

from django_tasks_coord import handlers, queue, running
from django_tasks_coord.enums import Result, TaskState
from django_tasks_coord.exceptions import TaskCanceledError
from django_tasks_coord.models import Owner, Task
from django_tasks_coord.retry import RetryPolicy
from tests.node.conftest import run
from tests.operating.test_signals import needs_tasks
from tests.processes import wait_for


def _cancel_when_running(sequence: int, started: threading.Event) -> threading.Thread:
    def cancel() -> None:
        try:
            started.wait(20)
            queue.cancel(Task.objects.get(pk=sequence), "stop it")
        finally:
            connections.close_all()  # this thread's connection

    thread = threading.Thread(target=cancel)
    thread.start()
    return thread


def test_a_checkpoint_stops_the_handler_and_the_task_ends_canceled(make_node, work_topic):
    started, seen = threading.Event(), {}

    def loop(task: Task) -> None:
        started.set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            running.report_progress({"step": 1})
            try:
                running.raise_if_canceled()
            except TaskCanceledError:
                seen["canceled"] = time.monotonic()
                raise
            time.sleep(0.01)
        seen["timed out"] = True

    handlers.register("work", loop, retry=RetryPolicy(max_attempts=5))
    task = queue.push("work", "long")
    thread = _cancel_when_running(task.pk, started)
    node = make_node()
    run(node)
    thread.join()
    assert node.state.runs.delivered == 1  # tasks_coord_node_cancels_delivered_total
    assert node.state.runs.progress_writes >= 1
    task.refresh_from_db()
    assert "timed out" not in seen and "canceled" in seen
    assert task.state == TaskState.CANCELED
    assert task.attempts == 1  # never retried
    assert task.message == "stop it"
    assert task.cancel_requested_at is not None
    assert task.progress == {"step": 1}
    assert Owner.objects.count() == 0  # unregistered on exit
    assert work_topic.__class__.objects.get(pk="work").consecutive_failures == 0


def test_a_handler_that_ignores_the_cancel_and_succeeds_still_ends_canceled(make_node, work_topic):
    started, saw = threading.Event(), []

    def stubborn(task: Task) -> Result:
        started.set()
        wait_for(running.cancel_requested, timeout=20.0, interval=0.02)
        saw.append(running.cancel_requested())
        return Result.SUCCESS

    handlers.register("work", stubborn)
    task = queue.push("work", "stubborn")
    thread = _cancel_when_running(task.pk, started)
    run(make_node())
    thread.join()
    task.refresh_from_db()
    assert saw == [True]
    assert task.state == TaskState.CANCELED
    assert task.message == "stop it"


def test_a_batch_handler_sees_each_task_of_its_batch(make_node, work_topic):
    started, seen = threading.Event(), {}

    def batch(tasks: list[Task]) -> None:
        started.set()
        wait_for(running.cancel_requested, timeout=20.0, interval=0.02)
        seen.update({t.identifier: running.cancel_requested(t) for t in tasks})
        running.report_progress("half", tasks[1])

    handlers.register("work", batch, batch=True)
    first = queue.push("work", "a")
    queue.push("work", "b")
    thread = _cancel_when_running(first.pk, started)
    run(make_node(batch_size=10))
    thread.join()
    assert seen == {"a": True, "b": False}
    states = dict(Task.objects.values_list("identifier", "state"))
    assert states == {"a": TaskState.CANCELED, "b": TaskState.SUCCEEDED}
    assert Task.objects.get(identifier="b").progress == "half"


def test_outside_a_node_the_row_answers(transactional_db, work_topic):
    queue.push("work", "x")
    (task,) = queue.poll("work")
    assert running.cancel_requested(task) is False
    assert running.cancel_requested() is False  # no handler runs here
    running.report_progress([1, 2], task)
    queue.cancel(task)
    assert running.cancel_requested(task) is True
    with pytest.raises(TaskCanceledError):
        running.raise_if_canceled(task)
    queue.complete(task, Result.SUCCESS)
    task.refresh_from_db()
    assert (task.state, task.progress) == (TaskState.CANCELED, [1, 2])


@needs_tasks
def test_a_django_task_sees_the_cancel_through_its_context(make_node, transactional_db):
    from django_tasks_coord.backends.compat import TaskResultStatus, task_backends
    from tests.backends import tasks

    result = tasks.waits_for_cancel.enqueue()
    backend = task_backends["default"]

    def cancel() -> None:
        try:
            wait_for(
                lambda: Task.objects.filter(state=TaskState.ACTIVE).exists(),
                timeout=20.0,
                interval=0.02,
            )
            asked.append(backend.cancel(result.id, "enough"))
        finally:
            connections.close_all()  # this thread's connection

    asked: list = []

    thread = threading.Thread(target=cancel)
    thread.start()
    run(make_node(topics=["default"]))
    thread.join()
    assert (asked[0].status, asked[0].cancel_requested) == (TaskResultStatus.RUNNING, True)
    result = backend.get_result(result.id)  # a CoordTaskResult
    assert result.status == TaskResultStatus.FAILED
    assert (result.progress, result.cancel_requested) == ({"saw the cancel": True}, True)
    row = Task.objects.get(identifier=result.id)
    assert (row.state, row.attempts, row.message) == (TaskState.CANCELED, 1, "enough")


def test_every_end_of_a_claim_ends_a_canceled_task_canceled(transactional_db, work_topic):
    """Retry release, a dead owner's sweep, a fenced job run's last step: never PENDING
    again, never SUCCEEDED, once a cancel was requested."""
    from datetime import timedelta

    from django_tasks_coord import owners, store

    owner = queue.register_owner("dying")
    queue.push_many("work", [("released", None), ("expired", None), ("fenced", None)])
    released, expired, fenced = queue.poll("work", 3, owner=owner)
    for task in (released, expired, fenced):
        queue.cancel(Task.objects.get(pk=task.pk), "stop")
    assert queue.release(released, execute_at=None).state == TaskState.CANCELED
    assert store.succeed_held_run(fenced, finished_at=fenced.created_at) is True
    assert fenced.state == TaskState.CANCELED
    assert [t.pk for t in owners.expire(timedelta(0))] == [expired.pk]
    rows = Task.objects.order_by("sequence").values_list("identifier", "state", "message")
    assert list(rows) == [
        ("released", TaskState.CANCELED, "stop"),
        ("expired", TaskState.CANCELED, "stop"),
        ("fenced", TaskState.CANCELED, "stop"),
    ]
    assert Task.objects.filter(finished_at__isnull=True).count() == 0


def test_a_canceled_handler_that_fails_otherwise_is_not_retried(make_node, work_topic):
    started = threading.Event()

    def fails(task: Task) -> None:
        started.set()
        wait_for(running.cancel_requested, timeout=20.0, interval=0.02)
        raise RuntimeError("gave up on my own terms")

    handlers.register("work", fails, retry=RetryPolicy(max_attempts=5, retry_interval=0))
    task = queue.push("work", "x")
    thread = _cancel_when_running(task.pk, started)
    node = make_node()
    run(node)
    thread.join()
    task.refresh_from_db()
    assert (task.state, task.attempts) == (TaskState.CANCELED, 1)
    assert node.stats["retried"] == 0 and node.stats["failed"] == 0
