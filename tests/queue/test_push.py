from datetime import timedelta

import pytest
from django.utils import timezone

from django_tasks_coord import queue
from django_tasks_coord.enums import TaskState
from django_tasks_coord.exceptions import InvalidArgumentError, PayloadError
from django_tasks_coord.models import Task
from django_tasks_coord.queue import Insertion

pytestmark = pytest.mark.django_db


def states(identifier="a"):
    return list(
        Task.objects.filter(identifier=identifier)
        .order_by("sequence")
        .values_list("state", flat=True)
    )


@pytest.mark.parametrize(
    "payload",
    [
        None,
        "plain string",
        "",
        0,
        3.5,
        True,
        [1, "two", None],
        {"nested": {"list": [1, 2], "s": "é€😀"}},
    ],
)
def test_payload_round_trips(topic, payload):
    task = queue.push(topic, "a", payload)
    assert Task.objects.get(pk=task.pk).payload == payload
    assert task.payload == payload


def test_sequence_is_assigned_and_grows(topic):
    tasks = [queue.push(topic, f"id{i}") for i in range(5)]
    sequences = [t.sequence for t in tasks]
    assert all(isinstance(s, int) for s in sequences)
    assert sequences == sorted(sequences)
    assert len(set(sequences)) == 5


def test_push_sets_defaults(topic):
    task = queue.push(topic, "a", {"x": 1})
    assert task.state == TaskState.PENDING
    assert task.attempts == 0
    assert task.recreated is False
    assert task.created_at is not None
    assert task.message is None and task.error is None


def test_append_keeps_every_task(topic):
    for _ in range(3):
        queue.push(topic, "a", insertion=Insertion.APPEND)
    assert states() == [TaskState.PENDING] * 3


def test_replace_makes_every_unfinished_task_redundant_active_included(topic):
    queue.push(topic, "a")
    queue.push(topic, "a")
    (active,) = queue.poll(topic)
    done = queue.push(topic, "done")  # another identifier is untouched
    new = queue.push(topic, "a", insertion=Insertion.REPLACE)
    active.refresh_from_db()
    assert active.state == TaskState.REDUNDANT
    assert states() == [TaskState.REDUNDANT, TaskState.REDUNDANT, TaskState.PENDING]
    assert new.state == TaskState.PENDING
    assert Task.objects.get(pk=done.pk).state == TaskState.PENDING


def test_replace_leaves_completed_tasks_alone(topic):
    queue.push(topic, "a")
    (task,) = queue.poll(topic)
    queue.complete(task, queue.Decision(queue.Result.SUCCESS))
    queue.push(topic, "a", insertion="replace")
    assert states() == [TaskState.SUCCEEDED, TaskState.PENDING]


def test_supersede_only_touches_not_yet_polled_tasks(topic):
    queue.push(topic, "a")
    queue.poll(topic)  # first one ACTIVE
    queue.push(topic, "a")
    queue.push(topic, "a", insertion=Insertion.SUPERSEDE)
    assert states() == [TaskState.ACTIVE, TaskState.REDUNDANT, TaskState.PENDING]


def test_delete_removes_earlier_tasks_not_in_flight(topic):
    queue.push(topic, "a")
    queue.poll(topic)  # ACTIVE, kept
    queue.push(topic, "a")
    queue.push(topic, "a")
    queue.push(topic, "b")
    queue.push(topic, "a", insertion=Insertion.DELETE)
    assert states() == [TaskState.ACTIVE, TaskState.PENDING]
    assert states("b") == [TaskState.PENDING]


def test_delete_removes_completed_history_too(topic):
    queue.push(topic, "a")
    (task,) = queue.poll(topic)
    queue.complete(task, queue.Decision(queue.Result.FAILURE))
    queue.push(topic, "a", insertion=Insertion.DELETE)
    assert states() == [TaskState.PENDING]


def test_push_many_returns_tasks_in_order(topic):
    tasks = queue.push_many(topic, [("a", 1), ("b", 2), ("c", None)])
    assert [(t.identifier, t.payload) for t in tasks] == [("a", 1), ("b", 2), ("c", None)]
    assert [t.sequence for t in tasks] == sorted(t.sequence for t in tasks)
    assert all(t.created_at is not None for t in tasks)
    assert Task.objects.count() == 3


def test_push_many_empty(topic):
    assert queue.push_many(topic, []) == []


@pytest.mark.parametrize("insertion", [Insertion.REPLACE, Insertion.SUPERSEDE])
def test_push_many_repeated_identifier_keeps_the_last_pending(topic, insertion):
    queue.push(topic, "a")
    tasks = queue.push_many(topic, [("a", 1), ("b", 2), ("a", 3)], insertion=insertion)
    assert [t.state for t in tasks] == [TaskState.REDUNDANT, TaskState.PENDING, TaskState.PENDING]
    assert states() == [TaskState.REDUNDANT, TaskState.REDUNDANT, TaskState.PENDING]
    assert Task.objects.get(identifier="a", state=TaskState.PENDING).payload == 3


def test_push_many_delete_repeated_identifier_creates_only_the_last(topic):
    queue.push(topic, "a")
    tasks = queue.push_many(topic, [("a", 1), ("a", 2)], insertion=Insertion.DELETE)
    assert [t.payload for t in tasks] == [2]
    assert list(Task.objects.values_list("payload", flat=True)) == [2]


def test_priority_and_execute_at_are_stored(topic):
    later = timezone.now() + timedelta(hours=1)
    task = queue.push(topic, "a", priority=7, execute_at=later)
    task = Task.objects.get(pk=task.pk)
    assert task.priority == 7
    assert task.execute_at == later


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"identifier": ""}, "identifier"),
        ({"identifier": None}, "identifier"),
        ({"identifier": "x" * 256}, "identifier"),
        ({"insertion": "upsert"}, "Insertion.APPEND"),
        ({"priority": "high"}, "priority"),
        ({"priority": 40000}, "priority"),
        ({"priority": True}, "priority"),
        ({"execute_at": "tomorrow"}, "execute_at"),
        ({"execute_at": timezone.now().replace(tzinfo=None)}, "naive"),
    ],
)
def test_bad_arguments_are_refused_with_a_clear_message(topic, kwargs, fragment):
    args = {"identifier": "a", **kwargs}
    with pytest.raises(InvalidArgumentError, match=fragment):
        queue.push(topic, args.pop("identifier"), **args)
    assert Task.objects.count() == 0


@pytest.mark.parametrize(
    "payload", [{1, 2}, timezone.now(), object(), float("nan"), {"x": b"bytes"}]
)
def test_non_json_payload_is_refused(topic, payload):
    with pytest.raises(PayloadError, match="JSON"):
        queue.push(topic, "a", payload)
    assert Task.objects.count() == 0


def test_bad_item_in_a_batch_writes_nothing(topic):
    with pytest.raises(PayloadError):
        queue.push_many(topic, [("a", 1), ("b", {3})])
    with pytest.raises(InvalidArgumentError, match="pairs"):
        queue.push_many(topic, [("a", 1), "b"])
    assert Task.objects.count() == 0


def test_insertion_accepts_names_case_insensitively(topic):
    queue.push(topic, "a")
    queue.push(topic, "a", insertion="SUPERSEDE")
    assert states() == [TaskState.REDUNDANT, TaskState.PENDING]
