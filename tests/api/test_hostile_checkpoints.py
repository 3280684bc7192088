"""Hostile input in ``notify``'s ``checkpoints``, as a client in another language sends it: lone
surrogates and NULs in names and values (JSON escapes in the raw body), deep nesting, bodies
over the size limit, the wrong types, too many checkpoints, names too long. Every answer is a
JSON 4xx with a clear message, never a 5xx, and a refused call writes nothing: no checkpoint
(not even the valid ones sent with a bad one), no heartbeat, no progress."""

from __future__ import annotations

import json

import pytest
from django.test import override_settings

from django_tasks_coord import executions, running, validation
from django_tasks_coord.api import openapi
from django_tasks_coord.exceptions import InvalidArgumentError
from django_tasks_coord.models import Checkpoint, Task
from tests.api.conftest import Api, run_one
from tests.api.test_hostile_input import error, nested, raw

pytestmark = pytest.mark.django_db


@pytest.fixture
def started(submitter: Api, executor: Api) -> dict:
    """A task started by ``executor``, with one checkpoint stored already."""
    submitter.ok("POST", "", {"definition": "test/basic"}, expect=201)
    task = run_one(executor)
    body = {"exec_id": task["exec_id"], "checkpoints": {"first": 1}}
    executor.ok("POST", f"{task['id']}/notify", body)
    return task


def unchanged(task: dict) -> tuple[dict, list]:
    """What a refused call must leave as it was: the task's row and its checkpoints."""
    row = Task.objects.filter(pk=task["id"]).values().get()
    return row, list(Checkpoint.objects.filter(task_id=task["id"]).values_list("name", "value"))


def notify(executor: Api, task: dict, checkpoints: str, extra: str = ""):
    """POST notify with ``checkpoints`` written as raw JSON (escapes reach the server as written)."""
    body = f'{{"exec_id": "{task["exec_id"]}"{extra}, "checkpoints": {checkpoints}}}'
    return raw(executor, f"{task['id']}/notify", body)


@pytest.mark.parametrize("escape", [r"\ud800", r"\udfff", r"\u0000", r"x\udc00\ud800y"])
@pytest.mark.parametrize(
    ("template", "path"),
    [
        ('{{"{bad}": 1}}', "/checkpoints/{name}"),
        ('{{"ok": 1, "step": "{bad}"}}', "/checkpoints/step"),
        ('{{"ok": 1, "step": {{"a": [0, "{bad}"]}}}}', "/checkpoints/step/a/1"),
        ('{{"step": {{"{bad}": true}}}}', "/checkpoints/step/{name}"),
    ],
)
def test_a_lone_surrogate_or_nul_in_a_name_or_value_is_400_and_writes_nothing(
    executor, started, escape, template, path
):
    before = unchanged(started)
    response = notify(executor, started, template.format(bad=escape), ', "progress": 50')
    found = error(response, 400, "invalid_request")
    assert found["path"] == path.format(name=json.loads(f'"{escape}"'))
    assert unchanged(started) == before


@pytest.mark.parametrize(
    ("checkpoints", "code"),
    [
        (nested(3000), "invalid_json"),  # unreadable
        ('{"deep": ' + nested(1200) + "}", "invalid_request"),
        ('{"deep": ' + nested(validation.MAX_JSON_DEPTH) + "}", "invalid_request"),
    ],
)
def test_deep_nesting_is_400_and_writes_nothing(executor, started, checkpoints, code):
    before = unchanged(started)
    found = error(notify(executor, started, checkpoints), 400, code)
    if code == "invalid_request":
        assert found["path"] == "/checkpoints/deep" + "/0" * (validation.MAX_JSON_DEPTH - 1)
    assert unchanged(started) == before


def test_a_value_as_deep_as_the_limit_allows_is_stored(executor, started):
    """The body's ``checkpoints`` object is one level: its values may nest one less."""
    deepest = json.loads(nested(validation.MAX_JSON_DEPTH - 1))
    done = json.loads(notify(executor, started, json.dumps({"deep": deepest})).content)
    assert done["checkpoints"]["deep"] == deepest


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000)
def test_a_body_over_the_size_limit_is_a_json_413_and_writes_nothing(executor, started):
    before = unchanged(started)
    found = error(notify(executor, started, json.dumps({"big": "x" * 1000})), 413, "body_too_large")
    assert "DATA_UPLOAD_MAX_MEMORY_SIZE" in found["message"]
    assert unchanged(started) == before


