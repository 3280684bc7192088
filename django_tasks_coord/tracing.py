"""OpenTelemetry tracing: a producer span per task pushed, a consumer span per run.

Optional: install the ``[otel]`` extra (``opentelemetry-api``) and configure an SDK
(a tracer provider and an exporter) in your project as usual. Without the API package,
every function here does nothing and no task carries a trace. With the API and no SDK,
nothing is recorded and no span is made (a task costs no tracing), except that a trace
received from a caller (a ``traceparent``) is carried on to the tasks pushed under it.

- Every insertion of a task (``queue.push``/``push_many``, a ``django.tasks`` enqueue,
  a task created through the HTTP API, a job's run submitted by the scheduler, a
  recreated task) opens a ``PRODUCER`` span ``send <topic>``, a child of the span
  current at that moment (an HTTP request's, say). Its W3C ``traceparent`` is stored
  on the task (``Task.traceparent``).
- A node runs the task inside a ``CONSUMER`` span ``process <topic>``, a child of that
  producer span: the request that enqueued a task and the run of the task share one
  trace. A batch handler runs in one span with a link to each task's producer.
- The HTTP API hands the stored ``traceparent`` to executors (the ``traceparent``
  header and field of a polled task) and accepts theirs on start, notify and outcome
  requests, so that an executor's spans join the trace.

Attributes follow OpenTelemetry's messaging semantic conventions:
``messaging.system`` (:data:`SYSTEM`), ``messaging.destination.name`` (the topic),
``messaging.message.id`` (the task's sequence number), ``messaging.operation.type``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from django_tasks_coord import __version__
from django_tasks_coord.enums import Decision, Result

try:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the [otel] extra is not installed: tracing is off
    trace = None  # type: ignore[assignment]


if TYPE_CHECKING:
    from django_tasks_coord.models import Task

#: ``messaging.system`` of every span.
SYSTEM = "django_tasks_coord"
#: A W3C ``traceparent`` value (version 00): trace id, parent span id, flags.
TRACEPARENT = re.compile(r"^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$")

__all__ = [
    "SYSTEM",
    "api_call",
    "consuming",
    "context_of",
    "enabled",
    "producing",
    "producing_rows",
    "valid_traceparent",
]

#: The tracer while no SDK is configured: its spans record nothing, but a span made
#: under a valid parent (a stored or received ``traceparent``) carries its context on.
_NO_SDK_TRACER = trace.NoOpTracer() if trace is not None else None

#: HTTP API operations an executor calls about one task: each gets a span of its own.
EXECUTOR_OPERATIONS = frozenset({"start", "notify", "success", "fail"})


def enabled() -> bool:
    """Whether ``opentelemetry-api`` is installed (spans are recorded only with an SDK)."""
    return trace is not None


def _tracer() -> Any:
    """The package's tracer; None while no SDK is configured (every span would record
    nothing: OpenTelemetry's proxy or no-op provider)."""
    if isinstance(
        trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
    ):
        return None
    return trace.get_tracer("django_tasks_coord", __version__)


def _span_tracer(*, carrying: bool = False) -> Any:
    """The tracer of a span to make now, or None: no span to make.

    With an SDK, the package's tracer (:func:`_tracer`). Without one, every span would
    record nothing: a no-op tracer still makes one while a trace must be carried on (a
    valid span is current, a caller's ``traceparent`` say, or ``carrying``: a task to run
    stores one), as its span has its parent's context; otherwise None, so that a task costs
    no tracing.
    """
    tracer = _tracer()
    if tracer is not None:
        return tracer
    if carrying or trace.get_current_span().get_span_context().is_valid:
        return _NO_SDK_TRACER
    return None


def _attributes(task: Task, operation: str) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": task.topic_id,
        "messaging.operation.type": operation,
    }
    if task.pk is not None:
        attributes["messaging.message.id"] = str(task.pk)
    return attributes


def valid_traceparent(value: object) -> str | None:
    """``value`` if it is a well-formed W3C ``traceparent`` (lower-cased), else None."""
    if not isinstance(value, str):
        return None
    value = value.strip().lower()
    return value if TRACEPARENT.match(value) else None


def context_of(traceparent: str | None) -> Any:
    """The OpenTelemetry context a ``traceparent`` names (None: none, or no OpenTelemetry)."""
    if trace is None or not traceparent:
        return None
    return TraceContextTextMapPropagator().extract({"traceparent": traceparent})


def _traceparent(span: Any) -> str | None:
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent")


@contextmanager
def producing(tasks: Sequence[Task]) -> Iterator[None]:
    """Around the insertion of ``tasks``: a producer span each, its ``traceparent`` stored.

    The spans start before the insert (so that ``traceparent`` is written with the row)
    and end after it, with the task's sequence as ``messaging.message.id``. A failed
    insert ends them with an error status. Does nothing without OpenTelemetry; a task
    that already has a ``traceparent`` keeps it.
    """
    tracer = None if trace is None or not tasks else _span_tracer()
    if tracer is None:
        yield
        return
    spans = []
    for task in tasks:
        if task.traceparent:
            continue
        span = tracer.start_span(
            f"send {task.topic_id}",
            kind=trace.SpanKind.PRODUCER,
            attributes=_attributes(task, "send"),
        )
        if not span.is_recording() and not span.get_span_context().is_valid:
            break  # no SDK and no trace in progress: no task would get a traceparent
        task.traceparent = _traceparent(span)
        spans.append((task, span))
    try:
        yield
    except BaseException as exc:
        for _, span in spans:
            span.record_exception(exc)
            span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
            span.end()
        raise
    for task, span in spans:
        if task.pk is not None:
            span.set_attribute("messaging.message.id", str(task.pk))
        span.end()


