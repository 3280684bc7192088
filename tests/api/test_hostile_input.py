"""Hostile input, as a client in another language sends it: lone surrogates and NULs (written as
JSON escapes in the raw body), deep nesting, bodies over the size limit, the wrong Content-Type,
HEAD. Every answer is a JSON 4xx in the API's error shape, never a 5xx or an HTML page, and a
refused call changes nothing. The same through a live ASGI server: test_e2e.py."""

from __future__ import annotations

import json

import pytest
from django.test import override_settings

from django_tasks_coord import definitions, executions, queue, validation
from django_tasks_coord.exceptions import PayloadError
from django_tasks_coord.models import Task
from tests.api.conftest import Api, run_one

pytestmark = pytest.mark.django_db


def error(response, status: int, code: str) -> dict:
    """The error of a JSON error response (never HTML, never 5xx)."""
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"] == "application/json"
    body = json.loads(response.content)["error"]
    assert body["code"] == code
    assert body["message"]
    return body


def raw(api: Api, path: str, body: bytes | str, content_type: str = "application/json"):
    """POST ``body`` byte for byte (the JSON escapes reach the server as written)."""
    headers = {"Authorization": f"Bearer {api.token}"}
    return api.client.generic(
        "POST", f"/tasks/{path}", body, content_type=content_type, headers=headers
    )


def nested(depth: int) -> str:
    """A JSON array nested ``depth`` levels deep."""
    return "[" * depth + "]" * depth


def snapshot(task_id: int) -> dict:
    return Task.objects.filter(pk=task_id).values().get()


# --- lone surrogates and NULs --------------------------------------------------------------------

CREATE_BODIES = [
    # (the raw body, the path of the offending value)
    (r'{"definition": "test/basic", "params": {"a": [0, 1, "\ud800"]}}', "/params/a/2"),
    (r'{"definition": "test/basic", "params": "\ud800"}', "/params"),
    (r'{"definition": "test/basic", "params": {"\udfff": 1}}', "/params/\udfff"),
    (r'{"definition": "test/basic", "params": ["ok", "x\udc00\ud800y"]}', "/params/1"),
    (r'{"definition": "test/basic", "label": "\ud800"}', "/label"),
    (r'{"definition": "test/basic", "params": {"a": [0, 1, "\u0000"]}}', "/params/a/2"),
    (r'{"definition": "test/basic", "params": {"\u0000": 1}}', "/params/\x00"),
    (r'{"definition": "test/basic", "label": "a\u0000b"}', "/label"),
]


@pytest.mark.parametrize(("body", "path"), CREATE_BODIES)
def test_a_lone_surrogate_or_nul_in_create_is_400_with_its_path(submitter, body, path):
    found = error(raw(submitter, "", body), 400, "invalid_request")
    assert found["path"] == path
    assert not Task.objects.exists()


@pytest.mark.parametrize("escape", [r"\ud800", r"\u0000"])
@pytest.mark.parametrize(
    ("call", "template", "path"),
    [
        (
            "success",
            '{{"exec_id": "{exec_id}", "result": {{"a": [0, 1, "{bad}"]}}}}',
            "/result/a/2",
        ),
        ("success", '{{"exec_id": "{exec_id}", "result": "{bad}"}}', "/result"),
        ("fail", '{{"exec_id": "{exec_id}", "error": {{"a": [0, 1, "{bad}"]}}}}', "/error/a/2"),
        ("fail", '{{"exec_id": "{exec_id}", "error": {{"{bad}": true}}}}', None),
    ],
)
def test_a_lone_surrogate_or_nul_in_a_result_or_error_is_400(
    submitter, executor, escape, call, template, path
):
    submitter.ok("POST", "", {"definition": "test/basic"}, expect=201)
    task = run_one(executor)
    before = snapshot(task["id"])
    body = template.format(exec_id=task["exec_id"], bad=escape)
    found = error(raw(executor, f"{task['id']}/{call}", body), 400, "invalid_request")
    assert found["path"] == (path or "/error/" + json.loads(f'"{escape}"'))
    assert snapshot(task["id"]) == before


@pytest.mark.parametrize("escape", [r"\ud800", r"\u0000"])
def test_a_lone_surrogate_or_nul_in_a_definition_name_is_400(executor, escape):
    found = error(
        raw(executor, "poll", f'{{"definitions": ["x{escape}"]}}'), 400, "invalid_request"
    )
    assert found["path"] == "/definitions/0"


