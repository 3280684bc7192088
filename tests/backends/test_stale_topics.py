"""``.enqueue()`` after its queue's topic was flushed or deleted by another process.

The backend registers a queue's topic on first use and remembers it (``known_topics``).
Here the cache goes stale inside each test (the conftest's fixture that clears it
around every test plays no part), and the enqueue must heal it: register the topic
again and enqueue, never fail with ``IntegrityError: FOREIGN KEY constraint failed``.
"""

from __future__ import annotations

import pytest
from django.db import transaction

from django_tasks_coord import queue
from django_tasks_coord.models import Task as TaskRow
from django_tasks_coord.models import Topic
from tests.backends import tasks
from tests.queue.test_stale_topics import delete_elsewhere, flush

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["flush", "deleted elsewhere"])
def stale(request) -> str:
    """The queue ``default``, enqueued to (so cached), and gone since."""
    tasks.add.enqueue(1, 2)
    assert "default" in queue.known_topics
    if request.param == "flush":
        flush()
    else:
        delete_elsewhere("default")
    assert "default" in queue.known_topics
    assert not Topic.objects.filter(name="default").exists()
    return "default"


def test_enqueue_registers_the_topic_again(stale):
    result = tasks.add.enqueue(2, 3)
    [row] = TaskRow.objects.all()
    assert (row.topic_id, row.identifier) == (stale, result.id)
    assert tasks.add.get_result(result.id).args == [2, 3]


def test_enqueue_inside_a_transaction_registers_the_topic_again(stale):
    with transaction.atomic():
        result = tasks.add.enqueue(2, 3)
    [row] = TaskRow.objects.all()
    assert (row.topic_id, row.identifier) == (stale, result.id)


def test_enqueue_after_each_of_two_flushes(stale):
    """Like a user's TransactionTestCase: every test enqueues, every test ends in a flush."""
    for _ in range(2):
        tasks.add.enqueue(1, 1)
        assert TaskRow.objects.count() == 1
        flush()
