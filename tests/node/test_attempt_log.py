"""Consumer tasks keep an attempt log (error, node, time of each attempt), as ``@task`` tasks do."""

from __future__ import annotations

from datetime import datetime

from django_tasks_coord import handlers, queue
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