class Rows:
    """What :func:`producing_rows` yields: the traceparents to store with the rows, and
    (set after the insert) their sequence numbers."""

    def __init__(self, count: int) -> None:
        self.traceparents: list[str | None] = [None] * count
        self.sequences: Sequence[int] = ()


@contextmanager
def producing_rows(topic: str, count: int) -> Iterator[Rows]:
    """:func:`producing` for ``count`` rows of ``topic`` inserted without ``Task`` objects.

    Yields a :class:`Rows`: the caller stores ``traceparents`` with the rows (None each
    without tracing) and sets ``sequences`` after the insert.
    """
    rows = Rows(count)
    tracer = None if trace is None or not count else _span_tracer()
    if tracer is None:
        yield rows
        return
    attributes = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": topic,
        "messaging.operation.type": "send",
    }
    spans = []
    for index in range(count):
        span = tracer.start_span(
            f"send {topic}", kind=trace.SpanKind.PRODUCER, attributes=attributes
        )
        if not span.is_recording() and not span.get_span_context().is_valid:
            break  # no SDK and no trace in progress: no row would get a traceparent
        rows.traceparents[index] = _traceparent(span)
        spans.append(span)
    try:
        yield rows
    except BaseException as exc:
        for span in spans:
            span.record_exception(exc)
            span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
            span.end()
        raise
    for span, sequence in zip(spans, rows.sequences, strict=False):
        span.set_attribute("messaging.message.id", str(sequence))
    for span in spans:
        span.end()


class _Run:
    """What :func:`consuming` yields: report the run's decisions to the span."""

    def __init__(self, span: Any) -> None:
        self.span = span

    def finished(self, decisions: Sequence[Decision]) -> None:
        """Mark the span failed if any task failed (its exception recorded)."""
        if self.span is None:
            return
        failures = [d for d in decisions if d.result is Result.FAILURE]
        for decision in failures:
            if decision.exception is not None:
                self.span.record_exception(decision.exception)
        if failures:
            message = str(failures[0].exception or failures[0].message or "failed")
            self.span.set_status(trace.Status(trace.StatusCode.ERROR, message))


@contextmanager
def consuming(tasks: Sequence[Task]) -> Iterator[_Run]:
    """The consumer span around a run of ``tasks`` (one task, or one batch).

    One task: a child of its producer span (its stored ``traceparent``). A batch: the
    child of the first task's producer, with a link to each task's producer. The span is
    current while the handler runs, so the handler's own spans nest under it.
    """
    if trace is None or not tasks:
        yield _Run(None)
        return
    tracer = _span_tracer(carrying=any(task.traceparent for task in tasks))
    if tracer is None:
        yield _Run(None)
        return
    first = tasks[0]
    attributes = _attributes(first, "process")
    links = []
    if len(tasks) > 1:
        attributes.pop("messaging.message.id", None)
        attributes["messaging.batch.message_count"] = len(tasks)
        for task in tasks:
            context = context_of(task.traceparent)
            span_context = trace.get_current_span(context).get_span_context()
            if span_context.is_valid:
                links.append(trace.Link(span_context))
    with tracer.start_as_current_span(
        f"process {first.topic_id}",
        context=context_of(first.traceparent),
        kind=trace.SpanKind.CONSUMER,
        attributes=attributes,
        links=links,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield _Run(span)


@contextmanager
def api_call(traceparent: str | None, operation: str, task_id: int | None) -> Iterator[None]:
    """Around an HTTP API call: the caller's ``traceparent`` header, if any, is the parent.

    Unless a span is current already (OpenTelemetry's Django instrumentation makes one from
    the same header), the header's context is made current, so that a task created by the
    call gets a producer span under the caller's span. An executor's call about a task
    (:data:`EXECUTOR_OPERATIONS`) is recorded as a span ``<operation> task`` there.
    """
    if trace is None:
        yield
        return
    from opentelemetry import context as otel_context

    token = None
    parent = valid_traceparent(traceparent)
    if parent and not trace.get_current_span().get_span_context().is_valid:
        token = otel_context.attach(context_of(parent))
    try:
        tracer = _span_tracer() if operation in EXECUTOR_OPERATIONS else None
        if tracer is not None:
            attributes: dict[str, Any] = {
                "messaging.system": SYSTEM,
                "messaging.operation.name": operation,
            }
            if task_id is not None:
                attributes["messaging.message.id"] = str(task_id)
            with tracer.start_as_current_span(f"{operation} task", attributes=attributes):
                yield
        else:
            yield
    finally:
        if token is not None:
            otel_context.detach(token)
