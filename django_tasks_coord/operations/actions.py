"""Bulk actions: retry, reset, recreate or cancel the selected tasks, in batches.

:func:`bulk` reads the candidates in sequence order (keyset pagination, no ``OFFSET``)
and changes each batch through the services that own those writes
(:func:`django_tasks_coord.queue.cancel_many`, :func:`django_tasks_coord.revival.reset_many`
and :func:`~django_tasks_coord.revival.recreate_many`), each batch in a transaction of
its own. Every run is logged on the ``django_tasks_coord.operations`` logger.
"""

from __future__ import annotations

import enum
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django_tasks_coord import queue, revival
from django_tasks_coord.enums import IN_FLIGHT, TaskState
from django_tasks_coord.exceptions import InvalidArgumentError
from django_tasks_coord.models import Task
from django_tasks_coord.operations.selection import MAX_LIST, TaskFilter, state_name

#: The logger of every operation (documented in docs/reference/logging.md).
logger = logging.getLogger("django_tasks_coord.operations")

#: Tasks changed per transaction by :func:`bulk` unless told otherwise.
BATCH_SIZE = 1000


class Action(enum.StrEnum):
    """What :func:`bulk` does to each selected task."""

    RETRY = "retry"  #: FAILED tasks go back to PENDING in place (``queue.reset``)
    RESET = "reset"  #: completed tasks go back to PENDING in place (``queue.reset``)
    RECREATE = "recreate"  #: completed tasks get a new PENDING copy (``queue.recreate``)
    CANCEL = "cancel"  #: not completed tasks become CANCELED (``queue.cancel``)

    @property
    def eligible(self) -> tuple[TaskState, ...]:
        """The states a task must be in for this action."""
        if self is Action.RETRY:
            return (TaskState.FAILED,)
        if self is Action.CANCEL:
            return (TaskState.PENDING, *IN_FLIGHT)
        return tuple(TaskState.completed_states())


@dataclass(frozen=True)
class Batch:
    """One committed batch of :func:`bulk`, as passed to its ``on_batch`` callback."""

    number: int  #: 1, 2, ...
    matched: int  #: tasks read as candidates
    changed: int  #: tasks changed (0 in a dry run)
    last_sequence: int  #: where the next batch starts (exclusive)


@dataclass
class BulkResult:
    """What :func:`bulk` did (or, in a dry run, would do).

    ``matched`` tasks were selected; ``changed`` were changed (in a dry run: 0);
    ``skipped`` were left alone because they changed meanwhile or a node held them
    locked; ``by_topic`` counts the matched tasks per topic; ``created`` are the new
    tasks' sequences (``recreate`` only).
    """

    action: Action
    selection: TaskFilter
    dry_run: bool
    batch_size: int
    matched: int = 0
    changed: int = 0
    batches: int = 0
    first_sequence: int | None = None
    last_sequence: int | None = None
    by_topic: Counter[str] = field(default_factory=Counter)
    created: list[int] = field(default_factory=list)

    @property
    def skipped(self) -> int:
        """Tasks matched but not changed (always 0 in a dry run)."""
        return 0 if self.dry_run else self.matched - self.changed

    def data(self) -> dict[str, Any]:
        """JSON-ready data (the keys ``manage.py tasks_coord <action> --json`` writes)."""
        return {
            "action": self.action.value,
            "dry_run": self.dry_run,
            "filter": self.selection.describe(),
            "matched": self.matched,
            "changed": self.changed,
            "skipped": self.skipped,
            "batches": self.batches,
            "batch_size": self.batch_size,
            "first_sequence": self.first_sequence,
            "last_sequence": self.last_sequence,
            "by_topic": dict(sorted(self.by_topic.items())),
            "created": self.created,
        }


def _apply(
    action: Action, tasks: list[Task], states: tuple[TaskState, ...], message: str | None
) -> list[Task]:
    """Change one batch through the queue's services; return the tasks changed (or made)."""
    if action is Action.CANCEL:
        return queue.cancel_many(tasks, message, states=states)
    if action is Action.RECREATE:
        return revival.recreate_many(tasks, states=states)
    return revival.reset_many(tasks, states=states)