@pytest.mark.parametrize(
    ("checkpoints", "said"),
    [
        ("[1, 2]", "is not of type 'object'"),
        ('[["a", 1]]', "is not of type 'object'"),
        ("null", "is not of type 'object'"),
        ('"a"', "is not of type 'object'"),
        ("7", "is not of type 'object'"),
        ("true", "is not of type 'object'"),
        ('{"": 1}', "non-empty"),
        ('{"tasks_coord.step": 1}', "reserved"),
        ('{"ok": 1, "tasks_coord.step": 1}', "reserved"),
        ('{"ok": 1, "nan": 1e400}', "JSON"),  # infinity: no JSON value
    ],
)
def test_the_wrong_types_and_names_are_400_with_a_clear_message(
    executor, started, checkpoints, said
):
    before = unchanged(started)
    found = error(notify(executor, started, checkpoints), 400, "invalid_request")
    assert said in found["message"]
    assert unchanged(started) == before


def test_an_over_long_name_is_400_and_one_of_the_limit_is_stored(executor, started):
    limit = running.CHECKPOINT_NAME_MAX_LENGTH
    before = unchanged(started)
    for name in ("x" * (limit + 1), "\U0001f600" * (limit + 1)):
        found = error(notify(executor, started, json.dumps({name: 1})), 400, "invalid_request")
        assert str(limit) in found["message"]
        assert unchanged(started) == before
    longest = {"x" * limit: 1, "\U0001f600" * limit: 2}  # 4-byte characters: 800 bytes
    done = json.loads(notify(executor, started, json.dumps(longest)).content)
    assert done["checkpoints"] == {"first": 1, **longest}


def test_too_many_checkpoints_in_one_call_are_400_and_writes_nothing(executor, started):
    limit = running.CHECKPOINTS_PER_NOTIFY
    before = unchanged(started)
    many = json.dumps({f"step-{n}": n for n in range(limit + 1)})
    found = error(notify(executor, started, many), 400, "invalid_request")
    assert str(limit) in found["message"]
    assert unchanged(started) == before
    # 10,000 fit in the default body size limit: refused just the same, before any write
    many = json.dumps({f"step-{n}": n for n in range(10_000)})
    error(notify(executor, started, many), 400, "invalid_request")
    assert unchanged(started) == before
    exactly = {f"step-{n}": n for n in range(limit)}
    done = json.loads(notify(executor, started, json.dumps(exactly)).content)
    assert done["checkpoints"] == {"first": 1, **exactly}


def test_python_callers_get_the_same_checks(started):
    task = Task.objects.get(pk=started["id"])
    for bad in ({"\ud800": 1}, {"a\x00": 1}, {"step": "\udc00"}, {"step": {"k": [0, "\x00"]}}):
        with pytest.raises(InvalidArgumentError, match="cannot be stored"):
            executions.notify(task.pk, task.exec_id, checkpoints=bad)
    too_many = {f"step-{n}": n for n in range(running.CHECKPOINTS_PER_NOTIFY + 1)}
    with pytest.raises(InvalidArgumentError, match="at most"):
        executions.notify(task.pk, task.exec_id, checkpoints=too_many)
    for name, value in (("\ud800", 1), ("step", "\x00"), ("step", [["\udfff"]])):
        with pytest.raises(InvalidArgumentError, match="cannot be stored"):
            running.checkpoint(name, value, task)
    assert unchanged(started)[1] == [("first", 1)]


def test_the_published_schema_states_the_limit_the_service_applies():
    schema = openapi.SCHEMAS["NotifyRequest"]["properties"]["checkpoints"]
    assert schema["maxProperties"] == running.CHECKPOINTS_PER_NOTIFY
    assert f"at most {running.CHECKPOINTS_PER_NOTIFY} per call" in schema["description"]


def test_a_large_refused_value_is_named_by_its_size_not_quoted_whole(executor, started):
    for checkpoints, said in (
        (json.dumps(list(range(10_000))), "an array of 10000 items is not of type 'object'"),
        (json.dumps({f"s{n}": n for n in range(10_000)}), "an object of 10000 properties"),
    ):
        found = error(notify(executor, started, checkpoints), 400, "invalid_request")
        assert said in found["message"]
        assert len(found["message"]) < 300, found["message"][:300]
