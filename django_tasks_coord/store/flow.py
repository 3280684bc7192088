"""The claim of a topic under flow control (:mod:`django_tasks_coord.flow`).

One short write transaction per claim:

1. lock the topic's row (``SELECT ... FOR UPDATE``; SQLite's write lock) and read its
   limits: the limited claims of one topic take turns, cluster-wide, so each one counts
   what the previous one committed and no race can overrun a limit; then read the
   database clock (``now``), so that the claims' times follow their order;
2. count the room per key (:class:`~django_tasks_coord.store.flow_room.Room`): its
   ``concurrency`` (a key value's own from ``key_limits``, else the topic's per-key one)
   minus its tasks in flight, its ``rate`` minus its starts logged in ``FlowStart`` within
   the rate's period; and the topic's: ``total_concurrency`` and ``total_rate`` minus the
   sums over the keys (rows older than the topic's longest period are deleted);
3. choose due tasks, oldest first (or round-robin across keys when the topic is ``fair``:
   each key's oldest first, then each key's second..., starting after the key the previous
   claim served last, kept in ``Topic.fair_cursor``), skipping keys without room, up to the
   topic's room;
4. mark them ACTIVE with ``started_at = now`` (re-checking in the ``UPDATE`` that they are
   still pending) and log their starts.

Limits without a key give every due task the same place, so steps 2 to 4 shrink to what a
claim without limits does plus two statements: the clock and the room counted in one
statement (:meth:`~django_tasks_coord.store.flow_room.Room.unkeyed`), the claim statement
of a topic without limits (:func:`django_tasks_coord.store.claims.claim`) taking
min(batch, room) tasks, and the starts logged (an expired log row overwritten rather than
a row inserted and another deleted). A claim's time went mostly to its round trips, each
a wait for the database and for the node's other threads: limits that do not bind cost
little more than none (``docs/flow-control.md``, "What it costs").

A rate limit is a sliding window on one clock, the database's: no window of ``period``
seconds ever holds more than N starts, whatever the nodes' clocks say.
"""

from __future__ import annotations

import math
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

from django.db.models import Case, F, Value, When, Window
from django.db.models.functions import Now, RowNumber

from django_tasks_coord import db
from django_tasks_coord.enums import Order, TaskState
from django_tasks_coord.flow import FIELDS, Limits
from django_tasks_coord.models import FlowStart, Owner, Task, TaskQuerySet, Topic
from django_tasks_coord.store.flow_room import Room, Rooms, log_starts
from django_tasks_coord.store.flow_usage import usage

__all__ = ["claim", "hand_out", "held_back_until", "usage"]

#: The claim of :func:`claim`'s topic without its limits: ``(due, limit, changes)`` -> the
#: first ``limit`` of ``due`` (ordered), marked ACTIVE under ``changes`` (owner, exec_id,
#: started_at).
type ClaimStatement = Callable[[TaskQuerySet, int, dict[str, Any]], list[Task]]
#: Rounds of candidates a claim looks through for tasks whose key has room.
_MAX_ROUNDS = 20
#: Where a claim was held back by a limit: topic -> when (``time.monotonic()``) to look again.
_held_back: dict[str, float] = {}


def held_back_until(topics: list[str], since: float = -math.inf) -> float | None:
    """The earliest ``time.monotonic()`` at which a claim of one of ``topics`` that a limit
    held back in this process may find room again; None if none was held back.

    With ``since``, only the moments at or after it count: a claim that began at ``since``
    or later notes no earlier one, and a topic held back once and unlimited since (its
    claims no longer come here) keeps its old entry.
    """
    times = [at for at in map(_held_back.get, topics) if at is not None and at >= since]
    return min(times) if times else None


#: The shortest wait for a claim that a limit held back: the moment its claim noted may have
#: passed by the time the caller reads it (a claim's round trip can outlast the time left until
#: a rate window moves on).
RECHECK_AFTER = 0.02


def next_look(topics: list[str], since: float) -> float | None:
    """Seconds until a claim of one of ``topics`` that a limit held back may find room again,
    counting only claims that began at ``since`` (``time.monotonic()``) or later (see
    :func:`held_back_until`), and at least :data:`RECHECK_AFTER`; None if none was held back."""
    held = held_back_until(topics, since)
    return None if held is None else max(held - time.monotonic(), RECHECK_AFTER)


def _note_held_back(topic: str, seconds: float | None, since: float) -> None:
    """Remember that a claim of ``topic`` that began at ``since`` (``time.monotonic()``) may
    find room ``seconds`` after it began (None: it was not held back)."""
    if seconds is None:
        _held_back.pop(topic, None)
    else:
        _held_back[topic] = since + max(seconds, 0.001)


