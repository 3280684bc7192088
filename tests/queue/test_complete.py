import pytest

from django_tasks_coord import queue
from django_tasks_coord.enums import TaskState
from django_tasks_coord.exceptions import (
    InvalidArgumentError,
    StaleClaimError,
    TaskAlreadyCompletedError,
    TaskNotActiveError,
    TaskNotClaimedError,
    TaskRedundantError,
    TaskStateError,
)
from django_tasks_coord.models import Task
from django_tasks_coord.queue import Decision, Result

pytestmark = pytest.mark.django_db


@pytest.fixture
def active(topic):
    queue.push(topic, "a", {"x": 1})
    return queue.poll(topic)[0]


@pytest.mark.parametrize(
    ("result", "state"),
    [
        (Result.SUCCESS, TaskState.SUCCEEDED),
        (Result.SUSPENSION, TaskState.SUSPENDED),
        (Result.FILTER, TaskState.FILTERED),
        (Result.FAILURE, TaskState.FAILED),
    ],
)
def test_each_decision_sets_its_state(active, result, state):
    done = queue.complete(active, Decision(result, message="why"))
    stored = Task.objects.get(pk=active.pk)
    for obj in (done, stored):
        assert obj.state == state
        assert obj.message == "why"
        assert obj.finished_at is not None
        assert obj.owner_id is None
        assert obj.is_completed


def test_exception_is_stored_with_class_and_traceback(active):
    def fail():
        raise ValueError("bad amount")

    try:
        fail()
    except ValueError as exc:
        queue.complete(active, Decision(Result.FAILURE, exception=exc))
    error = Task.objects.get(pk=active.pk).error
    assert error.startswith("Traceback (most recent call last):")
    assert "in fail" in error
    assert error.endswith("ValueError: bad amount")


def test_exception_without_traceback(active):
    queue.complete(active, Decision.failure(KeyError("k"), message="m"))
    stored = Task.objects.get(pk=active.pk)
    assert stored.error == "KeyError: 'k'"
    assert stored.message == "m"


def test_result_alone_is_accepted(active):
    assert queue.complete(active, Result.SUCCESS).state == TaskState.SUCCEEDED


def test_completing_twice_is_refused(active):
    queue.complete(active, Decision.success())
    with pytest.raises(TaskAlreadyCompletedError, match="already completed"):
        queue.complete(active, Decision.success())


def test_completing_a_pending_task_is_refused(topic):
    task = queue.push(topic, "a")
    with pytest.raises(TaskNotActiveError) as refused:
        queue.complete(task, Decision.success())
    assert type(refused.value) is TaskNotActiveError
    assert str(refused.value) == (
        f"Cannot complete task #{task.pk}: it is pending, not active. Only a task claimed by "
        f"queue.poll can be completed, through the Task object queue.poll returned."
    )
    assert Task.objects.get(pk=task.pk).state == TaskState.PENDING


@pytest.mark.parametrize("action", ["complete", "release"])
def test_a_task_object_that_poll_did_not_return_carries_no_claim(topic, action):
    pushed = queue.push(topic, "a")  # or a lookup made before the task was claimed
    owner = queue.register_owner("node-a")
    (polled,) = queue.poll(topic, owner=owner)
    act = {
        "complete": lambda task: queue.complete(task, Decision.success()),
        "release": queue.release,
    }[action]
    with pytest.raises(TaskNotClaimedError) as refused:
        act(pushed)
    assert str(refused.value) == (
        f"Cannot {action} task #{pushed.pk}: this Task object carries no claim (its exec_id is "
        f"None): it was not returned by queue.poll (it came from queue.push, or from a lookup "
        f"made before the task was claimed). The task is active under the claim "
        f"{polled.exec_id} of 'node-a'; a claim is identified by the exec_id queue.poll gives "
        f"the task. {action.capitalize()} the Task object queue.poll returned, or look the task "
        f"up again (Task.objects.get(pk={pushed.pk})) to {action} it under its current claim."
    )
    assert Task.objects.get(pk=pushed.pk).state == TaskState.ACTIVE  # nothing written
    act(Task.objects.get(pk=pushed.pk))  # looked up again: it carries the current claim
    assert Task.objects.get(pk=pushed.pk).state != TaskState.ACTIVE


def test_completing_a_replaced_task_says_so(topic, active):
    queue.push(topic, "a", insertion="replace")
    with pytest.raises(TaskRedundantError, match="redundant"):
        queue.complete(active, Decision.success())


