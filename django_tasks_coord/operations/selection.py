"""Finding tasks: ages and states as operators write them, a filter, listing and showing.

The read side of :mod:`django_tasks_coord.operations` (``manage.py tasks_coord list``,
``show``), shared with the bulk actions, which select their tasks with a
:class:`TaskFilter`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from django_tasks_coord import db, topics
from django_tasks_coord.enums import TaskState
from django_tasks_coord.exceptions import InvalidArgumentError, UnknownTaskError
from django_tasks_coord.models import Task, TaskQuerySet

#: The most tasks :func:`list_tasks` returns at once (and the largest bulk batch).
MAX_LIST = 10_000


# --- parsing --------------------------------------------------------------------------------

_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_AGE = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_age(value: str) -> timedelta:
    """An age such as ``"90s"``, ``"15m"``, ``"1h30m"``, ``"2d"``, ``"1w"``, or plain seconds (``"300"``).

    Raises :class:`~django_tasks_coord.exceptions.InvalidArgumentError` for anything else
    (a negative or empty age, an unknown unit).
    """
    text = value.strip().lower() if isinstance(value, str) else ""
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return timedelta(seconds=float(text))
    if text and _AGE.sub("", text) == "":
        return timedelta(seconds=sum(float(n) * _AGE_UNITS[unit] for n, unit in _AGE.findall(text)))
    raise InvalidArgumentError(
        f"{value!r} is not an age: write seconds (300) or a number with a unit "
        f"(s, m, h, d, w), possibly several (1h30m)."
    )


def parse_state(value: str) -> TaskState:
    """A task state by its name, case-insensitively (``"failed"``, ``"PENDING"``)."""
    for state in TaskState:
        if isinstance(value, str) and value.strip().upper() == state.name:
            return state
    names = ", ".join(s.name.lower() for s in TaskState)
    raise InvalidArgumentError(f"{value!r} is not a task state; the states are: {names}.")


def state_name(state: int | None) -> str | None:
    """The lowercase name of a task state (``"failed"``), as the JSON output writes it."""
    return None if state is None else TaskState(state).name.lower()


# --- selecting tasks ------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskFilter:
    """Which tasks an operation looks at. Empty fields do not filter.

    ``older_than``/``newer_than`` compare the task's ``created_at`` with the time the
    operation starts (this machine's clock).
    """

    topic: str | None = None
    states: tuple[TaskState, ...] = ()
    identifier: str | None = None
    older_than: timedelta | None = None
    newer_than: timedelta | None = None

    @property
    def is_empty(self) -> bool:
        """True when nothing narrows the selection (every task of every topic)."""
        return not (
            self.topic or self.states or self.identifier or self.older_than or self.newer_than
        )

    def queryset(self, now: datetime | None = None) -> TaskQuerySet:
        """The tasks selected, unordered. Raises if the topic is not registered."""
        now = now or timezone.now()
        rows = Task.objects.using(db.alias()).all()
        if self.topic is not None:
            rows = rows.for_topic(topics.topic_name(self.topic))
        if self.states:
            rows = rows.filter(state__in=list(self.states))
        if self.identifier is not None:
            rows = rows.filter(identifier=self.identifier)
        if self.older_than is not None:
            rows = rows.filter(created_at__lte=now - self.older_than)
        if self.newer_than is not None:
            rows = rows.filter(created_at__gte=now - self.newer_than)
        return rows

    def describe(self) -> str:
        """The filter in words, for logs and messages."""
        parts = [
            f"topic={self.topic}" if self.topic else "",
            f"state={','.join(str(state_name(s)) for s in self.states)}" if self.states else "",
            f"identifier={self.identifier}" if self.identifier is not None else "",
            f"older_than={self.older_than}" if self.older_than is not None else "",
            f"newer_than={self.newer_than}" if self.newer_than is not None else "",
        ]
        return " ".join(p for p in parts if p) or "all tasks"


def list_tasks(selection: TaskFilter, *, limit: int = 50, before: int | None = None) -> list[Task]:
    """The selected tasks, newest (highest sequence) first: at most ``limit``, below ``before``.

    To page on, pass the last sequence returned as ``before``.
    """
    if not 0 < limit <= MAX_LIST:
        raise InvalidArgumentError(f"limit must be between 1 and {MAX_LIST}, not {limit}.")
    rows = selection.queryset().select_related("owner")
    if before is not None:
        rows = rows.filter(sequence__lt=before)
    return list(rows.order_by("-sequence")[:limit])


def get_task(sequence: int) -> Task:
    """The task with this sequence; :class:`~django_tasks_coord.exceptions.UnknownTaskError` if none."""
    task = Task.objects.using(db.alias()).select_related("owner").filter(pk=sequence).first()
    if task is None:
        raise UnknownTaskError(f"No task has the sequence {sequence}.")
    return task


def iso(value: datetime | None) -> str | None:
    """``value`` in ISO 8601, or None."""
    return None if value is None else value.isoformat()


def task_data(task: Task, *, full: bool = False) -> dict[str, Any]:
    """A task as JSON-ready data (the keys ``manage.py tasks_coord ... --json`` writes).

    ``full`` adds the payload, the result, the message and errors, and the attempt log.
    """
    data: dict[str, Any] = {
        "sequence": task.sequence,
        "topic": task.topic_id,
        "identifier": task.identifier,
        "state": state_name(task.state),
        "attempts": task.attempts,
        "priority": task.priority,
        "label": task.label,
        "owner": task.owner.name if task.owner_id is not None and task.owner else None,
        "created_at": iso(task.created_at),
        "execute_at": iso(task.execute_at),
        "started_at": iso(task.started_at),
        "finished_at": iso(task.finished_at),
        "recreated": task.recreated,
        "original": task.original_id,
    }
    if full:
        data |= {
            "payload": task.payload,
            "result": task.result,
            "message": task.message,
            "error": task.error,
            "error_detail": task.error_detail,
            "attempt_log": task.attempt_log,
            "handler": task.handler,
            "requester": task.requester,
            "outcome_reason": task.outcome_reason,
            "exec_id": None if task.exec_id is None else str(task.exec_id),
            "deadline": iso(task.deadline),
            "slot": iso(task.slot),
            "term": task.term,
            "concurrency_key": task.concurrency_key,
        }
    return data


# --- bulk actions ---------------------------------------------------------------------------
