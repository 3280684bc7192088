"""The batch calls: claim (poll and start in one call, up to a limit, waiting like a long-poll if
asked) and complete (the outcomes of many executions, each accepted or refused on its own).

Transactional: a claim runs in the API's database threads, on their own connections."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connections
from django.test import Client

from django_tasks_coord import execution_batches, executions, queue
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Task
from tests.api.conftest import Api, make_user
from tests.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def executor(transactional_db) -> Api:
    return Api(make_user("executor", "execute_tasks")[1], Client())


@pytest.fixture
def submitter(transactional_db) -> Api:
    return Api(make_user("alice", "submit_tasks")[1], Client())


def claim(api: Api, definition: str = "test/basic", limit: int = 1, **extra) -> list[dict]:
    body = {"definitions": [definition], "limit": limit, **extra}
    return api.ok("POST", "claim", body)["tasks"]


def succeeded(task: dict, result: object = None) -> dict:
    return {"id": task["id"], "exec_id": task["exec_id"], "outcome": "succeeded", "result": result}


def complete(api: Api, *reports: dict) -> list[dict]:
    return api.ok("POST", "complete", {"tasks": list(reports)})["results"]


# --- claim -------------------------------------------------------------------------------------


def test_a_claim_hands_out_and_starts_tasks_by_priority_then_age_up_to_its_limit(executor, clock):
    low = executions.create("test/basic", priority=0).pk
    high = executions.create("test/basic", priority=5).pk
    later = executions.create("test/basic", priority=0).pk
    left = executions.create("test/basic", priority=-1).pk
    tasks = claim(executor, limit=3)
    assert [task["id"] for task in tasks] == [high, low, later]
    assert len({task["exec_id"] for task in tasks}) == 3
    for task in tasks:
        assert (task["status"], task["attempts"]) == ("in_progress", 1)
        assert task["started_at"] == clock.now.isoformat()
        assert task["deadline"] == (clock.now + timedelta(seconds=120)).isoformat()
        row = Task.objects.get(pk=task["id"])
        assert (row.state, str(row.exec_id), row.attempts) == (TaskState.ACTIVE, task["exec_id"], 1)
        assert row.attempt_log == [
            {"attempt": 1, "exec_id": task["exec_id"], "started_at": clock.now.isoformat()}
        ]
    assert executions.status(Task.objects.get(pk=left))[0] == "ready"


def test_claimed_tasks_go_on_like_started_ones(executor, clock):
    for _ in range(2):
        executions.create("billing/send-invoice", {"invoiceId": 1})
    first, second = claim(executor, "billing/send-invoice", limit=2)
    clock.advance(10)
    notified = executor.ok("POST", f"{first['id']}/notify", {"exec_id": first["exec_id"]})
    assert notified["deadline"] == (clock.now + timedelta(seconds=30)).isoformat()
    body = {"exec_id": first["exec_id"], "result": {"sent": True}}
    assert executor.ok("POST", f"{first['id']}/success", body)["outcome"] == "succeeded"
    body = {"exec_id": second["exec_id"], "error": {"code": "E"}}
    assert executor.ok("POST", f"{second['id']}/fail", body)["status"] == "waiting"
    # Started already: starting it again is a conflict, as for a started task.
    response = executor.post(f"{first['id']}/start", {"exec_id": first["exec_id"]})
    assert (response.status_code, response.json_body["error"]["code"]) == (409, "task_done")


def test_a_claim_takes_from_several_definitions_and_skips_paused_ones(executor):
    basic = executions.create("test/basic").pk
    invoice = executions.create("billing/send-invoice", {"invoiceId": 3}).pk
    body = {"definitions": ["test/basic", "billing/send-invoice"], "limit": 5}
    queue.pause_topic("test/basic")
    assert [t["id"] for t in executor.ok("POST", "claim", body)["tasks"]] == [invoice]
    queue.resume_topic("test/basic")
    assert [t["id"] for t in executor.ok("POST", "claim", body)["tasks"]] == [basic]


def test_a_claim_stays_within_a_concurrency_limit_and_a_completion_frees_a_slot(executor):
    for _ in range(5):
        executions.create("test/limited")
    tasks = claim(executor, "test/limited", limit=5)
    assert len(tasks) == 3  # the definition's limit
    assert claim(executor, "test/limited", limit=5) == []
    assert complete(executor, succeeded(tasks[0]))[0]["ok"]
    assert len(claim(executor, "test/limited", limit=5)) == 1


def test_a_claim_with_nothing_ready_answers_at_once_or_waits_for_work(executor):
    began = time.monotonic()
    assert claim(executor) == []
    assert time.monotonic() - began < 5

    created: list[int] = []

    def create_later() -> None:
        wait_for(lambda: _waiting(), timeout=10)
        created.append(executions.create("test/basic").pk)
        connections.close_all()

    thread = threading.Thread(target=create_later)
    thread.start()
    tasks = claim(executor, timeout=20)
    thread.join()
    assert [task["id"] for task in tasks] == created
    assert tasks[0]["status"] == "in_progress"


def _waiting() -> bool:
    """a claim waits"""
    from django_tasks_coord.api import longpoll

    return any(hub.waiters for hub in list(longpoll._hubs.values()))


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"definitions": ["nope"]}, 404, "unknown_definition"),
        ({"definitions": ["test/basic"], "limit": 0}, 400, "invalid_request"),
        ({"definitions": ["test/basic"], "limit": 101}, 400, "invalid_request"),
        ({"definitions": ["test/basic"], "timeout": -1}, 400, "invalid_request"),
        ({"definitions": []}, 400, "invalid_request"),
        ({"definitions": ["test/basic"], "start": False}, 400, "invalid_request"),
    ],
)
def test_a_bad_claim_is_a_json_4xx_that_claims_nothing(executor, body, status, code):
    executions.create("test/basic")
    response = executor.post("claim", body)
    assert (response.status_code, response.json_body["error"]["code"]) == (status, code)
    assert not Task.objects.exclude(state=TaskState.PENDING).exists()


def test_claiming_needs_the_execute_permission(submitter):
    executions.create("test/basic")
    response = submitter.post("claim", {"definitions": ["test/basic"]})
    assert (response.status_code, response.json_body["error"]["code"]) == (
        403,
        "permission_denied",
    )
    assert not Task.objects.exclude(state=TaskState.PENDING).exists()


# --- complete ----------------------------------------------------------------------------------


def test_a_batch_completion_accepts_or_refuses_each_report_on_its_own(executor, clock):
    for n in range(6):
        executions.create("billing/send-invoice", {"invoiceId": n})
    ok, retried, failed, stale, invalid, unknown = claim(executor, "billing/send-invoice", 6)
    clock.advance(7)
    results = complete(
        executor,
        succeeded(ok, {"sent": True}),
        {"id": retried["id"], "exec_id": retried["exec_id"], "outcome": "failed",
         "error": {"code": "E1"}},
        {"id": failed["id"], "exec_id": failed["exec_id"], "outcome": "failed",
         "error": {"code": "E2"}, "retry": False},
        {**succeeded(stale, {"sent": True}), "exec_id": str(uuid.uuid4())},
        succeeded(invalid, {"sent": "yes"}),
        {**succeeded(unknown), "id": 999_999_999},
    )  # fmt: skip
    assert [r["id"] for r in results] == [
        ok["id"], retried["id"], failed["id"], stale["id"], invalid["id"], 999_999_999
    ]  # fmt: skip
    assert results[:3] == [
        {"id": ok["id"], "ok": True, "status": "done", "outcome": "succeeded"},
        {"id": retried["id"], "ok": True, "status": "waiting", "outcome": None},
        {"id": failed["id"], "ok": True, "status": "done", "outcome": "failed"},
    ]
    refused = [(r["ok"], r["error"]["code"], r["error"].get("path")) for r in results[3:]]
    assert refused == [
        (False, "stale_exec_id", None),
        (False, "schema_violation", "/tasks/4/result/sent"),
        (False, "not_found", None),
    ]
    done = executor.ok("GET", str(ok["id"]))
    assert (done["result"], done["finished_at"]) == ({"sent": True}, clock.now.isoformat())
    waiting = Task.objects.get(pk=retried["id"])
    assert (waiting.state, waiting.exec_id, waiting.error_detail) == (
        TaskState.PENDING,
        None,
        {"code": "E1"},
    )
    assert waiting.execute_at == clock.now + timedelta(seconds=10)
    assert waiting.attempt_log[-1]["outcome"] == "retry"
    assert Task.objects.get(pk=failed["id"]).outcome_reason == "failed_by_executor"
    for task in (stale, invalid):  # refused: still in progress under their exec_ids
        row = Task.objects.get(pk=task["id"])
        assert (row.state, str(row.exec_id), row.result) == (
            TaskState.ACTIVE,
            task["exec_id"],
            None,
        )
        assert "finished_at" not in row.attempt_log[-1]


def test_a_failure_without_an_error_is_an_unknown_error(executor):
    executions.create("test/basic")
    (task,) = claim(executor)
    report = {"id": task["id"], "exec_id": task["exec_id"], "outcome": "failed", "retry": False}
    assert complete(executor, report)[0]["outcome"] == "failed"
    assert Task.objects.get(pk=task["id"]).outcome_reason == "unknown_error"


def test_a_task_reported_twice_in_one_batch_counts_once(executor):
    executions.create("test/basic")
    (task,) = claim(executor)
    first, second = complete(executor, succeeded(task, 1), succeeded(task, 2))
    assert first["ok"]
    assert (second["ok"], second["error"]["code"]) == (False, "task_done")
    assert Task.objects.get(pk=task["id"]).result == 1


def test_reports_on_tasks_not_in_progress_are_refused(executor):
    executions.create("test/basic")
    (requested,) = executor.ok("POST", "poll", {"definitions": ["test/basic"]})["tasks"]
    executions.create("test/basic")
    (done,) = claim(executor)
    complete(executor, succeeded(done))
    queue.register_topic("internal")
    plain = queue.push("internal", "x", {"secret": 1})
    results = complete(
        executor,
        succeeded(requested),
        succeeded(done),
        {"id": plain.pk, "exec_id": str(uuid.uuid4()), "outcome": "succeeded"},
    )
    assert [r["error"]["code"] for r in results] == ["wrong_state", "task_done", "not_found"]
    assert Task.objects.get(pk=requested["id"]).state == TaskState.REQUESTED


def test_an_execution_handed_out_again_is_stale_in_a_batch(executor, clock):
    executions.create("test/basic")
    (old,) = claim(executor)
    clock.advance(121)  # past the in-progress timeout: the reaper ends the attempt
    assert executions.reap(now=clock.now)["in_progress_timeout"] == 1
    clock.advance(11)  # past the retry delay
    (new,) = claim(executor)
    assert new["id"] == old["id"]
    assert new["attempts"] == 2
    stale, current = complete(executor, succeeded(old, "late"), succeeded(new, "in time"))
    assert (stale["ok"], stale["error"]["code"]) == (False, "stale_exec_id")
    assert current["ok"]
    assert Task.objects.get(pk=new["id"]).result == "in time"


EXEC_ID = str(uuid.uuid4())


@pytest.mark.parametrize(
    ("tasks", "path"),
    [
        ([], "/tasks"),
        ([{"id": 1, "exec_id": EXEC_ID, "outcome": "succeeded"}] * 101, "/tasks"),
        ([{"id": 1, "exec_id": "nope", "outcome": "succeeded"}], "/tasks/0/exec_id"),
        ([{"id": 1, "exec_id": EXEC_ID, "outcome": "done"}], "/tasks/0/outcome"),
        ([{"id": 1, "exec_id": EXEC_ID, "outcome": "succeeded", "retry": False}], "/tasks/0"),
        ([{"id": 1, "exec_id": EXEC_ID, "outcome": "failed", "result": 1}], "/tasks/0"),
        ([{"id": 1, "exec_id": EXEC_ID, "outcome": "failed", "retry": 1}], "/tasks/0/retry"),
        ([{"id": -1, "exec_id": EXEC_ID, "outcome": "succeeded"}], "/tasks/0/id"),
        ([{"id": 2**63, "exec_id": EXEC_ID, "outcome": "succeeded"}], "/tasks/0/id"),
        ([{"id": 1, "exec_id": EXEC_ID}], "/tasks/0"),
    ],
)
def test_a_batch_that_does_not_match_its_schema_is_400_and_changes_nothing(executor, tasks, path):
    executions.create("test/basic")
    (task,) = claim(executor)
    response = executor.post("complete", {"tasks": [*tasks, succeeded(task)] if tasks else []})
    assert (response.status_code, response.json_body["error"]["code"]) == (400, "invalid_request")
    assert response.json_body["error"]["path"] == path
    assert Task.objects.get(pk=task["id"]).state == TaskState.ACTIVE


def test_the_python_api_refuses_each_bad_report_on_its_own(transactional_db):
    executions.create("test/basic")
    executions.create("test/basic")
    good, bad = executions.poll(["test/basic"], 2, start=True)
    done = execution_batches.complete(
        [
            execution_batches.Report(good.pk, good.exec_id, succeeded=True, result=[1]),
            execution_batches.Report(bad.pk, bad.exec_id, succeeded=True, result={1, 2}),
            execution_batches.Report("x", bad.exec_id, succeeded=True),  # type: ignore[arg-type]
            execution_batches.Report(bad.pk, "not a uuid", succeeded=False),
        ]
    )
    assert [c.ok for c in done] == [True, False, False, False]
    assert [type(c.error).__name__ for c in done[1:]] == [
        "PayloadError",
        "DoesNotExist",
        "InvalidArgumentError",
    ]
    assert done[0].task is not None and done[0].task.result == [1]
    assert Task.objects.get(pk=bad.pk).state == TaskState.ACTIVE


# --- many executors at once --------------------------------------------------------------------


def test_4_executors_claiming_and_completing_in_batches_run_each_task_once(executor):
    total, executors = 60, 4
    for n in range(total):
        executions.create("test/basic", {"n": n})
    ran: list[int] = []
    failures: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(executors)

    def run() -> None:
        api = Api(executor.token, Client())
        start.wait()
        try:
            while tasks := claim(api, limit=7):
                results = complete(api, *(succeeded(t, t["params"]["n"]) for t in tasks))
                assert all(result["ok"] for result in results), results
                with lock:
                    ran.extend(task["id"] for task in tasks)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(executors)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not failures, failures
    assert sorted(Counter(ran).values()) == [1] * total
    rows = Task.objects.filter(topic_id="test/basic")
    assert {(row.state, row.attempts, row.result) for row in rows} == {
        (TaskState.SUCCEEDED, 1, row.payload["n"]) for row in rows
    }
