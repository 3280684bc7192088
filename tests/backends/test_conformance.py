"""Django's public task API, end to end, for each backend path in ``conftest.BACKENDS``.

Tasks are enqueued here, run by real node processes (``runscheduler --burst``) on
the test database, and read back with ``get_result()`` / ``refresh()``.
"""

from __future__ import annotations

import signal
import threading
from datetime import timedelta

import pytest
from django.db import connections, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from django_tasks_coord.backends.compat import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
)
from django_tasks_coord.backends.results import LOST_CLASS
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Owner
from django_tasks_coord.models import Task as TaskRow
from django_tasks_coord.owners import expire
from tests.backends import tasks
from tests.backends.conftest import wait_exit
from tests.processes import reap, wait_for
from tests.testapp.models import Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multiprocess]


def test_enqueue_run_and_read_the_result(worker):
    result = tasks.add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY
    assert result.enqueued_at is not None
    assert (result.args, result.kwargs) == ([2, 3], {})
    with pytest.raises(ValueError, match="not finished"):
        _ = result.return_value
    assert tasks.add.get_result(result.id).status == TaskResultStatus.READY

    worker.drain()

    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.is_finished
    assert result.return_value == 5
    assert result.errors == []
    assert len(result.worker_ids) == 1
    assert result.attempts == 1
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at
    fetched = tasks.add.get_result(result.id)
    assert (fetched.id, fetched.return_value, fetched.backend) == (result.id, 5, "default")
    assert fetched.task.func is tasks.add.func


def test_get_result_of_an_unknown_id(worker):
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result("no-such-result")


def test_a_failure_keeps_its_exception_and_traceback(worker):
    result = tasks.fail.enqueue("boom")
    worker.drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    with pytest.raises(ValueError, match="failed"):
        _ = result.return_value
    [error] = result.errors
    assert error.exception_class is ValueError
    assert "ValueError: boom" in error.traceback
    assert "tests/backends/tasks.py" in error.traceback
    assert result.finished_at is not None


def test_retries_keep_every_attempts_error_and_worker(worker):
    result = tasks.flaky.enqueue(2)
    worker.drain()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"attempt": 3}  # context.attempt counted the retries
    assert [e.exception_class for e in result.errors] == [RuntimeError, RuntimeError]
    assert "attempt 1 fails" in result.errors[0].traceback
    assert "attempt 2 fails" in result.errors[1].traceback
    assert result.attempts == 3
    assert len(result.worker_ids) == 3
    assert result.started_at < result.last_attempted_at


def test_a_retried_task_fails_for_good_after_max_attempts(worker):
    result = tasks.flaky.enqueue(10)  # max_attempts=3
    worker.drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert len(result.errors) == 3
    assert result.attempts == 3


def test_async_tasks_run_in_the_workers(worker):
    ok = tasks.async_add.enqueue(2, 40)
    failing = tasks.async_fail.enqueue()
    worker.drain()
    ok.refresh()
    failing.refresh()
    assert ok.status == TaskResultStatus.SUCCESSFUL
    assert ok.return_value == {"sum": 42, "attempt": 1}
    assert failing.status == TaskResultStatus.FAILED
    assert failing.errors[0].exception_class is KeyError


def test_aenqueue_and_aget_result(worker):
    from asgiref.sync import async_to_sync

    result = async_to_sync(tasks.add.aenqueue)(1, 1)
    worker.drain()
    fetched = async_to_sync(tasks.add.aget_result)(result.id)
    assert fetched.return_value == 2
    async_to_sync(result.arefresh)()
    assert result.status == TaskResultStatus.SUCCESSFUL


def test_a_return_value_that_is_not_json_fails_the_task(worker):
    result = tasks.not_json.enqueue()
    worker.drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class is TypeError


def test_priority_then_enqueue_order(worker):
    for label, priority in [("low", -5), ("mid-1", 0), ("high", 10), ("mid-2", 0), ("top", 100)]:
        tasks.record.using(priority=priority).enqueue(label)
    worker.drain("--workers", "1", settings={"BUFFER": 0})
    order = list(Run.objects.order_by("pk").values_list("identifier", flat=True))
    assert order == ["top", "high", "mid-1", "mid-2", "low"]


def test_run_after_holds_a_task_back(worker):
    later = tasks.record.using(run_after=timezone.now() + timedelta(hours=1)).enqueue("later")
    past = tasks.record.using(run_after=timezone.now() - timedelta(seconds=1)).enqueue("past")
    now = tasks.record.enqueue("now")
    worker.drain()
    assert tasks.record.get_result(now.id).status == TaskResultStatus.SUCCESSFUL
    assert tasks.record.get_result(past.id).status == TaskResultStatus.SUCCESSFUL
    held = tasks.record.get_result(later.id)
    assert held.status == TaskResultStatus.READY
    assert held.task.run_after == later.task.run_after
    assert set(Run.objects.values_list("identifier", flat=True)) == {"now", "past"}


