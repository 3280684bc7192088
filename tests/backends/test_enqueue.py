"""The enqueue path of ``DatabaseBackend``: its statements, ``enqueue_many``, signals, transactions."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_tasks_coord.backends.compat import (
    SOURCE,
    InvalidTask,
    TaskResultStatus,
    task_backends,
    task_enqueued,
)
from django_tasks_coord.enums import TaskState
from django_tasks_coord.exceptions import InvalidArgumentError, PayloadError
from django_tasks_coord.models import Task as TaskRow
from django_tasks_coord.models import Topic
from tests.backends import tasks

pytestmark = pytest.mark.django_db(transaction=True)


class Boom(Exception):
    pass


@pytest.fixture(autouse=True)
def _registered() -> None:
    """The queue's topic exists and this process knows it (the state of a running site)."""
    tasks.add.enqueue(0, 0)
    TaskRow.objects.all().delete()


def statements(run) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        run()
    return [query["sql"] for query in captured.captured_queries]


def test_an_enqueue_in_autocommit_is_one_statement_and_on_postgresql_carries_its_wake_up():
    sql = statements(lambda: tasks.add.enqueue(1, 2))
    assert len(sql) == 1  # one round trip
    assert sql[0].startswith("INSERT INTO")
    if connection.vendor == "postgresql":
        insert, wake = sql[0].split("; COMMIT; ")  # the wake-up after the insert's commit
        assert "pg_notify" not in insert and "pg_notify" in wake
    assert not any(Topic._meta.db_table in s.split("INSERT")[0] for s in sql)  # no topic look-up


def test_enqueues_in_a_transaction_are_one_statement_each():
    def three() -> None:
        with transaction.atomic():
            for n in range(3):
                tasks.add.enqueue(n, n)

    sql = statements(three)
    inserts = [s for s in sql if TaskRow._meta.db_table in s]
    assert len(inserts) == 3
    looked_up = [s for s in sql if s.startswith("SELECT") and Topic._meta.db_table in s]
    # SQLite checks the topic in the transaction (its foreign keys are checked at commit).
    assert len(looked_up) == (3 if connection.vendor == "sqlite" else 0)
    wakes = [s for s in sql if "pg_notify" in s]
    assert len(wakes) == (1 if connection.vendor == "postgresql" else 0)
    assert len(sql) == len(inserts) + len(looked_up) + len(wakes) + 2  # BEGIN, COMMIT


def test_enqueue_many_returns_a_ready_result_per_call_in_order():
    results = tasks.add.enqueue_many([((1, 2), {}), ((3,), {"b": 4}), ([5, 6], {})])
    assert [r.args for r in results] == [[1, 2], [3], [5, 6]]
    assert [r.kwargs for r in results] == [{}, {"b": 4}, {}]
    assert all(r.status == TaskResultStatus.READY and r.enqueued_at for r in results)
    assert len({r.id for r in results}) == 3
    rows = {row.identifier: row for row in TaskRow.objects.all()}
    assert [rows[r.id].payload["args"] for r in results] == [[1, 2], [3], [5, 6]]
    assert [task_backends["default"].get_result(r.id).args for r in results] == [
        [1, 2],
        [3],
        [5, 6],
    ]


def test_enqueue_many_stores_what_enqueue_stores():
    single = tasks.add.using(priority=3).enqueue(1, 2)
    (many,) = tasks.add.using(priority=3).enqueue_many([((1, 2), {})])
    one, other = (TaskRow.objects.get(identifier=r.id) for r in (single, many))
    fields = ("topic_id", "handler", "priority", "state", "execute_at", "payload")
    assert [getattr(one, f) for f in fields] == [getattr(other, f) for f in fields]


def test_enqueue_many_is_one_insert():
    # 20 rows: within the 999 parameters of a statement of SQLite under Django 5.2
    calls = [((n, n), {}) for n in range(20)]
    sql = statements(lambda: tasks.add.enqueue_many(calls))
    assert len([s for s in sql if TaskRow._meta.db_table in s]) == 1
    assert TaskRow.objects.count() == 20