def test_a_surrogate_pair_is_text_and_is_stored(submitter):
    created = json.loads(
        raw(
            submitter,
            "",
            r'{"definition": "test/basic", "params": "\ud83d\ude00", "label": "\ud83d\ude00"}',
        ).content
    )
    assert created["params"] == created["label"] == "\U0001f600"
    assert Task.objects.get().payload == "\U0001f600"


def test_python_callers_get_the_same_check(db):
    with pytest.raises(PayloadError) as caught:
        executions.create("test/basic", {"a": [0, 1, "\ud800"]})
    assert caught.value.path == "/params/a/2"
    with pytest.raises(PayloadError, match=r"lone surrogate"):
        executions.create("test/basic", {"a": "\udc00"})
    with pytest.raises(ValueError, match=r"label holds a NUL"):
        executions.create("test/basic", label="\x00")
    queue.register_topic("plain")
    with pytest.raises(PayloadError) as caught:
        queue.push("plain", "a", json.loads(nested(validation.MAX_JSON_DEPTH + 1)))
    assert caught.value.path == "/payload" + "/0" * validation.MAX_JSON_DEPTH
    with pytest.raises(PayloadError, match=r"payload/k holds a lone surrogate"):
        queue.push("plain", "a", {"k": "\ud800"})
    with pytest.raises(ValueError, match=r"identifier holds a NUL"):
        queue.push("plain", "a\x00", {})
    assert not Task.objects.exists()


@pytest.mark.parametrize(
    "execute_at", ["2030-01-01T09:60:00Z", "2030-02-30T09:00:00Z", "2030-01-01T25:00:00+01:00"]
)
def test_an_execute_at_that_is_no_time_is_400(submitter, execute_at):
    body = json.dumps({"definition": "test/basic", "execute_at": execute_at})
    assert error(raw(submitter, "", body), 400, "invalid_request")["path"] == "/execute_at"
    assert not Task.objects.exists()


# --- nesting ----------------------------------------------------------------------------------


def test_3000_levels_of_nesting_are_400_not_a_recursion_error(submitter, executor):
    body = '{"definition": "test/basic", "params": ' + nested(3000) + "}"
    found = error(raw(submitter, "", body), 400, "invalid_json")
    assert str(validation.MAX_JSON_DEPTH) in found["message"]
    error(raw(executor, "poll", nested(3000)), 400, "invalid_json")
    assert not Task.objects.exists()


@pytest.mark.django_db(transaction=True)  # a long-poll checks its token in another thread
def test_3000_levels_of_nesting_in_a_long_poll_are_400(executor):
    error(raw(executor, "long-poll", nested(3000)), 400, "invalid_json")
    body = '{"definitions": ["test/basic"], "timeout": 0, "x": ' + nested(3000) + "}"
    error(raw(executor, "long-poll", body), 400, "invalid_json")


@pytest.mark.parametrize("depth", [validation.MAX_JSON_DEPTH + 1, 1200])
def test_params_deeper_than_the_limit_are_400_with_a_path(submitter, depth):
    body = '{"definition": "test/basic", "params": ' + nested(depth) + "}"
    found = error(raw(submitter, "", body), 400, "invalid_request")
    assert found["path"] == "/params" + "/0" * validation.MAX_JSON_DEPTH
    assert not Task.objects.exists()


def test_values_as_deep_as_the_limit_are_stored_validated_and_returned(submitter, executor):
    """The deepest allowed value goes through a recursive schema, the database and back."""
    definitions.define(
        "test/deep",
        params_schema={
            "$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
            "$ref": "#/$defs/n",
        },
        result_schema={
            "$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
            "$ref": "#/$defs/n",
        },
    )
    deepest = json.loads(nested(validation.MAX_JSON_DEPTH))
    created = submitter.ok("POST", "", {"definition": "test/deep", "params": deepest}, expect=201)
    assert created["params"] == deepest
    task = run_one(executor, "test/deep")
    done = executor.ok(
        "POST", f"{task['id']}/success", {"exec_id": task["exec_id"], "result": deepest}
    )
    assert done["result"] == deepest
    assert submitter.ok("GET", str(task["id"]))["params"] == deepest


# --- batch completions: each report's values are checked where they are ----------------------


def claimed(definition: str = "test/basic", count: int = 1) -> list[Task]:
    for _ in range(count):
        executions.create(definition)
    return executions.poll([definition], count, start=True)


REPORTS = (
    '{{"tasks": [{{"id": {}, "exec_id": "{}", "outcome": "succeeded", "result": [1]}}, '
    '{{"id": {}, "exec_id": "{}", "outcome": "failed", "error": {{"a": [0, "{}"]}}}}]}}'
)


