"""Handing defined tasks out to external executors, and taking back hand-outs never started.

:func:`hand_out` is the executor API's claim (``executions.poll``): ready tasks of one
definition become REQUESTED, each under a fresh ``exec_id``, within the definition's
concurrency limit. :func:`take_back` returns requested tasks whose start deadline
passed to the ready state (the requested-to-start timeout). :func:`freed_a_slot` wakes
the long-polls waiting for room under a concurrency limit.
"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.db.models import Case, Count, Q, QuerySet, UUIDField, Value, When

from django_tasks_coord import db, definitions
from django_tasks_coord.enums import IN_FLIGHT, TaskState
from django_tasks_coord.models import Task, Topic
from django_tasks_coord.store.fencing import held

if TYPE_CHECKING:
    from django_tasks_coord.definitions import Definition

__all__ = ["expired", "freed_a_slot", "give_back", "hand_out", "take_back"]

#: Rounds of candidates a poll looks through for tasks whose concurrency key has room.
_MAX_ROUNDS = 20


def hand_out(definition: Definition, limit: int, now: datetime) -> list[Task]:
    """Claim up to ``limit`` ready tasks of one definition in one short transaction.

    Without a concurrency limit this is the queue's claim: ``SELECT ... FOR UPDATE SKIP
    LOCKED``, so concurrent pollers never take the same task. With a limit, the
    definition's topic row is locked first (``FOR UPDATE``): polls of a limited
    definition take turns, so each one counts the tasks in flight after the previous
    one committed, and the limit cannot be overrun by a race. (SQLite serializes every
    write transaction anyway.)
    """
    using, conn = db.alias(), db.connection()
    with db.write_transaction():
        room: Counter[str] | None = None
        topic = Topic.objects.using(using).filter(name=definition.name)
        if definition.concurrency_limit is not None:
            locked = topic.select_for_update(**db.lock_kwargs(conn, skip_locked=False))
            if list(locked.values_list("paused", flat=True)) != [False]:
                return []  # paused in the admin, or no task was ever created
            room = _room(definition)
            if room.total() <= 0 and definition.concurrency_key_path is None:
                return []
        elif topic.filter(paused=True).exists():
            return []  # paused (queue.pause_topic, the admin): executors get nothing
        ready = (
            Task.objects.using(using)
            .filter(topic_id=definition.name, state=TaskState.PENDING)
            .filter(Q(execute_at__isnull=True) | Q(execute_at__lte=now))
            .order_by("-priority", "sequence")
            .select_for_update(**db.lock_kwargs(conn))
        )
        chosen = _choose(ready, limit, room, definition)
        if not chosen:
            return []
        exec_ids = {task.pk: uuid.uuid4() for task in chosen}
        deadline = now + timedelta(seconds=definition.requested_to_start_timeout)
        Task.objects.using(using).rows(chosen).update(
            state=TaskState.REQUESTED,
            exec_id=Case(
                *(When(pk=pk, then=Value(exec_id)) for pk, exec_id in exec_ids.items()),
                output_field=UUIDField(),
            ),
            deadline=deadline,
            owner=None,
        )
    for task in chosen:
        task.state, task.exec_id, task.deadline = TaskState.REQUESTED, exec_ids[task.pk], deadline
    return chosen


def _room(definition: Definition) -> Counter[str]:
    """Free places per concurrency key (the key ``""`` only, without a key path)."""
    assert definition.concurrency_limit is not None
    in_flight = (
        Task.objects.using(db.alias())
        .filter(topic_id=definition.name, state__in=IN_FLIGHT)
        .values("concurrency_key")
        .annotate(n=Count("pk"))
        .values_list("concurrency_key", "n")
    )
    taken = dict(in_flight)
    if definition.concurrency_key_path is None:
        return Counter({"": definition.concurrency_limit - sum(taken.values())})
    return Counter({key: definition.concurrency_limit - n for key, n in taken.items()})


def _choose(
    ready: QuerySet[Task], limit: int, room: Counter[str] | None, definition: Definition
) -> list[Task]:
    """Take up to ``limit`` tasks of ``ready`` that fit the free places of their keys."""
    if room is None:
        return list(ready[:limit])
    if definition.concurrency_key_path is None:
        return list(ready[: min(limit, room[""])])
    assert definition.concurrency_limit is not None
    limit_per_key = definition.concurrency_limit
    chosen: list[Task] = []
    seen: list[int] = []
    full = {key for key, free in room.items() if free <= 0}
    for _ in range(_MAX_ROUNDS):
        wanted = limit - len(chosen)
        batch = list(ready.exclude(concurrency_key__in=full).exclude(pk__in=seen)[:wanted])
        for task in batch:
            seen.append(task.pk)
            key = task.concurrency_key
            free = room.get(key, limit_per_key)
            if free > 0 and len(chosen) < limit:
                chosen.append(task)
                room[key] = free - 1
            if room.get(key, limit_per_key) <= 0:
                full.add(key)
        if len(chosen) >= limit or len(batch) < wanted:
            break
    return chosen


def expired(state: TaskState, names: list[str], now: datetime, batch_size: int) -> list[Task]:
    """Lock up to ``batch_size`` tasks of ``names`` in ``state`` past their deadline, oldest
    deadline first, skipping rows locked elsewhere. Call it inside a write transaction."""
    conn = db.connection()
    return list(
        Task.objects.using(db.alias())
        .filter(state=state, deadline__lt=now, topic_id__in=names)
        .order_by("deadline")
        .select_for_update(**db.lock_kwargs(conn))[:batch_size]
    )


def take_back(names: list[str], now: datetime, batch_size: int, reason: str) -> int:
    """Return requested tasks of ``names`` past their deadline to ready (``reason`` says
    why); at most ``batch_size``, skipping rows locked elsewhere; return how many."""
    with db.write_transaction():
        late = expired(TaskState.REQUESTED, names, now, batch_size)
        if not late:
            return 0
        Task.objects.using(db.alias()).rows(late).update(
            state=TaskState.PENDING,
            exec_id=None,
            deadline=None,
            outcome_reason=reason,
        )
        for topic in sorted({t.topic_id for t in late}):
            db.notify(db.connection(), topic)
    return len(late)


def give_back(tasks: list[Task]) -> int:
    """Undo :func:`hand_out` for ``tasks`` still requested under the exec_ids it gave them:
    ready again, as if never handed out (nothing was started, no attempt counted). For a
    hand-out whose recipient turned out not to be entitled to it. Returns how many."""
    if not tasks:
        return 0
    with db.write_transaction():
        returned = held(tasks, state=TaskState.REQUESTED).update(
            state=TaskState.PENDING, exec_id=None, deadline=None
        )
        for topic in sorted({t.topic_id for t in tasks}):
            db.notify(db.connection(), topic)
    for task in tasks:
        task.state, task.exec_id, task.deadline = TaskState.PENDING, None, None
    return returned


def freed_a_slot(task: Task, definition: Definition | None = None) -> None:
    """Wake long-polls waiting for a concurrency slot of ``task``'s definition (PostgreSQL):
    call it once a write took ``task`` out of flight."""
    definition = definition or definitions.get(task.topic_id)
    if definition.concurrency_limit is not None:
        db.notify(db.connection(), task.topic_id)
