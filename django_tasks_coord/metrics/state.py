"""The queue's state, read from the database for a scrape: a few cheap queries at any size.

No ``prometheus_client`` here: :func:`read` returns plain values, which
:mod:`django_tasks_coord.metrics.collector` turns into metrics.

What each read costs (the same discipline as the admin's changelist, see
``docs/reference/metrics.md``):

- **Tasks per topic and state**: for every registered topic and every state, one
  count that reads at most :data:`EXACT_BELOW` + 1 entries of the ``(topic, state,
  sequence)`` index (all of them in one statement). Below that the count is exact;
  above it, it is the planner's estimate for that topic and state (PostgreSQL from
  its statistics, per partition when the table is partitioned; MySQL/MariaDB from an
  index dive). SQLite keeps no estimates: one exact grouped count.
- **Oldest due pending task per topic**: two index probes per topic (the first due
  ``execute_at`` in the ``tasks_coord_due`` index; the first pending task without one
  in sequence order).
- **Workflows per state**: for each state, one count of at most :data:`EXACT_BELOW` + 1
  entries of the ``(state, id)`` index (one statement for the four states), the planner's
  estimate above that; SQLite: one exact grouped count.
- Live nodes, leaders, jobs: small tables (one row per node, group, job); a job's last
  success reads its latest successful run through the ``(topic, identifier,
  sequence)`` index only when its last run did not succeed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.db import connections
from django.db.models import (
    Case,
    CharField,
    Count,
    Exists,
    F,
    OuterRef,
    Q,
    Subquery,
    Value,
    When,
)
from django.db.models.functions import Concat, Now

from django_tasks_coord import db, flow
from django_tasks_coord.conf import app_settings
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import (
    HealthCheck,
    Owner,
    PeriodicTask,
    Task,
    TokenHolder,
    Topic,
    Workflow,
    WorkflowState,
)
from django_tasks_coord.scheduling.names import GROUP_TOPIC_PREFIX, JOBS_TOPIC

#: A topic's count in one state is exact up to this many tasks, an estimate above.
EXACT_BELOW = 10_000
#: Counts per statement (topics x states), to keep each statement small.
_COUNTS_PER_STATEMENT = 180
#: Topics per statement of :func:`oldest_pending`.
_BRANCHES_PER_STATEMENT = 50


@dataclass
class Leader:
    """A coordination group's token: its term, its holder and whether the holder is alive."""

    group: str
    term: int
    holder: str
    alive: bool


@dataclass
class Job:
    """A scheduled job's times (None: unknown or none) and its missed slots."""

    id: str
    last_success: datetime | None
    next_slot: datetime | None
    missed_slots: int


@dataclass
class QueueState:
    """Everything the metrics view reports, read at one scrape."""

    #: ``(topic, state name)`` → tasks (``state name``: ``pending``, ``succeeded``...)
    tasks: dict[tuple[str, str], int] = field(default_factory=dict)
    #: the ``(topic, state name)`` pairs whose count is the planner's estimate
    estimated: set[tuple[str, str]] = field(default_factory=set)
    #: topic → seconds since its oldest pending task became due (0: none is due)
    oldest_pending: dict[str, float] = field(default_factory=dict)
    #: topic → paused
    paused: dict[str, bool] = field(default_factory=dict)
    #: topic → its rate limit in starts per second (topics with one only)
    rate_limits: dict[str, float] = field(default_factory=dict)
    #: topic → its concurrency limit (topics with one only)
    concurrency_limits: dict[str, float] = field(default_factory=dict)
    #: topic → its topic-wide rate limit in starts per second (topics with one only)
    total_rate_limits: dict[str, float] = field(default_factory=dict)
    #: topic → its topic-wide concurrency limit (topics with one only)
    total_concurrency_limits: dict[str, float] = field(default_factory=dict)
    #: owners (nodes) with a heartbeat younger than ``LIVENESS_INTERVAL``
    nodes: int = 0
    leaders: list[Leader] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)
    #: workflow state (``running``, ``succeeded``...) → workflows, every state listed
    workflows: dict[str, int] = field(default_factory=dict)


def state_name(state: int) -> str:
    """The label of a state ordinal: ``10`` → ``"pending"``."""
    return TaskState(state).name.lower()