def test_queues_are_topics_and_unknown_queues_are_refused(worker):
    result = tasks.record.using(queue_name="other").enqueue("elsewhere")
    assert TaskRow.objects.get(identifier=result.id).topic_id == "other"
    with pytest.raises(InvalidTask, match="not valid"):
        tasks.record.using(queue_name="nope")
    worker.drain()
    fetched = tasks.record.get_result(result.id)
    assert fetched.task.queue_name == "other"
    assert fetched.return_value == "elsewhere"


def test_a_rolled_back_enqueue_never_existed(worker):
    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        result = tasks.record.enqueue("rolled back")
        raise Rollback
    with pytest.raises(TaskResultDoesNotExist):
        tasks.record.get_result(result.id)
    worker.drain()
    assert not Run.objects.exists()


def test_an_enqueue_is_visible_only_when_its_transaction_commits(worker):
    def seen_elsewhere(identifier: str) -> bool:
        found: list[bool] = []

        def look() -> None:
            try:
                found.append(TaskRow.objects.filter(identifier=identifier).exists())
            finally:
                connections.close_all()

        thread = threading.Thread(target=look)
        thread.start()
        thread.join()
        return found[0]

    with transaction.atomic():
        result = tasks.record.enqueue("committed")
        assert not seen_elsewhere(result.id)
    assert seen_elsewhere(result.id)
    worker.drain()
    assert tasks.record.get_result(result.id).return_value == "committed"


def test_task_enqueued_is_sent_with_the_backend_as_sender(worker):
    received = []

    def receiver(sender, task_result, **kwargs):
        received.append((sender, task_result.id, task_result.status))

    task_enqueued.connect(receiver)
    try:
        result = tasks.add.enqueue(1, 2)
    finally:
        task_enqueued.disconnect(receiver)
    backend = tasks.add.get_backend()
    assert received == [(type(backend), result.id, TaskResultStatus.READY)]
    assert type(backend) is import_string(worker.backend_path)


def test_timeouts_fail_sync_and_async_attempts(worker):
    sync = tasks.too_slow.enqueue()
    coroutine = tasks.async_too_slow.enqueue()
    worker.drain("--workers", "2")
    for result in (sync, coroutine):
        result.refresh()
        assert result.status == TaskResultStatus.FAILED
        [error] = result.errors
        assert error.exception_class.__name__ == "TaskTimeoutError"
        assert (result.finished_at - result.started_at) < timedelta(seconds=30)


def test_a_unique_key_keeps_one_waiting_task(worker):
    first = tasks.refresh_user.enqueue(7)
    second = tasks.refresh_user.enqueue(7)
    other = tasks.refresh_user.enqueue(8)
    assert first.id == second.id != other.id
    assert TaskRow.objects.filter(identifier=first.id).count() == 2
    worker.drain()
    assert tasks.refresh_user.get_result(first.id).return_value == 7
    assert tasks.refresh_user.get_result(other.id).return_value == 8
    states = sorted(TaskRow.objects.filter(identifier=first.id).values_list("state", flat=True))
    assert states == [TaskState.SUCCEEDED, TaskState.REDUNDANT]


def test_sigkill_mid_task_goes_back_to_ready_and_another_node_completes_it(worker):
    """The crash test: the killed attempt and the rescuing one both show in the result."""
    result = tasks.sleep_first_attempt.enqueue(60)
    doomed = worker.start("--node-id", "doomed", settings={"LIVENESS_INTERVAL": 2.0})
    try:
        wait_for(lambda: Run.objects.filter(node="doomed").exists())
        # The start of an attempt is written once it has run for a moment (START_DELAY).
        wait_for(lambda: tasks.sleep_first_attempt.get_result(result.id).worker_ids)
        result.refresh()
        assert result.status == TaskResultStatus.RUNNING
        assert result.worker_ids == ["doomed"]
    finally:
        reap(doomed, signal.SIGKILL)
    assert doomed.returncode == -signal.SIGKILL
    # Any live node's reaper frees the task once the liveness interval has passed.
    wait_for(lambda: expire(timedelta(seconds=2)) or not Owner.objects.exists(), timeout=30)
    result.refresh()
    assert result.status == TaskResultStatus.READY  # not stuck RUNNING
    assert result.worker_ids == ["doomed"]
    assert [e.exception_class_path for e in result.errors] == [LOST_CLASS]

    rescuer = worker.start("--burst", "--node-id", "rescuer")
    out, err = wait_exit(rescuer)
    assert rescuer.returncode == 0, out + err
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == "done"
    assert result.worker_ids == ["doomed", "rescuer"]
    assert result.attempts == 2
    assert [e.exception_class_path for e in result.errors] == [LOST_CLASS]
    assert "doomed died during attempt 1" in result.errors[0].traceback
    assert list(Run.objects.order_by("pk").values_list("node", "attempt")) == [
        ("doomed", 1),
        ("rescuer", 2),
    ]
