"""Recording OpenTelemetry spans in tests: the SDK's in-memory exporter, no global state.

:func:`recording` points :mod:`django_tasks_coord.tracing` at a tracer provider of the test's
own (the process-wide provider is never set, so other tests keep the no-op tracer and tasks
without a ``traceparent``), and returns the exporter and a tracer for the test's spans.
"""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_tasks_coord import tracing


def recording(monkeypatch: pytest.MonkeyPatch) -> tuple[InMemorySpanExporter, trace.Tracer]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_tracer", lambda: provider.get_tracer("django_tasks_coord"))
    return exporter, provider.get_tracer("tests")


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    """The finished spans called ``name``."""
    return [span for span in exporter.get_finished_spans() if span.name == name]


def traceparent_of(span: Any) -> str:
    """The W3C ``traceparent`` of a span (what an executor sends)."""
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
