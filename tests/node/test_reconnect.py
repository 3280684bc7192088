"""Going on after a lost database connection: the shared helper, and the completer's retries."""

from __future__ import annotations

import logging

import pytest
from django.db import DatabaseError, IntegrityError, OperationalError, connection, connections

from django_tasks_coord import db, queue, signals
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Task
from django_tasks_coord.node import EXIT_LOST_OWNERSHIP
from tests.node.conftest import run
from tests.servers import terminate_connections


def lost(message: str = "server closed the connection unexpectedly") -> OperationalError:
    """The error Django raises when the server ended the connection (psycopg's message)."""
    return OperationalError(message)


class MySQLError(Exception):
    """Stands for MySQLdb's OperationalError: a code and a message in ``args``."""


class MySQLOperationalError(MySQLError):
    pass


def mysql(code: int, message: str) -> OperationalError:
    error = OperationalError(code, message)
    error.__cause__ = MySQLOperationalError(code, message)
    return error


class AdminShutdown(Exception):
    """Stands for psycopg's ``OperationalError`` subclass raised by pg_terminate_backend."""

    sqlstate = "57P01"


@pytest.mark.parametrize(
    "error",
    [
        lost(),
        lost("the connection is lost"),
        lost("consuming input failed: server closed the connection unexpectedly"),
        mysql(2006, "Server has gone away"),
        mysql(2013, "Lost connection to server during query"),
        mysql(1927, "Connection was killed"),
        OperationalError("terminating connection due to administrator command"),
    ],
    ids=["closed", "lost", "consuming", "2006", "2013", "1927", "terminating"],
)
def test_connection_losses_are_recognized(error):
    assert db.connection_lost(error)


def test_a_chained_driver_error_and_an_interface_error_are_losses():
    from django.db import InterfaceError

    wrapped = OperationalError("terminating")
    cause = type("OperationalError", (AdminShutdown,), {})("terminating connection")
    wrapped.__cause__ = cause
    assert db.connection_lost(wrapped)
    assert db.connection_lost(InterfaceError("connection already closed"))


@pytest.mark.parametrize(
    "error",
    [
        mysql(1213, "Deadlock found when trying to get lock"),
        mysql(1205, "Lock wait timeout exceeded"),
        OperationalError("database is locked"),
        IntegrityError("duplicate key value violates unique constraint"),
        ValueError("the connection is lost"),  # not a database error at all
    ],
    ids=["deadlock", "lock-wait", "sqlite-locked", "integrity", "not-a-database-error"],
)
def test_failed_statements_are_not_losses(error):
    assert not db.connection_lost(error)


def test_retry_while_lost_backs_off_and_calls_again():
    failures = [lost(), lost(), lost()]
    waits: list[float] = []

    def call():
        if failures:
            raise failures.pop()
        return "written"

    result = db.retry_while_lost(call, what="test", wait=lambda s: waits.append(s) or False)
    assert result == "written"
    assert waits == [db.RECONNECT_DELAY, 2 * db.RECONNECT_DELAY, 4 * db.RECONNECT_DELAY]


def test_retry_while_lost_caps_its_back_off():
    reconnect = db.Reconnect("test")
    delays = [reconnect.failed(lost()) for _ in range(8)]
    assert max(delays) == db.RECONNECT_MAX_DELAY
    reconnect.succeeded()
    assert reconnect.failed(lost()) == db.RECONNECT_DELAY


def test_retry_while_lost_raises_other_errors_at_once_and_gives_up_when_told():
    calls = []

    def deadlock():
        calls.append(1)
        raise mysql(1213, "Deadlock found")

    with pytest.raises(OperationalError, match="Deadlock"):
        db.retry_while_lost(deadlock, what="test", wait=lambda s: False)
    assert calls == [1]

    def down():
        raise lost()

    with pytest.raises(OperationalError, match="server closed"):
        db.retry_while_lost(down, what="test", wait=lambda s: True)


