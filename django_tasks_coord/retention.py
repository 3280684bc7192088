"""Retention: per-topic policies that delete old finished tasks, in small batches.

::

    from django_tasks_coord import retention

    retention.set_policy("invoices", keep_completed_days=7, keep_failed_days=90)
    retention.set_policy("events", keep_completed_rows=100_000, keep_failed_rows=10_000)
    retention.apply()            # what every node does every RETENTION_INTERVAL seconds

A topic's policy has two classes of finished tasks, each with two optional limits
(``None``: keep for ever):

- *completed*: SUCCEEDED, FILTERED, CANCELED and REDUNDANT tasks
  (``keep_completed_days``, ``keep_completed_rows``);
- *failed*: FAILED tasks (``keep_failed_days``, ``keep_failed_rows``), so that
  failures can be kept longer than successes.

A task goes when it is past *either* limit of its class: its ``finished_at`` is more
than N days ago, or it is not among the N newest tasks (by sequence) of its class
in its topic. SUSPENDED tasks (they wait for a reset or a junction) and tasks that
are not finished (PENDING, REQUESTED, ACTIVE) are never deleted by retention.
``queue.purge`` and ``manage.py tasks_coord_prune`` stay available for manual deletion.

How it deletes: one topic at a time (the task table may be partitioned by topic,
so every statement names its topic), one state at a time (each victim query is a
range of the ``(topic, state, sequence)`` index, read in sequence order), in
batches of ``RETENTION_BATCH_SIZE`` rows, each batch a short transaction of its
own. On PostgreSQL and MySQL/MariaDB the batch's rows are picked with
``SELECT ... FOR UPDATE SKIP LOCKED``: retention never waits for a row another
transaction holds, so two nodes applying it at once, or a node and the hot path,
never block each other; what is skipped goes in a later pass. SQLite has no row
locks: the rows are picked first and deleted in a write transaction that checks
the policy again.

Every node runs a :class:`Housekeeper` thread (``RETENTION_INTERVAL``, ``0``: none)
that applies the policies of every topic that has one in bounded passes; when no
topic has a policy, a pass is one query on the topic table.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connections, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from django_tasks_coord import db
from django_tasks_coord.conf import app_settings
from django_tasks_coord.enums import TaskState
from django_tasks_coord.exceptions import InvalidArgumentError
from django_tasks_coord.models import Task, Topic
from django_tasks_coord.topics import TopicRef, topic_name

__all__ = [
    "COMPLETED_STATES",
    "FAILED_STATES",
    "LIMITS",
    "PASS_MAX_BATCHES",
    "Housekeeper",
    "Policy",
    "apply",
    "delete_finished",
    "get_policy",
    "policies",
    "set_policy",
]

logger = logging.getLogger(__name__)

#: The states the *completed* limits apply to.
COMPLETED_STATES: tuple[TaskState, ...] = (
    TaskState.SUCCEEDED,
    TaskState.FILTERED,
    TaskState.CANCELED,
    TaskState.REDUNDANT,
)
#: The states the *failed* limits apply to.
FAILED_STATES: tuple[TaskState, ...] = (TaskState.FAILED,)
#: At most this many batches per pass of a node's :class:`Housekeeper`.
PASS_MAX_BATCHES = 10

#: The Topic fields that hold a policy's limits.
LIMITS = ("keep_completed_days", "keep_completed_rows", "keep_failed_days", "keep_failed_rows")


@dataclass(frozen=True)
class Policy:
    """A topic's retention limits; ``None`` keeps such tasks for ever."""

    topic: str
    keep_completed_days: int | None = None
    keep_completed_rows: int | None = None
    keep_failed_days: int | None = None
    keep_failed_rows: int | None = None

    @classmethod
    def of(cls, topic: Topic) -> Policy:
        """The policy stored on ``topic``."""
        return cls(topic.name, **{name: getattr(topic, name) for name in LIMITS})

    @property
    def is_set(self) -> bool:
        """True if any limit is set (the topic's tasks are not all kept for ever)."""
        return any(getattr(self, name) is not None for name in LIMITS)

    def rules(self) -> list[tuple[tuple[TaskState, ...], int | None, int | None]]:
        """``(states, days, rows)`` for each class that has a limit."""
        rules = []
        for states, days, rows in (
            (COMPLETED_STATES, self.keep_completed_days, self.keep_completed_rows),
            (FAILED_STATES, self.keep_failed_days, self.keep_failed_rows),
        ):
            if days is not None or rows is not None:
                rules.append((states, days, rows))
        return rules


