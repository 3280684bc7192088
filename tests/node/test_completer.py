"""The node's one writer: per-row values in one statement, fenced by each row's claim.

Outcomes that carry values of their own are written per row in one ``UPDATE``
(:func:`~django_tasks_coord.store.completion.write_changes`); the completer writes the
start of an attempt that logs every attempt only if no later write of it came first.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from django.db import OperationalError

from django_tasks_coord import attempts, db, queue, store
from django_tasks_coord.enums import Decision, Result, TaskState
from django_tasks_coord.handlers import TaskType
from django_tasks_coord.models import Task
from django_tasks_coord.node import completer as completer_module
from django_tasks_coord.node.completer import Completer
from django_tasks_coord.store import completion

pytestmark = pytest.mark.django_db(transaction=True)


class EveryAttempt(TaskType):
    """A task type that logs every attempt, as ``@task`` does."""

    logs_every_attempt = True


EVERY = EveryAttempt(name="w", func=lambda task: None)


class StubNode:
    """What the completer asks of its node."""

    node_id = "n"

    def __init__(self) -> None:
        self.stats: Counter[str] = Counter()
        self.left = 0
        self.in_flight = 0

    def done(self, n: int) -> None:
        self.left += n

    def wait_unless_forced(self, seconds: float) -> bool:
        time.sleep(seconds)
        return False

    def forget_topic(self, topic: str) -> None:
        pass


@pytest.fixture
def claimed():
    queue.register_topic("w")
    queue.push_many("w", [(f"t{i}", None) for i in range(3)])
    return queue.poll("w", 3)


@pytest.fixture
def writer():
    instance = Completer(StubNode(), threading.Event())  # type: ignore[arg-type]
    instance.start()
    yield instance
    instance.flush_and_stop()


def outcome(value):
    return {"state": TaskState.SUCCEEDED, "result": value, "attempt_log": [{"v": value}]}


def succeeded(task, value):
    """The decision of an attempt of ``task`` that returned ``value``."""
    entry = attempts.begin(task, "n").end("succeeded")
    return Decision(Result.SUCCESS, value=value, attempt=entry)


def test_outcomes_of_several_rows_keep_their_own_values(claimed):
    writes = [store.Change(task, outcome({"n": i})) for i, task in enumerate(claimed)]
    store.write_changes(writes)
    assert [write.ok for write in writes] == [True, True, True]
    rows = {row.pk: row for row in Task.objects.all()}
    for i, task in enumerate(claimed):
        row = rows[task.pk]
        assert (row.state, row.result, row.attempt_log) == (
            TaskState.SUCCEEDED,
            {"n": i},
            [{"v": {"n": i}}],
        )
        assert row.finished_at == writes[i].fields["finished_at"] is not None


def test_per_row_values_of_every_kind_are_kept_without_a_case_per_row_on_postgresql(claimed):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    values = [None, 'it\'s "quoted" \\', [1, None, {"a": "b"}]]
    writes = [
        store.Change(task, {**outcome(value), "message": f"m{i}" if i else None})
        for i, (task, value) in enumerate(zip(claimed, values, strict=True))
    ]
    with CaptureQueriesContext(connection) as statements:
        store.write_changes(writes)
    assert [write.ok for write in writes] == [True, True, True]
    rows = {row.pk: row for row in Task.objects.all()}
    for i, (task, value) in enumerate(zip(claimed, values, strict=True)):
        row = rows[task.pk]
        assert (row.result, row.attempt_log, row.message) == (
            value,
            [{"v": value}],
            f"m{i}" if i else None,
        )
    if connection.vendor == "postgresql":  # one parameter per column, not one per row
        (update,) = statements.captured_queries
        assert update["sql"].count("WHEN") == 0


def test_a_completion_statement_is_the_same_text_however_many_rows_on_postgresql(claimed):
    """psycopg parses a statement's placeholders once per distinct text: the completer's
    ``UPDATE`` of one row and of many must be one text (keys and values as arrays)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("arrays of keys and values are PostgreSQL's")
    sent: list[str] = []

    def record(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        store.write_changes([store.Change(claimed[0], outcome(1))])
        store.write_changes([store.Change(task, outcome(2)) for task in claimed[1:]])
    assert len(sent) == 2 and sent[0] == sent[1], sent
    assert [row.result for row in Task.objects.order_by("sequence")] == [1, 2, 2]


def test_a_lost_claim_is_not_written(claimed):
    lost = claimed[0]
    queue.release(lost)  # back to PENDING: the claim the write quotes is gone
    writes = [store.Change(task, outcome(task.pk)) for task in claimed]
    store.write_changes(writes)
    assert [write.ok for write in writes] == [False, True, True]
    assert Task.objects.get(pk=lost.pk).state == TaskState.PENDING
    assert Task.objects.get(pk=lost.pk).result is None


def test_a_delayed_start_is_superseded_by_the_outcome(claimed, writer, monkeypatch):
    monkeypatch.setattr(completer_module, "START_DELAY", 3600)
    task = claimed[0]
    (start,) = writer.starting(EVERY, [task])
    decision = succeeded(task, "done")
    writer.put(EVERY, task, decision)
    assert start.wait() is True  # its content went in with the outcome
    stored = Task.objects.get(pk=task.pk)
    assert (stored.state, stored.result) == (TaskState.SUCCEEDED, "done")
    assert stored.attempt_log == [decision.attempt.to_json()]


def test_a_delayed_start_is_written_when_nothing_supersedes_it(claimed, writer, monkeypatch):
    monkeypatch.setattr(completer_module, "START_DELAY", 0.01)
    task = claimed[0]
    (start,) = writer.starting(EVERY, [task])  # the completer sleeps: this wakes it
    assert start.done.wait(10), "the completer slept on"
    assert start.change.ok is True
    stored = Task.objects.get(pk=task.pk)
    assert (stored.state, stored.attempt_log) == (
        TaskState.ACTIVE,
        start.change.fields["attempt_log"],
    )
    assert [entry["worker_id"] for entry in stored.attempt_log] == ["n"]


def test_stop_writes_delayed_starts_and_a_later_write_is_made_by_its_worker(
    claimed, writer, monkeypatch
):
    monkeypatch.setattr(completer_module, "START_DELAY", 3600)
    first, second = claimed[0], claimed[1]
    (start,) = writer.starting(EVERY, [first])
    writer.flush_and_stop()
    assert start.wait() is True
    assert Task.objects.get(pk=first.pk).attempt_log == start.change.fields["attempt_log"]
    failure = Decision(Result.FAILURE, attempt=attempts.begin(second, "n").end("failed"))
    assert writer.attempt_ended(EVERY, second, failure).attempt is None  # written, not carried
    assert Task.objects.get(pk=second.pk).attempt_log == [failure.attempt.to_json()]


class LosesConnection:
    """Replaces ``completion._update``: its first call fails with a lost connection, before
    writing or, with ``commit``, after its statement went through (only the answer lost)."""

    def __init__(self, real, *, commit: bool) -> None:
        self.real, self.commit, self.calls = real, commit, 0

    def __call__(self, fields, items):
        self.calls += 1
        if self.calls == 1:
            if self.commit:
                self.real(fields, items)
            raise OperationalError("server closed the connection unexpectedly")
        return self.real(fields, items)


@pytest.mark.parametrize("commit", [False, True], ids=["before-commit", "after-commit"])
def test_outcomes_whose_connection_broke_are_written_again_once(
    claimed, writer, monkeypatch, commit
):
    update = LosesConnection(completion._update, commit=commit)
    monkeypatch.setattr(completion, "_update", update)
    monkeypatch.setattr(db.reconnect, "RECONNECT_DELAY", 0.01)
    for i, task in enumerate(claimed):
        writer.put(EVERY, task, succeeded(task, i))
    writer.flush_and_stop()
    assert writer.node.stats["processed"] == 3  # written, not "failed", and counted once
    assert update.calls == 2
    rows = Task.objects.order_by("pk")
    assert [row.state for row in rows] == [TaskState.SUCCEEDED] * 3
    assert [row.finished_at for row in rows] == [task.finished_at for task in claimed]
    assert [row.result for row in rows] == [0, 1, 2]


def test_two_runs_of_one_task_in_a_batch_complete_it_once(claimed, writer, monkeypatch):
    """A run whose claim was lost (its node was declared dead, then claimed the task again)
    finishes in the same batch as the run of the new claim: only the latter is written and
    followed up (``on_outcome``, the signals): the task is not announced twice."""
    monkeypatch.setattr(completer_module, "START_DELAY", 3600)
    old = claimed[0]
    lost_claim = old.exec_id
    queue.release(old)  # its claim is lost...
    old.exec_id = lost_claim  # (the run still quotes it)
    (new,) = [t for t in queue.poll("w", 3) if t.pk == old.pk]  # ...and the task claimed again
    followed: list[tuple[int, object]] = []
    monkeypatch.setattr(
        writer._follow_ups,
        "completed",
        lambda items: followed.extend((task.pk, task.exec_id) for _, task, _ in items),
    )
    batch = [(EVERY, old, succeeded(old, "stale")), (EVERY, new, succeeded(new, "fresh"))]
    writer._write(batch)
    assert followed == [(new.pk, new.exec_id)]
    stored = Task.objects.get(pk=new.pk)
    assert (stored.state, stored.result) == (TaskState.SUCCEEDED, "fresh")
    # And the other way round: the stale run handed over last is still not written.
    queue.push("w", "again")
    (fresh,) = queue.poll("w", 1)
    stale = Task.objects.get(pk=fresh.pk)
    stale.exec_id = old.exec_id
    followed.clear()
    writer._write(
        [(EVERY, fresh, succeeded(fresh, "fresh")), (EVERY, stale, succeeded(stale, "x"))]
    )
    assert followed == [(fresh.pk, fresh.exec_id)]


def test_a_stale_and_a_current_change_of_one_row_are_each_fenced_by_their_claim(claimed):
    old = claimed[0]
    lost_claim = old.exec_id
    queue.release(old)
    old.exec_id = lost_claim
    (new,) = [t for t in queue.poll("w", 3) if t.pk == old.pk]
    writes = [store.Change(old, outcome("stale")), store.Change(new, outcome("fresh"))]
    store.write_changes(writes)
    assert [write.ok for write in writes] == [False, True]
    assert Task.objects.get(pk=new.pk).result == "fresh"


# --- batching: waiting briefly for the outcomes of tasks still under way -----------------


def finished_item() -> tuple[None, object, object]:
    """An outcome as a worker hands it over (``_receive`` only passes it on)."""
    return (None, object(), object())


@pytest.fixture
def lingering(monkeypatch):
    """A completer not started (``_receive`` called directly), whose linger is long: a wait
    that should not happen would make the test take 60 s."""
    monkeypatch.setattr(completer_module, "LINGER", 60.0)
    return Completer(StubNode(), threading.Event())  # type: ignore[arg-type]


def test_a_batch_waits_for_the_outcomes_of_tasks_still_under_way(lingering):
    lingering.node.in_flight = 3
    first, second, third = finished_item(), finished_item(), finished_item()
    lingering._items.put(first)
    late = threading.Timer(0.05, lambda: [lingering._items.put(i) for i in (second, third)])
    late.start()
    started = time.monotonic()
    assert lingering._receive() == [first, second, third]  # one write for the three
    assert time.monotonic() - started < 30  # and no longer: none were left under way
    late.join()


def test_a_lone_outcome_is_written_at_once(lingering):
    lingering.node.in_flight = 1
    only = finished_item()
    lingering._items.put(only)
    started = time.monotonic()
    assert lingering._receive() == [only]
    assert time.monotonic() - started < 30


def test_a_stop_or_a_full_batch_ends_the_wait(lingering, monkeypatch):
    lingering.node.in_flight = 10
    first = finished_item()
    for item in (first, None):
        lingering._items.put(item)
    started = time.monotonic()
    assert lingering._receive() == [first, None]
    monkeypatch.setattr(completer_module, "MAX_BATCH", 2)
    full = [finished_item(), finished_item()]
    for item in full:
        lingering._items.put(item)
    assert lingering._receive() == full
    assert time.monotonic() - started < 30


# --- delayed starts: added by many workers at once, without a lock ----------------------


def test_starts_added_by_concurrent_workers_are_each_replaced_by_their_outcome(writer, monkeypatch):
    """Workers add starts while the completer takes outcomes: each start must be in the
    completer's hands before the outcome that follows it, so the outcome carries it and it
    is never written on its own (as a start of a finished task, refused by its claim)."""
    monkeypatch.setattr(completer_module, "START_DELAY", 3600)
    monkeypatch.setattr(completer_module, "LINGER", 0)  # a write per few outcomes: many rounds
    queue.register_topic("w")
    queue.push_many("w", [(f"t{i}", None) for i in range(200)])
    tasks = queue.poll("w", 200)
    starts: list = []

    def work(mine: list) -> None:
        for task in mine:
            starts.extend(writer.starting(EVERY, [task]))
            writer.put(EVERY, task, succeeded(task, task.pk))

    workers = [threading.Thread(target=work, args=(tasks[i::5],)) for i in range(5)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    writer.flush_and_stop()
    assert len(starts) == 200
    assert all(start.done.is_set() and start.change.ok is True for start in starts)
    rows = Task.objects.filter(pk__in=[task.pk for task in tasks])
    assert {row.state for row in rows} == {TaskState.SUCCEEDED}
    assert all([entry["outcome"] for entry in row.attempt_log] == ["succeeded"] for row in rows)
    assert writer.node.stats["processed"] == 200
