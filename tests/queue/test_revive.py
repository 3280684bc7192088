import pytest

from django_tasks_coord import queue
from django_tasks_coord.enums import TaskState
from django_tasks_coord.exceptions import TaskStateError
from django_tasks_coord.models import Task
from django_tasks_coord.queue import Decision, Result

pytestmark = pytest.mark.django_db


@pytest.fixture
def failed(topic):
    queue.push(topic, "a", {"x": 1}, priority=3)
    task = queue.poll(topic)[0]
    return queue.complete(task, Decision(Result.FAILURE, message="no", exception=RuntimeError("x")))


def test_reset_revives_in_place(topic, failed):
    revived = queue.reset(failed)
    stored = Task.objects.get(pk=failed.pk)
    for obj in (revived, stored):
        assert obj.state == TaskState.PENDING
        assert obj.sequence == failed.sequence
        assert obj.message is None and obj.error is None
        assert obj.attempts == 0
        assert obj.finished_at is None
    (again,) = queue.poll(topic)
    assert again.pk == failed.pk
    assert again.attempts == 1


def test_recreate_makes_a_new_task_and_keeps_the_old_result(topic, failed):
    copy = queue.recreate(failed)
    assert copy.sequence > failed.sequence
    assert copy.recreated is True
    assert copy.original_id == failed.pk
    assert (copy.identifier, copy.payload, copy.priority) == ("a", {"x": 1}, 3)
    assert copy.state == TaskState.PENDING
    original = Task.objects.get(pk=failed.pk)
    assert original.state == TaskState.FAILED
    assert original.message == "no"
    assert list(original.recreations.all()) == [copy]


def test_recreated_copy_survives_purge_of_its_original(topic, failed):
    copy = queue.recreate(failed)
    queue.purge(topic, copy.sequence)
    copy.refresh_from_db()
    assert copy.original_id == failed.pk
    assert copy.recreated is True


@pytest.mark.parametrize("operation", [queue.reset, queue.recreate])
def test_only_completed_tasks_can_be_revived(topic, operation):
    pending = queue.push(topic, "p")
    with pytest.raises(TaskStateError, match="pending; only completed"):
        operation(pending)
    queue.push(topic, "q")
    active = queue.poll(topic)[0]
    with pytest.raises(TaskStateError, match="active"):
        operation(active)
    assert Task.objects.count() == 2
