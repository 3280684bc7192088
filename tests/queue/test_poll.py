from datetime import timedelta

import pytest
from django.utils import timezone

from django_tasks_coord import queue
from django_tasks_coord.enums import TaskState
from django_tasks_coord.exceptions import InvalidArgumentError, OwnerExpiredError
from django_tasks_coord.models import Owner, Task
from django_tasks_coord.queue import Order
from tests.factories import OwnerFactory

pytestmark = pytest.mark.django_db


def identifiers(tasks):
    return [t.identifier for t in tasks]


def test_empty_topic_polls_nothing(topic):
    assert queue.poll(topic) == []


def test_fifo_and_lifo(topic):
    queue.push_many(topic, [(f"t{i}", i) for i in range(5)])
    assert identifiers(queue.poll(topic, 2)) == ["t0", "t1"]
    assert identifiers(queue.poll(topic, 2, order=Order.LIFO)) == ["t4", "t3"]
    assert identifiers(queue.poll(topic, 5, order="fifo")) == ["t2"]


def test_batch_limit(topic):
    queue.push_many(topic, [(f"t{i}", None) for i in range(25)])
    assert len(queue.poll(topic, 10)) == 10
    assert len(queue.poll(topic, 10)) == 10
    assert len(queue.poll(topic, 10)) == 5
    assert queue.poll(topic, 10) == []


def test_priority_first_then_sequence(topic):
    queue.push(topic, "low", priority=-1)
    queue.push(topic, "normal1")
    queue.push(topic, "high", priority=5)
    queue.push(topic, "normal2")
    assert identifiers(queue.poll(topic, 4)) == ["high", "normal1", "normal2", "low"]


def test_lifo_respects_priority(topic):
    queue.push(topic, "high1", priority=5)
    queue.push(topic, "high2", priority=5)
    queue.push(topic, "normal")
    assert identifiers(queue.poll(topic, 3, order=Order.LIFO)) == ["high2", "high1", "normal"]


def test_poll_marks_tasks_active_with_claim(topic):
    owner = queue.register_owner("node-a")
    queue.push(topic, "a")
    (task,) = queue.poll(topic, owner=owner)
    for obj in (task, Task.objects.get(pk=task.pk)):
        assert obj.state == TaskState.ACTIVE
        assert obj.owner_id == owner.pk
        assert obj.exec_id is not None
        assert obj.attempts == 1
        assert obj.started_at is not None


def test_each_poll_gets_a_fresh_exec_id(topic):
    queue.push_many(topic, [("a", None), ("b", None)])
    (first,) = queue.poll(topic)
    (second,) = queue.poll(topic)
    assert first.exec_id != second.exec_id


def test_future_tasks_wait_for_execute_at(topic):
    queue.push(topic, "later", execute_at=timezone.now() + timedelta(hours=1))
    queue.push(topic, "past", execute_at=timezone.now() - timedelta(seconds=1))
    queue.push(topic, "now")
    assert identifiers(queue.poll(topic, 10)) == ["past", "now"]
    assert Task.objects.get(identifier="later").state == TaskState.PENDING


def test_other_topics_are_not_polled(topic):
    queue.register_topic("other")
    queue.push("other", "x")
    assert queue.poll(topic) == []
    assert identifiers(queue.poll("other")) == ["x"]


def test_active_and_completed_tasks_are_not_polled_again(topic):
    queue.push_many(topic, [("a", None), ("b", None)])
    (a,) = queue.poll(topic)
    queue.complete(a, queue.Decision(queue.Result.SUCCESS))
    (b,) = queue.poll(topic)
    assert b.identifier == "b"
    assert queue.poll(topic) == []


def test_polling_refreshes_the_owner_heartbeat(topic):
    owner = OwnerFactory()
    Owner.objects.filter(pk=owner.pk).update(heartbeat=timezone.now() - timedelta(hours=1))
    queue.poll(topic, owner=owner)
    owner.refresh_from_db()
    assert timezone.now() - owner.heartbeat < timedelta(minutes=5)


def test_an_expired_owner_cannot_claim(topic):
    owner = OwnerFactory()
    queue.push(topic, "a")
    Owner.objects.filter(pk=owner.pk).delete()
    with pytest.raises(OwnerExpiredError, match="declared dead"):
        queue.poll(topic, owner=owner)
    assert Task.objects.get().state == TaskState.PENDING


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 10_001}, "limit"),
        ({"limit": "5"}, "limit"),
        ({"order": "random"}, "Order.FIFO"),
        ({"condition": "exclusive"}, "Condition.SINGULAR_BY_IDENTIFIER"),
        ({"owner": "node-a"}, "Owner"),
    ],
)
def test_bad_poll_arguments(topic, kwargs, fragment):
    with pytest.raises(InvalidArgumentError, match=fragment):
        queue.poll(topic, **kwargs)
