"""The executor operations through the HTTP API: poll, start, notify, success, fail."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from django_tasks_coord import executions
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Task
from tests.api.conftest import run_one

pytestmark = pytest.mark.django_db


def test_a_task_from_creation_to_success(submitter, executor, clock):
    created = submitter.ok(
        "POST",
        "",
        {"definition": "billing/send-invoice", "params": {"invoiceId": 7}, "label": "inv 7"},
        expect=201,
    )
    assert created["status"] == "ready"
    assert created["requester"] == "alice"
    assert created["label"] == "inv 7"
    assert created["params"] == {"invoiceId": 7}
    assert created["exec_id"] is None

    polled = executor.ok("POST", "poll", {"definitions": ["billing/send-invoice"], "limit": 5})
    (task,) = polled["tasks"]
    assert task["id"] == created["id"]
    assert task["status"] == "requested"
    assert uuid.UUID(task["exec_id"])
    assert task["deadline"] == (clock.now + timedelta(seconds=5)).isoformat()

    started = executor.ok("POST", f"{task['id']}/start", {"exec_id": task["exec_id"]})
    assert started["status"] == "in_progress"
    assert started["exec_id"] == task["exec_id"]
    assert started["attempts"] == 1

    clock.advance(20)
    notified = executor.ok("POST", f"{task['id']}/notify", {"exec_id": task["exec_id"]})
    assert notified["deadline"] == (clock.now + timedelta(seconds=30)).isoformat()

    done = executor.ok(
        "POST", f"{task['id']}/success", {"exec_id": task["exec_id"], "result": {"sent": True}}
    )
    assert done["status"] == "done"
    assert done["outcome"] == "succeeded"
    assert done["result"] == {"sent": True}
    assert done["retry_count"] == 0
    row = Task.objects.get(pk=task["id"])
    assert row.state == TaskState.SUCCEEDED
    assert row.topic_id == "billing/send-invoice"
    assert row.attempt_log[0]["outcome"] == "succeeded"

    assert submitter.ok("GET", f"{task['id']}") == {**done, "checkpoints": {}}  # the read has them


def test_a_task_with_execute_at_waits_until_it_is_due(submitter, executor, clock):
    at = (clock.now + timedelta(seconds=60)).isoformat()
    created = submitter.ok("POST", "", {"definition": "test/basic", "execute_at": at}, expect=201)
    assert created["status"] == "waiting"
    assert created["execute_at"] == at
    assert executor.ok("POST", "poll", {"definitions": ["test/basic"]})["tasks"] == []
    clock.advance(60)
    assert submitter.ok("GET", str(created["id"]))["status"] == "ready"
    (task,) = executor.ok("POST", "poll", {"definitions": ["test/basic"]})["tasks"]
    assert task["id"] == created["id"]


def test_a_failure_is_retried_after_the_retry_delay_then_fails_for_good(submitter, executor, clock):
    submitter.ok(
        "POST", "", {"definition": "billing/send-invoice", "params": {"invoiceId": 1}}, expect=201
    )
    task = run_one(executor, "billing/send-invoice")
    failed = executor.ok(
        "POST", f"{task['id']}/fail", {"exec_id": task["exec_id"], "error": {"code": "smtp"}}
    )
    assert failed["status"] == "waiting"
    assert failed["outcome"] is None
    assert failed["outcome_reason"] == "failed_by_executor"
    assert failed["error"] == {"code": "smtp"}
    assert failed["retry_count"] == 1
    assert failed["exec_id"] is None
    assert failed["execute_at"] == (clock.now + timedelta(seconds=10)).isoformat()
    assert executor.ok("POST", "poll", {"definitions": ["billing/send-invoice"]})["tasks"] == []

    clock.advance(10)
    again = run_one(executor, "billing/send-invoice")
    assert again["id"] == task["id"]
    assert again["exec_id"] != task["exec_id"]  # a fresh exec_id per hand-out, so per start
    assert again["attempts"] == 2
    final = executor.ok(
        "POST", f"{task['id']}/fail", {"exec_id": again["exec_id"], "error": {"code": "smtp2"}}
    )
    assert final["status"] == "done"
    assert final["outcome"] == "failed"
    assert final["outcome_reason"] == "failed_by_executor"
    assert final["error"] == {"code": "smtp2"}
    assert final["retry_count"] == 1  # allowed_retry_count=1 used up
    log = Task.objects.get(pk=task["id"]).attempt_log
    assert [entry["outcome"] for entry in log] == ["retry", "failed"]
    assert [entry["exec_id"] for entry in log] == [task["exec_id"], again["exec_id"]]


def test_a_task_that_succeeds_after_a_failed_attempt_shows_no_error(submitter, executor, clock):
    """`error` is the last failed attempt's while the task is retried, none once it succeeded."""
    submitter.ok("POST", "", {"definition": "test/basic"}, expect=201)
    task = run_one(executor)
    failed = executor.ok(
        "POST", f"{task['id']}/fail", {"exec_id": task["exec_id"], "error": {"code": "smtp"}}
    )
    assert (failed["status"], failed["error"]) == ("waiting", {"code": "smtp"})
    clock.advance(10)
    again = run_one(executor)
    assert (again["status"], again["error"]) == ("in_progress", {"code": "smtp"})
    done = executor.ok(
        "POST", f"{task['id']}/success", {"exec_id": again["exec_id"], "result": {"ok": 1}}
    )
    assert (done["outcome"], done["outcome_reason"], done["error"]) == ("succeeded", None, None)
    assert done["retry_count"] == 1  # the failed attempt is still counted
    assert submitter.ok("GET", str(task["id"]))["error"] is None
    assert Task.objects.get(pk=task["id"]).error_detail is None


