"""Every error path of the HTTP API (long-poll's own are in test_longpoll.py): JSON errors with a code, a message and, where one is at
fault, the JSON Pointer of the offending value. Refused calls change nothing."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from django_tasks_coord import queue
from django_tasks_coord.api.auth import issue_token
from django_tasks_coord.models import ApiToken, Task
from tests.api.conftest import Api, run_one

pytestmark = pytest.mark.django_db

EXECUTOR_CALLS = ["start", "notify", "success", "fail"]


def error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.json_body
    assert response["Content-Type"] == "application/json"
    body = response.json_body["error"]
    assert body["code"] == code
    assert body["message"]
    return body


def snapshot(task_id: int) -> dict:
    return Task.objects.filter(pk=task_id).values().get()


@pytest.fixture
def started(submitter, executor) -> dict:
    submitter.ok(
        "POST", "", {"definition": "billing/send-invoice", "params": {"invoiceId": 1}}, expect=201
    )
    return run_one(executor, "billing/send-invoice")


# --- 401 and 403 -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "poll"),
        ("POST", "long-poll"),
        ("POST", "1/start"),
        ("POST", ""),
        ("GET", ""),
        ("GET", "1"),
        ("POST", "1/cancel"),
        ("GET", "definitions"),
    ],
)
def test_no_token_is_401(anonymous, method, path, db):
    response = anonymous.call(method, path, {"definitions": ["test/basic"]})
    error(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize("header", ["Basic abc", "Bearer", "Bearer dtc_unknown", "token"])
def test_a_bad_or_unknown_token_is_401(client, header, db):
    response = client.post(
        "/tasks/poll", "{}", content_type="application/json", headers={"Authorization": header}
    )
    assert response.status_code == 401


def test_an_expired_token_or_an_inactive_user_is_401(executor, db):
    ApiToken.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    error(executor.post("poll", {"definitions": ["test/basic"]}), 401, "not_authenticated")
    ApiToken.objects.update(expires_at=timezone.now() + timedelta(days=1))
    assert executor.post("poll", {"definitions": ["test/basic"]}).status_code == 200
    User.objects.update(is_active=False)
    error(executor.post("poll", {"definitions": ["test/basic"]}), 401, "not_authenticated")


def test_tokens_are_stored_hashed_and_record_their_use(db):
    user = User.objects.create_user("u")
    row, token = issue_token(user, "ci")
    assert token.startswith("dtc_") and len(token) > 40
    assert token not in (row.digest, row.prefix) and token.startswith(row.prefix)
    assert ApiToken.objects.filter(digest=row.digest).exists()
    assert not ApiToken.objects.filter(digest=token).exists()


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "poll", {"definitions": ["test/basic"]}),
        ("POST", "1/start", {"exec_id": str(uuid.uuid4())}),
        ("POST", "1/notify", {"exec_id": str(uuid.uuid4())}),
        ("POST", "1/success", {"exec_id": str(uuid.uuid4())}),
        ("POST", "1/fail", {"exec_id": str(uuid.uuid4())}),
    ],
)
def test_executor_calls_need_the_execute_permission(submitter, method, path, body):
    assert (
        "execute_tasks"
        in error(submitter.call(method, path, body), 403, "permission_denied")["message"]
    )


@pytest.mark.parametrize(("method", "path"), [("POST", ""), ("POST", "1/cancel")])
def test_creating_and_canceling_need_the_submit_permission(executor, method, path):
    response = executor.call(method, path, {"definition": "test/basic"})
    assert "submit_tasks" in error(response, 403, "permission_denied")["message"]


@pytest.mark.parametrize(("path"), ["", "1", "definitions"])
def test_reading_needs_one_of_the_two_permissions(nobody, path):
    error(nobody.get(path), 403, "permission_denied")


def test_a_superuser_may_do_everything(db):
    user = User.objects.create_superuser("root")
    api = Api(issue_token(user)[1], __import__("django.test", fromlist=["Client"]).Client())
    created = api.ok("POST", "", {"definition": "test/basic"}, expect=201)
    assert (
        api.ok("POST", "poll", {"definitions": ["test/basic"]})["tasks"][0]["id"] == created["id"]
    )


# --- 400 -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("body", ["{not json", b"\xff\xfe", ""])
def test_a_body_that_is_not_json_is_400(executor, body):
    error(executor.post("poll", body), 400, "invalid_json" if body else "invalid_request")


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({}, ""),
        ([], ""),
        ({"definitions": []}, "/definitions"),
        ({"definitions": "test/basic"}, "/definitions"),
        ({"definitions": [""]}, "/definitions/0"),
        ({"definitions": ["test/basic"], "limit": 0}, "/limit"),
        ({"definitions": ["test/basic"], "limit": 101}, "/limit"),
        ({"definitions": ["test/basic"], "limit": "2"}, "/limit"),
        ({"definitions": ["test/basic"], "extra": 1}, ""),
    ],
)
def test_a_poll_body_that_does_not_match_its_schema_is_400(executor, body, path):
    assert error(executor.post("poll", body), 400, "invalid_request")["path"] == path


@pytest.mark.parametrize("call", EXECUTOR_CALLS)
@pytest.mark.parametrize("exec_id", [None, "", "not-a-uuid", 42])
def test_an_exec_id_that_is_not_a_uuid_is_400(executor, started, call, exec_id):
    before = snapshot(started["id"])
    body = {} if exec_id is None else {"exec_id": exec_id}
    error(executor.post(f"{started['id']}/{call}", body), 400, "invalid_request")
    assert snapshot(started["id"]) == before


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"definition": "test/basic", "execute_at": "tomorrow"}, "/execute_at"),
        ({"definition": "test/basic", "execute_at": "2030-01-01T09:00:00"}, "/execute_at"),
        ({"definition": "test/basic", "label": "x" * 256}, "/label"),
        ({"definition": "test/basic", "priority": 40000}, "/priority"),
        ({"params": {}}, ""),
    ],
)
def test_a_create_body_that_does_not_match_is_400(submitter, body, path):
    assert error(submitter.post("", body), 400, "invalid_request")["path"] == path
    assert not Task.objects.exists()


@pytest.mark.parametrize(
    "query",
    [
        {"limit": "0"},
        {"limit": "x"},
        {"limit": "501"},
        {"before": "x"},
        {"status": "running"},
        {"outcome": "ok"},
    ],
)
def test_bad_list_parameters_are_400(submitter, query):
    error(submitter.get("", **query), 400, "invalid_request")


# --- 404 and 405 ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), [("GET", "999"), ("POST", "999/cancel")])
def test_an_unknown_task_is_404(submitter, method, path):
    error(submitter.call(method, path), 404, "not_found")


@pytest.mark.parametrize("call", EXECUTOR_CALLS)
def test_executor_calls_on_an_unknown_task_are_404(executor, call):
    error(executor.post(f"999/{call}", {"exec_id": str(uuid.uuid4())}), 404, "not_found")


def test_tasks_of_plain_topics_are_not_exposed(submitter, executor):
    queue.register_topic("internal")
    task = queue.push("internal", "x", {"secret": 1})
    error(submitter.get(str(task.pk)), 404, "not_found")
    error(submitter.post(f"{task.pk}/cancel"), 404, "not_found")
    polled = queue.poll("internal")[0]
    error(executor.post(f"{task.pk}/success", {"exec_id": str(polled.exec_id)}), 404, "not_found")
    assert submitter.ok("GET", "")["tasks"] == []


def test_unknown_definitions_are_404(submitter, executor):
    error(submitter.post("", {"definition": "nope"}), 404, "unknown_definition")
    error(executor.post("poll", {"definitions": ["test/basic", "nope"]}), 404, "unknown_definition")
    error(submitter.get("", definition="nope"), 404, "unknown_definition")


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "poll"), ("DELETE", "1"), ("PUT", ""), ("GET", "long-poll"), ("GET", "1/start")],
)
def test_a_wrong_method_is_405(executor, method, path):
    response = executor.call(method, path)
    error(response, 405, "method_not_allowed")
    assert response["Allow"]


# --- 409: fencing and states -----------------------------------------------------------------------


@pytest.mark.parametrize("call", EXECUTOR_CALLS)
def test_a_wrong_exec_id_is_409_and_changes_nothing(executor, started, call):
    before = snapshot(started["id"])
    response = executor.post(f"{started['id']}/{call}", {"exec_id": str(uuid.uuid4())})
    error(response, 409, "stale_exec_id")
    assert snapshot(started["id"]) == before


def test_starting_twice_or_reporting_before_the_start_is_409(submitter, executor):
    submitter.ok("POST", "", {"definition": "test/basic"}, expect=201)
    (task,) = executor.ok("POST", "poll", {"definitions": ["test/basic"]})["tasks"]
    for call in ("notify", "success", "fail"):
        before = snapshot(task["id"])
        error(
            executor.post(f"{task['id']}/{call}", {"exec_id": task["exec_id"]}), 409, "wrong_state"
        )
        assert snapshot(task["id"]) == before
    executor.ok("POST", f"{task['id']}/start", {"exec_id": task["exec_id"]})
    error(executor.post(f"{task['id']}/start", {"exec_id": task["exec_id"]}), 409, "wrong_state")


def test_calls_on_a_done_task_are_409(submitter, executor, started):
    executor.ok(
        "POST",
        f"{started['id']}/success",
        {"exec_id": started["exec_id"], "result": {"sent": True}},
    )
    before = snapshot(started["id"])
    for call in EXECUTOR_CALLS:
        error(
            executor.post(f"{started['id']}/{call}", {"exec_id": started["exec_id"]}),
            409,
            "task_done",
        )
    error(submitter.post(f"{started['id']}/cancel"), 409, "task_done")
    assert snapshot(started["id"]) == before


# --- 422: schemas ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "path"),
    [
        (None, "/params"),
        ({}, "/params"),
        ({"invoiceId": "7"}, "/params/invoiceId"),
        ({"invoiceId": 7, "customer": {"email": "x" * 51}}, "/params/customer/email"),
        ({"invoiceId": 7, "customer": {}}, "/params/customer"),
    ],
)
def test_params_violating_the_schema_are_422_naming_the_path(submitter, params, path):
    body = {"definition": "billing/send-invoice", "params": params}
    found = error(submitter.post("", body), 422, "schema_violation")
    assert found["path"] == path
    assert path in found["message"] or path == "/params"
    assert not Task.objects.exists()


def test_a_result_violating_the_schema_is_422_and_changes_nothing(executor, started):
    before = snapshot(started["id"])
    response = executor.post(
        f"{started['id']}/success", {"exec_id": started["exec_id"], "result": {"sent": "yes"}}
    )
    assert error(response, 422, "schema_violation")["path"] == "/result/sent"
    assert snapshot(started["id"]) == before


def test_an_error_violating_the_schema_is_422_and_changes_nothing(executor, started):
    before = snapshot(started["id"])
    response = executor.post(
        f"{started['id']}/fail", {"exec_id": started["exec_id"], "error": {"code": 5}}
    )
    assert error(response, 422, "schema_violation")["path"] == "/error/code"
    assert snapshot(started["id"]) == before


@pytest.mark.parametrize(
    "body",
    [
        {"definition": "test/basic", "label": "a\x00b"},
        {"definition": "test/basic", "params": {"k": ["\x00"]}},
        {"definition": "test/basic", "params": {"\x00": 1}},
    ],
)
def test_nul_characters_are_400_everywhere(submitter, body):
    """PostgreSQL cannot store them; every database refuses them alike."""
    error(submitter.post("", body), 400, "invalid_request")
    assert not Task.objects.exists()


def test_unknown_urls_under_the_api_are_json_404s(submitter):
    error(submitter.get("nothing/here"), 404, "not_found")
    error(submitter.get("abc"), 404, "not_found")
    error(submitter.post("abc/start", {"exec_id": str(uuid.uuid4())}), 404, "not_found")
    error(submitter.get(str(2**64)), 404, "not_found")


# --- 503 ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [("POST", "poll", {"definitions": ["billing/send-invoice"]}), ("GET", "1", None)],
)
def test_a_database_that_does_not_answer_is_503_json(executor, monkeypatch, method, path, body):
    """A lost or refused connection (a restart, an outage) is a JSON 503 with Retry-After,
    not Django's HTML error page; the next call works again."""
    from django.db import OperationalError

    from django_tasks_coord.api import auth

    real = auth.authorized

    def down(*args, **kwargs):
        raise OperationalError('connection to server at "127.0.0.1" failed: Connection refused')

    monkeypatch.setattr(auth, "authorized", down)
    response = executor.call(method, path, body)
    error(response, 503, "database_unavailable")
    assert response["Retry-After"] == "1"
    monkeypatch.setattr(auth, "authorized", real)
    assert executor.call(method, path, body).status_code in (200, 404)


def test_other_database_errors_are_not_hidden_behind_a_503(executor, monkeypatch):
    from django.db import IntegrityError

    from django_tasks_coord.api import auth

    def broken(*args, **kwargs):
        raise IntegrityError("duplicate key value violates unique constraint")

    monkeypatch.setattr(auth, "authorized", broken)
    with pytest.raises(IntegrityError):
        executor.call("GET", "definitions")
