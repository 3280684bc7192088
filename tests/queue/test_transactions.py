"""The queue runs in the caller's transaction."""

import pytest
from django.db import transaction

from django_tasks_coord import queue
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Task

pytestmark = pytest.mark.django_db(transaction=True)


class Boom(Exception):
    pass


def test_push_in_a_rolled_back_block_never_existed():
    queue.register_topic("jobs")
    with pytest.raises(Boom), transaction.atomic():
        queue.push("jobs", "a")
        queue.push_many("jobs", [("b", 1), ("c", 2)])
        assert Task.objects.count() == 3
        raise Boom
    assert Task.objects.count() == 0
    assert queue.poll("jobs") == []


def test_poll_and_complete_roll_back_with_the_caller():
    queue.register_topic("jobs")
    queue.push("jobs", "a")
    with pytest.raises(Boom), transaction.atomic():
        (task,) = queue.poll("jobs")
        queue.complete(task, queue.Result.SUCCESS)
        raise Boom
    assert Task.objects.get().state == TaskState.PENDING
    assert Task.objects.get().attempts == 0


def test_a_failing_push_leaves_the_callers_transaction_usable():
    queue.register_topic("jobs")
    with transaction.atomic():
        queue.push("jobs", "a")
        with pytest.raises(Exception):  # noqa: B017, PT011
            queue.push("jobs", "b", {1})
        queue.push("jobs", "c")
    assert sorted(Task.objects.values_list("identifier", flat=True)) == ["a", "c"]