def test_a_failure_without_an_error_is_an_unknown_error(submitter, executor):
    submitter.ok("POST", "", {"definition": "test/basic"}, expect=201)
    task = run_one(executor)
    failed = executor.ok("POST", f"{task['id']}/fail", {"exec_id": task["exec_id"]})
    assert failed["outcome_reason"] == "unknown_error"
    assert failed["status"] == "waiting"  # test/basic allows 2 retries


def test_retry_false_fails_for_good_at_once(submitter, executor):
    submitter.ok("POST", "", {"definition": "test/basic"}, expect=201)
    task = run_one(executor)
    failed = executor.ok(
        "POST",
        f"{task['id']}/fail",
        {"exec_id": task["exec_id"], "error": "bad input", "retry": False},
    )
    assert (failed["status"], failed["outcome"], failed["retry_count"]) == ("done", "failed", 0)


def test_poll_hands_out_by_priority_then_age_across_definitions_up_to_the_limit(
    submitter, executor
):
    low = submitter.ok("POST", "", {"definition": "test/basic"}, expect=201)
    high = submitter.ok("POST", "", {"definition": "test/basic", "priority": 5}, expect=201)
    other = submitter.ok("POST", "", {"definition": "test/limited"}, expect=201)
    first = executor.ok("POST", "poll", {"definitions": ["test/basic"], "limit": 1})["tasks"]
    assert [t["id"] for t in first] == [high["id"]]
    rest = executor.ok("POST", "poll", {"definitions": ["test/basic", "test/limited"], "limit": 10})
    assert sorted(t["id"] for t in rest["tasks"]) == sorted([low["id"], other["id"]])
    assert len({t["exec_id"] for t in first + rest["tasks"]}) == 3
    assert executor.ok("POST", "poll", {"definitions": ["test/basic"], "limit": 10})["tasks"] == []


