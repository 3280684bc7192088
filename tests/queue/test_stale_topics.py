"""A stale topic cache heals on the next call and never surfaces as an ``IntegrityError``.

Each test fills the process's topic cache (``known_topics``) itself and then deletes the
topic behind its back: ``manage.py flush`` (what ``TransactionTestCase`` and
pytest-django's ``transactional_db`` do between tests), or a plain ``DELETE`` as another
process would, which no signal of this process sees. The conftest's autouse fixture that
clears the cache around every test plays no part: the cache goes stale inside the test.
"""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import connection, transaction

from django_tasks_coord import executions, queue
from django_tasks_coord.exceptions import UnknownTopicError
from django_tasks_coord.models import Task, Topic

pytestmark = pytest.mark.django_db(transaction=True)


def flush() -> None:
    """Empty every table, as ``TransactionTestCase`` does after each test."""
    call_command("flush", verbosity=0, interactive=False)


def delete_elsewhere(name: str) -> None:
    """Delete the topic (and its tasks) with SQL, as another process would: no signal here."""
    quote = connection.ops.quote_name
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {quote(Task._meta.db_table)} WHERE topic_id = %s", [name])
        cursor.execute(f"DELETE FROM {quote(Topic._meta.db_table)} WHERE name = %s", [name])


@pytest.fixture(params=["flush", "deleted elsewhere"])
def stale(request) -> str:
    """A topic that this process has registered (so cached) and that is gone since."""
    queue.register_topic("mail")
    queue.push("mail", "before")
    assert "mail" in queue.known_topics
    if request.param == "flush":
        flush()
    else:
        delete_elsewhere("mail")
    assert "mail" in queue.known_topics  # stale: nothing told this process
    assert not Topic.objects.filter(name="mail").exists()
    return "mail"


def test_a_push_to_a_deleted_topic_says_it_is_not_registered(stale):
    with pytest.raises(UnknownTopicError, match="register_topic"):
        queue.push(stale, "after")
    assert stale not in queue.known_topics
    assert not Task.objects.exists()


def test_a_push_inside_a_transaction_says_so_before_the_commit(stale):
    with pytest.raises(UnknownTopicError), transaction.atomic():
        queue.push_many(stale, [("a", 1), ("b", 2)])
    assert not Task.objects.exists()


def test_a_push_inside_a_transaction_that_goes_on_leaves_it_usable(stale):
    with transaction.atomic():
        Topic.objects.create(name="other")
        with pytest.raises(UnknownTopicError):
            queue.push(stale, "after")
        queue.push("other", "kept")
    assert list(Task.objects.values_list("topic_id", "identifier")) == [("other", "kept")]


def test_registering_again_works_and_pushes_go_through(stale):
    queue.register_topic(stale)
    task = queue.push(stale, "after")
    with transaction.atomic():
        queue.push(stale, "inside")
    assert Task.objects.filter(topic_id=stale).count() == 2
    assert task.sequence is not None


def test_a_topic_registered_again_elsewhere_is_pushed_to(stale):
    """The cache was right after all by the time of the push: no error, no extra step."""
    Topic.objects.create(name=stale)
    queue.push(stale, "after")
    assert Task.objects.filter(topic_id=stale, identifier="after").exists()


def test_an_execution_of_a_definition_recreates_its_topic(transactional_db):
    from tests.api import defs

    executions.create(defs.BASIC.name)
    assert defs.BASIC.name in queue.known_topics
    flush()
    created = executions.create(defs.BASIC.name)
    assert Task.objects.get(pk=created.pk).topic_id == defs.BASIC.name
    delete_elsewhere(defs.BASIC.name)
    with transaction.atomic():
        created = executions.create(defs.BASIC.name)
    assert Task.objects.get(pk=created.pk).topic_id == defs.BASIC.name