def _has_policy() -> Q:
    return Q(
        keep_completed_days__isnull=False,
        _connector=Q.OR,
        keep_completed_rows__isnull=False,
        keep_failed_days__isnull=False,
        keep_failed_rows__isnull=False,
    )


def _check_limit(name: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(f"{name} must be a non-negative int or None, not {value!r}.")
    if value > 2_147_483_647:  # the column is a PositiveIntegerField on every database
        raise InvalidArgumentError(f"{name} must be at most 2147483647, not {value!r}.")
    return value


def set_policy(
    topic: TopicRef,
    *,
    keep_completed_days: int | None = None,
    keep_completed_rows: int | None = None,
    keep_failed_days: int | None = None,
    keep_failed_rows: int | None = None,
) -> Policy:
    """Replace ``topic``'s retention policy and return it; a limit left out is ``None`` (for ever).

    ``set_policy(topic)`` without limits keeps every task of the topic again. Days
    count from a task's ``finished_at``; rows are the newest tasks (by sequence) of
    the class in the topic. ``0`` deletes such tasks at the next pass. Raises
    :class:`~django_tasks_coord.exceptions.InvalidArgumentError` for a limit that is
    not a non-negative int or ``None``, and
    :class:`~django_tasks_coord.exceptions.UnknownTopicError` for an unknown topic.
    """
    limits = {
        "keep_completed_days": _check_limit("keep_completed_days", keep_completed_days),
        "keep_completed_rows": _check_limit("keep_completed_rows", keep_completed_rows),
        "keep_failed_days": _check_limit("keep_failed_days", keep_failed_days),
        "keep_failed_rows": _check_limit("keep_failed_rows", keep_failed_rows),
    }
    name = topic_name(topic)
    Topic.objects.using(db.alias()).filter(name=name).update(**limits)
    if isinstance(topic, Topic):
        for field, value in limits.items():
            setattr(topic, field, value)
    return Policy(name, **limits)


def get_policy(topic: TopicRef) -> Policy:
    """``topic``'s retention policy (read from the database)."""
    name = topic_name(topic)
    row = Topic.objects.using(db.alias()).only(*LIMITS).get(name=name)
    return Policy.of(row)


def policies() -> list[Policy]:
    """The policies of every topic that has one, by topic name (one query)."""
    rows = Topic.objects.using(db.alias()).filter(_has_policy()).only("name", *LIMITS)
    return [Policy.of(row) for row in rows.order_by("name")]


# --- applying -------------------------------------------------------------------------------


class _Budget:
    """Batches a pass may still run; ``None``: no limit."""

    def __init__(self, batches: int | None) -> None:
        self.left = batches
        self.cut_short = False  # work was left for later because the budget ran out

    @property
    def spent(self) -> bool:
        """True once no batch is left; asking marks the pass as cut short."""
        if self.left is not None and self.left <= 0:
            self.cut_short = True
            return True
        return False

    def take(self) -> None:
        if self.left is not None:
            self.left -= 1


def _check_positive(name: str, value: object, *, none: bool) -> int | None:
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        accepted = "a positive int or None" if none else "a positive int"
        raise InvalidArgumentError(f"{name} must be {accepted}, not {value!r}.")
    return value


def apply(
    topic: TopicRef | None = None,
    *,
    batch_size: int | None = None,
    max_batches: int | None = None,
    now: datetime | None = None,
) -> dict[str, int]:
    """Apply the retention policies; return the tasks deleted per topic (topics with a policy).

    ``topic``: only this topic (its policy; nothing if it has none); default: every topic
    with a policy. ``batch_size``: rows per batch (default ``RETENTION_BATCH_SIZE``);
    ``max_batches``: stop after this many batches that found rows (default: none, run
    until nothing is left); ``now``: the current time (default ``timezone.now()``, the
    clock ``finished_at`` is written with). Call it outside a transaction, so that each
    batch commits on its own.
    """
    batch_size = _check_positive(
        "batch_size",
        app_settings.RETENTION_BATCH_SIZE if batch_size is None else batch_size,
        none=False,
    )
    assert batch_size is not None
    budget = _Budget(_check_positive("max_batches", max_batches, none=True))
    selected = policies() if topic is None else [p for p in [get_policy(topic)] if p.is_set]
    now = timezone.now() if now is None else now
    counts = {}
    for policy in selected:
        counts[policy.topic] = _apply_policy(policy, batch_size, budget, now)
    return counts


#: Where a node's sweep of one (topic, state, limit) stopped: the last sequence it read.
Sweeps = dict[tuple[str, int, str], int]


def _apply_policy(
    policy: Policy,
    batch_size: int,
    budget: _Budget,
    now: datetime,
    node: str | None = None,
    sweeps: Sweeps | None = None,
) -> int:
    """Apply one topic's policy within ``budget``; return the tasks deleted."""
    deleted = 0
    topic = policy.topic
    for states, days, rows in policy.rules():
        if days is not None and not budget.spent:
            before = now - timedelta(days=days)
            deleted += _delete(topic, states, batch_size, budget, before=before, sweeps=sweeps)
        if rows is not None and not budget.spent:
            if rows == 0:  # keep none: every task of the class goes
                deleted += _delete(topic, states, batch_size, budget, sweeps=sweeps)
            elif (below := _rows_threshold(topic, states, rows)) is not None:
                deleted += _delete(topic, states, batch_size, budget, below=below, sweeps=sweeps)
    if deleted:
        logger.info(
            "Retention deleted %s task(s) of topic %r.",
            deleted,
            topic,
            extra={"topic": topic, "deleted": deleted, "node": node},
        )
    return deleted


def delete_finished(
    topic: str,
    states: Iterable[int],
    *,
    before: datetime,
    batch_size: int,
    max_batches: int | None = None,
) -> int:
    """Delete ``topic``'s tasks in ``states`` that finished before ``before``; return how many.

    In batches of ``batch_size`` rows, each its own transaction, skipping rows that
    other transactions hold (PostgreSQL, MySQL/MariaDB); at most ``max_batches``
    batches. Used to prune old ``django.tasks`` results
    (:func:`django_tasks_coord.backends.housekeeping.prune_results`): unlike a retention
    pass, it reads the candidates with their ``finished_at`` (no sweep bound), so every task
    finished before ``before`` goes, whatever its creation time.
    """
    old = Task.objects.using(db.alias()).filter(
        topic_id=topic, state__in=list(states), finished_at__lt=before
    )
    deleted, _ = _delete_range(old, old, batch_size, _Budget(max_batches))
    return deleted


def _delete_range(
    window: QuerySet[Task],
    victims: QuerySet[Task],
    batch_size: int,
    budget: _Budget,
    after: int = 0,
) -> tuple[int, int]:
    """Walk ``window`` in sequence order from after ``after``, ``batch_size`` candidates at a
    time, deleting those that are ``victims``, until the window is exhausted or ``budget``
    is spent. Returns the tasks deleted and where the next walk resumes (``0``: from the
    window's start, as it was exhausted)."""
    deleted = 0
    while True:
        candidates = list(
            window.filter(sequence__gt=after)
            .order_by("sequence")
            .values_list("sequence", flat=True)[:batch_size]
        )
        if not candidates:
            return deleted, 0
        if budget.spent:  # candidates are left: for the next walk
            return deleted, after
        budget.take()
        deleted += _delete_batch(victims, candidates)
        after = candidates[-1]
        if len(candidates) < batch_size:
            return deleted, 0


def _delete(
    topic: str,
    states: Sequence[int],
    batch_size: int,
    budget: _Budget,
    *,
    before: datetime | None = None,
    below: int | None = None,
    sweeps: Sweeps | None = None,
) -> int:
    """Delete, state by state, ``topic``'s tasks in ``states`` finished before ``before`` and
    with a sequence under ``below`` (each bound optional), until none is left or the
    budget is spent; return how many went.

    Each batch reads the next ``batch_size`` candidates of one state in sequence order
    from the ``(topic, state, sequence)`` index alone (an index-only range: the
    planner cannot mistake a walk of the primary key through other topics' rows for
    it), then locks and deletes those of them that are still victims. ``sweeps``
    remembers, from one pass to the next, where the sweep of each state stopped, so
    that candidates that are no victims (tasks finished after ``before`` though
    created before it) are not read again at every pass.
    """
    tasks = Task.objects.using(db.alias())
    limit = below
    if before is not None:
        # A task finishes after it is created: the tasks finished before ``before`` were
        # created before it too. The sequence of the first task created after ``before``
        # (index (topic, created_at)) bounds the sweep, so that the tasks still kept are
        # not read at every pass. Tasks whose creation and sequence disagree (a long
        # transaction, clock skew) are only deleted a little later, never earlier.
        bound = (
            tasks.filter(topic_id=topic, created_at__gt=before)
            .order_by("created_at")
            .values_list("sequence", flat=True)
            .first()
        )
        limit = bound if limit is None or bound is None else min(limit, bound)
    kind = "rows" if before is None else "days"
    deleted = 0
    for state in states:
        victims = tasks.filter(topic_id=topic, state=state)
        if before is not None:
            victims = victims.filter(finished_at__lt=before)
        window = tasks.filter(topic_id=topic, state=state)
        if limit is not None:
            window = window.filter(sequence__lt=limit)
        key = (topic, state, kind)
        after = sweeps.get(key, 0) if sweeps is not None else 0
        removed, after = _delete_range(window, victims, batch_size, budget, after)
        deleted += removed
        if sweeps is not None:
            sweeps[key] = after
    return deleted


def _delete_batch(victims: QuerySet[Task], candidates: list[int]) -> int:
    """Delete those of ``candidates`` (sequences) that are still ``victims``, in one short
    transaction; return how many went. Rows another transaction holds are skipped."""
    conn = db.connection()
    chosen = victims.filter(sequence__in=candidates)
    if conn.features.has_select_for_update_skip_locked:
        with transaction.atomic(using=db.alias()):
            locked = chosen.values_list("sequence", flat=True).select_for_update(
                **db.lock_kwargs(conn)
            )
            pks = list(locked)
            # The topic stays in the WHERE: one partition of a partitioned table.
            return victims.filter(sequence__in=pks).delete()[0] if pks else 0
    # SQLite: no row locks, one writer at a time; the delete checks the policy itself.
    with db.write_transaction():
        return chosen.delete()[0]


def _rows_threshold(topic: str, states: Sequence[int], keep: int) -> int | None:
    """The sequence of the ``keep``-th newest task of ``topic`` in ``states`` (``keep`` >= 1):
    the tasks below it go. ``None`` if there are not more than ``keep``.

    Each state's newest ``keep`` sequences are a backward range of the
    ``(topic, state, sequence)`` index; the threshold is the ``keep``-th of their union.
    """
    alias = db.alias()
    tasks = Task.objects.using(alias).filter(topic_id=topic)
    if len(states) == 1:
        by_age = tasks.filter(state=states[0]).order_by("-sequence")
        found = by_age.values_list("sequence", flat=True)[keep - 1 : keep]
        return next(iter(found), None)
    conn = connections[alias]
    column = conn.ops.quote_name("sequence")
    parts, params = [], []
    for i, state in enumerate(states):
        newest = tasks.filter(state=state).order_by("-sequence").values_list("sequence")[:keep]
        sql, part_params = newest.query.get_compiler(using=alias).as_sql()
        parts.append(f"SELECT {column} FROM ({sql}) {conn.ops.quote_name(f'newest_{i}')}")
        params.extend(part_params)
    sql = " UNION ALL ".join(parts) + f" ORDER BY {column} DESC LIMIT 1 OFFSET {int(keep) - 1}"
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return None if row is None else int(row[0])


# --- the node's housekeeping ----------------------------------------------------------------


class Housekeeper(threading.Thread):
    """A node's retention thread: a bounded :func:`apply` pass every ``interval`` seconds.

    It runs apart from the lifeline, so a pass never delays a heartbeat. The first
    pass runs when the node starts. A pass runs at most :data:`PASS_MAX_BATCHES`
    batches, topics taken in turn from one pass to the next so that a topic with a
    backlog does not starve the others; when the budget ran out, the next pass comes
    after a pause as long as the pass took (at least one second) instead of a whole
    interval, so retention keeps up with busy topics while using at most half of this
    thread's time. An error is logged and the next pass tries again; after a lost
    database connection that pass comes after :class:`~django_tasks_coord.db.Reconnect`'s
    back-off instead of a whole interval.

    ``clock`` (monotonic seconds) and ``now`` (the current datetime) can be replaced in
    tests; :meth:`tick` runs a pass if one is due.
    """

    def __init__(
        self,
        interval: float,
        stopping: threading.Event,
        *,
        node: str | None = None,
        batch_size: int | None = None,
        max_batches: int = PASS_MAX_BATCHES,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = timezone.now,
    ) -> None:
        super().__init__(name="retention", daemon=True)
        self.interval = interval
        self.stopping = stopping
        self.node = node
        self.batch_size = batch_size
        self.max_batches = max_batches
        self.clock = clock
        self.now = now
        self.next_pass = clock()
        self._rotation = itertools.count()
        self._sweeps: Sweeps = {}
        self._reconnect = db.Reconnect("Retention")

    def run(self) -> None:
        try:
            self.tick()
            while not self.stopping.wait(max(self.next_pass - self.clock(), 0.0)):
                self.tick()
        finally:
            connections.close_all()

    def tick(self) -> dict[str, int] | None:
        """Run a pass if one is due; return its deletions per topic, or None if none was due."""
        started = self.clock()
        if started < self.next_pass:
            return None
        self.next_pass = started + self.interval
        try:
            counts, backlog = self._pass()
        except Exception as exc:  # the database may be briefly unreachable; try again
            if db.connection_lost(exc):  # soon: back off like every loop of the node
                self.next_pass = self.clock() + self._reconnect.failed(exc)
                return {}
            db.reset_connection()
            logger.warning(
                "Retention pass failed (%s); next pass in %ss.",
                exc,
                self.interval,
                exc_info=True,
                extra={"node": self.node},
            )
            return {}
        self._reconnect.succeeded()
        if backlog:
            self.next_pass = min(self.next_pass, self.clock() + max(self.clock() - started, 1.0))
        return counts

    def _pass(self) -> tuple[dict[str, int], bool]:
        """One bounded pass: (deleted per topic, True if the budget ran out)."""
        selected = policies()
        if not selected:
            return {}, False
        start = next(self._rotation) % len(selected)
        batch_size = self.batch_size or app_settings.RETENTION_BATCH_SIZE
        budget = _Budget(self.max_batches)
        now = self.now()
        counts = {}
        for policy in selected[start:] + selected[:start]:
            if budget.spent or self.stopping.is_set():  # the node stops: do not delay it
                break
            counts[policy.topic] = _apply_policy(
                policy, batch_size, budget, now, self.node, self._sweeps
            )
        return counts, budget.cut_short