def test_cancel_of_an_in_progress_task_reaches_its_executor_and_ends_it_canceled(
    submitter, executor
):
    submitter.ok("POST", "", {"definition": "test/basic"}, expect=201)
    task = run_one(executor)
    asked = submitter.ok("POST", f"{task['id']}/cancel")
    assert (asked["status"], asked["cancel_requested"]) == ("in_progress", True)
    beat = executor.ok(
        "POST", f"{task['id']}/notify", {"exec_id": task["exec_id"], "progress": {"done": 3}}
    )
    assert (beat["status"], beat["cancel_requested"], beat["progress"]) == (
        "in_progress",
        True,
        {"done": 3},
    )
    late = executor.ok("POST", f"{task['id']}/success", {"exec_id": task["exec_id"], "result": 1})
    assert (late["status"], late["outcome"], late["outcome_reason"]) == (
        "done",
        "canceled",
        "canceled",
    )
    assert Task.objects.get(pk=task["id"]).result is None
    again = submitter.post(f"{task['id']}/cancel")
    assert again.status_code == 409


def test_cancel_ends_a_requested_task_and_refuses_its_executor(submitter, executor):
    submitter.ok("POST", "", {"definition": "test/basic"}, expect=201)
    (task,) = executor.ok("POST", "poll", {"definitions": ["test/basic"]})["tasks"]
    canceled = submitter.ok("POST", f"{task['id']}/cancel")
    assert (canceled["status"], canceled["outcome"], canceled["cancel_requested"]) == (
        "done",
        "canceled",
        False,
    )
    late = executor.post(f"{task['id']}/start", {"exec_id": task["exec_id"]})
    assert late.status_code == 409
    assert late.json_body["error"]["code"] == "task_done"


def test_a_task_canceled_in_progress_ends_canceled_at_its_timeout(submitter, executor, clock):
    submitter.ok("POST", "", {"definition": "test/basic"}, expect=201)
    task = run_one(executor)
    submitter.ok("POST", f"{task['id']}/cancel")
    clock.advance(10_000)
    assert executions.reap() == {"in_progress_timeout": 1}
    row = Task.objects.get(pk=task["id"])
    assert (row.state, row.outcome_reason) == (TaskState.CANCELED, "canceled")


def test_notify_refuses_a_progress_too_large(executor, submitter, settings):
    settings.TASKS_COORD = {**getattr(settings, "TASKS_COORD", {}), "PROGRESS_MAX_BYTES": 10}
    submitter.ok("POST", "", {"definition": "test/basic"}, expect=201)
    task = run_one(executor)
    refused = executor.post(
        f"{task['id']}/notify", {"exec_id": task["exec_id"], "progress": "x" * 20}
    )
    assert refused.status_code in (400, 422)
    assert "PROGRESS_MAX_BYTES" in refused.json_body["error"]["message"]


def test_a_waiting_task_can_be_canceled(submitter, executor):
    created = submitter.ok("POST", "", {"definition": "test/basic"}, expect=201)
    assert submitter.ok("POST", f"{created['id']}/cancel")["outcome"] == "canceled"
    assert executor.ok("POST", "poll", {"definitions": ["test/basic"]})["tasks"] == []


def test_list_filters_by_definition_and_status_and_pages(submitter, executor, clock):
    ids = [
        submitter.ok("POST", "", {"definition": "test/basic", "label": f"t{i}"}, expect=201)["id"]
        for i in range(5)
    ]
    other = submitter.ok("POST", "", {"definition": "test/limited"}, expect=201)["id"]
    task = run_one(executor)  # the oldest basic task is now in progress
    page = submitter.ok("GET", "", definition="test/basic", limit=2)
    assert [t["id"] for t in page["tasks"]] == ids[::-1][:2]
    assert page["next_before"] == ids[3]
    page2 = submitter.ok("GET", "", definition="test/basic", limit=2, before=page["next_before"])
    assert [t["id"] for t in page2["tasks"]] == [ids[2], ids[1]]
    page3 = submitter.ok("GET", "", definition="test/basic", limit=2, before=page2["next_before"])
    assert [t["id"] for t in page3["tasks"]] == [ids[0]]
    assert page3["next_before"] is None
    running = submitter.ok("GET", "", status="in_progress")
    assert [t["id"] for t in running["tasks"]] == [task["id"]]
    ready = submitter.ok("GET", "", status="ready")
    assert sorted(t["id"] for t in ready["tasks"]) == sorted([*ids[1:], other])
    both = executor.ok("GET", "", definition=["test/basic", "test/limited"])
    assert len(both["tasks"]) == 6
    executor.ok("POST", f"{task['id']}/success", {"exec_id": task["exec_id"]})
    assert [t["id"] for t in submitter.ok("GET", "", outcome="succeeded")["tasks"]] == [task["id"]]
    assert submitter.ok("GET", "", status="waiting")["tasks"] == []


