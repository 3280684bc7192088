"""``@task(rate=..., concurrency=...)``: limits of one function, across all nodes.

A function's limits are an entry of its queue topic's ``key_limits``
(:func:`django_tasks_coord.flow.set_key_limits`) under the function's module path, with
the topic keyed by :data:`TASK_KEY` (the ``"task"`` field of every ``@task`` payload holds
that path). :func:`ensure` writes them before the function's first enqueue in each process
and again whenever the topic's limits, as the push last read them with the topic
(:data:`~django_tasks_coord.topics.known_topics`), no longer hold them (changed by the
admin, ``TASKS_COORD["LIMITS"]`` or another process): an enqueue otherwise costs a
dictionary look-up. See docs/flow-control.md.
"""

from __future__ import annotations

import threading
from typing import Any

from django.db import transaction

from django_tasks_coord import db, flow, topics
from django_tasks_coord.backends.compat import Task
from django_tasks_coord.backends.tasks import CoordTask

__all__ = ["TASK_KEY", "ensure", "forget", "limits_of"]

#: The limit key of a queue whose functions have limits: the payload's module path.
TASK_KEY = "payload.task"
#: Where the position of ``limit_key`` and ``key_limits`` in :data:`flow.FIELDS` is.
_KEY, _KEY_LIMITS = flow.FIELDS.index("limit_key"), flow.FIELDS.index("key_limits")

#: (database, queue, module path, entry) written by this process (and committed).
_written: set[tuple[str, str, str, str]] = set()
_lock = threading.Lock()


def limits_of(task: Task) -> flow.KeyLimit | None:  # type: ignore[type-arg]
    """The limits ``@task(rate=..., concurrency=...)`` gives ``task``; None: none (or not a
    :class:`CoordTask`). Raises ``InvalidArgumentError`` for a bad value."""
    if not isinstance(task, CoordTask) or (task.rate is None and task.concurrency is None):
        return None
    checked = flow.validated(rate=task.rate, concurrency=task.concurrency)
    return flow.KeyLimit(checked.rate, checked.concurrency)


def _holds(known: tuple[Any, ...], path: str, stored: dict[str, Any]) -> bool:
    """Whether the topic's limits read as ``known`` hold the function's entry."""
    entries = known[_KEY_LIMITS]
    return known[_KEY] == TASK_KEY and isinstance(entries, dict) and entries.get(path) == stored


def ensure(task: Task) -> None:  # type: ignore[type-arg]
    """Write the limits of ``task``'s function to its queue's topic if this process has not
    (or the topic no longer holds them); nothing for a function without limits.

    A queue limited per another key raises
    :class:`~django_tasks_coord.exceptions.LimitKeyConflictError`. Inside a transaction,
    the write is remembered once it commits (a rolled-back one is written again).
    """
    own = limits_of(task)
    if own is None:
        return
    alias, queue, path = db.alias(), task.queue_name, task.module_path
    stored = own.stored()
    known = topics.known_topics.limits(queue)
    done = (alias, queue, path, repr(sorted(stored.items())))
    if known is not None and _holds(known, path, stored):
        return
    if known is None and done in _written:
        return
    flow.ensure_key(
        queue,
        TASK_KEY,
        fix=(
            f"{path} has rate or concurrency limits of its own (@task(rate=..., "
            f"concurrency=...)), which key its queue by {TASK_KEY!r}: give it a queue_name "
            f"of its own, or remove the key of {queue!r}."
        ),
    )
    flow.set_key_limits(
        queue, path, rate=str(own.rate) if own.rate else None, concurrency=own.concurrency
    )

    def remember() -> None:
        with _lock:
            _written.add(done)

    if transaction.get_connection(alias).in_atomic_block:
        transaction.on_commit(remember, using=alias)
    else:
        remember()


def forget() -> None:
    """Forget what this process wrote (tests whose database was emptied)."""
    with _lock:
        _written.clear()