def test_enqueue_many_sends_task_enqueued_once_per_task():
    seen = []

    def enqueued(sender, task_result, **kwargs):
        seen.append(task_result.id)

    task_enqueued.connect(enqueued)
    try:
        results = tasks.add.enqueue_many([((1, 2), {}), ((3, 4), {})])
    finally:
        task_enqueued.disconnect(enqueued)
    assert seen == [r.id for r in results]


@pytest.mark.parametrize(
    ("bad", "error"),
    [(object(), TypeError), ("nul\x00", PayloadError), (float("nan"), PayloadError)],
)
def test_enqueue_many_refuses_what_enqueue_refuses_and_writes_nothing(bad, error):
    with pytest.raises(error):
        tasks.add.enqueue(bad, 2)
    with pytest.raises(error):
        tasks.add.enqueue_many([((1, 2), {}), ((bad, 2), {})])
    assert not TaskRow.objects.exists()


def test_enqueue_many_checks_its_calls_and_task_before_writing_anything():
    for bad in ([(1, 2)], [((1,),)], [((1,), {1: 2})], "abc", [({"a": 1}, {})]):
        with pytest.raises(InvalidArgumentError, match="pairs"):
            tasks.add.enqueue_many(bad)
    with pytest.raises(InvalidTask):
        tasks.add.using(queue_name="nope").enqueue_many([((1, 2), {})])
    assert not TaskRow.objects.exists()


def test_enqueue_many_of_nothing_writes_nothing():
    assert statements(lambda: tasks.add.enqueue_many([])) == []


def test_enqueue_many_in_a_rolled_back_transaction_never_existed():
    with pytest.raises(Boom), transaction.atomic():
        tasks.add.enqueue_many([((1, 2), {}), ((3, 4), {})])
        assert TaskRow.objects.count() == 2
        raise Boom
    assert not TaskRow.objects.exists()


def test_enqueue_many_with_a_unique_key_ends_like_enqueues_one_by_one():
    results = tasks.refresh_user.enqueue_many([((7,), {}), ((8,), {}), ((7,), {})])
    assert results[0].id == results[2].id != results[1].id
    pending = TaskRow.objects.filter(state=TaskState.PENDING)
    assert sorted(pending.values_list("identifier", flat=True)) == sorted(
        {results[0].id, results[1].id}
    )


def test_aenqueue_many():
    results = async_to_sync(tasks.add.aenqueue_many)([((1, 2), {})])
    assert TaskRow.objects.get().identifier == results[0].id


def test_an_enqueue_that_waits_for_a_commit_is_checked_at_once(monkeypatch):
    """With the tables on a database of their own, an enqueue in a transaction on the
    default database waits for its commit (ENQUEUE_ON_COMMIT); bad arguments raise now."""
    from django_tasks_coord.backends import DatabaseBackend

    monkeypatch.setattr(DatabaseBackend, "_defer", lambda self: True)
    deferred = []
    monkeypatch.setattr(transaction, "on_commit", lambda func, using=None: deferred.append(func))
    with pytest.raises(PayloadError):
        tasks.add.enqueue(float("nan"), 1)
    with pytest.raises(PayloadError):
        tasks.add.enqueue_many([((1, 2), {}), (("nul\x00", 2), {})])
    assert deferred == []
    tasks.add.enqueue(1, 2)
    assert len(deferred) == 1 and not TaskRow.objects.exists()


def test_enqueue_many_needs_this_backend(settings):
    settings.TASKS = {
        **settings.TASKS,
        "dummy": {"BACKEND": f"{SOURCE}.backends.dummy.DummyBackend"},
    }
    with pytest.raises(InvalidTask, match="DatabaseBackend"):
        tasks.add.using(backend="dummy").enqueue_many([((1, 2), {})])
