"""Tracing through the HTTP API: a task created by a traced caller carries its trace, and an
executor that passes ``traceparent`` joins it."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from opentelemetry.propagate import extract
from opentelemetry.trace import SpanKind

from django_tasks_coord import executions
from django_tasks_coord.models import Task
from tests.api.conftest import make_user
from tests.otel import named, recording, traceparent_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def spans(monkeypatch):
    return recording(monkeypatch)


def call(token: str, path: str, body: dict, traceparent: str | None = None) -> dict:
    headers = {"Authorization": f"Bearer {token}"}
    if traceparent:
        headers["traceparent"] = traceparent
    response = Client().post(
        f"/tasks/{path}", json.dumps(body), content_type="application/json", headers=headers
    )
    assert response.status_code in (200, 201), response.content
    return json.loads(response.content)


def test_an_executor_passing_traceparent_joins_the_trace(spans):
    exporter, tracer = spans
    with tracer.start_as_current_span("POST /orders", kind=SpanKind.SERVER) as request:
        created = executions.create("test/basic", {"order": 7})
    _, token = make_user("executor", "execute_tasks")
    (polled,) = call(token, "poll", {"definitions": ["test/basic"]})["tasks"]
    (producer,) = named(exporter, "send test/basic")
    assert polled["id"] == created.pk
    assert polled["traceparent"] == traceparent_of(producer)  # the API returns it

    # The executor (in any language) starts its span under it and passes its own on.
    with tracer.start_as_current_span(
        "executor: send order", context=extract({"traceparent": polled["traceparent"]})
    ) as work:
        mine = traceparent_of(work)
        call(token, f"{polled['id']}/start", {"exec_id": polled["exec_id"]}, mine)
        call(token, f"{polled['id']}/success", {"exec_id": polled["exec_id"]}, mine)

    trace_id = request.get_span_context().trace_id
    (start,) = named(exporter, "start task")
    (success,) = named(exporter, "success task")
    (executor_span,) = named(exporter, "executor: send order")
    assert executor_span.parent.span_id == producer.context.span_id
    for span in (producer, executor_span, start, success):
        assert span.context.trace_id == trace_id
    assert start.parent.span_id == success.parent.span_id == work.get_span_context().span_id
    assert start.attributes["messaging.message.id"] == str(created.pk)


def test_a_task_created_over_http_is_a_child_of_the_callers_span(spans):
    exporter, tracer = spans
    _, token = make_user("alice", "submit_tasks")
    with tracer.start_as_current_span("caller in another service") as caller:
        theirs = traceparent_of(caller)
    created = call(token, "", {"definition": "test/basic", "params": {}}, theirs)
    (producer,) = named(exporter, "send test/basic")
    assert producer.parent.span_id == caller.get_span_context().span_id
    assert producer.context.trace_id == caller.get_span_context().trace_id
    assert created["traceparent"] == Task.objects.get(pk=created["id"]).traceparent


def test_a_malformed_traceparent_is_ignored(spans):
    exporter, _ = spans
    _, token = make_user("alice", "submit_tasks")
    created = call(token, "", {"definition": "test/basic"}, "00-not-a-trace-01")
    (producer,) = named(exporter, "send test/basic")
    assert producer.parent is None  # a root span of its own
    assert created["traceparent"] == traceparent_of(producer)
