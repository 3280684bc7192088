"""How a claim reaches the database: the fewest round trips each one allows, no row waited on."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_tasks_coord import db, flow, queue
from django_tasks_coord.enums import Condition, TaskState
from django_tasks_coord.models import Task, Topic
from tests.conftest import skip_unless_row_locks

pytestmark = pytest.mark.django_db(transaction=True)


def _statements() -> tuple[int, int] | None:
    """Statements of a claim that takes tasks, and of one that finds none, on this database:
    one ``UPDATE ... RETURNING`` (PostgreSQL, SQLite 3.35+); MariaDB's ``UPDATE`` joined to
    the rows it picks, and the ``SELECT`` of them if there were any. None: a transaction."""
    if connection.vendor == "postgresql" or (
        connection.vendor == "sqlite" and connection.features.can_return_columns_from_insert
    ):
        return (1, 1)
    if getattr(connection, "mysql_is_mariadb", False):
        return (2, 1)
    return None


def _claims_in_a_transaction_of_their_own(monkeypatch) -> list[int]:
    entered: list[int] = []
    real = db.write_transaction

    def counted():  # type: ignore[no-untyped-def]
        entered.append(1)
        return real()

    monkeypatch.setattr(db, "write_transaction", counted)
    return entered


def test_a_claim_takes_the_fewest_round_trips_the_database_allows(monkeypatch):
    expected = _statements()
    if expected is None:
        pytest.skip(f"{connection.vendor} claims in a transaction")
    queue.register_topic("jobs")
    queue.push_many("jobs", [(f"t{i}", i) for i in range(5)])
    transactions = _claims_in_a_transaction_of_their_own(monkeypatch)
    with CaptureQueriesContext(connection) as claiming:
        tasks = queue.poll("jobs", 3)
    assert len(queue.poll("jobs", 3)) == 2
    with CaptureQueriesContext(connection) as finding_none:
        assert queue.poll("jobs", 3) == []
    assert [task.payload for task in tasks] == [0, 1, 2]
    assert len(claiming.captured_queries) == expected[0]
    assert len(finding_none.captured_queries) == expected[1]
    assert not transactions  # autocommitted: no BEGIN, no COMMIT of its own


def test_claimed_tasks_are_returned_as_the_database_holds_them(topic):
    queue.push_many("jobs", [("a", 1), ("b", 2)], priority=1)
    queue.push("jobs", "c", 3, priority=5)
    owner = queue.register_owner("n1")
    tasks = queue.poll("jobs", 3, owner=owner)
    assert [task.identifier for task in tasks] == ["c", "a", "b"]  # priority, then FIFO
    rows = Task.objects.in_bulk([task.pk for task in tasks])
    for task in tasks:
        row = rows[task.pk]
        assert (task.state, task.attempts, task.finished_at) == (TaskState.ACTIVE, 1, None)
        assert (row.state, row.attempts, row.exec_id) == (task.state, 1, task.exec_id)
        assert row.started_at == task.started_at and row.owner_id == owner.pk
        assert task.owner is owner
    assert len({task.exec_id for task in tasks}) == 1
    assert queue.complete_many(tasks, "SUCCESS")


@skip_unless_row_locks()
@pytest.mark.parametrize("limited", [False, True], ids=["no_limits", "limits_without_key"])
@pytest.mark.parametrize("condition", [None, *Condition])
def test_a_claim_skips_a_row_locked_elsewhere_and_waits_for_none(condition, limited):
    """A claim skips a row another transaction locked, and waits for no lock: not even
    when a poll condition has to read that row (an earlier task of the same identifier;
    on MariaDB a locking statement's subqueries would wait for it). So does the claim of
    a topic whose limits have no key, the same statement under the topic's lock."""
    queue.register_topic("jobs")
    if limited:
        flow.set_limits("jobs", concurrency=100)
    tasks = queue.push_many("jobs", [("a", 0), ("b", 1), ("b", 2), ("c", 3)])
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        from django.db import connection as own  # this thread's connection

        try:
            with transaction.atomic():
                Task.objects.select_for_update().get(pk=tasks[1].pk)
                held.set()
                release.wait(30)
        finally:
            own.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        with connection.cursor() as cursor:  # were a row waited on, this fails, not hangs
            if connection.vendor == "postgresql":
                cursor.execute("SET lock_timeout = '5s'")
            else:
                cursor.execute("SET SESSION innodb_lock_wait_timeout = 5")
        started = time.monotonic()
        claimed = queue.poll("jobs", 4, condition=condition)
        assert time.monotonic() - started < 5
        # Under a condition the second "b" waits for the first, locked and still pending.
        expected = [0, 2, 3] if condition is None else [0, 3]
        assert [task.payload for task in claimed] == expected
    finally:
        release.set()
        holder.join(30)
    # The next claim takes the row once free; the second "b" still waits for the first.
    assert [task.payload for task in queue.poll("jobs", 4, condition=condition)] == [1]


def test_a_two_statement_claim_whose_select_fails_gives_its_rows_back():
    if _statements() != (2, 1):
        pytest.skip("the claim is one statement, or a transaction, here")
    from django.db import OperationalError

    queue.register_topic("jobs")
    queue.push("jobs", "a")
    statements: list[str] = []

    def interrupted_read(execute, sql, params, many, context):
        statements.append(sql)
        if len(statements) == 2:  # the SELECT of the rows the UPDATE took
            raise OperationalError(1317, "Query execution was interrupted")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(interrupted_read), pytest.raises(OperationalError):
        queue.poll("jobs", 1)
    task = Task.objects.get()
    assert (task.state, task.exec_id, task.attempts) == (TaskState.PENDING, None, 0)
    assert [t.identifier for t in queue.poll("jobs", 1)] == ["a"]


def test_a_claim_reuses_its_statement_and_still_reads_the_clock_and_limits_now(monkeypatch):
    """The statement of a claim without a condition is built once per topic and order,
    whatever its limit: it holds no value of the moment, so a later claim with it still
    leaves out what is not due by the database's clock, and takes nothing once the topic
    has limits."""
    from django_tasks_coord.store import claim_statements

    queue.register_topic("jobs")
    queue.push("jobs", "now", 1)
    assert [task.identifier for task in queue.poll("jobs", 7)] == ["now"]  # built here
    built = []
    real = claim_statements._locking_sql
    monkeypatch.setattr(
        claim_statements, "_locking_sql", lambda *args: built.append(1) or real(*args)
    )
    queue.push("jobs", "later", 2, execute_at=timezone.now() + timedelta(hours=1))
    assert queue.poll("jobs", 7) == []
    assert queue.poll("jobs", 3) == []  # another limit: the same statement
    Task.objects.filter(identifier="later").update(execute_at=Now())
    assert [task.identifier for task in queue.poll("jobs", 7)] == ["later"]
    if db.claim_statement(connection) in (db.CLAIM_RETURNING, db.CLAIM_JOINED):
        assert not built  # the statement was not built again
    monkeypatch.undo()
    queue.push("jobs", "limited", 3)
    Topic.objects.filter(name="jobs").update(concurrency_limit=5)  # the cache still says none
    assert not flow.limits_of("jobs", db.alias()).limited
    assert queue.poll("jobs", 7) == []  # the statement's own guard
