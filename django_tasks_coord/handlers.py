"""Handlers: which callable runs a task, and how (batch or single, retries, policies).

A task is run by

1. the callable its ``handler`` field names (the dotted path of a module-level
   callable), if set; or
2. the consumer registered for its topic.

::

    from django_tasks_coord import handlers
    from django_tasks_coord.retry import RetryPolicy

    @handlers.consumer("emails", retry=RetryPolicy(max_attempts=5))
    def send_email(task):
        ...                      # return None (success), a Result or a Decision; raise to fail

    @handlers.consumer("thumbnails", batch=True)
    def make_thumbnails(tasks):
        ...                      # return None or one Result/Decision per task, in order

Consumers are usually declared in an app's ``consumers.py``, imported by
``runscheduler`` at start-up (like ``admin.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, ClassVar

from django.utils import timezone
from django.utils.module_loading import autodiscover_modules, import_string

from django_tasks_coord import observers, running, tracing
from django_tasks_coord.enums import Decision, ErrorPolicy, Result, WaitingPolicy
from django_tasks_coord.exceptions import InvalidArgumentError, TasksCoordError
from django_tasks_coord.models import Task
from django_tasks_coord.retry import DEFAULT_RETRY, RetryPolicy

logger = logging.getLogger(__name__)

Outcome = Decision | Result | None
SingleHandler = Callable[[Task], Outcome]
BatchHandler = Callable[[list[Task]], Sequence[Outcome] | Mapping[int, Outcome] | None]


class HandlerNotFoundError(TasksCoordError):
    """No callable can run this task: its ``handler`` path does not import, or its topic has no consumer.

    Register a consumer for the topic (``handlers.consumer``), or push the task with
    the dotted path of a module-level callable. The task is failed; the node goes on.
    """


class HandlerResultError(TasksCoordError):
    """A handler returned something that is not None, a Result, a Decision, or (batch) one per task."""


@dataclass(frozen=True, eq=False)
class TaskType:
    """How tasks of one kind are run: the callable and its policies.

    ``waiting_time`` (seconds) is how late a task with an ``execute_at`` may start
    before ``waiting_policy`` applies; ``None`` means never too late.
    """

    name: str
    func: Callable[..., Any]
    batch: bool = False
    retry: RetryPolicy = DEFAULT_RETRY
    error_policy: ErrorPolicy = ErrorPolicy.LOG_AND_CONTINUE
    waiting_policy: WaitingPolicy = WaitingPolicy.WAIT
    waiting_time: float | None = None
    options: dict[str, Any] = field(default_factory=dict)
    #: Whether every attempt is logged, from its start, with the entry the task type
    #: returns in its decision (Django tasks); otherwise the node logs failed attempts
    #: and those after them (:mod:`django_tasks_coord.attempts`).
    logs_every_attempt: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if not callable(self.func):
            raise InvalidArgumentError(
                f"The handler of {self.name!r} must be callable, not {self.func!r}."
            )
        if not isinstance(self.retry, RetryPolicy):
            raise InvalidArgumentError(f"retry must be a RetryPolicy, not {self.retry!r}.")
        object.__setattr__(
            self, "error_policy", ErrorPolicy.coerce(self.error_policy, "error_policy")
        )
        object.__setattr__(
            self, "waiting_policy", WaitingPolicy.coerce(self.waiting_policy, "waiting_policy")
        )
        if isinstance(self.waiting_time, timedelta):
            object.__setattr__(self, "waiting_time", self.waiting_time.total_seconds())
        if self.waiting_time is not None and (
            not isinstance(self.waiting_time, int | float) or self.waiting_time < 0
        ):
            raise InvalidArgumentError(
                f"waiting_time must be None or non-negative seconds, not {self.waiting_time!r}."
            )

    def max_attempts_for(self, task: Task) -> int:
        """How many attempts ``task`` gets in all (subclasses may decide per task)."""
        return self.retry.max_attempts

    def retry_at(self, task: Task, decision: Decision, now: datetime) -> datetime | None:
        """When to run ``task`` again after the failed attempt ``decision``; None: fail it for good."""
        if not self.retry.can_retry(task.attempts):
            return None
        return now + self.retry.delay(task.attempts)

    def may_complete(self, task: Task) -> bool:
        """Whether the node may write ``task``'s outcome (a fencing hook; always True here)."""
        return True

    def outcome_committed(self, task: Task) -> bool:
        """Whether the outcome of ``task``, completed by its handler rather than by the node
        (a fenced run), is committed. The node calls it before :meth:`on_outcome` and sends
        the completion signals only if it is True; True here.
        """
        return True

    def on_outcome(self, task: Task, decision: Decision) -> None:
        """Called by the node once ``task``'s completion is written (any result). No-op here."""

    def run(self, tasks: list[Task]) -> list[Decision]:
        """Call the handler for ``tasks`` (one call per task unless ``batch``) and return one decision each.

        A handler that raises fails its tasks with the exception; nothing escapes. Each
        call runs in a consumer span (:func:`django_tasks_coord.tracing.consuming`) and is
        timed for the observers (:mod:`django_tasks_coord.observers`), if there are any.
        """
        if self.batch:
            return self._observed(tasks, self._call_batch)
        return [self._observed([task], self._call_single)[0] for task in tasks]

    def _observed(
        self, tasks: list[Task], call: Callable[[Any], Decision | list[Decision]]
    ) -> list[Decision]:
        """``call`` (one task, or the batch) inside its consumer span, timed for observers."""
        observed = observers.active()
        if observed:
            now = timezone.now()
            for task in tasks:
                due = task.execute_at or task.created_at
                delay = (now - due).total_seconds() if due is not None else 0.0
                observers.started(task, max(delay, 0.0))
            begun = time.monotonic()
        with tracing.consuming(tasks) as span, running.only(tasks):
            outcome = call(tasks if self.batch else tasks[0])
            decisions = outcome if isinstance(outcome, list) else [outcome]
            span.finished(decisions)
        if observed:
            share = (time.monotonic() - begun) / len(tasks)
            for task in tasks:
                observers.ran(task, share)
        return decisions

    def _call_single(self, task: Task) -> Decision:
        try:
            return as_decision(self.func(task), self.name)
        except Exception as exc:  # noqa: BLE001 - a failing task must never crash the node
            return Decision(Result.FAILURE, exception=exc)

    def _call_batch(self, tasks: list[Task]) -> list[Decision]:
        try:
            outcome = self.func(tasks)
            if outcome is None:
                return [Decision(Result.SUCCESS) for _ in tasks]
            if isinstance(outcome, Mapping):
                return [as_decision(outcome.get(task.sequence), self.name) for task in tasks]
            outcomes = list(outcome)
            if len(outcomes) != len(tasks):
                raise HandlerResultError(
                    f"Batch handler {self.name!r} returned {len(outcomes)} outcomes for {len(tasks)} tasks."
                )
            return [as_decision(item, self.name) for item in outcomes]
        except Exception as exc:  # noqa: BLE001 - a failing batch must never crash the node
            return [Decision(Result.FAILURE, exception=exc) for _ in tasks]