def test_an_outage_is_logged_once_per_loop(caplog):
    reconnect = db.Reconnect("Claiming")
    with caplog.at_level(logging.DEBUG, logger="django_tasks_coord.db"):
        for _ in range(5):
            reconnect.failed(lost())
        reconnect.succeeded()
    levels = [(r.levelname, r.getMessage().split(":")[0]) for r in caplog.records]
    assert levels.count(("WARNING", "Claiming")) == 1
    assert levels.count(("INFO", "Claiming")) == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def loud(caplog) -> list[tuple[str, str]]:
    """The records above DEBUG: (level, the loop that logged it)."""
    return [
        (r.levelname, r.getMessage().split(":")[0])
        for r in caplog.records
        if r.levelno > logging.DEBUG
    ]


def test_an_outage_is_logged_once_per_process_however_many_loops_and_tries(caplog):
    """Every loop of a node loses its connection at once: one WARNING, one INFO in all."""
    clock = Clock()
    outage = db.Outage(clock)
    loops = [db.Backoff(name, outage=outage) for name in ("LISTEN", "Heartbeat", "Claiming")]
    with caplog.at_level(logging.DEBUG, logger="django_tasks_coord.db"):
        for _ in range(4):
            for loop in loops:
                loop.failed(lost())
            clock.now += 1
        for loop in loops:
            loop.succeeded()
        clock.now += 5
        # A loop idle through the outage finds its connection broken afterwards: it was
        # broken by the same outage, and its retry gets through.
        idle = db.Backoff("Retention", outage=outage)
        idle.failed(lost())
        idle.succeeded()
    assert loud(caplog) == [("WARNING", "LISTEN"), ("INFO", "LISTEN")]
    assert outage.count == 1 and not outage.open


def test_a_new_outage_is_logged_again(caplog):
    clock = Clock()
    outage = db.Outage(clock)
    first, second = db.Backoff("Heartbeat", outage=outage), db.Backoff("Claiming", outage=outage)
    with caplog.at_level(logging.DEBUG, logger="django_tasks_coord.db"):
        first.failed(lost())
        first.succeeded()
        clock.now += 5
        second.failed(lost())  # soon after: taken for a connection broken by the first...
        second.failed(lost())  # ...until its retry fails too: the database is down again
        second.succeeded()
        clock.now += db.STALE_WINDOW + 1
        first.failed(lost())  # long after: a new outage at once
        first.succeeded()
    assert loud(caplog) == [
        ("WARNING", "Heartbeat"),
        ("INFO", "Heartbeat"),
        ("WARNING", "Claiming"),
        ("INFO", "Claiming"),
        ("WARNING", "Heartbeat"),
        ("INFO", "Heartbeat"),
    ]
    assert outage.count == 3


def test_other_database_errors_stay_each_loops_own(caplog):
    outage = db.Outage(Clock())
    loops = [db.Backoff(name, outage=outage) for name in ("Heartbeat", "Claiming")]
    with caplog.at_level(logging.DEBUG, logger="django_tasks_coord.db"):
        for loop in loops:
            loop.failed(mysql(1213, "Deadlock found"))
            loop.failed(mysql(1213, "Deadlock found"))
            loop.succeeded()
    assert loud(caplog) == [
        ("WARNING", "Heartbeat"),
        ("INFO", "Heartbeat"),
        ("WARNING", "Claiming"),
        ("INFO", "Claiming"),
    ]
    assert outage.count == 0


# --- on a real server ---------------------------------------------------------------------


def _terminate_own_connection() -> None:
    """End this thread's connection from another connection, as a restart would."""
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            terminate_connections(cursor, other.vendor)
    finally:
        other.close()


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite has no connection to lose")
@pytest.mark.django_db(transaction=True)
def test_a_terminated_connection_is_recognized_and_reset():
    assert Task.objects.count() == 0  # connected
    _terminate_own_connection()
    with pytest.raises(DatabaseError) as first:
        Task.objects.count()
    assert db.connection_lost(first.value), repr(first.value)
    # Django does not recover by itself outside a request: the dead connection stays.
    with pytest.raises(DatabaseError) as again:
        Task.objects.count()
    assert db.connection_lost(again.value), repr(again.value)
    db.reset_connection()
    assert Task.objects.count() == 0


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite has no connection to lose")
@pytest.mark.django_db(transaction=True)
def test_retry_while_lost_gets_through_a_terminated_connection():
    Task.objects.count()
    _terminate_own_connection()
    assert db.retry_while_lost(Task.objects.count, what="test", wait=lambda s: False) == 0


