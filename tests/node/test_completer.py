"""The batched writer: per-row values in one statement, fenced by each row's claim."""

from __future__ import annotations

import pytest
from django.db import OperationalError

from django_tasks_coord import db, queue
from django_tasks_coord.backends.writer import Writer
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Task

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def claimed():
    queue.register_topic("w")
    queue.push_many("w", [(f"t{i}", None) for i in range(3)])
    return queue.poll("w", 3)


@pytest.fixture
def writer():
    instance = Writer()
    yield instance
    instance.stop()


def outcome(value):
    return {"state": TaskState.SUCCEEDED, "result": value, "attempt_log": [{"v": value}]}


def test_outcomes_of_several_rows_keep_their_own_values(claimed, writer):
    writes = [writer.submit(task, outcome({"n": i})) for i, task in enumerate(claimed)]
    assert [write.wait() for write in writes] == [True, True, True]
    rows = {row.pk: row for row in Task.objects.all()}
    for i, task in enumerate(claimed):
        row = rows[task.pk]
        assert (row.state, row.result, row.attempt_log) == (
            TaskState.SUCCEEDED,
            {"n": i},
            [{"v": {"n": i}}],
        )
        assert row.finished_at == writes[i].changes["finished_at"] is not None


def test_a_lost_claim_is_not_written(claimed, writer):
    lost = claimed[0]
    queue.release(lost)  # back to PENDING: the claim the write quotes is gone
    writes = [writer.submit(task, outcome(task.pk)) for task in claimed]
    assert [write.wait() for write in writes] == [False, True, True]
    assert Task.objects.get(pk=lost.pk).state == TaskState.PENDING
    assert Task.objects.get(pk=lost.pk).result is None


def test_a_delayed_start_is_superseded_by_the_outcome(claimed, writer):
    task = claimed[0]
    start = writer.submit(task, {"attempt_log": [{"started": True}]}, delay=3600)
    done = writer.submit(task, outcome("done"))
    assert done.wait() is True
    assert start.wait() is True  # its content went in with the outcome
    assert Task.objects.get(pk=task.pk).attempt_log == [{"v": "done"}]


def test_a_delayed_start_is_written_when_nothing_supersedes_it(claimed, writer):
    task = claimed[0]
    assert writer.submit(task, {"attempt_log": [{"started": True}]}, delay=0.01).wait() is True
    stored = Task.objects.get(pk=task.pk)
    assert (stored.state, stored.attempt_log) == (TaskState.ACTIVE, [{"started": True}])


def test_stop_writes_delayed_starts_and_a_later_submit_starts_again(claimed, writer):
    first, second = claimed[0], claimed[1]
    start = writer.submit(first, {"attempt_log": [{"started": 1}]}, delay=3600)
    writer.stop()
    assert start.wait() is True
    assert Task.objects.get(pk=first.pk).attempt_log == [{"started": 1}]
    assert writer.submit(second, outcome(2)).wait() is True


class LosesConnection:
    """Replaces ``Writer._update``: its first call fails with a lost connection, before
    writing or, with ``commit``, after its statement went through (only the answer lost)."""

    def __init__(self, real, *, commit: bool) -> None:
        self.real, self.commit, self.calls = real, commit, 0

    def __call__(self, writer, fields, items):
        self.calls += 1
        if self.calls == 1:
            if self.commit:
                self.real(writer, fields, items)
            raise OperationalError("server closed the connection unexpectedly")
        return self.real(writer, fields, items)


@pytest.mark.parametrize("commit", [False, True], ids=["before-commit", "after-commit"])
def test_outcomes_whose_connection_broke_are_written_again_once(
    claimed, writer, monkeypatch, commit
):
    update = LosesConnection(Writer._update, commit=commit)
    monkeypatch.setattr(Writer, "_update", lambda *args: update(*args))
    monkeypatch.setattr(db, "RECONNECT_DELAY", 0.01)
    writes = [writer.submit(task, outcome(i)) for i, task in enumerate(claimed)]
    assert [write.wait() for write in writes] == [True, True, True]  # not None: "failed"
    assert update.calls == 2
    rows = Task.objects.order_by("pk")
    assert [row.state for row in rows] == [TaskState.SUCCEEDED] * 3
    assert [row.finished_at for row in rows] == [write.changes["finished_at"] for write in writes]
