"""Tracing through a node: the enqueue and the run of a task share one trace."""

from __future__ import annotations

import pytest
from opentelemetry import context, trace
from opentelemetry.trace import SpanKind, StatusCode

from django_tasks_coord import handlers, queue, tracing
from django_tasks_coord.models import Task
from tests.node.conftest import run
from tests.otel import named, recording, traceparent_of


@pytest.fixture
def spans(monkeypatch):
    return recording(monkeypatch)


def test_an_enqueue_in_a_request_span_and_its_run_share_one_trace(make_node, work_topic, spans):
    exporter, tracer = spans
    with tracer.start_as_current_span("GET /checkout", kind=SpanKind.SERVER) as request:
        pushed = queue.push("work", "traced")
    stored = Task.objects.get(pk=pushed.pk).traceparent
    (producer,) = named(exporter, "send work")
    assert stored == traceparent_of(producer)
    assert run(make_node()) == 0

    (consumer,) = named(exporter, "process work")
    trace_id = request.get_span_context().trace_id
    assert producer.context.trace_id == consumer.context.trace_id == trace_id
    assert producer.parent.span_id == request.get_span_context().span_id
    assert consumer.parent.span_id == producer.context.span_id
    assert (producer.kind, consumer.kind) == (SpanKind.PRODUCER, SpanKind.CONSUMER)
    for span, operation in ((producer, "send"), (consumer, "process")):
        assert span.attributes["messaging.system"] == tracing.SYSTEM
        assert span.attributes["messaging.destination.name"] == "work"
        assert span.attributes["messaging.message.id"] == str(pushed.pk)
        assert span.attributes["messaging.operation.type"] == operation


def test_a_failed_run_is_an_error_span(make_node, work_topic, spans):
    exporter, _ = spans
    queue.push("work", "flaky", {"fail_times": 1})
    assert run(make_node()) == 0
    # The first attempt fails; its retry (0.2 s later) may run before the burst ends.
    first, *retry = named(exporter, "process work")
    assert first.status.status_code is StatusCode.ERROR
    assert [event.name for event in first.events] == ["exception"]
    assert [span.status.status_code for span in retry] in ([], [StatusCode.UNSET])


def test_a_batch_links_every_producer(make_node, spans):
    exporter, tracer = spans
    queue.register_topic("batch")
    handlers.registry.register("batch", lambda tasks: None, batch=True)
    with tracer.start_as_current_span("request"):
        pushed = queue.push_many("batch", [("a", None), ("b", None), ("c", None)])
    assert len({task.traceparent for task in pushed}) == 3
    assert run(make_node(topics=["batch"], batch_size=10)) == 0
    (consumer,) = named(exporter, "process batch")
    producers = {span.context.span_id for span in named(exporter, "send batch")}
    assert {link.context.span_id for link in consumer.links} == producers
    assert consumer.attributes["messaging.batch.message_count"] == 3


def test_without_an_sdk_nothing_is_stored(make_node, work_topic):
    """The API alone (no tracer provider configured) records nothing and stores nothing."""
    assert trace.get_current_span().get_span_context().is_valid is False
    pushed = queue.push("work", "untraced")
    assert Task.objects.get(pk=pushed.pk).traceparent is None
    assert run(make_node()) == 0


def test_without_an_sdk_a_received_trace_is_carried_on(make_node, work_topic):
    """No SDK, but a caller's ``traceparent``: the task pushed under it stores it, and a
    task its run pushes carries the same trace on (nothing is recorded)."""
    caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    queue.register_topic("child")
    handlers.registry.register("work", lambda task: queue.push("child", f"of-{task.identifier}"))
    token = context.attach(tracing.context_of(caller))
    try:
        pushed = queue.push("work", "traced-by-caller")
    finally:
        context.detach(token)
    assert Task.objects.get(pk=pushed.pk).traceparent == caller
    assert run(make_node()) == 0
    child = Task.objects.get(topic_id="child")
    assert child.traceparent == caller  # a no-op span has its parent's context


def test_without_opentelemetry_nothing_happens(make_node, work_topic, monkeypatch):
    monkeypatch.setattr(tracing, "trace", None)
    assert not tracing.enabled()
    pushed = queue.push("work", "no-otel")
    assert Task.objects.get(pk=pushed.pk).traceparent is None
    assert run(make_node()) == 0
