"""Pushes wake the nodes after their commit: once per topic and transaction, never for a rollback.

On PostgreSQL the wake-up is a ``NOTIFY`` of its own, sent after the commit of the
insert (in autocommit in the same query string, after its ``COMMIT``), never inside the
transaction that wrote the task: PostgreSQL serializes the
commits of transactions that notify, and concurrent producers would commit one at a
time. Elsewhere the nodes of this process are woken (local listeners).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, transaction

from django_tasks_coord import db, queue
from django_tasks_coord.models import Task

pytestmark = pytest.mark.django_db(transaction=True)


class Boom(Exception):
    pass


class Statements:
    """Every statement run on the connection, with whether a transaction was open then."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bool]] = []

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        self.seen.append((sql, not connection.get_autocommit()))
        return execute(sql, params, many, context)

    def wakes(self) -> list[tuple[str, bool]]:
        return [(sql, in_transaction) for sql, in_transaction in self.seen if "pg_notify" in sql]


@pytest.fixture
def statements() -> Iterator[Statements]:
    recorder = Statements()
    with connection.execute_wrapper(recorder):
        yield recorder


class Woken:
    """The wake-ups this process can see: NOTIFYs on PostgreSQL (a LISTEN connection),
    local listeners elsewhere. ``topics()`` lists the topics woken so far, in order."""

    def __init__(self) -> None:
        self.local: list[str] = []
        self.listener: Any = None

    def topics(self, expected: int = 0) -> list[str]:
        if self.listener is None:
            return list(self.local)
        # Wait for the expected notifications (if any), then collect what else arrived.
        got = []
        if expected:
            got = [n.payload for n in self.listener.notifies(timeout=10, stop_after=expected)]
        return got + [n.payload for n in self.listener.notifies(timeout=0.2)]


@pytest.fixture
def woken() -> Iterator[Woken]:
    found = Woken()
    if connection.vendor != "postgresql":
        db.add_local_listener(found.local.append)
        yield found
        db.remove_local_listener(found.local.append)
        return
    import psycopg

    with psycopg.connect(**db.listen_params("default"), autocommit=True) as listener:
        listener.execute(f"LISTEN {db.NOTIFY_CHANNEL}")
        found.listener = listener
        yield found


@pytest.fixture
def topics() -> None:
    queue.register_topic("mail")
    queue.register_topic("sms")


@pytest.mark.usefixtures("topics")
def test_a_push_in_autocommit_wakes_its_topic_once_its_insert_is_committed(statements, woken):
    queue.push("mail", "a")
    assert woken.topics(1) == ["mail"]
    if connection.vendor == "postgresql":
        # One round trip: the insert, its COMMIT, then the NOTIFY in a transaction of its own.
        assert len(statements.seen) == 1
        ((sql, in_transaction),) = statements.wakes()
        assert sql.startswith("INSERT INTO") and not in_transaction
        insert, wake = sql.split("; COMMIT; ")
        assert "pg_notify" not in insert
        assert wake.startswith("SELECT set_config('synchronous_commit', 'off', true)")
    else:
        assert len(statements.seen) == 1  # the insert; the wake-up is local


@pytest.mark.usefixtures("topics")
def test_a_transaction_wakes_each_of_its_topics_once_after_its_commit(statements, woken):
    with transaction.atomic():
        queue.push("mail", "a")
        queue.push_many("mail", [("b", 1), ("c", 2)])
        queue.push("sms", "d")
        assert woken.topics() == []
        assert statements.wakes() == []
    assert woken.topics(2) == ["mail", "sms"]
    if connection.vendor == "postgresql":
        ((sql, in_transaction),) = statements.wakes()
        assert not in_transaction
        assert sql.count("pg_notify") == 2


@pytest.mark.usefixtures("topics")
def test_a_rolled_back_transaction_wakes_nobody(statements, woken):
    with pytest.raises(Boom), transaction.atomic():
        queue.push("mail", "a")
        raise Boom
    assert woken.topics() == []
    assert statements.wakes() == []
    assert not Task.objects.exists()


@pytest.mark.usefixtures("topics")
def test_a_push_after_a_rolled_back_savepoint_still_wakes(woken):
    with transaction.atomic():
        with pytest.raises(Boom), transaction.atomic():
            queue.push("mail", "a")  # its wake-up is registered in the savepoint...
            raise Boom  # ...and discarded with it
        queue.push("mail", "b")
    assert woken.topics(1) == ["mail"]
    assert list(Task.objects.values_list("identifier", flat=True)) == ["b"]


@pytest.mark.usefixtures("topics")
def test_a_wake_up_registered_before_a_savepoint_survives_its_rollback(woken):
    with transaction.atomic():
        queue.push("mail", "a")
        with pytest.raises(Boom), transaction.atomic():
            queue.push("sms", "b")
            raise Boom
    assert woken.topics(1) in (["mail"], ["mail", "sms"])  # sms: spurious, harmless


@pytest.mark.skipif(connection.vendor != "postgresql", reason="NOTIFY is PostgreSQL's")
@pytest.mark.usefixtures("topics")
def test_the_wake_up_commits_without_waiting_for_the_disk_and_cannot_fail_on_a_full_queue():
    sql, params = db.notifications.wake_statement(["mail", "sms", "mail"])
    assert "set_config('synchronous_commit', 'off', true)" in sql
    assert "pg_notification_queue_usage()" in sql
    assert params == [db.NOTIFY_CHANNEL, "mail", db.NOTIFY_CHANNEL, "sms"]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        cursor.execute("SHOW synchronous_commit")  # local to the wake-up's transaction
        assert cursor.fetchone()[0] == "on"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="NOTIFY is PostgreSQL's")
@pytest.mark.usefixtures("topics")
def test_an_autocommitted_push_and_its_wake_up_are_two_transactions_in_one_query(woken):
    queue.push("mail", "a")
    assert woken.topics(1) == ["mail"]
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")  # the wake-up's setting stayed local
        assert cursor.fetchone()[0] == "on"
    assert connection.get_autocommit()
    assert Task.objects.filter(identifier="a").exists()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="NOTIFY is PostgreSQL's")
@pytest.mark.usefixtures("topics")
def test_with_server_side_binding_the_wake_up_is_a_statement_of_its_own(
    statements, woken, monkeypatch
):
    options = {**connection.settings_dict.get("OPTIONS", {}), "server_side_binding": True}
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", options)
    assert not db.wakes_with_statement(connection)
    queue.push("mail", "a")
    assert woken.topics(1) == ["mail"]
    assert len(statements.seen) == 2  # a prepared statement holds one statement
    assert statements.wakes() == [(statements.seen[1][0], False)]