def test_completing_after_the_claim_was_lost(topic, active):
    Task.objects.filter(pk=active.pk).update(state=TaskState.PENDING, exec_id=None)  # expired
    with pytest.raises(StaleClaimError) as refused:
        queue.complete(active, Decision.success())
    assert str(refused.value) == (
        f"Cannot complete task #{active.pk}: its claim {active.exec_id} was lost (it expired "
        f"because its owner was declared dead, or it was released); it is now pending. "
        f"Do not retry."
    )
    (again,) = queue.poll(topic)
    with pytest.raises(StaleClaimError) as refused:
        queue.complete(active, Decision.success())
    assert str(refused.value) == (
        f"Cannot complete task #{active.pk}: its claim {active.exec_id} was lost (it expired "
        f"because its owner was declared dead, or it was released); it was claimed again and "
        f"is now active under the claim {again.exec_id}. Do not retry."
    )
    assert queue.complete(again, Decision.success()).state == TaskState.SUCCEEDED


def test_completing_a_deleted_task(active):
    Task.objects.filter(pk=active.pk).delete()
    with pytest.raises(TaskStateError, match="deleted"):
        queue.complete(active, Decision.success())


@pytest.mark.parametrize(
    "make",
    [
        lambda: Decision("maybe"),
        lambda: Decision(Result.SUCCESS, message=3),
        lambda: Decision(Result.FAILURE, exception="boom"),
    ],
)
def test_bad_decisions(make):
    with pytest.raises(InvalidArgumentError):
        make()


def test_complete_needs_a_task(db):
    with pytest.raises(InvalidArgumentError, match="Task"):
        queue.complete("task-1", Decision.success())
    with pytest.raises(InvalidArgumentError, match="Task"):
        queue.complete(Task(), Decision.success())


def test_release_returns_a_task_to_the_queue(topic, active):
    released = queue.release(active, refund_attempt=True)
    assert released.state == TaskState.PENDING
    assert released.attempts == 0
    (again,) = queue.poll(topic)
    assert again.pk == active.pk
    assert again.attempts == 1


def test_release_with_delay_keeps_the_attempt(topic, active):
    from datetime import timedelta

    from django.utils import timezone

    queue.release(active, execute_at=timezone.now() + timedelta(minutes=5))
    assert queue.poll(topic) == []
    stored = Task.objects.get(pk=active.pk)
    assert stored.attempts == 1
    assert stored.execute_at is not None


def test_cancel(topic, active):
    pending = queue.push(topic, "b")
    assert queue.cancel(pending).state == TaskState.CANCELED
    requested = queue.cancel(active, message="operator")
    assert (requested.state, requested.message) == (TaskState.ACTIVE, "operator")
    assert requested.cancel_requested_at is not None  # asked to stop, still running
    done = queue.complete(active, Decision.success("it returned"))
    assert (done.state, done.message) == (TaskState.CANCELED, "operator")
    assert Task.objects.get(pk=active.pk).state == TaskState.CANCELED  # never SUCCEEDED
    with pytest.raises(TaskAlreadyCompletedError):
        queue.complete(active, Decision.success())
    with pytest.raises(TaskStateError, match="canceled"):
        queue.cancel(pending)


def test_complete_many_in_one_go(topic):
    queue.push_many(topic, [(f"t{i}", i) for i in range(5)])
    first = queue.poll(topic, 3)
    second = queue.poll(topic, 2)
    done = queue.complete_many(first + second, Decision(Result.SUCCESS, message="batch"))
    assert [t.state for t in done] == [TaskState.SUCCEEDED] * 5
    assert set(Task.objects.values_list("state", "message")) == {(TaskState.SUCCEEDED, "batch")}
    assert queue.complete_many([], Result.SUCCESS) == []


def test_complete_many_is_all_or_nothing(topic):
    queue.push_many(topic, [("a", None), ("b", None), ("c", None)])
    tasks = queue.poll(topic, 3)
    queue.complete(tasks[1], Result.FAILURE)
    with pytest.raises(TaskAlreadyCompletedError, match=f"#{tasks[1].pk}"):
        queue.complete_many(tasks, Result.SUCCESS)
    states = dict(Task.objects.values_list("identifier", "state"))
    assert states == {"a": TaskState.ACTIVE, "b": TaskState.FAILED, "c": TaskState.ACTIVE}
    queue.complete_many([tasks[0], tasks[2], tasks[0]], Result.SUCCESS)  # duplicates are fine
    assert Task.objects.filter(state=TaskState.SUCCEEDED).count() == 2


def test_complete_many_refuses_a_lost_claim(topic):
    queue.push_many(topic, [("a", None), ("b", None)])
    tasks = queue.poll(topic, 2)
    Task.objects.filter(pk=tasks[0].pk).update(state=TaskState.PENDING, exec_id=None)
    queue.poll(topic)
    with pytest.raises(StaleClaimError):
        queue.complete_many(tasks, Result.SUCCESS)
    assert Task.objects.get(pk=tasks[1].pk).state == TaskState.ACTIVE