# --- the completer ------------------------------------------------------------------------


class Flaky:
    """Wraps ``queue.complete_many``: its first ``times`` calls fail with a lost connection,
    before writing (``commit=False``) or after the commit went through (``commit=True``)."""

    def __init__(self, real, times: int, *, commit: bool) -> None:
        self.real, self.times, self.commit = real, times, commit
        self.calls = 0

    def __call__(self, tasks, decision):
        self.calls += 1
        if self.calls <= self.times:
            if self.commit:
                self.real(list(tasks), decision)
            raise lost()
        return self.real(tasks, decision)


@pytest.mark.parametrize("commit", [False, True], ids=["before-commit", "after-commit"])
def test_completions_that_failed_for_a_lost_connection_are_written_once(
    make_node, work_topic, monkeypatch, commit
):
    flaky = Flaky(queue.complete_many, 2, commit=commit)
    monkeypatch.setattr(queue, "complete_many", flaky)
    monkeypatch.setattr(db.reconnect, "RECONNECT_DELAY", 0.01)
    completed = []

    def on_completed(sender, task, **kwargs):
        completed.append(task.pk)

    signals.task_completed.connect(on_completed)
    try:
        queue.push_many("work", [(f"t{i}", {}) for i in range(5)])
        node = make_node(batch_size=5, workers=1)
        assert run(node) == 0
    finally:
        signals.task_completed.disconnect(on_completed)
    assert flaky.calls > 2
    assert sorted(Task.objects.values_list("state", flat=True)) == [TaskState.SUCCEEDED] * 5
    assert node.stats["processed"] == 5
    assert sorted(completed) == sorted(Task.objects.values_list("pk", flat=True))  # once each


def test_a_node_declared_dead_gives_its_completions_up(make_node, work_topic, monkeypatch):
    monkeypatch.setattr(db.reconnect, "RECONNECT_DELAY", 0.01)
    node = make_node()
    attempts = []

    def down(tasks, decision):
        attempts.append(1)
        if len(attempts) == 3:
            node.lost_ownership()  # what the lifeline does after a liveness interval
        raise lost()

    monkeypatch.setattr(queue, "complete_many", down)
    queue.push("work", "t", {})
    assert run(node) == EXIT_LOST_OWNERSHIP
    assert len(attempts) == 3  # no retry after that: the task is left to expire
    assert Task.objects.get().state == TaskState.ACTIVE


def test_a_failed_attempt_whose_retry_could_not_be_read_is_retried_not_stuck(
    make_node, work_topic, monkeypatch
):
    from django_tasks_coord.handlers import TaskType

    monkeypatch.setattr(db.reconnect, "RECONNECT_DELAY", 0.01)
    real = TaskType.retry_at
    calls = []

    def retry_at(self, task, decision, now):
        calls.append(task.pk)
        if len(calls) == 1:  # a job reads its retry policy from the database
            raise lost()
        return real(self, task, decision, now)

    monkeypatch.setattr(TaskType, "retry_at", retry_at)
    queue.push("work", "t", {"fail_times": 1})
    assert run(make_node(), timeout=30) == 0  # not stuck with a task it holds
    task = Task.objects.get()
    # Released for its retry (and, if the burst was still there when it came due, retried).
    assert (task.state, task.attempts) in {(TaskState.PENDING, 1), (TaskState.SUCCEEDED, 2)}
    assert task.owner_id is None


@pytest.mark.django_db(transaction=True)
def test_nothing_is_retried_inside_an_atomic_block():
    from django.db import transaction

    calls = []

    def down():
        calls.append(1)
        raise lost()

    with pytest.raises(OperationalError), transaction.atomic():
        db.retry_while_lost(down, what="test", wait=lambda s: False)
    assert calls == [1]  # the transaction is lost: its outermost caller retries it