def _ordered(due: TaskQuerySet, order: Order, fair: bool, cursor: str) -> TaskQuerySet:
    """``due`` in claim order: by priority, then ``order``; when ``fair``, round-robin
    across keys: every key's first task (by priority, then ``order``) before any key's
    second, the keys after ``cursor`` (the last one served) before the others, in order."""
    sequence = "sequence" if order is Order.FIFO else "-sequence"
    if not fair:
        return due.order_by("-priority", sequence)
    turn = Window(
        RowNumber(),
        partition_by=[F("concurrency_key")],
        order_by=[
            F("priority").desc(),
            F("sequence").asc() if order is Order.FIFO else F("sequence").desc(),
        ],
    )
    wrapped = Case(When(concurrency_key__gt=cursor, then=Value(0)), default=Value(1))
    return due.annotate(_turn=turn, _wrapped=wrapped).order_by(
        "_turn", "_wrapped", "concurrency_key"
    )


def _unkeyed_room(limit: int, room: Room) -> int:
    """How many of ``limit`` tasks a claim of a topic whose limits have no key may take
    (as :func:`_choose` counts it); where none, what held it back is noted in ``room``."""
    wanted = min(limit, room.free_total())
    if wanted <= 0:
        room.note_total_blocked()
        return 0
    wanted = min(wanted, room.free(""))
    if wanted <= 0:
        room.take("")  # records what held the claim back
    return max(wanted, 0)


def _choose(candidates: TaskQuerySet, limit: int, room: Room | Rooms) -> list[Task]:
    """Up to ``limit`` of ``candidates`` whose keys have room, in their order."""
    chosen: list[Task] = []
    full: set[str] = set()
    seen: list[int] = []
    for _ in range(_MAX_ROUNDS):
        wanted = min(limit - len(chosen), room.free_total())
        if wanted <= 0:
            if len(chosen) < limit:
                room.note_total_blocked()  # records what held the claim back
            break
        batch_qs = candidates
        if room.keyed and full:
            batch_qs = batch_qs.exclude(concurrency_key__in=full)
        if seen:
            batch_qs = batch_qs.exclude(pk__in=seen)
        if not room.keyed:
            wanted = min(wanted, max(room.free(""), 0))
            if wanted <= 0:
                room.take("")  # records what held the claim back
                break
        batch = list(batch_qs[:wanted])
        for task in batch:
            seen.append(task.pk)
            key = room.key(task)
            if room.take(key):
                chosen.append(task)
            if room.free(key) <= 0:
                full.add(key)
        if len(chosen) >= limit or len(batch) < wanted or not room.keyed:
            break
    return chosen


def claim(
    name: str,
    limit: int,
    order: Order,
    owner: Owner | None,
    using: str,
    filter_due: Callable[[TaskQuerySet], TaskQuerySet],
    statement: ClaimStatement | None = None,
) -> list[Task]:
    """Claim up to ``limit`` due tasks of topic ``name`` within its limits (see the module).

    ``filter_due`` narrows the due tasks (a poll condition; ``statement`` applies it
    itself, see :func:`django_tasks_coord.store.claims.claim`). Returns the tasks, ACTIVE for
    ``owner``, in the order chosen. Where a limit held the claim back, this process
    remembers when to look again (:func:`held_back_until`).

    When the limits have no key, every due task takes the same place: steps 3 and 4 are
    then ``statement`` (given), the claim without limits of
    :func:`django_tasks_coord.store.claims.claim`, one ``UPDATE`` of the first
    min(``limit``, room) due tasks, rather than a ``SELECT`` of them and an ``UPDATE`` by
    their keys: limits that do not bind cost little more than none.
    """
    conn, exec_id, began = db.connection(), uuid.uuid4(), time.monotonic()
    with db.write_transaction():
        topic = Topic.objects.using(using).filter(name=name)
        row = (
            topic.select_for_update(**db.lock_kwargs(conn, skip_locked=False))
            .values_list(*FIELDS, "fair_cursor")
            .first()
        )
        if row is None:
            return []
        *fields, cursor = row
        limits = Limits.of(*fields)
        # The clock once the lock is held (a statement's clock starts with the statement,
        # and the lock may have been waited for): claims' times follow their order.
        if statement is not None and not limits.key:
            room = Room.unkeyed(limits, topic, name, using)  # the clock, and the counts
        else:
            now = topic.annotate(db_now=Now()).values_list("db_now", flat=True).get()
            room = Room(limits, name, now, using)
        now = room.now
        fair = limits.fair and room.keyed
        due = _ordered(Task.objects.using(using).for_topic(name).due(), order, fair, cursor)
        changes: dict[str, Any] = {"owner": owner, "exec_id": exec_id, "started_at": now}
        if statement is not None and not room.keyed:
            wanted = _unkeyed_room(limit, room)
            chosen = statement(due, wanted, changes) if wanted > 0 else []
        else:
            chosen = _choose(filter_due(due), limit, room)
            if fair and chosen:
                topic.update(fair_cursor=chosen[-1].concurrency_key)
            chosen = _start(chosen, name, changes, using)
        taken = Counter(room.key(task) for task in chosen)
        log_starts(room, taken)
    _note_held_back(name, room.retry_after(now, taken), began)
    return chosen