def test_definitions_are_listed_with_their_schemas(executor):
    listed = {d["name"]: d for d in executor.ok("GET", "definitions")["definitions"]}
    invoice = listed["billing/send-invoice"]
    assert invoice["params_schema"]["required"] == ["invoiceId"]
    assert (invoice["requested_to_start_timeout"], invoice["in_progress_timeout"]) == (5.0, 30.0)
    assert listed["test/basic"]["allowed_retry_count"] == 2
    assert listed["test/per-key"]["concurrency_key_path"] == ["params", "resourceType"]


def test_the_queue_api_sees_the_same_task(submitter, executor):
    from django_tasks_coord import queue

    created = submitter.ok("POST", "", {"definition": "test/basic", "params": [1, 2]}, expect=201)
    assert queue.count("test/basic") == 1
    row = Task.objects.get(pk=created["id"])
    assert (row.payload, row.state, row.requester) == ([1, 2], TaskState.PENDING, "alice")


@pytest.mark.parametrize("definition", ["test/basic", "test/limited"])
def test_a_paused_definition_hands_out_nothing(submitter, executor, definition):
    from django_tasks_coord import queue

    created = submitter.ok("POST", "", {"definition": definition}, expect=201)
    queue.pause_topic(definition)
    assert executor.ok("POST", "poll", {"definitions": [definition]})["tasks"] == []
    queue.resume_topic(definition)
    assert (
        executor.ok("POST", "poll", {"definitions": [definition]})["tasks"][0]["id"]
        == created["id"]
    )


def test_an_executor_stores_checkpoints_with_notify_and_its_retry_reads_them(
    submitter, executor, clock
):
    submitter.ok(
        "POST", "", {"definition": "billing/send-invoice", "params": {"invoiceId": 1}}, expect=201
    )
    task = run_one(executor, "billing/send-invoice")
    path, execution = f"{task['id']}/notify", {"exec_id": task["exec_id"]}
    beat = executor.ok("POST", path, {**execution, "checkpoints": {"page-1": {"rows": 10}}})
    assert beat["checkpoints"] == {"page-1": {"rows": 10}}
    beat = executor.ok("POST", path, {**execution, "checkpoints": {"page-2": [1, 2]}})
    assert beat["checkpoints"] == {"page-1": {"rows": 10}, "page-2": [1, 2]}
    for bad in ({"tasks_coord.x": 1}, {"x" * 201: 1}, [1]):
        refused = executor.post(path, {**execution, "checkpoints": bad})
        assert refused.status_code == 400, refused.content
    executor.ok("POST", f"{task['id']}/fail", {**execution, "error": {"code": "smtp"}})
    stale = executor.post(path, {**execution, "checkpoints": {"late": True}})
    assert stale.status_code == 409  # the claim ended: nothing written under it
    clock.advance(10)
    again = run_one(executor, "billing/send-invoice")  # the retry: a new exec_id
    read = executor.ok("GET", str(task["id"]))
    assert read["checkpoints"] == {"page-1": {"rows": 10}, "page-2": [1, 2]}
    beat = executor.ok("POST", f"{again['id']}/notify", {"exec_id": again["exec_id"]})
    assert beat["checkpoints"] == read["checkpoints"]
