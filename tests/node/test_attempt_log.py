"""Consumer tasks keep an attempt log (error, node, time of each attempt), as ``@task`` tasks do."""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import OperationalError
from django.db.models import QuerySet

from django_tasks_coord import db, handlers, queue
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Task
from django_tasks_coord.retry import RetryPolicy
from tests.node.conftest import run


def test_each_attempt_of_a_consumer_task_is_logged(make_node, work_topic):
    queue.push("work", "flaky", {"fail_times": 2})
    queue.push("work", "hopeless", {"fail_times": 99})
    queue.push("work", "fine", {})
    handlers.register(
        "work",
        handlers.registry.consumers()["work"].func,
        retry=RetryPolicy(max_attempts=3, retry_interval=0, jitter=0),
    )
    node = make_node(node_id="logging-node")
    assert run(node) == 0
    flaky, hopeless, fine = (
        Task.objects.get(identifier=name) for name in ("flaky", "hopeless", "fine")
    )
    assert (flaky.state, hopeless.state) == (TaskState.SUCCEEDED, TaskState.FAILED)
    assert [(e["attempt"], e["outcome"]) for e in flaky.attempt_log] == [
        (1, "failed"),
        (2, "failed"),
        (3, "succeeded"),  # the attempt that finished it
    ]
    assert [(e["attempt"], e["outcome"]) for e in hopeless.attempt_log] == [
        (1, "failed"),
        (2, "failed"),
        (3, "failed"),
    ]
    first = flaky.attempt_log[0]
    assert first["worker_id"] == "logging-node"
    assert first["exception_class_path"] == "tests.testapp.consumers.Flaky"
    assert first["error"] == "attempt 1 fails on purpose"
    assert "Traceback" in first["traceback"]
    started, finished = (datetime.fromisoformat(first[k]) for k in ("started_at", "finished_at"))
    assert started <= finished
    assert fine.attempt_log in (None, [])  # a first-attempt success costs no extra write


def test_an_attempt_log_write_that_lost_its_connection_is_written_again(
    make_node, work_topic, monkeypatch, caplog
):
    """A lost connection while the log is written is waited out like every write of a node
    (the database restart test asserts that an outage logs no ERROR)."""
    real_update = QuerySet.update
    failures: list[dict] = []

    def update(self, **fields):
        if "attempt_log" in fields and len(failures) < 2:
            failures.append(fields)
            raise OperationalError("server closed the connection unexpectedly")
        return real_update(self, **fields)

    monkeypatch.setattr(QuerySet, "update", update)
    monkeypatch.setattr(db.reconnect, "RECONNECT_DELAY", 0.01)
    handlers.register(
        "work",
        handlers.registry.consumers()["work"].func,
        retry=RetryPolicy(max_attempts=2, retry_interval=0, jitter=0),
    )
    queue.push("work", "flaky", {"fail_times": 1})
    with caplog.at_level(logging.WARNING, logger="django_tasks_coord"):
        assert run(make_node()) == 0
    assert len(failures) == 2
    flaky = Task.objects.get(identifier="flaky")
    assert flaky.state == TaskState.SUCCEEDED
    assert [(e["attempt"], e["outcome"]) for e in flaky.attempt_log] == [
        (1, "failed"),
        (2, "succeeded"),
    ]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
