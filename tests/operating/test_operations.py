"""``manage.py tasks_coord`` and :mod:`django_tasks_coord.operations`, on every database."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import threading
import uuid
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_tasks_coord import coordination, db, operations, queue, scheduling
from django_tasks_coord.enums import TaskState
from django_tasks_coord.exceptions import InvalidArgumentError
from django_tasks_coord.models import PeriodicTask, Task, Topic
from django_tasks_coord.operations import Action, Batch, TaskFilter
from tests.conftest import skip_unless_row_locks
from tests.factories import OwnerFactory
from tests.processes import ROOT, subprocess_env

pytestmark = pytest.mark.django_db

RECORD = "tests.testapp.job_functions.record"


def run(*args: str) -> str:
    out = StringIO()
    call_command("tasks_coord", *args, stdout=out)
    return out.getvalue()


def run_json(*args: str) -> Any:
    return json.loads(run(*args, "--json"))


def make(topic: str, state: TaskState, n: int = 1, **fields: Any) -> list[Task]:
    queue.register_topic(topic)
    rows = [
        Task(topic_id=topic, identifier=f"{topic}-{i}", state=state, payload={"i": i}, **fields)
        for i in range(n)
    ]
    return Task.objects.insert(rows)


def states(topic: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for state in Task.objects.for_topic(topic).values_list("state", flat=True):
        name = TaskState(state).name.lower()
        counts[name] = counts.get(name, 0) + 1
    return counts


# --- parsing ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("300", 300), ("90s", 90), ("15m", 900), ("1h30m", 5400), ("2d", 172800), ("1W", 604800)],
)
def test_ages_parse(text, seconds):
    assert operations.parse_age(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "-5", "5x", "h", "1h 30m", "1.5.2h"])
def test_bad_ages_are_refused(text):
    with pytest.raises(InvalidArgumentError, match="is not an age"):
        operations.parse_age(text)


def test_states_parse_by_name_and_a_bad_one_lists_them():
    assert operations.parse_state("Failed") is TaskState.FAILED
    with pytest.raises(InvalidArgumentError, match="the states are: pending, requested"):
        operations.parse_state("broken")


# --- list and show ----------------------------------------------------------------------------


def test_list_filters_by_topic_state_identifier_and_age():
    old = make("mail", TaskState.FAILED, 2)
    make("mail", TaskState.SUCCEEDED, 1)
    make("sms", TaskState.FAILED, 1)
    Task.objects.filter(pk=old[0].pk).update(created_at=timezone.now() - timedelta(hours=3))

    rows = run_json("list", "--topic", "mail", "--state", "failed")["tasks"]
    assert [r["sequence"] for r in rows] == [old[1].sequence, old[0].sequence]  # newest first
    assert {r["state"] for r in rows} == {"failed"}
    assert run_json("list", "--identifier", "sms-0")["tasks"][0]["topic"] == "sms"
    aged = run_json("list", "--older-than", "2h")["tasks"]
    assert [r["sequence"] for r in aged] == [old[0].sequence]
    fresh = run_json("list", "--topic", "mail", "--newer-than", "1h")["tasks"]
    assert old[0].sequence not in [r["sequence"] for r in fresh] and len(fresh) == 2


def test_list_pages_with_before_and_writes_a_table():
    made = make("mail", TaskState.PENDING, 5)
    page = run_json("list", "--limit", "2")
    assert [r["sequence"] for r in page["tasks"]] == [made[4].sequence, made[3].sequence]
    assert page["next_before"] == made[3].sequence
    rest = run_json("list", "--limit", "5", "--before", str(page["next_before"]))
    assert [r["sequence"] for r in rest["tasks"]] == [t.sequence for t in reversed(made[:3])]
    assert rest["next_before"] is None

    text = run("list", "--limit", "2")
    header, first, _second, more = text.splitlines()
    assert header.split()[:4] == ["SEQUENCE", "TOPIC", "IDENTIFIER", "STATE"]
    assert first.split()[:4] == [str(made[4].sequence), "mail", "mail-4", "pending"]
    assert more == f"More: --before {made[3].sequence}"
    assert run("list", "--topic", "mail", "--state", "failed") == "No tasks match.\n"


def test_list_keys_are_stable():
    make("mail", TaskState.PENDING)
    (row,) = run_json("list")["tasks"]
    assert list(row) == [
        "sequence",
        "topic",
        "identifier",
        "state",
        "attempts",
        "priority",
        "label",
        "owner",
        "created_at",
        "execute_at",
        "started_at",
        "finished_at",
        "recreated",
        "original",
    ]


def test_show_gives_payload_attempts_and_errors():
    (task,) = make(
        "mail",
        TaskState.FAILED,
        attempts=3,
        error="Traceback (most recent call last):\nValueError: boom",
        attempt_log=[{"attempt": 1, "outcome": "failure"}],
    )
    data = run_json("show", str(task.sequence))
    assert data["payload"] == {"i": 0}
    assert (data["attempts"], data["state"]) == (3, "failed")
    assert data["error"].endswith("ValueError: boom")
    assert data["attempt_log"] == [{"attempt": 1, "outcome": "failure"}]

    text = run("show", str(task.sequence))
    assert f"sequence: {task.sequence}\n" in text
    assert "attempts: 3\n" in text
    assert 'payload:\n  {\n    "i": 0\n  }\n' in text
    assert "error:\n  Traceback (most recent call last):\n  ValueError: boom\n" in text


def test_show_an_unknown_task_is_a_command_error():
    with pytest.raises(CommandError, match=r"No task has the sequence 999999\."):
        run("show", "999999")


# --- bulk actions -----------------------------------------------------------------------------


def test_dry_run_reports_exactly_what_would_change_and_changes_nothing():
    failed = make("mail", TaskState.FAILED, 3)
    make("mail", TaskState.SUCCEEDED, 2)
    make("sms", TaskState.FAILED, 1)
    before = list(Task.objects.order_by("sequence").values_list("sequence", "state", "attempts"))

    report = run_json("retry", "--topic", "mail", "--dry-run")

    assert list(Task.objects.order_by("sequence").values_list("sequence", "state", "attempts")) == (
        before
    )
    assert report == {
        "action": "retry",
        "dry_run": True,
        "filter": "topic=mail",
        "matched": 3,
        "changed": 0,
        "skipped": 0,
        "batches": 1,
        "batch_size": 1000,
        "first_sequence": failed[0].sequence,
        "last_sequence": failed[2].sequence,
        "by_topic": {"mail": 3},
        "created": [],
    }
    done = run_json("retry", "--topic", "mail")
    assert (done["matched"], done["changed"], done["dry_run"]) == (3, 3, False)
    assert states("mail") == {"pending": 3, "succeeded": 2}
    assert states("sms") == {"failed": 1}


@pytest.mark.parametrize("action", ["reset", "recreate", "cancel"])
def test_every_bulk_action_has_a_dry_run_that_changes_nothing(action):
    make("mail", TaskState.FAILED, 2)
    make("mail", TaskState.PENDING, 1)
    before = list(Task.objects.order_by("sequence").values_list("sequence", "state"))
    report = run_json(action, "--topic", "mail", "--dry-run")
    assert report["matched"] == (1 if action == "cancel" else 2)
    assert list(Task.objects.order_by("sequence").values_list("sequence", "state")) == before
    text = run(action, "--topic", "mail", "--dry-run")
    assert text.startswith(f"Dry run: would {action} {report['matched']} task(s) matching ")
    assert text.endswith("Nothing changed.\n")


def test_retry_text_output_counts_and_batches():
    make("mail", TaskState.FAILED, 5)
    text = run("retry", "--topic", "mail", "--batch-size", "2")
    assert text.startswith("Retried 5 of 5 task(s) matching topic=mail (mail: 5; sequences ")
    assert text.endswith(", in 3 batch(es) of up to 2.\n")
    assert states("mail") == {"pending": 5}
    (task,) = Task.objects.filter(identifier="mail-0")
    assert (task.attempts, task.error, task.finished_at) == (0, None, None)


def test_reset_takes_any_completed_state_and_a_state_filter_narrows_it():
    make("mail", TaskState.SUCCEEDED, 2)
    make("mail", TaskState.SUSPENDED, 1)
    make("mail", TaskState.PENDING, 1)
    done = run_json("reset", "--topic", "mail", "--state", "suspended")
    assert done["changed"] == 1
    assert states("mail") == {"succeeded": 2, "pending": 2}
    assert run_json("reset", "--topic", "mail")["changed"] == 2
    assert states("mail") == {"pending": 4}


def test_recreate_copies_completed_tasks_and_keeps_the_originals():
    originals = make("mail", TaskState.FAILED, 3)
    done = run_json("recreate", "--topic", "mail", "--batch-size", "2")
    assert (done["changed"], done["batches"], len(done["created"])) == (3, 2, 3)
    copies = Task.objects.filter(pk__in=done["created"]).order_by("sequence")
    assert [(c.original_id, c.recreated, c.state, c.payload) for c in copies] == [
        (o.pk, True, TaskState.PENDING, o.payload) for o in originals
    ]
    assert states("mail") == {"failed": 3, "pending": 3}


def test_cancel_takes_unfinished_tasks_with_a_message():
    make("mail", TaskState.PENDING, 2)
    make("mail", TaskState.SUCCEEDED, 1)
    text = run("cancel", "--topic", "mail", "--message", "bad batch")
    assert text.startswith("Canceled 2 of 2 task(s) matching topic=mail")
    assert states("mail") == {"canceled": 2, "succeeded": 1}
    assert set(Task.objects.filter(state=TaskState.CANCELED).values_list("message", flat=True)) == {
        "bad batch"
    }


@pytest.mark.parametrize("action", [Action.RETRY, Action.RECREATE])
def test_revived_tasks_wake_the_nodes_of_their_topics(
    monkeypatch, action, django_capture_on_commit_callbacks
):
    make("mail", TaskState.FAILED, 2)
    make("sms", TaskState.FAILED, 1)
    told: list[str] = []
    monkeypatch.setattr(db.notifications, "wake", lambda conn, topics: told.extend(sorted(topics)))
    with django_capture_on_commit_callbacks(execute=True):  # the wake-ups follow the commit
        operations.bulk(action, TaskFilter(states=(TaskState.FAILED,)), batch_size=2)
    assert sorted(told) == ["mail", "sms"]  # each topic woken, once


def test_limit_stops_after_that_many():
    made = make("mail", TaskState.FAILED, 5)
    done = run_json("retry", "--topic", "mail", "--limit", "3", "--batch-size", "2")
    assert (done["matched"], done["batches"], done["last_sequence"]) == (3, 2, made[2].sequence)
    assert states("mail") == {"pending": 3, "failed": 2}


def test_bulk_actions_log_who_what_and_how_many(caplog):
    make("mail", TaskState.FAILED, 2)
    with caplog.at_level(logging.INFO, logger="django_tasks_coord.operations"):
        run("retry", "--topic", "mail", "--dry-run")
        run("retry", "--topic", "mail")
    dry, done = (r.getMessage() for r in caplog.records)
    record = caplog.records[1]
    assert record.actor.startswith("cli:")  # structured fields, for JSON log formatters
    assert (record.action, record.matched, record.changed, record.skipped) == ("retry", 2, 2, 0)
    assert dry.startswith("Dry run of retry by cli:")
    assert dry.endswith(": would change 2 task(s) (topic=mail).")
    assert done.startswith("Retry by cli:")
    assert done.endswith(": changed 2 of 2 task(s) in 1 batch(es) of up to 1000 (topic=mail).")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["retry"], "retry needs a filter (--topic, "),
        (["retry", "--topic", "nope"], "Topic 'nope' is not registered."),
        (["retry", "--state", "pending"], "retry applies to tasks that are failed; not to pending"),
        (["cancel", "--state", "failed"], "cancel applies to tasks that are pending, requested"),
        (["list", "--state", "broken"], "'broken' is not a task state"),
        (["list", "--older-than", "5x"], "'5x' is not an age"),
        (["retry", "--all", "--batch-size", "0"], "'0' must be between 1 and 10000"),
        (["show", "abc"], "'abc' is not a task sequence"),
        (["pause-topic", "nope"], "Topic 'nope' is not registered."),
        (["pause-job", "nope"], "No job has the id 'nope'."),
        (["pause-job"], "Name one or more job ids, or pass --all (not both)."),
        (["run-job", "nope"], "No job has the id 'nope'."),
    ],
)
def test_bad_input_is_a_command_error(args, message):
    queue.register_topic("mail")
    with pytest.raises(CommandError, match=re.escape(message)):
        run(*args)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["retry", "--topic", "nope"], 1, "CommandError: Topic 'nope' is not registered."),
        (["list", "--older-than", "5x"], 2, "argument --older-than: '5x' is not an age"),
    ],
)
def test_bad_input_from_the_command_line_prints_one_line_no_traceback(args, code, message):
    proc = subprocess.run(
        [sys.executable, "manage.py", "tasks_coord", *args],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == code, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_retry_of_ten_thousand_failed_tasks_runs_in_batches():
    queue.register_topic("mail")
    Task.objects.bulk_create(
        Task(topic_id="mail", identifier=f"i{i % 100}", state=TaskState.FAILED, attempts=3)
        for i in range(10_000)
    )
    batches: list[Batch] = []
    with CaptureQueriesContext(connection) as queries:
        result = operations.bulk(
            Action.RETRY, TaskFilter(topic="mail"), actor="test", on_batch=batches.append
        )
    assert (result.matched, result.changed, result.batches) == (10_000, 10_000, 10)
    statements = [q["sql"] for q in queries.captured_queries]
    # One transaction per batch (a savepoint inside the test's transaction), one UPDATE in each.
    updates = [
        s for s in statements if s.startswith("UPDATE") and "coord_task" in s.split(" SET ")[0]
    ]
    assert len(updates) == 10
    assert len([s for s in statements if s.startswith("SAVEPOINT")]) == 10
    assert [(b.number, b.matched, b.changed) for b in batches] == [
        (n, 1000, 1000) for n in range(1, 11)
    ]
    assert states("mail") == {"pending": 10_000}


@pytest.mark.django_db(transaction=True)
def test_each_batch_is_committed_on_its_own():
    """Every batch is its own transaction: committed (visible) before the next one starts."""
    queue.register_topic("mail")
    Task.objects.bulk_create(
        Task(topic_id="mail", identifier=f"i{i}", state=TaskState.FAILED) for i in range(2500)
    )
    seen: list[tuple[bool, int]] = []

    def committed(batch: Batch) -> None:
        seen.append((connection.in_atomic_block, Task.objects.pending().count()))

    result = operations.bulk(
        Action.RETRY, TaskFilter(topic="mail"), batch_size=1000, on_batch=committed
    )
    assert result.batches == 3
    assert seen == [(False, 1000), (False, 2000), (False, 2500)]


@skip_unless_row_locks()
@pytest.mark.django_db(transaction=True)
def test_a_row_a_node_holds_is_skipped_not_waited_for():
    failed = make("mail", TaskState.FAILED, 3)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                Task.objects.select_for_update().filter(pk=failed[1].pk).get()
                held.set()
                release.wait(60)
        finally:
            connections.close_all()

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert held.wait(60)
        result = operations.bulk(Action.RETRY, TaskFilter(topic="mail"))
    finally:
        release.set()
        thread.join(60)
    assert (result.matched, result.changed, result.skipped) == (3, 2, 1)
    assert Task.objects.get(pk=failed[1].pk).state == TaskState.FAILED
    again = operations.bulk(Action.RETRY, TaskFilter(topic="mail"))
    assert (again.matched, again.changed) == (1, 1)


def test_service_refuses_bad_arguments():
    with pytest.raises(InvalidArgumentError, match="'explode' is not an action"):
        operations.bulk("explode", TaskFilter())
    with pytest.raises(InvalidArgumentError, match="message is for cancel only"):
        operations.bulk(Action.RETRY, TaskFilter(), message="x")


# --- topics, jobs, nodes, leaders --------------------------------------------------------------


def test_topics_pause_and_resume(caplog):
    queue.register_topic("mail")
    assert run_json("topics") == {
        "topics": [{"name": "mail", "paused": False, "consecutive_failures": 0}]
    }
    with caplog.at_level(logging.INFO, logger="django_tasks_coord.operations"):
        assert run("pause-topic", "mail") == "Paused topic mail.\n"
    assert "Paused topic(s) mail by cli:" in caplog.text
    assert Topic.objects.get(name="mail").paused
    assert run_json("pause-topic", "mail") == {"paused": True, "changed": {"mail": False}}
    assert "mail  yes" in run("topics")
    assert run("resume-topic", "mail") == "Resumed topic mail.\n"
    assert not Topic.objects.get(name="mail").paused


def test_jobs_pause_resume_and_run_now():
    job_id = scheduling.schedule_periodic(RECORD, "Mon 09:00", job_id="weekly")
    (row,) = run_json("jobs")["jobs"]
    assert (row["id"], row["kind"], row["paused"], row["last_outcome"]) == (
        "weekly",
        "periodic",
        False,
        None,
    )
    assert run("pause-job", job_id) == "Paused weekly.\n"
    assert PeriodicTask.objects.get(pk=job_id).paused
    assert run_json("resume-job", job_id) == {"paused": False, "all": False, "jobs": ["weekly"]}
    assert not PeriodicTask.objects.get(pk=job_id).paused

    assert run("pause-job", "--all") == "Paused every job.\n"
    assert run_json("jobs")["all_paused"] is True
    assert "Every job is paused" in run("jobs")
    run("resume-job", "--all")
    assert run_json("jobs")["all_paused"] is False

    submitted = run_json("run-job", job_id)
    task = Task.objects.get(pk=submitted["task"]["sequence"])
    assert (task.identifier, task.label, task.state) == ("weekly", "run now", TaskState.PENDING)
    assert task.requester.startswith("cli:")
    assert run("run-job", job_id).startswith("Submitted a run of weekly: task ")


def test_nodes_and_leaders():
    alive = OwnerFactory(name="node-a")
    OwnerFactory(name="node-b", heartbeat=timezone.now() - timedelta(days=1))
    for n in range(2):
        make(f"mail{n}", TaskState.ACTIVE, owner=alive, exec_id=uuid.uuid4())
    coordination.join("g1", "node-a")
    assert coordination.try_acquire("g1", "node-a", timedelta(seconds=30)) == 1

    nodes = {n["name"]: n for n in run_json("nodes")["nodes"]}
    assert (nodes["node-a"]["alive"], nodes["node-a"]["tasks_held"]) == (True, 2)
    assert (nodes["node-b"]["alive"], nodes["node-b"]["tasks_held"]) == (False, 0)
    assert nodes["node-b"]["heartbeat_age_seconds"] > 80000
    text = run("nodes").splitlines()
    assert text[0].split() == [
        "NAME",
        "ALIVE",
        "HEARTBEAT_AGE_SECONDS",
        "TASKS_HELD",
        "HOST",
        "PID",
    ]
    assert text[1].split()[:2] == ["node-a", "yes"]

    (leader,) = run_json("leaders")["leaders"]
    assert (leader["group"], leader["leader"], leader["term"], leader["alive"]) == (
        "g1",
        "node-a",
        1,
        True,
    )
    assert run("leaders").splitlines()[1].split()[:4] == ["g1", "node-a", "1", "yes"]
