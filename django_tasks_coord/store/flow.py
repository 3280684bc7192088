"""The claim of a topic under flow control (:mod:`django_tasks_coord.flow`).

One short write transaction per claim:

1. lock the topic's row (``SELECT ... FOR UPDATE``; SQLite's write lock) and read its
   limits: the limited claims of one topic take turns, cluster-wide, so each one counts
   what the previous one committed and no race can overrun a limit; then read the
   database clock (``now``), so that the claims' times follow their order;
2. count the room per key (:class:`_Room`): its ``concurrency`` (a key value's own from
   ``key_limits``, else the topic's per-key one) minus its tasks in flight, its ``rate``
   minus its starts logged in ``FlowStart`` within the rate's period; and the topic's:
   ``total_concurrency`` and ``total_rate`` minus the sums over the keys (rows older than
   the topic's longest period are deleted here);
3. choose due tasks, oldest first (or round-robin across keys when the topic is ``fair``:
   each key's oldest first, then each key's second..., starting after the key the previous
   claim served last, kept in ``Topic.fair_cursor``), skipping keys without room, up to the
   topic's room;
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
from django_tasks_coord.flow import FIELDS, Limits, Rate
from django_tasks_coord.models import FlowStart, Owner, Task, TaskQuerySet, Topic
from django_tasks_coord.store.flow_usage import usage

__all__ = ["claim", "hand_out", "held_back_until", "usage"]

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
    """Free places per key under the topic's limits, as counted at the claim's start: each
    key's own (``rate`` and ``concurrency``, or the key value's entry of ``key_limits``) and
    the topic's as a whole (``total_rate``, ``total_concurrency``: the sums over the keys,
    counted from the same tasks in flight and the same ``FlowStart`` log)."""

    def __init__(self, limits: Limits, name: str, now: datetime, using: str) -> None:
        self.limits, self.keyed, self.now = limits, bool(limits.key), now
        self.active: Counter[str] = Counter()
        self.total_active = 0
        #: the logged starts after ``now`` minus the longest period: (key, at, count)
        self.log: list[tuple[str, datetime, int]] = []
        self.started: dict[str, int] = {}  # per key, within the key's own rate period
        self.total_started = 0
        self.rate_waits: list[float] = []
        self.concurrency_blocked = False
        if limits.concurrencies():
            in_flight = Task.objects.using(using).filter(topic_id=name, state__in=IN_FLIGHT)
            if self.keyed:
                rows = in_flight.values("concurrency_key").annotate(n=Count("pk"))
                self.active.update({key: n for key, n in rows.values_list("concurrency_key", "n")})
            else:
                self.active[""] = in_flight.count()
            self.total_active = sum(self.active.values())
        rates = limits.rates()
        if rates:
            since = now - timedelta(seconds=max(rate.period for rate in rates))
            log = FlowStart.objects.using(using).filter(topic=name)
            log.filter(at__lte=since).delete()
            self.log = [
                (key if self.keyed else "", at, count)
                for key, at, count in log.values_list("key", "at", "count")
            ]
            if limits.total_rate is not None:
                self.total_started = self._starts(None, limits.total_rate)

    def _starts(self, key: str | None, rate: Rate) -> int:
        """Starts of ``key`` (None: all keys) logged within ``rate``'s period before now."""
        since = self.now - timedelta(seconds=rate.period)
        return sum(n for k, at, n in self.log if at > since and (key is None or k == key))

    def _wait(self, key: str | None, rate: Rate) -> float:
        """Seconds until the oldest start of ``key`` (None: all) in ``rate``'s window leaves it."""
        since = self.now - timedelta(seconds=rate.period)
        times = [at for k, at, _ in self.log if at > since and (key is None or k == key)]
        oldest = min(times, default=self.now)
        return (oldest - self.now).total_seconds() + rate.period

    def _started(self, key: str, rate: Rate) -> int:
        if key not in self.started:
            self.started[key] = self._starts(key, rate)
        return self.started[key]

    def key(self, task: Task) -> str:
        return task.concurrency_key if self.keyed else ""

    def free_total(self) -> int:
        """Places left for the topic as a whole."""
        limits, free = self.limits, 1 << 30
        if limits.total_concurrency is not None:
            free = min(free, limits.total_concurrency - self.total_active)
        if limits.total_rate is not None:
            free = min(free, limits.total_rate.count - self.total_started)
        return free

    def free(self, key: str) -> int:
        own, free = self.limits.for_key(key), self.free_total()
        if own.concurrency is not None:
            free = min(free, own.concurrency - self.active[key])
        if own.rate is not None:
            free = min(free, own.rate.count - self._started(key, own.rate))
        return free

    def take(self, key: str) -> bool:
        """Count a start of ``key`` if there is room for it; whether there was (if not,
        note what held it back)."""
        own = self.limits.for_key(key)
        if own.concurrency is not None and self.active[key] >= own.concurrency:
            self.concurrency_blocked = True
            return False
        if own.rate is not None and self._started(key, own.rate) >= own.rate.count:
            self.rate_waits.append(self._wait(key, own.rate))
            return False
        if self.free_total() <= 0:
            self.note_total_blocked()
            return False
        self.active[key] += 1
        self.total_active += 1
        if own.rate is not None:
            self.started[key] += 1
        self.total_started += 1
        return True

    def note_total_blocked(self) -> None:
        """Note what of the topic-wide limits leaves no room."""
        limits = self.limits
        if limits.total_concurrency is not None and self.total_active >= limits.total_concurrency:
            self.concurrency_blocked = True
        if limits.total_rate is not None and self.total_started >= limits.total_rate.count:
            self.rate_waits.append(self._wait(None, limits.total_rate))

    def retry_after(self, now: datetime, taken: Counter[str]) -> float | None:
        """Seconds until a claim held back now may find room (None: it was not held back)."""
        waits = list(self.rate_waits)
        if self.concurrency_blocked:
            waits.append(float(settings.FLOW_RECHECK_INTERVAL))
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