@pytest.mark.parametrize("escape", [r"\ud800", r"\u0000"])
def test_a_lone_surrogate_or_nul_in_a_batch_is_400_with_its_path_and_changes_nothing(
    executor, escape
):
    ok, bad = claimed(count=2)
    before = [snapshot(ok.pk), snapshot(bad.pk)]
    body = REPORTS.format(ok.pk, ok.exec_id, bad.pk, bad.exec_id, escape)
    found = error(raw(executor, "complete", body), 400, "invalid_request")
    assert found["path"] == "/tasks/1/error/a/1"
    assert [snapshot(ok.pk), snapshot(bad.pk)] == before


def test_results_as_deep_as_the_limit_are_accepted_in_a_batch_and_deeper_ones_refused(executor):
    """The limit applies to each report's result, not to the body around it."""
    definitions.define("test/deep-batch")
    first, second = claimed("test/deep-batch", 2)
    deepest = json.loads(nested(validation.MAX_JSON_DEPTH))
    report = {"id": first.pk, "exec_id": str(first.exec_id), "outcome": "succeeded"}
    too_deep = {
        "id": second.pk,
        "exec_id": str(second.exec_id),
        "outcome": "succeeded",
        "result": [deepest],
    }
    found = error(
        raw(executor, "complete", json.dumps({"tasks": [report, too_deep]})), 400, "invalid_request"
    )
    assert found["path"] == "/tasks/1/result" + "/0" * validation.MAX_JSON_DEPTH
    (result,) = executor.ok("POST", "complete", {"tasks": [{**report, "result": deepest}]})[
        "results"
    ]
    assert result["ok"], result
    assert Task.objects.get(pk=first.pk).result == deepest


def test_3000_levels_of_nesting_in_a_batch_are_400(executor):
    (task,) = claimed()
    before = snapshot(task.pk)
    error(raw(executor, "complete", '{"tasks": ' + nested(3000) + "}"), 400, "invalid_json")
    assert snapshot(task.pk) == before


# --- size and media type ----------------------------------------------------------------------


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000)
@pytest.mark.parametrize("path", ["", "poll", "long-poll", "claim", "complete"])
def test_a_body_over_the_size_limit_is_a_json_413(submitter, path):
    body = json.dumps({"definition": "test/basic", "params": "x" * 1000})
    found = error(raw(submitter, path, body), 413, "body_too_large")
    assert "DATA_UPLOAD_MAX_MEMORY_SIZE" in found["message"] and "1000" in found["message"]
    assert not Task.objects.exists()


def test_a_body_over_the_default_size_limit_is_a_json_413(submitter):
    body = json.dumps({"definition": "test/basic", "params": "x" * (2621440 + 1)})
    error(raw(submitter, "", body), 413, "body_too_large")
    assert not Task.objects.exists()


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/jsonx",
        "application/json; charset=latin-1",
        "",
    ],
)
def test_a_body_of_another_media_type_is_415(submitter, content_type):
    response = raw(submitter, "", '{"definition": "test/basic"}', content_type=content_type)
    error(response, 415, "unsupported_media_type")
    assert not Task.objects.exists()


@pytest.mark.parametrize(
    "content_type",
    ["application/json", "application/json; charset=utf-8", "Application/JSON; Charset=UTF-8"],
)
def test_json_with_or_without_its_charset_is_accepted(submitter, content_type):
    response = raw(submitter, "", '{"definition": "test/basic"}', content_type=content_type)
    assert response.status_code == 201, response.content


# --- HEAD ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["", "{id}", "definitions", "openapi.json", "?limit=1"])
def test_head_answers_like_get_without_a_body(submitter, path):
    task = submitter.ok("POST", "", {"definition": "test/basic"}, expect=201)
    url = "/tasks/" + path.replace("{id}", str(task["id"]))
    headers = {"Authorization": f"Bearer {submitter.token}"}
    got = submitter.client.get(url, headers=headers)
    head = submitter.client.head(url, headers=headers)
    assert (head.status_code, got.status_code) == (200, 200)
    assert head.content == b""
    assert head["Content-Type"] == got["Content-Type"] == "application/json"
    assert int(head["Content-Length"]) == len(got.content)


def test_head_is_refused_where_get_is_with_a_json_405(submitter):
    task = submitter.ok("POST", "", {"definition": "test/basic"}, expect=201)
    headers = {"Authorization": f"Bearer {submitter.token}"}
    response = submitter.client.head(f"/tasks/{task['id']}/cancel", headers=headers)
    assert response.status_code == 405
    assert response["Allow"] == "POST"
    response = submitter.client.put("/tasks/", headers=headers)
    assert json.loads(response.content)["error"]["code"] == "method_not_allowed"
    assert response["Allow"] == "GET, HEAD, POST"