def _checked(
    action: Action | str,
    selection: TaskFilter,
    *,
    batch_size: int,
    limit: int | None,
    message: str | None,
) -> Action:
    """The action :func:`bulk` was asked for, once its arguments are known to be valid."""
    try:
        action = Action(action)
    except ValueError:
        choices = ", ".join(a.value for a in Action)
        raise InvalidArgumentError(f"{action!r} is not an action; use one of {choices}.") from None
    if not 0 < batch_size <= MAX_LIST:
        raise InvalidArgumentError(
            f"batch_size must be between 1 and {MAX_LIST}, not {batch_size}."
        )
    if message is not None and action is not Action.CANCEL:
        raise InvalidArgumentError(f"message is for cancel only, not {action.value}.")
    if limit is not None and limit < 1:
        raise InvalidArgumentError(f"limit must be at least 1, not {limit}.")
    wrong = [s for s in selection.states if s not in action.eligible]
    if wrong:
        accepted = ", ".join(str(state_name(s)) for s in action.eligible)
        raise InvalidArgumentError(
            f"{action.value} applies to tasks that are {accepted}; not to "
            f"{', '.join(str(state_name(s)) for s in wrong)} tasks."
        )
    return action


def bulk(
    action: Action | str,
    selection: TaskFilter,
    *,
    dry_run: bool = False,
    batch_size: int = BATCH_SIZE,
    limit: int | None = None,
    actor: str = "",
    on_batch: Callable[[Batch], object] | None = None,
    message: str | None = None,
) -> BulkResult:
    """Apply ``action`` to the selected tasks, ``batch_size`` per transaction; return the counts.

    Only tasks in a state the action accepts are selected (:attr:`Action.eligible`);
    ``selection.states`` narrows that further and must be among them. ``limit`` stops
    after that many tasks. A dry run reads the same batches and changes nothing: its
    ``matched`` and ``by_topic`` are what a run at that moment would change, save
    tasks that change meanwhile. ``on_batch`` is called after each batch is committed.
    The outcome is logged with ``actor`` (who asked). ``message`` is stored on each
    canceled task (``cancel`` only).
    """
    action = _checked(action, selection, batch_size=batch_size, limit=limit, message=message)
    states = selection.states or action.eligible
    candidates = selection.queryset().filter(state__in=list(states))
    result = BulkResult(action, selection, dry_run, batch_size)
    last = 0
    while limit is None or result.matched < limit:
        size = batch_size if limit is None else min(batch_size, limit - result.matched)
        keys = list(
            candidates.filter(sequence__gt=last)
            .order_by("sequence")
            .values_list("topic_id", "sequence")[:size]
        )
        if not keys:
            break
        last = keys[-1][1]
        result.batches += 1
        result.matched += len(keys)
        result.by_topic.update(topic for topic, _ in keys)
        if result.first_sequence is None:
            result.first_sequence = keys[0][1]
        result.last_sequence = last
        changed = 0
        if not dry_run:
            batch = [Task(topic_id=topic, sequence=sequence) for topic, sequence in keys]
            done = _apply(action, batch, states, message)
            changed = len(done)
            if action is Action.RECREATE:
                result.created.extend(t.sequence for t in done)
            result.changed += changed
        if on_batch is not None:
            on_batch(Batch(result.batches, len(keys), changed, last))
    _log(result, actor)
    return result


def _log(result: BulkResult, actor: str) -> None:
    who = actor or "unknown"
    extra = {
        "actor": who,
        "action": result.action.value,
        "dry_run": result.dry_run,
        "matched": result.matched,
        "changed": result.changed,
        "skipped": result.skipped,
    }
    if result.dry_run:
        logger.info(
            "Dry run of %s by %s: would change %d task(s) (%s).",
            result.action.value,
            who,
            result.matched,
            result.selection.describe(),
            extra=extra,
        )
        return
    logger.info(
        "%s by %s: changed %d of %d task(s) in %d batch(es) of up to %d (%s).",
        result.action.value.capitalize(),
        who,
        result.changed,
        result.matched,
        result.batches,
        result.batch_size,
        result.selection.describe(),
        extra=extra,
    )
    if result.skipped:
        logger.warning(
            "%s by %s: skipped %d task(s) that changed meanwhile or were locked by a node; "
            "run it again for them.",
            result.action.value.capitalize(),
            who,
            result.skipped,
            extra=extra,
        )


# --- topics and jobs ------------------------------------------------------------------------
