"""The attempt log: one :class:`Attempt` entry per attempt of a task, in ``Task.attempt_log``.

Every kind of task logs its attempts with the same entry type:

- ``@task`` tasks (Django's task framework) log every attempt: the node writes an
  attempt's start once it has run for a moment (:func:`begin`), and its end rides
  back in the task type's :class:`~django_tasks_coord.enums.Decision` (``attempt``);
  an attempt whose node died is closed as ``lost`` by the next one (:func:`close_lost`).
- Tasks run by a consumer or a handler path log every attempt that failed (retried
  or not), and any later attempt once the log has an entry, so that it ends with the
  attempt that finished the task (:func:`ended`, :func:`must_log`). A task that
  succeeds at its first attempt gets no entry: its ``started_at``, ``finished_at``
  and owner say it all, and its completion stays one batched ``UPDATE``.
- Tasks of the executor API (:mod:`django_tasks_coord.executions`) log every started
  attempt with its ``exec_id`` and, once it ended, its outcome and ``reason``.

The node's completer (:mod:`django_tasks_coord.node.completer`) writes the entries of
its tasks, fenced by their claims (:mod:`django_tasks_coord.store.completion`). This
module only builds them; it writes nothing.
"""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Self

from django.utils import timezone

from django_tasks_coord.enums import Decision, Result

if TYPE_CHECKING:
    from django_tasks_coord.models import Task

#: ``outcome`` of an entry, per result.
OUTCOMES = {
    Result.SUCCESS: "succeeded",
    Result.FAILURE: "failed",
    Result.FILTER: "filtered",
    Result.SUSPENSION: "suspended",
}
#: The worker id of an attempt lost before its start was written.
UNKNOWN_WORKER = "unknown"
#: The exception class recorded for an attempt whose node died (its heartbeat went stale).
LOST_CLASS = "django_tasks_coord.exceptions.OwnerExpiredError"

_KEYS = (
    "attempt",
    "worker_id",
    "exec_id",
    "started_at",
    "finished_at",
    "outcome",
    "reason",
    "message",
    "exception_class_path",
    "error",
    "traceback",
)


@dataclass(frozen=True)
class Attempt:
    """One entry of ``Task.attempt_log``; times are ISO strings, as stored.

    :meth:`to_json` leaves out the fields that are None, so each kind of task stores
    only what it knows; keys this type does not know are kept (``extra``).
    """

    attempt: int | None = None
    worker_id: str | None = None
    exec_id: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    outcome: str | None = None
    reason: str | None = None
    message: str | None = None
    exception_class_path: str | None = None
    error: str | None = None
    traceback: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_json(self) -> dict[str, Any]:
        """The stored form: a dict without the fields that are None."""
        stored = {key: getattr(self, key) for key in _KEYS if getattr(self, key) is not None}
        return {**self.extra, **stored}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        """An entry as stored (unknown keys go to ``extra``)."""
        known = {key: data[key] for key in _KEYS if key in data}
        return cls(**known, extra={k: v for k, v in data.items() if k not in _KEYS})

    @property
    def ended(self) -> bool:
        """Whether the attempt ended (stored entries without ``finished_at`` did not)."""
        return self.finished_at is not None or self.outcome is not None

    def end(self, outcome: str, *, now: datetime | None = None, **fields: Any) -> Self:
        """This attempt, ended now with ``outcome`` (and ``fields``: a reason, a message...)."""
        when = (now or timezone.now()).isoformat()
        return dataclasses.replace(self, finished_at=when, outcome=outcome, **fields)

    def failed(self, exc: BaseException, *, now: datetime | None = None) -> Self:
        """This attempt, ended now by ``exc``: its class and traceback."""
        return self.end(
            "failed",
            now=now,
            exception_class_path=exception_path(exc),
            traceback="".join(traceback.format_exception(exc)),
        )

    def lost(self, now: datetime | None) -> Self:
        """This attempt, lost with its node (``finished_at`` ``now``, None: unknown)."""
        return dataclasses.replace(
            self,
            finished_at=now.isoformat() if now is not None else None,
            outcome="lost",
            exception_class_path=LOST_CLASS,
            traceback=(
                f"The worker {self.worker_id if self.worker_id is not None else '?'} died "
                f"during attempt {self.attempt if self.attempt is not None else '?'} (its "
                "node stopped heartbeating); the task went back to the queue."
            ),
        )

    def into(self, log: Iterable[Any] | None) -> list[Any]:
        """``log`` with this entry: in place of the unfinished entry of its attempt at the
        end of ``log`` (its start), else appended."""
        entries = list(log or [])
        last = entries[-1] if entries else None
        if (
            isinstance(last, dict)
            and last.get("attempt") == self.attempt
            and "finished_at" not in last
        ):
            entries.pop()
        return [*entries, self.to_json()]


def exception_path(exc: BaseException) -> str:
    """The dotted path of ``exc``'s class, as Django's ``TaskError`` stores it."""
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


def close_lost(log: Iterable[Any], now: datetime, attempts: int) -> list[dict[str, Any]]:
    """``log`` with every one of the first ``attempts`` attempts ended.

    An attempt that never ended is marked ``lost`` (its node died); one missing from
    the log altogether (its node died before its start was written) is added as lost,
    its worker unknown.
    """
    closed = []
    for entry in log:
        if "finished_at" not in entry:
            entry = {**entry, **Attempt.from_json(entry).lost(now).to_json()}
        closed.append(entry)
    logged = {entry.get("attempt") for entry in closed}
    for attempt in range(1, attempts + 1):
        if attempt not in logged:
            closed.append(Attempt(attempt, UNKNOWN_WORKER).lost(now).to_json())
    closed.sort(key=lambda entry: entry.get("attempt") or 0)
    return closed


def begin(task: Task, worker_id: str, *, now: datetime | None = None) -> Attempt:
    """The entry of ``task``'s attempt under way, started now by ``worker_id``.

    For task types that log every attempt (``@task``): ``task.attempt_log`` (in memory)
    becomes the log with earlier attempts that never ended closed as lost, and this
    attempt's start at its end. Calling it again during the attempt returns that start.
    """
    log = list(task.attempt_log or [])
    last = log[-1] if log else None
    if (
        isinstance(last, dict)
        and last.get("attempt") == task.attempts
        and "finished_at" not in last
    ):
        return Attempt.from_json(last)
    now = now or timezone.now()
    started = Attempt(attempt=task.attempts, worker_id=worker_id, started_at=now.isoformat())
    task.attempt_log = started.into(close_lost(log, now, task.attempts - 1))
    return started


def ended(task: Task, decision: Decision, worker_id: str | None) -> Attempt:
    """The entry of the attempt of ``task`` (run by a consumer) that ended with ``decision``."""
    exc = decision.exception
    return Attempt(
        attempt=task.attempts,
        worker_id=worker_id or "",
        started_at=task.started_at.isoformat() if task.started_at else None,
        finished_at=timezone.now().isoformat(),
        outcome=OUTCOMES.get(decision.result, str(decision.result)),
        message=decision.message or None,
        exception_class_path=exception_path(exc) if exc is not None else None,
        error=str(exc) if exc is not None else None,
        traceback="".join(traceback.format_exception(exc)) if exc is not None else None,
    )


def must_log(task: Task, decision: Decision) -> bool:
    """Whether the attempt of a consumer's ``task`` that ended with ``decision`` is logged:
    a failure, or any attempt once the log has an entry (see the module docstring)."""
    if task.is_completed:
        return False  # completed by its handler (a fenced run): nothing more is written
    return decision.result is Result.FAILURE or bool(task.attempt_log)