def read(using: str | None = None) -> QueueState:
    """Read the queue's state from database ``using`` (default: the app's database)."""
    using = using or db.alias()
    result = QueueState()
    rows = Topic.objects.using(using).order_by("name")
    topics = {}
    for name, paused, *fields in rows.values_list("name", "paused", *flow.FIELDS):
        topics[name] = paused
        limits = flow.Limits.of(*fields)
        if limits.rate is not None:
            result.rate_limits[name] = limits.rate.count / limits.rate.period
        if limits.concurrency is not None:
            result.concurrency_limits[name] = float(limits.concurrency)
        if limits.total_rate is not None:
            result.total_rate_limits[name] = limits.total_rate.count / limits.total_rate.period
        if limits.total_concurrency is not None:
            result.total_concurrency_limits[name] = float(limits.total_concurrency)
    result.paused = topics
    result.tasks, result.estimated = task_counts(list(topics), using)
    result.oldest_pending = oldest_pending(list(topics), using)
    alive = db.ago(app_settings.liveness_interval)
    result.nodes = Owner.objects.using(using).filter(heartbeat__gte=alive).count()
    result.leaders = leaders(using)
    result.jobs = jobs(using)
    result.workflows = workflow_counts(using)
    return result


def workflow_counts(using: str, exact_below: int = EXACT_BELOW) -> dict[str, int]:
    """Workflows per state (every state, 0 included): exact up to ``exact_below`` per
    state, then the planner's estimate (see the module's docstring)."""
    conn = connections[using]
    counts = {state.value: 0 for state in WorkflowState}
    if not db.has_row_estimates(conn):
        rows = Workflow.objects.using(using).order_by().values_list("state").annotate(n=Count("pk"))
        for state, n in rows:
            counts[state] = n
        return counts
    table = conn.ops.quote_name(Workflow._meta.db_table)
    branch = (
        f"SELECT %s, COUNT(*) FROM (SELECT 1 FROM {table} WHERE state = %s "
        f"ORDER BY id LIMIT {int(exact_below) + 1}) AS capped"
    )  # ORDER BY id: the (state, id) index's order, so that index is read
    sql = " UNION ALL ".join([branch] * len(counts))
    with conn.cursor() as cursor:
        cursor.execute(sql, [value for state in counts for value in (state, state)])
        found = cursor.fetchall()
    for state, n in found:
        if n > exact_below:
            guess = db.planner_rows(conn, f"SELECT 1 FROM {table} WHERE state = %s", [state])
            n = max(guess or 0, n)
        counts[str(state)] = int(n)
    return counts


def task_counts(
    topics: list[str], using: str, exact_below: int = EXACT_BELOW
) -> tuple[dict[tuple[str, str], int], set[tuple[str, str]]]:
    """Tasks per ``(topic, state name)`` of ``topics``, every state listed (0 included),
    and the pairs whose count is an estimate (see the module's docstring)."""
    conn = connections[using]
    counts = {(topic, state_name(state)): 0 for topic in topics for state in TaskState}
    if not db.has_row_estimates(conn):  # no estimates to fall back on: exact
        rows = (
            Task.objects.using(using)
            .filter(topic_id__in=topics)
            .order_by()
            .values_list("topic_id", "state")
            .annotate(n=Count("pk"))
        )
        for topic, state, n in rows:
            counts[(topic, state_name(state))] = n
        return counts, set()
    table = conn.ops.quote_name(Task._meta.db_table)
    pairs = [(topic, state.value) for topic in topics for state in TaskState]
    estimated = set()
    for start in range(0, len(pairs), _COUNTS_PER_STATEMENT):
        chunk = pairs[start : start + _COUNTS_PER_STATEMENT]
        branch = (
            f"SELECT %s, %s, COUNT(*) FROM (SELECT 1 FROM {table} WHERE topic_id = %s "
            f"AND state = %s ORDER BY sequence LIMIT {int(exact_below) + 1}) AS capped"
        )  # ORDER BY: the (topic, state, sequence) index's order, so that index is read
        sql = " UNION ALL ".join([branch] * len(chunk))
        params = [value for topic, state in chunk for value in (topic, state, topic, state)]
        with conn.cursor() as cursor:
            cursor.execute(sql, params)
            found = cursor.fetchall()
        for topic, state, n in found:
            key = (topic, state_name(int(state)))
            if n > exact_below:
                guess = db.planner_rows(
                    conn,
                    f"SELECT 1 FROM {table} WHERE topic_id = %s AND state = %s",
                    [topic, int(state)],
                )
                n = max(guess or 0, n)
                estimated.add(key)
            counts[key] = int(n)
    return counts, estimated


