"""Argument checks shared by the queue's operations: each raises a clear
:class:`~django_tasks_coord.exceptions.InvalidArgumentError` (or a subclass) naming the
argument and what is accepted."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.utils import timezone

from django_tasks_coord import db
from django_tasks_coord.enums import TaskState
from django_tasks_coord.exceptions import InvalidArgumentError, PayloadError, TaskStateError
from django_tasks_coord.models import Task

PRIORITY_RANGE = range(-32768, 32768)

#: The deepest nesting of lists and dicts (objects) a stored JSON value may have: a payload,
#: params, a result or an error. 31 is the most MariaDB's JSON_VALID check accepts (MySQL
#: takes 100, PostgreSQL more), so a value stores alike on every database; and deeper values
#: are refused before anything (a schema validator, the database's JSON encoder) recurses on them.
MAX_JSON_DEPTH = 31

#: Characters no database stores alike: NUL (PostgreSQL's text and jsonb refuse it) and the
#: UTF-16 surrogates, which Python only holds unpaired ("\ud800" read from JSON), and which
#: no UTF-8 text column nor jsonb accepts.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def json_pointer(path: Iterable[object]) -> str:
    """The JSON Pointer (RFC 6901) of ``path``; ``""`` is the whole document."""
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in path)


def _unstorable(text: str) -> str | None:
    """What in ``text`` cannot be stored, or None."""
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    if found.group() == "\x00":
        return "a NUL character (\\u0000)"
    return f"a lone surrogate (\\u{ord(found.group()):04x}) at index {found.start()}"


def check_text(text: str, argument: str) -> str:
    """Refuse a str that no database can store (NUL, a lone surrogate); return it."""
    problem = _unstorable(text)
    if problem is not None:
        raise InvalidArgumentError(
            f"{argument} holds {problem}, which cannot be stored; send valid Unicode text."
        )
    return text


def check_json(value: Any, argument: str, *, pointer: str = "") -> None:
    """Refuse a JSON value that cannot be stored alike on every database.

    Its lists and dicts may nest at most :data:`MAX_JSON_DEPTH` deep, and none of its strings
    (dict keys included) may hold NUL or a lone surrogate. Raises :class:`PayloadError`
    whose ``path`` is the JSON Pointer of the offending value (``pointer`` prefixed), and
    whose message names it after ``argument``. Walks iteratively: no depth can make it recurse.
    """
    stack: list[tuple[Any, tuple[object, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        problem = None
        if isinstance(item, str):
            problem = _unstorable(item)
        elif isinstance(item, dict | list | tuple):
            if len(path) >= MAX_JSON_DEPTH:
                problem = f"lists and objects nested more than {MAX_JSON_DEPTH} deep"
            elif isinstance(item, dict):
                for key, member in item.items():
                    if isinstance(key, str) and (key_problem := _unstorable(key)) is not None:
                        problem, path = f"a key with {key_problem}", (*path, key)
                        break
                    stack.append((member, (*path, key)))
            else:
                stack.extend((member, (*path, index)) for index, member in enumerate(item))
        if problem is not None:
            where = pointer + json_pointer(path)
            raise PayloadError(
                f"{argument}{json_pointer(path)} holds {problem}, which cannot be stored; "
                + (
                    f"nest at most {MAX_JSON_DEPTH} levels."
                    if problem.startswith("lists")
                    else "send valid Unicode text."
                ),
                path=where,
            )


def check_identifier(identifier: object) -> str:
    if not isinstance(identifier, str) or not 0 < len(identifier) <= 255:
        raise InvalidArgumentError(
            f"identifier must be a non-empty str of at most 255 characters, not {identifier!r}."
        )
    return check_text(identifier, "identifier")


def check_payload(payload: object, argument: str = "payload") -> None:
    """Refuse a value that cannot be stored as JSON: not serializable, or refused by
    :func:`check_json` (too deep, NUL, a lone surrogate)."""
    check_json(payload, argument, pointer=f"/{argument}")
    try:
        json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise PayloadError(
            f"The {argument} is not JSON-serializable ({exc}). Pass dicts, lists, str, int, "
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