def as_decision(outcome: object, name: str) -> Decision:
    """Normalize what a handler returned: None → SUCCESS, a Result → Decision(result)."""
    if outcome is None:
        return Decision(Result.SUCCESS)
    if isinstance(outcome, Decision):
        return outcome
    if isinstance(outcome, Result):
        return Decision(outcome)
    raise HandlerResultError(
        f"Handler {name!r} returned {outcome!r}; return None, a Result or a Decision."
    )


class Registry:
    """Consumers by topic and named task types by dotted path. Thread-safe."""

    def __init__(self) -> None:
        self._consumers: dict[str, TaskType] = {}
        self._named: dict[str, TaskType] = {}
        #: The dotted path of each topic's ``@consumer``, and the topics declared twice.
        self._declared: dict[str, str] = {}
        self._conflicts: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()

    def register(self, topic: str, func: Callable[..., Any], **options: Any) -> TaskType:
        """Register ``func`` as the consumer of ``topic`` (replacing any earlier one)."""
        task_type = TaskType(name=topic, func=func, **options)
        with self._lock:
            self._consumers[topic] = task_type
        return task_type

    def add(self, topic: str, task_type: TaskType) -> TaskType:
        """Register a ready-made (possibly subclassed) task type as the consumer of ``topic``."""
        with self._lock:
            self._consumers[topic] = task_type
        return task_type

    def consumer(
        self, topic: str, **options: Any
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator form of :meth:`register`; the function is returned unchanged.

        This is how consumers are declared in code: a second function declared for the
        same topic is recorded (:meth:`conflicts`, system check ``tasks_coord.E007``).
        """

        def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
            path = f"{func.__module__}.{func.__qualname__}"
            with self._lock:
                known = self._declared.setdefault(topic, path)
                if known != path:
                    self._conflicts.append((topic, known, path))
            try:
                self.register(topic, func, **options)
            except (InvalidArgumentError, TypeError) as exc:
                raise InvalidArgumentError(f"Consumer {path} of topic {topic!r}: {exc}") from exc
            return func

        return decorate

    def unregister(self, topic: str) -> None:
        """Forget the consumer of ``topic`` (tests)."""
        with self._lock:
            self._consumers.pop(topic, None)

    def restore(self, consumers: dict[str, TaskType]) -> None:
        """Replace every consumer with ``consumers`` (a :meth:`consumers` snapshot; tests)."""
        with self._lock:
            self._consumers = dict(consumers)
            self._named.clear()
            self._declared = {
                topic: path for topic, path in self._declared.items() if topic in consumers
            }
            self._conflicts.clear()

    def conflicts(self) -> list[tuple[str, str, str]]:
        """``(topic, first path, second path)`` for each topic declared with ``@consumer``
        by two different functions (system check ``tasks_coord.E007``)."""
        with self._lock:
            return list(self._conflicts)

    def consumers(self) -> dict[str, TaskType]:
        """The registered consumers by topic (a copy)."""
        with self._lock:
            return dict(self._consumers)

    def named(self, path: str) -> TaskType:
        """The task type for a dotted path, importing it on first use."""
        with self._lock:
            known = self._named.get(path)
        if known is not None:
            return known
        try:
            func = import_string(path)
        except ImportError as exc:
            raise HandlerNotFoundError(f"Handler {path!r} cannot be imported: {exc}") from exc
        declared = getattr(func, "task_type", None)
        task_type = (
            replace(declared, name=path)
            if isinstance(declared, TaskType)
            else TaskType(name=path, func=func)
        )
        with self._lock:
            self._named[path] = task_type
        return task_type

    def for_task(self, task: Task) -> TaskType:
        """The task type that runs ``task``; :class:`HandlerNotFoundError` if there is none."""
        if task.handler:
            return self.named(task.handler)
        with self._lock:
            task_type = self._consumers.get(task.topic_id)
        if task_type is None:
            raise HandlerNotFoundError(
                f"Task #{task.sequence} of topic {task.topic_id!r} names no handler and the topic "
                f"has no consumer. Register one with handlers.consumer({task.topic_id!r})."
            )
        return task_type


registry = Registry()
register = registry.register
consumer = registry.consumer


def autodiscover() -> None:
    """Import every installed app's ``consumers`` module, registering its consumers."""
    autodiscover_modules("consumers")
