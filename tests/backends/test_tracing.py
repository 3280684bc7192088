"""Tracing a Django ``@task``: the enqueue in a request span and the run share one trace."""

from __future__ import annotations

import pytest
from opentelemetry.trace import SpanKind

from django_tasks_coord.models import Task as TaskRow
from tests.backends import tasks
from tests.backends.test_backend import run_node
from tests.otel import named, recording, traceparent_of


@pytest.mark.django_db(transaction=True)
def test_an_enqueue_in_a_request_span_and_its_run_share_one_trace(monkeypatch):
    exporter, tracer = recording(monkeypatch)
    with tracer.start_as_current_span("POST /signup", kind=SpanKind.SERVER) as request:
        result = tasks.add.enqueue(1, 2)
    run_node("default")
    assert tasks.add.get_result(result.id).return_value == 3

    (producer,) = named(exporter, "send default")
    (consumer,) = named(exporter, "process default")
    assert producer.parent.span_id == request.get_span_context().span_id
    assert consumer.parent.span_id == producer.context.span_id
    assert consumer.context.trace_id == request.get_span_context().trace_id
    row = TaskRow.objects.get(topic_id="default")
    assert row.traceparent == traceparent_of(producer)
    assert consumer.attributes["messaging.message.id"] == str(row.pk)


@pytest.mark.django_db(transaction=True)
def test_enqueue_many_gives_each_task_a_producer_span_of_its_own(monkeypatch):
    exporter, tracer = recording(monkeypatch)
    with tracer.start_as_current_span("POST /import", kind=SpanKind.SERVER) as request:
        results = tasks.add.enqueue_many([((1, 2), {}), ((3, 4), {}), ((5, 6), {})])
    producers = named(exporter, "send default")
    assert len(producers) == 3
    assert {p.parent.span_id for p in producers} == {request.get_span_context().span_id}
    rows = {row.identifier: row for row in TaskRow.objects.filter(topic_id="default")}
    stored = [rows[result.id] for result in results]
    assert [row.traceparent for row in stored] == [traceparent_of(p) for p in producers]
    assert [p.attributes["messaging.message.id"] for p in producers] == [
        str(row.pk) for row in stored
    ]