@pytest.mark.parametrize(("error", "warned"), [(lost(), False), (mysql(1213, "Deadlock"), True)])
def test_a_leader_leaves_a_lost_connection_to_the_lifeline_to_report(
    monkeypatch, caplog, error, warned
):
    from django_tasks_coord import coordination
    from django_tasks_coord.node.leadership import Leadership

    def heartbeat(group, node_id):
        raise error

    monkeypatch.setattr(coordination, "heartbeat", heartbeat)
    leadership = Leadership("g", "n", liveness=30, heartbeat=1, on_change=lambda term: None)
    with (
        caplog.at_level(logging.WARNING, logger="django_tasks_coord.node.leadership"),
        pytest.raises(OperationalError),
    ):
        leadership.beat()
    assert bool(caplog.records) is warned  # one WARNING per outage, not one per beat


# --- claims -------------------------------------------------------------------------------


def _lose_the_claims_answer(monkeypatch):
    """Let the first claim commit, then raise a lost connection as if its answer never came."""
    from contextlib import contextmanager

    if db.claim_statement(connection) == db.CLAIM_LOCKED:  # a transaction: lose its COMMIT's answer
        real, commits = db.write_transaction, []

        @contextmanager
        def commit_then_lose_the_answer():
            with real():
                yield
            commits.append(1)
            if len(commits) == 1:
                raise lost()

        monkeypatch.setattr(db, "write_transaction", commit_then_lose_the_answer)
        return contextmanager(lambda: (yield))()
    statements = []

    def autocommitted_then_lost(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql.startswith(("WITH", "UPDATE (")) and not statements:  # the claim, committed
            statements.append(sql)
            raise lost()
        return result

    return connection.execute_wrapper(autocommitted_then_lost)


@pytest.mark.django_db(transaction=True)
def test_a_claim_whose_commit_lost_its_answer_is_returned_not_orphaned(monkeypatch):
    queue.register_topic("w")
    queue.push_many("w", [("a", None), ("b", None)])
    with _lose_the_claims_answer(monkeypatch):
        tasks = queue.poll("w", 2)
    assert [task.identifier for task in tasks] == ["a", "b"]
    rows = Task.objects.filter(exec_id=tasks[0].exec_id, state=TaskState.ACTIVE)
    assert rows.count() == 2 and {task.attempts for task in tasks} == {1}
    assert queue.complete_many(tasks, "SUCCESS")  # the caller holds the claim it made


@pytest.mark.django_db(transaction=True)
def test_a_claim_that_did_not_commit_still_fails():
    queue.register_topic("w")
    queue.push("w", "a")
    statements = []

    def lost_before_the_claim(execute, sql, params, many, context):
        statements.append(sql)
        if len(statements) == 1:
            raise lost()  # the claim's first statement never reached the server
        return execute(sql, params, many, context)

    with connection.execute_wrapper(lost_before_the_claim), pytest.raises(OperationalError):
        queue.poll("w", 1)
    assert len(statements) == 2  # then it looked for the claim, and found nothing
    assert Task.objects.get().state == TaskState.PENDING


class TooManyClients(Exception):
    """Stands for psycopg's error when every connection slot is taken."""

    sqlstate = "53300"


@pytest.mark.parametrize(
    "error",
    [
        OperationalError("connection failed: FATAL:  sorry, too many clients already"),
        mysql(1040, "Too many connections"),
        mysql(1203, "User root already has more than 'max_user_connections' active connections"),
    ],
    ids=["postgres", "1040", "1203"],
)
def test_a_server_out_of_connections_is_an_outage(error):
    """No connection to be had is an outage to wait through, not a failed statement: a
    worker that met it logged an ERROR with its traceback, and its task ran again after the
    liveness interval (the fault suite's ``connections`` scenario)."""
    assert db.connection_lost(error)
    coded = OperationalError("connection failed")  # only the driver's SQLSTATE says why
    coded.__cause__ = type("OperationalError", (TooManyClients,), {})("connection failed")
    assert db.connection_lost(coded)


def test_the_back_off_survives_a_long_outage():
    """``2.0 ** failures`` overflows a float after 1,024 failures: a lifeline that failed
    that often (a 30 s outage did) died of an ``OverflowError`` and stopped its node."""
    backoff = db.Backoff("test", outage=db.Outage())
    for _ in range(2000):
        delay = backoff.failed(lost())
    assert delay == db.RECONNECT_MAX_DELAY