def oldest_pending(topics: list[str], using: str) -> dict[str, float]:
    """Per topic, seconds since its longest-waiting due pending task became due (0: none).

    A task is due at its ``execute_at``, or when it was created if it has none. Each topic
    is named in its own branch of one ``UNION ALL``, so that PostgreSQL looks only into
    that topic's partition and picks its indexes with that partition's statistics.
    """
    tasks = Task.objects.using(using).filter(state=TaskState.PENDING)
    branches = []
    for topic in topics:
        pending = tasks.filter(topic_id=topic)
        scheduled = pending.filter(execute_at__lte=Now()).order_by("execute_at")
        # (state, sequence) after the topic: the order of the (topic, state, sequence) index.
        plain = pending.filter(execute_at__isnull=True).order_by("state", "sequence")
        branches.append(
            Topic.objects.using(using)
            .filter(name=topic)
            .annotate(
                now=Now(),
                scheduled=Subquery(scheduled.values("execute_at")[:1]),
                plain=Subquery(plain.values("created_at")[:1]),
            )
            .values_list("name", "now", "scheduled", "plain")
        )
    ages = dict.fromkeys(topics, 0.0)
    per_statement = _BRANCHES_PER_STATEMENT
    if not connections[using].features.supports_slicing_ordering_in_compound:
        per_statement = 1  # SQLite: no LIMIT in a UNION's subqueries; one query per topic
    for start in range(0, len(branches), per_statement):
        first, *others = branches[start : start + per_statement]
        for name, now, scheduled, plain in first.union(*others, all=True) if others else first:
            due = min((t for t in (scheduled, plain) if t is not None), default=None)
            ages[name] = max((now - due).total_seconds(), 0.0) if due is not None else 0.0
    return ages


def leaders(using: str) -> list[Leader]:
    """Every coordination group (with a token or members), its token and its holder's health."""
    alive = db.ago(app_settings.liveness_interval)
    holder_alive = HealthCheck.objects.using(using).filter(
        group_id=OuterRef("group_id"), task_id=OuterRef("task_id"), last_heartbeat__gte=alive
    )
    found = {
        group: Leader(group, term, holder, bool(holder) and is_alive)
        for group, term, holder, is_alive in TokenHolder.objects.using(using)
        .annotate(alive=Exists(holder_alive))
        .values_list("group_id", "term", "task_id", "alive")
    }
    members = HealthCheck.objects.using(using).order_by().values_list("group_id", flat=True)
    for group in set(members.distinct()) - set(found):
        found[group] = Leader(group, 0, "", False)
    return [found[group] for group in sorted(found)]


def _run_topic() -> Case:
    """The topic of a job's runs (``OuterRef``: the job), as ``scheduler.run_topic`` says."""
    return Case(
        When(
            leader_only=True,
            then=Concat(Value(GROUP_TOPIC_PREFIX), F("group"), output_field=CharField()),
        ),
        default=Value(JOBS_TOPIC),
        output_field=CharField(),
    )


def jobs(using: str) -> list[Job]:
    """Every job: its last successful run's end, its next slot, its missed slots."""
    last_success = (
        Task.objects.using(using)
        .filter(
            topic_id=OuterRef("run_topic"),
            identifier=OuterRef("id"),
            state=TaskState.SUCCEEDED,
        )
        .order_by("-sequence")
        .values("finished_at")[:1]
    )
    rows = (
        PeriodicTask.objects.using(using)
        .annotate(run_topic=_run_topic())
        .annotate(
            last_success=Case(
                When(
                    Q(last_outcome=TaskState.SUCCEEDED, last_finished_at__isnull=False),
                    then=F("last_finished_at"),
                ),
                default=Subquery(last_success),
            )
        )
        .order_by("id")
        .values_list("id", "last_success", "nextrun", "missed_slots")
    )
    return [Job(*row) for row in rows]
