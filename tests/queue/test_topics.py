import pytest

from django_tasks_coord import queue
from django_tasks_coord.exceptions import InvalidArgumentError, TasksCoordError, UnknownTopicError
from django_tasks_coord.models import Topic

pytestmark = pytest.mark.django_db


def test_register_topic_is_idempotent():
    first = queue.register_topic("emails")
    second = queue.register_topic("emails")
    assert first == second
    assert Topic.objects.filter(name="emails").count() == 1


def test_unknown_topic_names_it_and_the_registered_ones():
    queue.register_topic("emails")
    queue.register_topic("reports")
    with pytest.raises(UnknownTopicError) as info:
        queue.push("invoices", "x")
    message = str(info.value)
    assert "'invoices'" in message
    assert "'emails', 'reports'" in message
    assert "register_topic('invoices')" in message
    assert isinstance(info.value, TasksCoordError)


@pytest.mark.parametrize("call", ["poll", "count", "purge", "resolve"])
def test_every_operation_refuses_unknown_topics(call):
    from django.utils import timezone

    args = {"poll": (), "count": (), "purge": (10,), "resolve": (timezone.now(),)}[call]
    with pytest.raises(UnknownTopicError):
        getattr(queue, call)("nope", *args)


@pytest.mark.parametrize("name", ["", " padded ", "x" * 101, 42, None])
def test_bad_topic_names(name):
    with pytest.raises(InvalidArgumentError):
        queue.register_topic(name)


def test_topic_instance_accepted(topic):
    task = queue.push(topic, "a")
    assert task.topic_id == "jobs"
    assert task.topic == topic
