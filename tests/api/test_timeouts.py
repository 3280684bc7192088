"""The two timeouts, enforced by the reaper with an injected clock, and exec_id fencing after a
timeout re-issued the task."""

from __future__ import annotations

from datetime import timedelta

import pytest

from django_tasks_coord import executions
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Task
from tests.api.conftest import run_one

pytestmark = pytest.mark.django_db

INVOICE = "billing/send-invoice"  # requested-to-start 5 s, in progress 30 s, 1 retry after 10 s


@pytest.fixture
def created(submitter) -> dict:
    return submitter.ok("POST", "", {"definition": INVOICE, "params": {"invoiceId": 1}}, expect=201)


def test_a_requested_task_not_started_in_time_is_ready_again_and_its_exec_id_fenced(
    created, executor, submitter, clock
):
    (first,) = executor.ok("POST", "poll", {"definitions": [INVOICE]})["tasks"]
    clock.advance(5)
    assert executions.reap() == {}  # the deadline itself is still in time
    clock.advance(0.001)
    assert executions.reap() == {"requested_to_start_timeout": 1}
    task = submitter.ok("GET", str(created["id"]))
    assert (task["status"], task["exec_id"], task["deadline"]) == ("ready", None, None)
    assert task["outcome_reason"] == "requested_to_start_timeout"
    assert task["attempts"] == 0  # never started: no attempt used

    (second,) = executor.ok("POST", "poll", {"definitions": [INVOICE]})["tasks"]
    assert second["exec_id"] != first["exec_id"]
    before = Task.objects.filter(pk=created["id"]).values().get()
    late = executor.post(f"{created['id']}/start", {"exec_id": first["exec_id"]})
    assert late.status_code == 409
    assert late.json_body["error"]["code"] == "stale_exec_id"
    assert Task.objects.filter(pk=created["id"]).values().get() == before
    executor.ok("POST", f"{created['id']}/start", {"exec_id": second["exec_id"]})


def test_an_in_progress_task_without_news_is_retried_then_failed(
    created, executor, submitter, clock
):
    first = run_one(executor, INVOICE)
    clock.advance(30.5)
    assert executions.reap() == {"in_progress_timeout": 1}
    task = submitter.ok("GET", str(created["id"]))
    assert (task["status"], task["outcome_reason"], task["retry_count"]) == (
        "waiting",
        "in_progress_timeout",
        1,
    )
    assert task["execute_at"] == (clock.now + timedelta(seconds=10)).isoformat()
    for call in ("notify", "success", "fail"):  # the first executor wakes up too late
        late = executor.post(f"{created['id']}/{call}", {"exec_id": first["exec_id"]})
        assert late.json_body["error"]["code"] == "stale_exec_id"

    clock.advance(10)
    second = run_one(executor, INVOICE)
    assert second["attempts"] == 2
    clock.advance(31)
    executions.reap()
    task = submitter.ok("GET", str(created["id"]))
    assert (task["status"], task["outcome"], task["outcome_reason"]) == (
        "done",
        "failed",
        "in_progress_timeout",
    )
    log = Task.objects.get(pk=created["id"]).attempt_log
    assert [(e["outcome"], e["reason"]) for e in log] == [
        ("retry", "in_progress_timeout"),
        ("failed", "in_progress_timeout"),
    ]


def test_notify_extends_the_in_progress_timeout(created, executor, clock):
    task = run_one(executor, INVOICE)
    for _ in range(5):
        clock.advance(20)
        executor.ok("POST", f"{task['id']}/notify", {"exec_id": task["exec_id"]})
        assert executions.reap() == {}
    clock.advance(31)
    assert executions.reap() == {"in_progress_timeout": 1}


def test_a_late_success_before_the_reaper_ran_still_counts(created, executor, clock):
    task = run_one(executor, INVOICE)
    clock.advance(60)
    done = executor.ok(
        "POST", f"{task['id']}/success", {"exec_id": task["exec_id"], "result": {"sent": True}}
    )
    assert done["outcome"] == "succeeded"
    assert executions.reap() == {}


def test_the_reaper_works_in_batches_and_leaves_other_tasks_alone(submitter, executor, clock):
    from django_tasks_coord import queue

    for _ in range(25):
        submitter.ok("POST", "", {"definition": "test/basic"}, expect=201)
    polled = executor.ok("POST", "poll", {"definitions": ["test/basic"], "limit": 25})["tasks"]
    for task in polled[:10]:
        executor.ok("POST", f"{task['id']}/start", {"exec_id": task["exec_id"]})
    queue.register_topic("plain")
    queue.push("plain", "x")
    plain = queue.poll("plain")[0]
    Task.objects.filter(pk=plain.pk).update(deadline=clock.now)  # not a definition's task
    clock.advance(1000)
    caught = executions.reap(batch_size=4)
    assert caught == {"requested_to_start_timeout": 15, "in_progress_timeout": 10}
    assert Task.objects.get(pk=plain.pk).state == TaskState.ACTIVE
    assert Task.objects.filter(topic_id="test/basic", state=TaskState.PENDING).count() == 25
