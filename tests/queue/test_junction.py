import pytest

from django_tasks_coord import queue
from django_tasks_coord.enums import TaskState
from django_tasks_coord.exceptions import InvalidArgumentError
from django_tasks_coord.models import Task
from django_tasks_coord.queue import Decision, Junction, Result

pytestmark = pytest.mark.django_db


def suspend(topic, identifier):
    queue.push(topic, identifier)
    (task,) = queue.poll(topic)
    return queue.complete(task, Decision(Result.SUSPENSION))


def test_singular_waits_until_every_identifier_is_suspended(topic):
    suspend(topic, "a")
    assert queue.junction(topic, ["a", "b"]) == []
    suspend(topic, "b")
    started = queue.junction(topic, ["a", "b"], Junction.SINGULAR)
    assert [t.identifier for t in started] == ["a", "b"]
    assert all(t.state == TaskState.PENDING for t in started)
    assert Task.objects.filter(state=TaskState.PENDING).count() == 2
    assert queue.junction(topic, ["a", "b"]) == []  # started once only


def test_singular_needs_the_latest_task_of_each_to_be_suspended(topic):
    suspend(topic, "a")
    suspend(topic, "b")
    queue.push(topic, "b")  # a newer, pending task of b
    assert queue.junction(topic, ["a", "b"]) == []
    assert Task.objects.filter(state=TaskState.SUSPENDED).count() == 2


def test_eternal_fires_once_all_are_present_in_any_state(topic):
    suspend(topic, "a")
    assert queue.junction(topic, ["a", "b"], Junction.ETERNAL) == []
    queue.push(topic, "b")
    started = queue.junction(topic, ["a", "b"], "eternal")
    assert [t.identifier for t in started] == ["a"]
    assert Task.objects.get(identifier="a").state == TaskState.PENDING


def test_junction_ignores_other_identifiers(topic):
    suspend(topic, "a")
    suspend(topic, "c")
    assert [t.identifier for t in queue.junction(topic, ["a"])] == ["a"]
    assert Task.objects.get(identifier="c").state == TaskState.SUSPENDED


@pytest.mark.parametrize(
    ("identifiers", "mode"), [([], "singular"), ("ab", "singular"), (["a"], "sometimes")]
)
def test_bad_junction_arguments(topic, identifiers, mode):
    with pytest.raises(InvalidArgumentError):
        queue.junction(topic, identifiers, mode)
