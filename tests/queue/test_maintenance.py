"""purge, resolve and count."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_tasks_coord import queue
from django_tasks_coord.enums import TaskState
from django_tasks_coord.exceptions import InvalidArgumentError
from django_tasks_coord.models import Task

pytestmark = pytest.mark.django_db


def test_purge_deletes_below_a_sequence(topic):
    tasks = queue.push_many(topic, [(f"t{i}", i) for i in range(6)])
    assert queue.purge(topic, tasks[3].sequence) == 3
    assert list(Task.objects.order_by("sequence").values_list("payload", flat=True)) == [3, 4, 5]


def test_purge_keeps_tasks_in_flight(topic):
    first, second = queue.push_many(topic, [("a", None), ("b", None)])
    queue.poll(topic)
    assert queue.purge(topic, second.sequence + 1) == 1
    assert list(Task.objects.values_list("pk", flat=True)) == [first.pk]


def test_purge_is_per_topic(topic):
    queue.register_topic("other")
    other = queue.push("other", "x")
    mine = queue.push(topic, "y")
    assert queue.purge(topic, mine.sequence + 1) == 1
    assert Task.objects.filter(pk=other.pk).exists()


def test_purge_needs_an_int(topic):
    with pytest.raises(InvalidArgumentError, match="below"):
        queue.purge(topic, "10")


def test_resolve_uses_creation_times(topic):
    early = queue.push(topic, "early")
    late = queue.push(topic, "late")
    # Move the first task into the past on the database side, as if created an hour ago.
    Task.objects.filter(pk=early.pk).update(created_at=timezone.now() - timedelta(hours=1))
    assert queue.resolve(topic, timezone.now() - timedelta(minutes=30)) == late.sequence
    assert queue.resolve(topic, timezone.now() - timedelta(hours=2)) == early.sequence


def test_resolve_after_everything_is_past_the_last_sequence(topic):
    last = queue.push(topic, "x")
    when = timezone.now() + timedelta(hours=1)
    following = queue.resolve(topic, when)
    assert following == last.sequence + 1
    assert queue.purge(topic, following) == 1


def test_resolve_uses_the_database_clock(topic):
    """A task pushed now has a created_at from the database clock close to the server's now."""
    task = queue.push(topic, "x")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT CURRENT_TIMESTAMP"
            if connection.vendor != "sqlite"
            else "SELECT datetime('now')"
        )
    assert abs(task.created_at - timezone.now()) < timedelta(minutes=1)


def test_resolve_needs_an_aware_datetime(topic):
    with pytest.raises(InvalidArgumentError, match="naive"):
        queue.resolve(topic, timezone.now().replace(tzinfo=None))


def test_count_with_ranges(topic):
    tasks = queue.push_many(topic, [(f"t{i}", None) for i in range(10)])
    seq = [t.sequence for t in tasks]
    assert queue.count(topic) == 10
    assert queue.count(topic, start=seq[2]) == 8
    assert queue.count(topic, end=seq[2]) == 2
    assert queue.count(topic, start=seq[2], end=seq[5]) == 3


def test_count_latest_per_identifier(topic):
    tasks = queue.push_many(topic, [("a", 1), ("a", 2), ("b", 1), ("c", 1), ("c", 2)])
    assert queue.count(topic, latest_per_identifier=True) == 3
    assert (
        queue.count(
            topic, start=tasks[1].sequence, end=tasks[3].sequence, latest_per_identifier=True
        )
        == 2
    )


def test_count_ignores_other_topics(topic):
    queue.register_topic("other")
    queue.push("other", "x")
    assert queue.count(topic) == 0


def test_count_bad_bounds(topic):
    with pytest.raises(InvalidArgumentError, match="start"):
        queue.count(topic, start="1")


def test_completed_states_are_one_range():
    values = sorted(s.value for s in TaskState.completed_states())
    assert values == list(range(values[0], values[-1] + 1))
    assert {s.name for s in TaskState.completed_states()} == {
        "SUCCEEDED",
        "SUSPENDED",
        "FILTERED",
        "FAILED",
        "CANCELED",
        "REDUNDANT",
    }
    assert all(
        s.value < values[0] for s in (TaskState.PENDING, TaskState.REQUESTED, TaskState.ACTIVE)
    )


def test_completed_queryset_is_a_range(topic):
    queue.push_many(topic, [("a", None), ("b", None)])
    task = queue.poll(topic)[0]
    queue.complete(task, queue.Result.FILTER)
    assert list(Task.objects.completed().values_list("identifier", flat=True)) == ["a"]
    assert list(Task.objects.not_completed().values_list("identifier", flat=True)) == ["b"]
