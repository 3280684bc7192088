"""The room of a claim under flow control (:mod:`django_tasks_coord.store.flow`): the free
places per key and for the topic as a whole, counted from the tasks in flight and the
``FlowStart`` log once the topic's row is locked (:class:`Room`; :class:`Rooms`, several at
once, for the executor API's hand-out), and the log of the starts a claim made
(:func:`log_starts`)."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Aggregate, Count, Min, QuerySet, Subquery, Sum, Value
from django.db.models.functions import Coalesce, Now

from django_tasks_coord import db
from django_tasks_coord.conf import app_settings as settings
from django_tasks_coord.enums import IN_FLIGHT
from django_tasks_coord.flow import Limits, Rate
from django_tasks_coord.models import FlowStart, Task, Topic

__all__ = ["Room", "Rooms", "log_starts"]


def _longest(rates: list[Rate]) -> float:
    return max(rate.period for rate in rates)


def _scalar(rows: QuerySet[Any], column: str, aggregate: Aggregate, empty: Any = 0) -> Any:
    """``aggregate`` over ``rows`` (all of one ``column`` value) as a scalar subquery;
    ``empty`` where there is no row."""
    value = Subquery(rows.order_by().values(column).annotate(v=aggregate).values("v"))
    return value if empty is None else Coalesce(value, Value(empty))


class Room:
    """Free places per key under the topic's limits, as counted at the claim's start: each
    key's own (``rate`` and ``concurrency``, or the key value's entry of ``key_limits``) and
    the topic's as a whole (``total_rate``, ``total_concurrency``: the sums over the keys,
    counted from the same tasks in flight and the same ``FlowStart`` log)."""

    def __init__(
        self, limits: Limits, name: str, now: datetime, using: str, *, count: bool = True
    ) -> None:
        self.limits, self.keyed, self.now = limits, bool(limits.key), now
        self.name, self.using = name, using
        self.active: Counter[str] = Counter()
        self.total_active = 0
        #: the logged starts after ``now`` minus the longest period: (key, at, count); None
        #: until read (:attr:`log`)
        self._log: list[tuple[str, datetime, int]] | None = []
        self.started: dict[str, int] = {}  # per key, within the key's own rate period
        self.total_started = 0
        self.rate_waits: list[float] = []
        self.concurrency_blocked = False
        #: logged starts older than the longest period, and the first of them (:meth:`unkeyed`)
        self.expired, self.expired_pk = 0, None
        if not count:
            return
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
            self._log = [
                (key if self.keyed else "", at, count)
                for key, at, count in log.values_list("key", "at", "count")
            ]
            if limits.total_rate is not None:
                self.total_started = self._starts(None, limits.total_rate)

    @classmethod
    def unkeyed(cls, limits: Limits, topic: QuerySet[Topic], name: str, using: str) -> Room:
        """The room of a claim of topic ``name`` (its row ``topic``, locked) whose ``limits``
        have no key, counted in one statement with the database clock (``now``): the tasks
        in flight, the starts logged within each rate's period, and the expired log rows
        (older than the longest period: :func:`log_starts` deletes them). The log itself is
        read only when a rate leaves no room (to tell when it will)."""
        values: dict[str, Any] = {"db_now": Now()}
        if limits.concurrencies():
            in_flight = Task.objects.using(using).filter(topic_id=name, state__in=IN_FLIGHT)
            values["active"] = _scalar(in_flight, "topic_id", Count("pk"))
        rates = limits.rates()
        log = FlowStart.objects.using(using).filter(topic=name)
        periods = {rate.period: f"started_{i}" for i, rate in enumerate(rates)}
        for period, alias in periods.items():
            within = log.filter(at__gt=db.ago(timedelta(seconds=period)))
            values[alias] = _scalar(within, "topic", Sum("count"))
        if rates:
            expired = log.filter(at__lte=db.ago(timedelta(seconds=_longest(rates))))
            values["expired"] = _scalar(expired, "topic", Count("pk"))
            values["expired_pk"] = _scalar(expired, "topic", Min("pk"), None)
        counted = dict(
            zip(values, topic.annotate(**values).values_list(*values).get(), strict=True)
        )
        room = cls(limits, name, counted["db_now"], using, count=False)
        room._log = None
        room.active[""] = room.total_active = counted.get("active", 0)
        if limits.rate is not None:
            room.started[""] = counted[periods[limits.rate.period]]
        if limits.total_rate is not None:
            room.total_started = counted[periods[limits.total_rate.period]]
        room.expired, room.expired_pk = counted.get("expired", 0), counted.get("expired_pk")
        return room

    @property
    def log(self) -> list[tuple[str, datetime, int]]:
        """The logged starts within the longest period (read now if not yet read)."""
        if self._log is None:
            since = self.now - timedelta(seconds=_longest(self.limits.rates()))
            log = FlowStart.objects.using(self.using).filter(topic=self.name, at__gt=since)
            self._log = [("", at, count) for at, count in log.values_list("at", "count")]
        return self._log

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


class Rooms:
    """Several rooms at once, each a :class:`Room`: a start needs a place in every one.

    The room of a definition's topic (:func:`hand_out`): the topic's own limits, all
    topic-wide (its ``rate`` and ``concurrency`` and its totals), and the definition's
    ``concurrency_limit``, per the definition's key when it has a key path. Counted per
    ``Task.concurrency_key`` if any room is keyed; an unkeyed room counts every key under
    ``""``.
    """

    def __init__(self, rooms: list[Room]) -> None:
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


def log_starts(room: Room, taken: Counter[str]) -> None:
    """Log the starts ``taken`` (per key) of a claim at ``room.now`` in ``FlowStart`` (a
    topic with a rate), and delete the rows older than the topic's longest period.

    A room counted by :meth:`Room.unkeyed` (its log already pruned otherwise) overwrites
    the first expired row with its start rather than inserting one and deleting it, and
    deletes only when more than that one has expired.
    """
    rates = room.limits.rates()
    if not rates:
        return
    log = FlowStart.objects.using(room.using).filter(topic=room.name)
    reused = 0
    if room.expired_pk is not None and taken:
        ((key, n),) = taken.items()  # unkeyed: one key
        reused = log.filter(pk=room.expired_pk).update(key=key, at=room.now, count=n)
    if taken and not reused:
        FlowStart.objects.using(room.using).bulk_create(
            FlowStart(topic=room.name, key=key, at=room.now, count=n) for key, n in taken.items()
        )
    if room.expired > reused:
        log.filter(at__lte=room.now - timedelta(seconds=_longest(rates))).delete()