def _choose(candidates: TaskQuerySet, limit: int, room: _Room | _Rooms) -> list[Task]:
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
            .values_list(*FIELDS, "fair_cursor")
            .first()
        )
        if row is None:
            return []
        *fields, cursor = row
        # The clock once the lock is held (a statement's clock starts with the statement,
        # and the lock may have been waited for): claims' times follow their order.
        now = topic.annotate(db_now=Now()).values_list("db_now", flat=True).get()
        limits = Limits.of(*fields)
        room = _Room(limits, name, now, using)
        fair = limits.fair and room.keyed
        due = filter_due(Task.objects.using(using).for_topic(name).due())
        chosen = _choose(_ordered(due, order, fair, cursor), limit, room)
        if fair and chosen:
            topic.update(fair_cursor=chosen[-1].concurrency_key)
        changes: dict[str, Any] = {"owner": owner, "exec_id": exec_id, "started_at": now}
        chosen = _start(chosen, name, changes, using)
        taken = Counter(room.key(task) for task in chosen)
        if limits.rates() and taken:
            FlowStart.objects.using(using).bulk_create(
                FlowStart(topic=name, key=key, at=now, count=n) for key, n in taken.items()
            )
    _note_held_back(name, room.retry_after(now, taken), began)
    return chosen


class _Rooms:
    """Several rooms at once, each a :class:`_Room`: a start needs a place in every one.

    The room of a definition's topic (:func:`hand_out`): the topic's own limits, all
    topic-wide (its ``rate`` and ``concurrency`` and its totals), and the definition's
    ``concurrency_limit``, per the definition's key when it has a key path. Counted per
    ``Task.concurrency_key`` if any room is keyed; an unkeyed room counts every key under
    ``""``.
    """

    def __init__(self, rooms: list[_Room]) -> None:
        self.rooms = rooms
        self.keyed = any(room.keyed for room in rooms)

    def key(self, task: Task) -> str:
        return task.concurrency_key if self.keyed else ""

    def free_total(self) -> int:
        """Places left for the topic as a whole, in every room (an unkeyed room's one key
        is the whole topic)."""
        return min(
            (room.free_total() if room.keyed else room.free("") for room in self.rooms),
            default=1 << 30,
        )

    def note_total_blocked(self) -> None:
        """Note, in each room without a place for the topic as a whole, what held it back."""
        for room in self.rooms:
            if room.keyed:
                if room.free_total() <= 0:
                    room.note_total_blocked()
            elif room.free("") <= 0:
                room.take("")  # records what held the start back

    def free(self, key: str) -> int:
        return min((room.free(key if room.keyed else "") for room in self.rooms), default=1 << 30)

    def take(self, key: str) -> bool:
        """Count a start of ``key`` in every room if each has a place for it; whether they had
        (the first room without one records what held the start back)."""
        for room in self.rooms:
            own = key if room.keyed else ""
            if room.free(own) <= 0:
                room.take(own)
                return False
        for room in self.rooms:
            room.take(key if room.keyed else "")
        return True

    def retry_after(self, now: datetime, taken: Counter[str]) -> float | None:
        """Seconds until the window of a rate that held the hand-out back moves on (None: no
        rate held it back). A concurrency slot is not waited for: a freed one is announced
        (:func:`django_tasks_coord.store.handout.freed_a_slot`)."""
        waits = [wait for room in self.rooms for wait in room.rate_waits]
        return min(waits) if waits else None


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
        rooms = [_Room(limits, name, now, using)]
        if concurrency_limit is not None:
            own = Limits(concurrency=concurrency_limit, key="definition" if keyed else "")
            rooms.append(_Room(own, name, now, using))
        room = _Rooms(rooms)
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
