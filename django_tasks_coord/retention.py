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

How it deletes (this module decides what goes; the task store's
:mod:`~django_tasks_coord.store.prune` deletes it): one topic at a time (the task table may be partitioned by topic,
so every statement names its topic), one state at a time (each victim query is a
range of the ``(topic, state, sequence)`` index, read in sequence order), in
batches of ``RETENTION_BATCH_SIZE`` rows, each batch a short transaction of its
own. On PostgreSQL and MySQL/MariaDB the batch's rows are picked with
``SELECT ... FOR UPDATE SKIP LOCKED``: retention never waits for a row another
transaction holds, so two nodes applying it at once, or a node and the hot path,
never block each other; what is skipped goes in a later pass. SQLite has no row
locks: the rows are picked first and deleted in a write transaction that checks
the policy again.

Finished workflows and their steps go ``WORKFLOW_KEEP_COMPLETED_DAYS`` (SUCCEEDED, CANCELED)
or ``WORKFLOW_KEEP_FAILED_DAYS`` after they ended (``None``, the default: kept for ever, as
tasks without a policy), in the same passes and batches (:func:`apply_workflows`).

Every node runs a :class:`Housekeeper` thread (``RETENTION_INTERVAL``, ``0``: none)
that applies the policies of every topic that has one in bounded passes; when no
topic has a policy, a pass is one query on the topic table.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connections
from django.db.models import Q
from django.utils import timezone

from django_tasks_coord import db
from django_tasks_coord.conf import app_settings
from django_tasks_coord.enums import TaskState
from django_tasks_coord.exceptions import InvalidArgumentError
from django_tasks_coord.models import Topic, WorkflowState
from django_tasks_coord.store import workflows as workflow_rows
from django_tasks_coord.store.prune import (
    Budget,
    Sweeps,
    delete_by_state,
    delete_finished,
    rows_threshold,
)
from django_tasks_coord.topics import TopicRef, topic_name

__all__ = [
    "COMPLETED_STATES",
    "FAILED_STATES",
    "LIMITS",
    "PASS_MAX_BATCHES",
    "WORKFLOW_COMPLETED_STATES",
    "Housekeeper",
    "Policy",
    "apply",
    "apply_workflows",
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
#: The workflow states ``WORKFLOW_KEEP_COMPLETED_DAYS`` applies to (FAILED: the other setting).
WORKFLOW_COMPLETED_STATES: tuple[WorkflowState, ...] = (
    WorkflowState.SUCCEEDED,
    WorkflowState.CANCELED,
)
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


def _batches(batch_size: int | None, max_batches: int | None) -> tuple[int, Budget]:
    """The checked ``batch_size`` (default ``RETENTION_BATCH_SIZE``) and the budget of
    ``max_batches`` of :func:`apply` and :func:`apply_workflows`."""
    size = _check_positive(
        "batch_size",
        app_settings.RETENTION_BATCH_SIZE if batch_size is None else batch_size,
        none=False,
    )
    assert size is not None
    return size, Budget(_check_positive("max_batches", max_batches, none=True))


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
    batch_size, budget = _batches(batch_size, max_batches)
    selected = policies() if topic is None else [p for p in [get_policy(topic)] if p.is_set]
    now = timezone.now() if now is None else now
    counts = {}
    for policy in selected:
        counts[policy.topic] = _apply_policy(policy, batch_size, budget, now)
    return counts


def _apply_policy(
    policy: Policy,
    batch_size: int,
    budget: Budget,
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
            deleted += delete_by_state(
                topic, states, batch_size, budget, before=before, sweeps=sweeps
            )
        if rows is not None and not budget.spent:
            if rows == 0:  # keep none: every task of the class goes
                deleted += delete_by_state(topic, states, batch_size, budget, sweeps=sweeps)
            elif (below := rows_threshold(topic, states, rows)) is not None:
                deleted += delete_by_state(
                    topic, states, batch_size, budget, below=below, sweeps=sweeps
                )
    if deleted:
        logger.info(
            "Retention deleted %s task(s) of topic %r.",
            deleted,
            topic,
            extra={"topic": topic, "deleted": deleted, "node": node},
        )
    return deleted


def workflow_rules() -> list[tuple[tuple[WorkflowState, ...], int]]:
    """``(states, days)`` for each class of finished workflows that has a limit (settings)."""
    rules = []
    for states, days in (
        (WORKFLOW_COMPLETED_STATES, app_settings.WORKFLOW_KEEP_COMPLETED_DAYS),
        ((WorkflowState.FAILED,), app_settings.WORKFLOW_KEEP_FAILED_DAYS),
    ):
        if days is not None:
            rules.append((states, _check_limit("workflow retention days", days) or 0))
    return rules


def settings_problems(values: dict[str, object]) -> list[str]:
    """What is wrong with the workflow retention settings of ``values`` (system checks)."""
    problems = []
    for key in ("WORKFLOW_KEEP_COMPLETED_DAYS", "WORKFLOW_KEEP_FAILED_DAYS"):
        try:
            _check_limit(key, values[key])
        except InvalidArgumentError as exc:
            problems.append(str(exc))
    return problems


def apply_workflows(
    *,
    batch_size: int | None = None,
    max_batches: int | None = None,
    now: datetime | None = None,
) -> int:
    """Delete the finished workflows (with their steps) past ``WORKFLOW_KEEP_COMPLETED_DAYS``
    or ``WORKFLOW_KEEP_FAILED_DAYS``; return how many went. Options as :func:`apply`'s;
    no query at all while both settings are None."""
    batch_size, budget = _batches(batch_size, max_batches)
    return _apply_workflows(batch_size, budget, timezone.now() if now is None else now)


def _apply_workflows(
    batch_size: int, budget: Budget, now: datetime, node: str | None = None
) -> int:
    deleted = 0
    for states, days in workflow_rules():
        if budget.spent:
            break
        deleted += workflow_rows.delete_finished(
            states, before=now - timedelta(days=days), batch_size=batch_size, budget=budget
        )
    if deleted:
        logger.info(
            "Retention deleted %s finished workflow(s).",
            deleted,
            extra={"deleted": deleted, "node": node},
        )
    return deleted


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
        #: Finished workflows the last pass deleted.
        self.workflows_deleted = 0

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
        """One bounded pass: (deleted per topic, True if the budget ran out). Finished
        workflows go after the topics' tasks, under the same budget (their count is
        :attr:`workflows_deleted`)."""
        selected = policies()
        batch_size = self.batch_size or app_settings.RETENTION_BATCH_SIZE
        budget = Budget(self.max_batches)
        now = self.now()
        counts = {}
        if selected:
            start = next(self._rotation) % len(selected)
            for policy in selected[start:] + selected[:start]:
                if budget.spent or self.stopping.is_set():  # the node stops: do not delay it
                    break
                counts[policy.topic] = _apply_policy(
                    policy, batch_size, budget, now, self.node, self._sweeps
                )
        self.workflows_deleted = 0
        if not self.stopping.is_set():
            self.workflows_deleted = _apply_workflows(batch_size, budget, now, self.node)
        return counts, budget.cut_short
