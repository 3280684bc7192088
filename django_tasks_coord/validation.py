"""Argument checks shared by the queue's operations: each raises a clear
:class:`~django_tasks_coord.exceptions.InvalidArgumentError` (or a subclass) naming the
argument and what is accepted."""

from __future__ import annotations

import json
from datetime import datetime

from django.utils import timezone

from django_tasks_coord import db
from django_tasks_coord.enums import TaskState
from django_tasks_coord.exceptions import InvalidArgumentError, PayloadError, TaskStateError
from django_tasks_coord.models import Task

PRIORITY_RANGE = range(-32768, 32768)


def check_identifier(identifier: object) -> str:
    if not isinstance(identifier, str) or not 0 < len(identifier) <= 255:
        raise InvalidArgumentError(
            f"identifier must be a non-empty str of at most 255 characters, not {identifier!r}."
        )
    return identifier


def check_payload(payload: object) -> None:
    try:
        json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise PayloadError(
            f"The payload is not JSON-serializable ({exc}). Pass dicts, lists, str, int, "
            f"float (not NaN/Infinity), bool or None; convert other objects first."
        ) from exc


def check_priority(priority: object) -> int:
    if (
        not isinstance(priority, int)
        or isinstance(priority, bool)
        or priority not in PRIORITY_RANGE
    ):
        raise InvalidArgumentError(
            f"priority must be an int from -32768 to 32767, not {priority!r}."
        )
    return priority


def check_when(value: object, argument: str, *, optional: bool = True) -> datetime | None:
    if value is None and optional:
        return None
    if not isinstance(value, datetime):
        raise InvalidArgumentError(f"{argument} must be a datetime, not {value!r}.")
    if timezone.is_naive(value):
        raise InvalidArgumentError(
            f"{argument}={value!r} is naive; pass an aware datetime (e.g. django.utils.timezone.now())."
        )
    return value


def check_handler(handler: object) -> str:
    if not isinstance(handler, str) or len(handler) > 255 or (handler and "." not in handler):
        raise InvalidArgumentError(
            f"handler must be the dotted path of a module-level callable "
            f"(e.g. 'myapp.jobs.send_email') or '', not {handler!r}."
        )
    return handler


def check_task(task: object) -> Task:
    if not isinstance(task, Task) or task.pk is None:
        raise InvalidArgumentError(f"Expected a saved Task, not {task!r}.")
    return task


def state_error(task: Task, action: str, accepted: str) -> TaskStateError:
    state = (
        Task.objects.using(db.alias()).filter(pk=task.pk).values_list("state", flat=True).first()
    )
    if state is None:
        return TaskStateError(f"Cannot {action} task #{task.pk}: it was deleted.")
    return TaskStateError(
        f"Cannot {action} task #{task.pk}: it is {TaskState(state).label}; only {accepted} tasks can be."
    )
