"""The claim of a topic under flow control (:mod:`django_tasks_coord.flow`).

One short write transaction per claim:

1. lock the topic's row (``SELECT ... FOR UPDATE``; SQLite's write lock) and read its
   limits: the limited claims of one topic take turns, cluster-wide, so each one counts
   what the previous one committed and no race can overrun a limit; then read the
   database clock (``now``), so that the claims' times follow their order;
2. count the room per key: ``concurrency`` minus the tasks in flight, ``rate`` minus the
   starts logged in ``FlowStart`` after ``now - period`` (older rows are deleted here);
3. choose due tasks, oldest first (or round-robin across keys when the topic is ``fair``:
   each key's oldest first, then each key's second..., starting after the key the previous
   claim served last, kept in ``Topic.fair_cursor``), skipping keys without room;
4. mark them ACTIVE with ``started_at = now`` (re-checking in the ``UPDATE`` that they are
   still pending) and log their starts.

A rate limit is a sliding window on one clock, the database's: no window of ``period``
seconds ever holds more than N starts, whatever the nodes' clocks say.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Case, Count, F, Value, When, Window
from django.db.models.functions import Now, RowNumber

from django_tasks_coord import db
from django_tasks_coord.conf import app_settings as settings
from django_tasks_coord.enums import IN_FLIGHT, Order, TaskState
from django_tasks_coord.flow import Limits
from django_tasks_coord.models import FlowStart, Owner, Task, TaskQuerySet, Topic

__all__ = ["claim", "held_back_until", "usage"]

#: Rounds of candidates a claim looks through for tasks whose key has room.
_MAX_ROUNDS = 20
#: Where a claim was held back by a limit: topic -> when (``time.monotonic()``) to look again.
_held_back: dict[str, float] = {}


def held_back_until(topics: list[str]) -> float | None:
    """The earliest ``time.monotonic()`` at which a claim of one of ``topics`` that a limit
    held back in this process may find room again; None if none was held back."""
    times = [_held_back[topic] for topic in topics if topic in _held_back]
    return min(times) if times else None


def _note_held_back(topic: str, seconds: float | None, since: float) -> None:
    """Remember that a claim of ``topic`` that began at ``since`` (``time.monotonic()``) may
    find room ``seconds`` after it began (None: it was not held back)."""
    if seconds is None:
        _held_back.pop(topic, None)
    else:
        _held_back[topic] = since + max(seconds, 0.001)


class _Room:
    """Free places per key under the topic's limits, as counted at the claim's start."""

    def __init__(self, limits: Limits, name: str, now: datetime, using: str) -> None:
        self.limits, self.keyed = limits, bool(limits.key)
        self.active: Counter[str] = Counter()
        self.started: Counter[str] = Counter()
        self.oldest: dict[str, datetime] = {}
        self.rate_blocked = self.concurrency_blocked = False
        if limits.concurrency is not None:
            in_flight = Task.objects.using(using).filter(topic_id=name, state__in=IN_FLIGHT)
            if self.keyed:
                rows = in_flight.values("concurrency_key").annotate(n=Count("pk"))
                self.active.update({key: n for key, n in rows.values_list("concurrency_key", "n")})
            else:
                self.active[""] = in_flight.count()
        if limits.rate is not None:
            since = now - timedelta(seconds=limits.rate.period)
            log = FlowStart.objects.using(using).filter(topic=name)
            log.filter(at__lte=since).delete()
            for key, at, count in log.values_list("key", "at", "count"):
                key = key if self.keyed else ""
                self.started[key] += count
                self.oldest[key] = min(at, self.oldest.get(key, at))

    def key(self, task: Task) -> str:
        return task.concurrency_key if self.keyed else ""

    def free(self, key: str) -> int:
        limits, free = self.limits, 1 << 30
        if limits.concurrency is not None:
            free = min(free, limits.concurrency - self.active[key])
        if limits.rate is not None:
            free = min(free, limits.rate.count - self.started[key])
        return free

    def take(self, key: str) -> bool:
        """Count a start of ``key`` if there is room for it; whether there was."""
        limits = self.limits
        if limits.concurrency is not None and self.active[key] >= limits.concurrency:
            self.concurrency_blocked = True
            return False
        if limits.rate is not None and self.started[key] >= limits.rate.count:
            self.rate_blocked = True
            return False
        self.active[key] += 1
        self.started[key] += 1
        return True

    def retry_after(self, now: datetime, taken: Counter[str]) -> float | None:
        """Seconds until a claim held back now may find room (None: it was not held back)."""
        waits = []
        if self.concurrency_blocked:
            waits.append(float(settings.FLOW_RECHECK_INTERVAL))
        if self.rate_blocked and self.limits.rate is not None:
            period = self.limits.rate.period
            oldest = min(self.oldest.values(), default=now)
            waits.append((oldest - now).total_seconds() + period)
        return min(waits) if waits else None


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


def _choose(candidates: TaskQuerySet, limit: int, room: _Room) -> list[Task]:
    """Up to ``limit`` of ``candidates`` whose keys have room, in their order."""
    chosen: list[Task] = []
    full: set[str] = set()
    seen: list[int] = []
    for _ in range(_MAX_ROUNDS):
        wanted = limit - len(chosen)
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
) -> list[Task]:
    """Claim up to ``limit`` due tasks of topic ``name`` within its limits (see the module).

    ``filter_due`` narrows the due tasks (a poll condition). Returns the tasks, ACTIVE for
    ``owner``, in the order chosen. Where a limit held the claim back, this process
    remembers when to look again (:func:`held_back_until`).
    """
    conn, exec_id, began = db.connection(), uuid.uuid4(), time.monotonic()
    with db.write_transaction():
        topic = Topic.objects.using(using).filter(name=name)
        row = (
            topic.select_for_update(**db.lock_kwargs(conn, skip_locked=False))
            .values_list("rate_limit", "concurrency_limit", "limit_key", "fair", "fair_cursor")
            .first()
        )
        if row is None:
            return []
        rate, concurrency, key, fair, cursor = row
        # The clock once the lock is held (a statement's clock starts with the statement,
        # and the lock may have been waited for): claims' times follow their order.
        now = topic.annotate(db_now=Now()).values_list("db_now", flat=True).get()
        limits = Limits.of(rate, concurrency, key, fair)
        room = _Room(limits, name, now, using)
        fair = limits.fair and room.keyed
        due = filter_due(Task.objects.using(using).for_topic(name).due())
        chosen = _choose(_ordered(due, order, fair, cursor), limit, room)
        if fair and chosen:
            topic.update(fair_cursor=chosen[-1].concurrency_key)
        changes: dict[str, Any] = {"owner": owner, "exec_id": exec_id, "started_at": now}
        chosen = _start(chosen, name, changes, using)
        taken = Counter(room.key(task) for task in chosen)
        if limits.rate is not None and taken:
            FlowStart.objects.using(using).bulk_create(
                FlowStart(topic=name, key=key, at=now, count=n) for key, n in taken.items()
            )
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


def usage(name: str, using: str | None = None) -> dict[str, Any]:
    """What the limits of topic ``name`` see now: tasks in flight and starts in the current
    rate window, each per key (for the admin and the metrics)."""
    using = using or db.alias()
    row = Topic.objects.using(using).filter(name=name).annotate(db_now=Now())
    found = row.values_list(
        "rate_limit", "concurrency_limit", "limit_key", "fair", "db_now"
    ).first()
    if found is None:
        return {"limits": Limits(), "active": {}, "started": {}}
    rate, concurrency, key, fair, now = found
    limits = Limits.of(rate, concurrency, key, fair)
    active: Counter[str] = Counter()
    in_flight = Task.objects.using(using).filter(topic_id=name, state__in=IN_FLIGHT)
    for key, n in (
        in_flight.values("concurrency_key")
        .annotate(n=Count("pk"))
        .values_list("concurrency_key", "n")
    ):
        active[key if limits.key else ""] += n
    started: Counter[str] = Counter()
    if limits.rate is not None:
        since = now - timedelta(seconds=limits.rate.period)
        log = FlowStart.objects.using(using).filter(topic=name, at__gt=since)
        for key, count in log.values_list("key", "count"):
            started[key if limits.key else ""] += count
    return {"limits": limits, "active": dict(active), "started": dict(started)}