def hand_out(
    name: str,
    limit: int,
    concurrency_limit: int | None,
    keyed: bool,
    ready: TaskQuerySet,
    mark: Callable[[list[Task]], list[Task]],
    using: str,
) -> list[Task]:
    """The claim of an executor definition's topic ``name`` (the executor API's hand-out,
    :func:`django_tasks_coord.store.handout.hand_out`): :func:`claim`'s steps, under the
    topic's limits and the definition's own ``concurrency_limit`` together.

    The topic's row is locked and its limits read as :func:`claim` reads them, but counted
    topic-wide: ``rate`` and ``concurrency`` as much as ``total_rate`` and
    ``total_concurrency``. A definition's tasks are keyed by its ``concurrency_key_path``
    alone (a topic ``key`` and ``key_limits`` are refused for a definition's topic by
    :func:`django_tasks_coord.flow.set_limits` and
    :func:`~django_tasks_coord.flow.set_key_limits`; written around them, they and ``fair``
    are ignored here). ``concurrency_limit`` counts per ``Task.concurrency_key`` when
    ``keyed``, else topic-wide; every limit holds.

    ``ready`` are the candidates, in claim order; ``mark`` hands the chosen ones out
    (writes them) and returns those it marked. Nothing of a paused topic (or one without a
    row). Starts are logged in ``FlowStart`` when the topic has a rate; where a limit held
    the hand-out back, this process remembers when to look again (:func:`held_back_until`).
    """
    conn, began = db.connection(), time.monotonic()
    with db.write_transaction():
        topic = Topic.objects.using(using).filter(name=name)
        row = (
            topic.select_for_update(**db.lock_kwargs(conn, skip_locked=False))
            .values_list("paused", *FIELDS)
            .first()
        )
        if row is None or row[0]:
            return []  # paused in the admin, or no task was ever created
        stored = Limits.of(*row[1:])
        now = topic.annotate(db_now=Now()).values_list("db_now", flat=True).get()
        # Topic-wide: no key (so no fair, no key values' limits), the totals kept.
        limits = Limits(
            stored.rate,
            stored.concurrency,
            total_rate=stored.total_rate,
            total_concurrency=stored.total_concurrency,
        )
        rooms = [Room(limits, name, now, using)]
        if concurrency_limit is not None:
            own = Limits(concurrency=concurrency_limit, key="definition" if keyed else "")
            rooms.append(Room(own, name, now, using))
        room = Rooms(rooms)
        chosen = mark(_choose(ready, limit, room))
        taken = Counter(room.key(task) for task in chosen)
        if limits.rates() and chosen:
            FlowStart.objects.using(using).create(topic=name, key="", at=now, count=len(chosen))
    _note_held_back(name, room.retry_after(now, taken), began)
    return chosen


def _start(chosen: list[Task], name: str, changes: dict[str, Any], using: str) -> list[Task]:
    """Mark ``chosen`` ACTIVE under ``changes`` (owner, exec_id, started_at), re-checking in
    the ``UPDATE`` that each is still pending; those it marked, updated in memory too."""
    if not chosen:
        return []
    rows = Task.objects.using(using).rows(chosen).filter(state=TaskState.PENDING)
    updated = rows.update(
        state=TaskState.ACTIVE, attempts=F("attempts") + 1, finished_at=None, **changes
    )
    if updated != len(chosen):  # some changed since chosen (canceled, replaced)
        held = Task.objects.using(using).filter(
            topic_id=name, exec_id=changes["exec_id"], state=TaskState.ACTIVE
        )
        kept = set(held.values_list("pk", flat=True))
        chosen = [task for task in chosen if task.pk in kept]
    for task in chosen:
        task.state, task.attempts, task.finished_at = TaskState.ACTIVE, task.attempts + 1, None
        task.owner, task.exec_id, task.started_at = (
            changes["owner"],
            changes["exec_id"],
            changes["started_at"],
        )
    return chosen
