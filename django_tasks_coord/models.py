"""Storage: topics, tasks and owners.

One ``Task`` table carries the work of every entry point (queue pushes, periodic
firings, jobs, ``django.tasks`` enqueues, HTTP-created tasks). State changes go
through :mod:`django_tasks_coord.queue`; the models only describe rows and
read-side querysets.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.db import connections, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.expressions import Combinable
from django.db.models.functions import Now
from django.db.models.lookups import Exact, In
from django.db.models.sql.compiler import SQLCompiler
from django.utils.translation import gettext_lazy as _

from django_tasks_coord import db, tracing
from django_tasks_coord.db import PendingIndex
from django_tasks_coord.enums import COMPLETED_MAX, COMPLETED_MIN, IN_FLIGHT, TaskState


class Topic(models.Model):
    """A registered queue. Tasks can only be pushed to and polled from registered topics."""

    name = models.CharField(_("name"), max_length=100, primary_key=True)
    paused = models.BooleanField(
        _("paused"), default=False, help_text=_("Paused topics are not processed by any node.")
    )
    consecutive_failures = models.PositiveIntegerField(
        _("consecutive failures"),
        default=0,
        db_default=0,  # database defaults on added columns keep rolling upgrades safe
        help_text=_("Tasks failed for good in a row; reset by the next success."),
    )
    created_at = models.DateTimeField(_("created at"), db_default=Now())
    # Retention (django_tasks_coord.retention): None keeps such tasks for ever.
    keep_completed_days = models.PositiveIntegerField(
        _("keep completed for (days)"),
        null=True,
        blank=True,
        help_text=_("Delete finished tasks (except failures) older than this many days."),
    )
    keep_completed_rows = models.PositiveIntegerField(
        _("keep completed (rows)"),
        null=True,
        blank=True,
        help_text=_("Keep at most this many finished tasks (except failures), newest first."),
    )
    keep_failed_days = models.PositiveIntegerField(
        _("keep failures for (days)"),
        null=True,
        blank=True,
        help_text=_("Delete failed tasks older than this many days."),
    )
    keep_failed_rows = models.PositiveIntegerField(
        _("keep failures (rows)"),
        null=True,
        blank=True,
        help_text=_("Keep at most this many failed tasks, newest first."),
    )

    class Meta:
        verbose_name = _("topic")
        verbose_name_plural = _("topics")
        ordering = ["name"]
        permissions = [("pause_topic", _("Can pause and resume topics"))]

    def __str__(self) -> str:
        return self.name


class Dashboard(Topic):
    """The admin's dashboard page (throughput, failures, leaders, live nodes).

    A proxy without storage of its own: it exists so the dashboard gets an entry on
    the admin index of any project, without a custom ``AdminSite``.
    """

    class Meta:
        proxy = True
        verbose_name = _("dashboard")
        verbose_name_plural = _("dashboard")
        default_permissions = ("view",)
        permissions = [("view_metrics", _("Can scrape the Prometheus metrics"))]


class Owner(models.Model):
    """A registered node (a ``runscheduler`` process or any poller) that holds tasks.

    ``heartbeat`` is set from the database clock. An owner whose heartbeat is older
    than the liveness interval is dead: ``queue.expire`` returns its tasks to PENDING
    and deletes its row.
    """

    name = models.CharField(_("name"), max_length=200, unique=True)
    host = models.CharField(_("host"), max_length=255, blank=True)
    pid = models.PositiveIntegerField(_("process id"), null=True, blank=True)
    started_at = models.DateTimeField(_("started at"), db_default=Now())
    heartbeat = models.DateTimeField(_("last heartbeat"), db_default=Now(), db_index=True)

    class Meta:
        verbose_name = _("node")
        verbose_name_plural = _("nodes")
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


#: MySQL/MariaDB only: a virtual column of the task table (migration 0011), the task's
#: ``identifier`` while it is unfinished (state below :data:`COMPLETED_MIN`) and NULL
#: once it is finished. Those databases have no partial indexes; indexing this column
#: instead of ``(identifier, state)`` gives every finished task the same key, so
#: finishing a task moves its index entry to the end of its topic's range instead of
#: to the page of its identifier somewhere in the whole history.
UNFINISHED_IDENTIFIER = "unfinished_identifier"


class _UnfinishedIdentifier(models.Lookup):
    """``identifier`` compared only among unfinished tasks, the way each database indexes it.

    PostgreSQL and SQLite: ``(identifier = ... AND state < 40)``, served by the partial
    ``tasks_coord_unfinished`` index. MySQL/MariaDB: the virtual column
    :data:`UNFINISHED_IDENTIFIER` compared instead of ``identifier`` (its index is
    ``(topic_id, unfinished_identifier)``; MariaDB never rewrites an expression into a
    generated column on its own, so the query names it).
    """

    lhs: Any

    def _column(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, name: str) -> str:
        """Column ``name`` of the same table (alias) as ``identifier`` in this query."""
        identifier, _ = compiler.compile(self.lhs)
        qualifier = identifier.removesuffix(connection.ops.quote_name(self.lhs.target.column))
        return qualifier + connection.ops.quote_name(name)

    def process_lhs(
        self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, lhs: Any = None
    ) -> tuple[str, Any]:
        if lhs is None and db.uses_virtual_columns(connection):
            return self._column(compiler, connection, UNFINISHED_IDENTIFIER), []
        return super().process_lhs(compiler, connection, lhs)

    def as_sql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper) -> tuple[str, Any]:
        sql, params = super().as_sql(compiler, connection)
        state = self._column(compiler, connection, "state")
        return f"({sql} AND {state} < %s)", (*params, COMPLETED_MIN)

    def as_mysql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper) -> tuple[str, Any]:
        return super().as_sql(compiler, connection)  # the column is NULL once finished


class _UnfinishedIdentifierExact(_UnfinishedIdentifier, Exact):
    pass


class _UnfinishedIdentifierIn(_UnfinishedIdentifier, In):
    pass


class TaskQuerySet(models.QuerySet["Task"]):
    """Read-side vocabulary for tasks."""

    def for_topic(self, topic: str | Topic) -> TaskQuerySet:
        """Tasks of one topic."""
        return self.filter(topic_id=topic.name if isinstance(topic, Topic) else topic)

    def pending(self) -> TaskQuerySet:
        """Tasks waiting to be polled (due or not)."""
        return self.filter(state=TaskState.PENDING)

    def due(self) -> TaskQuerySet:
        """Pending tasks whose ``execute_at`` is unset or not in the future (database clock)."""
        return self.pending().filter(
            models.Q(execute_at__isnull=True) | models.Q(execute_at__lte=Now())
        )

    def in_flight(self) -> TaskQuerySet:
        """Tasks held by an owner or an external executor."""
        return self.filter(state__in=IN_FLIGHT)

    def rows(self, tasks: Iterable[Task]) -> TaskQuerySet:
        """Exactly these tasks, by topic and sequence (on MySQL/MariaDB by sequence alone).

        The topic lets PostgreSQL look only into the partitions of those topics when the
        task table is partitioned (:mod:`django_tasks_coord.partitions`).
        """
        tasks = list(tasks)
        keys = [task.pk for task in tasks]
        if not db.topic_in_key_lookups(connections[self.db]):
            # One table there, so the topic buys nothing; worse, with it MySQL may walk an
            # index of the topic's rows instead of looking these up by key, and then wait on
            # a row another transaction holds (one SKIP LOCKED left out of ``tasks``).
            return self.filter(pk__in=keys)
        return self.filter(topic_id__in={task.topic_id for task in tasks}, pk__in=keys)

    def completed(self) -> TaskQuerySet:
        """Tasks in any completed state (one range of ordinals)."""
        return self.filter(state__gte=COMPLETED_MIN, state__lte=COMPLETED_MAX)

    def not_completed(self) -> TaskQuerySet:
        """Tasks that are pending or in flight."""
        return self.filter(state__lt=COMPLETED_MIN)

    def unfinished_of(self, identifier: str | Iterable[str] | Combinable) -> TaskQuerySet:
        """Pending or in-flight tasks of ``identifier``: one, several, or an ``OuterRef``.

        Means ``filter(identifier=..., state__lt=COMPLETED_MIN)``, written the way the
        ``tasks_coord_unfinished`` index serves it on every database (on MySQL/MariaDB
        through the virtual column :data:`UNFINISHED_IDENTIFIER`). Lookups of an
        identifier's unfinished tasks on hot paths use this, so that their cost does not
        grow with the identifier's history.
        """
        if isinstance(identifier, (str, Combinable)):
            return self.filter(_UnfinishedIdentifierExact(models.F("identifier"), identifier))
        return self.filter(_UnfinishedIdentifierIn(models.F("identifier"), list(identifier)))

    def insert(self, tasks: list[Task]) -> list[Task]:
        """Insert ``tasks`` and return them with their sequence and database-made fields.

        One statement where the backend returns the keys of a multi-row insert
        (PostgreSQL, MariaDB, SQLite); row by row on MySQL 8, which cannot.
        """
        with tracing.producing(tasks):  # a producer span each, and its traceparent stored
            if not connections[self.db].features.can_return_rows_from_bulk_insert:
                for task in tasks:
                    task.save(using=self.db, force_insert=True)
                    task.refresh_from_db(using=self.db, fields=["created_at"])
                return tasks
            return self.bulk_create(tasks)


class Task(models.Model):
    """One unit of work in a topic.

    ``sequence`` is assigned by the database on insert and only grows: it orders
    the queue, and ``purge``/``resolve``/``count`` work on sequence ranges.
    """

    sequence = models.BigAutoField(_("sequence"), primary_key=True)
    topic = models.ForeignKey(
        Topic,
        on_delete=models.PROTECT,
        related_name="tasks",
        db_index=False,
        verbose_name=_("topic"),
    )
    identifier = models.CharField(_("identifier"), max_length=255)
    payload = models.JSONField(_("payload"), null=True, blank=True)
    handler = models.CharField(
        _("handler"),
        max_length=255,
        blank=True,
        default="",
        db_default="",
        help_text=_("Dotted path of the callable that runs it; empty: the topic's consumer."),
    )
    state = models.PositiveSmallIntegerField(
        _("state"), choices=TaskState.choices, default=TaskState.PENDING
    )
    priority = models.SmallIntegerField(
        _("priority"), default=0, help_text=_("Higher runs first; ties in sequence order.")
    )
    execute_at = models.DateTimeField(
        _("execute at"), null=True, blank=True, help_text=_("Not polled before this time.")
    )
    owner = models.ForeignKey(
        Owner,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="tasks",
        verbose_name=_("owner"),
    )
    exec_id = models.UUIDField(
        _("execution id"),
        null=True,
        blank=True,
        help_text=_("Fresh for every claim; completing must quote it (fencing)."),
    )
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    # None means "no message", distinct from an empty message: null=True on purpose.
    message = models.TextField(_("message"), null=True, blank=True)  # noqa: DJ001
    error = models.TextField(_("error"), null=True, blank=True)  # noqa: DJ001
    created_at = models.DateTimeField(_("created at"), db_default=Now())
    started_at = models.DateTimeField(_("started at"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    slot = models.DateTimeField(
        _("slot"),
        null=True,
        blank=True,
        help_text=_("For a scheduled job's run: the time slot it fires for."),
    )
    term = models.PositiveBigIntegerField(
        _("term"),
        null=True,
        blank=True,
        help_text=_("For a leader-only run: the term of the leader that claimed it (fencing)."),
    )
    result = models.JSONField(
        _("result"),
        null=True,
        blank=True,
        help_text=_("What the run returned (a job's return value, an executor's result)."),
    )
    error_detail = models.JSONField(
        _("error detail"),
        null=True,
        blank=True,
        help_text=_("A structured error document (an external executor's error)."),
    )
    attempt_log = models.JSONField(
        _("attempt log"),
        null=True,
        blank=True,
        help_text=_("One entry per attempt: who ran it, when, and how it ended."),
    )
    label = models.CharField(_("label"), max_length=255, blank=True, default="", db_default="")
    requester = models.CharField(
        _("requester"),
        max_length=255,
        blank=True,
        default="",
        db_default="",
        help_text=_("Who created the task (a user, a service)."),
    )
    outcome_reason = models.CharField(
        _("outcome reason"),
        max_length=32,
        blank=True,
        default="",
        db_default="",
        help_text=_("Why a task ended as it did, e.g. failed_by_executor, in_progress_timeout."),
    )
    deadline = models.DateTimeField(
        _("deadline"),
        null=True,
        blank=True,
        help_text=_(
            "A requested or in-progress task not started or heartbeated by then times out."
        ),
    )
    concurrency_key = models.CharField(
        _("concurrency key"),
        max_length=255,
        blank=True,
        default="",
        db_default="",
        help_text=_("Tasks sharing a key count against one concurrency limit."),
    )
    recreated = models.BooleanField(_("recreated"), default=False)
    original = models.ForeignKey(
        "self",
        on_delete=models.DO_NOTHING,
        db_constraint=False,  # purge may delete the original; the copy keeps the number
        null=True,
        blank=True,
        related_name="recreations",
        verbose_name=_("original"),
    )
    # W3C trace context of the span that pushed it (django_tasks_coord.tracing); None
    # without OpenTelemetry. max_length: "00-" + 32 + "-" + 16 + "-" + 2 hex digits.
    traceparent = models.CharField(  # noqa: DJ001 - None: no trace, distinct from a value
        _("traceparent"), max_length=55, null=True, blank=True, editable=False
    )

    objects = TaskQuerySet.as_manager()

    class Meta:
        verbose_name = _("task")
        verbose_name_plural = _("tasks")
        permissions = [
            ("revive_task", _("Can reset and recreate tasks")),
            ("cancel_task", _("Can cancel tasks")),
        ]
        indexes = [
            # The claim query, FIFO and LIFO: WHERE topic = ? AND state = PENDING ORDER BY priority DESC, sequence.
            PendingIndex(
                fields=["topic", "-priority", "sequence"],
                name="tasks_coord_claim_fifo",
                state_value=TaskState.PENDING,
            ),
            PendingIndex(
                fields=["topic", "-priority", "-sequence"],
                name="tasks_coord_claim_lifo",
                state_value=TaskState.PENDING,
            ),
            # A sleeping node's "when is the next task due?".
            PendingIndex(
                fields=["topic", "execute_at"],
                name="tasks_coord_due",
                state_value=TaskState.PENDING,
            ),
            # Insertion modes, poll conditions, junctions: one identifier's history in order.
            models.Index(fields=["topic", "identifier", "sequence"], name="tasks_coord_identifier"),
            # resolve(): first sequence created after a point in time.
            models.Index(fields=["topic", "created_at"], name="tasks_coord_created"),
            # count(), admin filters by state.
            models.Index(fields=["topic", "state", "sequence"], name="tasks_coord_state"),
            # An identifier's unfinished tasks (TaskQuerySet.unfinished_of): a job's run in
            # flight (no overlap), insertion modes, poll conditions. Partial, so that the
            # planner never walks every unfinished row per job instead; on MySQL/MariaDB
            # over the virtual column UNFINISHED_IDENTIFIER (NULL once a task finished).
            PendingIndex(
                fields=["topic", "identifier"],
                name="tasks_coord_unfinished",
                state_below=COMPLETED_MIN,
                fallback_columns=["topic_id", UNFINISHED_IDENTIFIER],
            ),
            # The reaper's timeouts: WHERE state IN (REQUESTED, ACTIVE) AND deadline < now.
            PendingIndex(
                fields=["deadline"],
                name="tasks_coord_deadline",
                states=[TaskState.REQUESTED, TaskState.ACTIVE],
                fallback_fields=["state", "deadline"],
            ),
            # Concurrency limits: in-flight tasks of a topic per key.
            models.Index(
                fields=["topic", "concurrency_key", "state"], name="tasks_coord_concurrency"
            ),
            # Admin filters and search across topics (docs/admin.md); the dashboard's last hour.
            # (state, sequence) also serves the changelist's newest-first order under a state filter.
            models.Index(fields=["state", "sequence"], name="tasks_coord_admin_state"),
            models.Index(fields=["identifier"], name="tasks_coord_admin_identifier"),
            models.Index(fields=["label"], name="tasks_coord_admin_label"),
            models.Index(fields=["created_at"], name="tasks_coord_admin_created"),
            models.Index(fields=["finished_at"], name="tasks_coord_admin_finished"),
        ]
        constraints = [
            # Exactly one run per job and slot, whatever the schedulers do (NULLs never clash).
            models.UniqueConstraint(
                fields=["topic", "identifier", "slot"], name="tasks_coord_one_run_per_slot"
            ),
            models.CheckConstraint(
                condition=models.Q(state__in=TaskState.values), name="tasks_coord_task_state_valid"
            ),
            models.CheckConstraint(
                condition=~models.Q(state=TaskState.ACTIVE) | models.Q(exec_id__isnull=False),
                name="tasks_coord_active_has_exec_id",
            ),
            models.CheckConstraint(
                condition=models.Q(recreated=False) | models.Q(original__isnull=False),
                name="tasks_coord_recreated_has_original",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.topic_id}#{self.sequence} {self.identifier} ({self.get_state_display()})"

    @property
    def is_completed(self) -> bool:
        """True once the task reached a completed state."""
        return COMPLETED_MIN <= self.state <= COMPLETED_MAX


class JobKind(models.TextChoices):
    """How a job's slots are computed."""

    ONE_TIME = "one_time", _("one-time")
    RECURRING = "recurring", _("recurring")
    PERIODIC = "periodic", _("periodic")


class CatchUp(models.TextChoices):
    """What happens to slots missed while no node could fire them (all down, paused)."""

    ONCE = "once", _("run once for all missed slots")
    SKIP = "skip", _("skip to the next future slot")
    ALL = "all", _("run each missed slot, up to a cap")


class PeriodicTask(models.Model):
    """A scheduled job: when it fires, a run task is pushed to the jobs topic.

    One row per job (``id`` is the job id). Nodes claim due rows with
    ``SELECT ... FOR UPDATE SKIP LOCKED``, push the run and advance ``nextrun`` in the
    same transaction, so each slot is submitted once; the unique (topic, identifier,
    slot) constraint on tasks backs this up. ``worker`` and ``marked`` record which
    node submitted last and when: they are written under the row lock, in the same
    transaction, so they can never be left stale by a node that dies.
    """

    id = models.CharField(_("job id"), max_length=200, primary_key=True)
    kind = models.CharField(_("kind"), max_length=16, choices=JobKind.choices)
    task = models.CharField(_("callable"), max_length=255, help_text=_("Dotted path of the job."))
    group = models.CharField(_("group"), max_length=100, blank=True, default="")
    leader_only = models.BooleanField(
        _("leader only"),
        default=False,
        help_text=_("Runs only on the node holding its group's token (warm backup)."),
    )
    args = models.JSONField(_("arguments"), default=list, blank=True)
    kwargs = models.JSONField(_("keyword arguments"), default=dict, blank=True)
    priority = models.SmallIntegerField(_("priority"), default=0)
    timer = models.CharField(_("timer"), max_length=255)
    tz = models.CharField(_("time zone"), max_length=64, blank=True, default="")
    enabled = models.BooleanField(_("enabled"), default=True)
    paused = models.BooleanField(_("paused"), default=False)
    nextrun = models.DateTimeField(_("next run"), null=True, blank=True)
    worker = models.CharField(_("submitted by"), max_length=200, blank=True, default="")
    marked = models.DateTimeField(_("submitted at"), null=True, blank=True)
    max_count = models.IntegerField(_("max count"), default=-1, help_text=_("-1: unlimited."))
    run_count = models.PositiveIntegerField(_("runs submitted"), default=0)
    start_time = models.DateTimeField(_("start time"), null=True, blank=True)
    end_time = models.DateTimeField(_("end time"), null=True, blank=True)
    fixed_delay = models.BooleanField(
        _("fixed delay"), default=False, help_text=_("Next run = end of the last run + interval.")
    )
    allow_overlap = models.BooleanField(_("allow overlap"), default=False)
    catch_up = models.CharField(
        _("missed slots"), max_length=8, choices=CatchUp.choices, default=CatchUp.ONCE
    )
    catch_up_limit = models.PositiveIntegerField(_("missed slots cap"), default=10)
    waiting_policy = models.CharField(_("waiting policy"), max_length=20, default="wait")
    waiting_time = models.FloatField(
        _("waiting time"),
        default=60.0,
        help_text=_("Seconds a slot may start late before it is missed."),
    )
    error_policy = models.CharField(_("error policy"), max_length=20, default="log_and_continue")
    retry = models.JSONField(_("retry policy"), null=True, blank=True)
    declared = models.BooleanField(_("declared in code"), default=False)
    last_slot = models.DateTimeField(_("last slot"), null=True, blank=True)
    last_outcome = models.PositiveSmallIntegerField(
        _("last outcome"), choices=TaskState.choices, null=True, blank=True
    )
    last_finished_at = models.DateTimeField(_("last finished at"), null=True, blank=True)
    consecutive_failures = models.PositiveIntegerField(_("consecutive failures"), default=0)
    missed_slots = models.PositiveBigIntegerField(
        _("missed slots"),
        default=0,
        db_default=0,
        help_text=_("Due slots never run (missed-slot policy), since the job was created."),
    )
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), db_default=Now())
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        db_table = "periodic_task"
        verbose_name = _("periodic job")
        verbose_name_plural = _("periodic jobs")
        ordering = ["id"]
        permissions = [
            ("pause_periodictask", _("Can pause and resume periodic jobs")),
            ("run_periodictask", _("Can run periodic jobs now")),
        ]
        indexes = [models.Index(fields=["enabled", "nextrun"], name="periodic_task_due")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(max_count__gte=-1), name="periodic_task_max_count_valid"
            ),
            models.CheckConstraint(
                condition=models.Q(start_time__isnull=True)
                | models.Q(end_time__isnull=True)
                | models.Q(end_time__gte=models.F("start_time")),
                name="periodic_task_end_after_start",
            ),
            models.CheckConstraint(
                condition=models.Q(leader_only=False) | ~models.Q(group=""),
                name="periodic_task_leader_only_has_group",
            ),
        ]

    def __str__(self) -> str:
        return self.id


class TokenHolder(models.Model):
    """Who holds a coordination group's token (its leader), and under which term.

    ``term`` only grows: every takeover increments it, so a deposed holder finds its
    term outdated (fencing). ``task_id`` is the holder's node id; empty while
    nobody holds the token (after a voluntary release).
    """

    group_id = models.CharField(_("group"), max_length=100, primary_key=True)
    task_id = models.CharField(_("holder (node id)"), max_length=200, blank=True, default="")
    term = models.PositiveBigIntegerField(_("term"), default=0)
    acquired_at = models.DateTimeField(_("acquired at"), null=True, blank=True)
    released_at = models.DateTimeField(_("released at"), null=True, blank=True)

    class Meta:
        db_table = "token_holder"
        verbose_name = _("leader")
        verbose_name_plural = _("leaders")
        ordering = ["group_id"]

    def __str__(self) -> str:
        return f"{self.group_id}: {self.task_id or '-'} (term {self.term})"


class HealthCheck(models.Model):
    """A node's membership of a coordination group and its last heartbeat (database clock)."""

    task_id = models.CharField(_("node id"), max_length=200)
    group_id = models.CharField(_("group"), max_length=100)
    last_heartbeat = models.DateTimeField(_("last heartbeat"), db_default=Now())

    class Meta:
        db_table = "health_check"
        verbose_name = _("group member")
        verbose_name_plural = _("group members")
        ordering = ["group_id", "task_id"]
        constraints = [
            models.UniqueConstraint(fields=["task_id", "group_id"], name="health_check_node_group")
        ]
        indexes = [models.Index(fields=["group_id", "last_heartbeat"], name="health_check_group")]

    def __str__(self) -> str:
        return f"{self.task_id}@{self.group_id}"


class TaskDefinition(models.Model):
    """A task type run by executors over HTTP, as declared in code (``definitions.define``).

    Its tasks live in the topic of the same name. The rows mirror the declarations
    (:func:`django_tasks_coord.definitions.sync`), so the admin, other processes and
    the reaper see the same settings; a row whose declaration disappeared is kept with
    ``declared`` False, never deleted with its tasks' history.
    """

    name = models.CharField(_("name"), max_length=100, primary_key=True)
    description = models.TextField(_("description"), blank=True, default="")
    requested_to_start_timeout = models.FloatField(
        _("requested-to-start timeout"),
        help_text=_("Seconds a polled task may wait for its start before it is ready again."),
    )
    in_progress_timeout = models.FloatField(
        _("in-progress timeout"),
        help_text=_("Seconds without a start, notify or outcome before the attempt fails."),
    )
    allowed_retry_count = models.PositiveIntegerField(_("allowed retry count"))
    retry_delay = models.FloatField(_("retry delay"), help_text=_("Seconds before a retry."))
    concurrency_limit = models.PositiveIntegerField(
        _("concurrency limit"),
        null=True,
        blank=True,
        help_text=_("At most this many tasks requested or in progress at once; empty: no limit."),
    )
    concurrency_key_path = models.JSONField(
        _("concurrency key path"),
        null=True,
        blank=True,
        help_text=_('The limit applies per value at this path, e.g. ["params", "resourceType"].'),
    )
    params_schema = models.JSONField(_("params schema"), null=True, blank=True)
    result_schema = models.JSONField(_("result schema"), null=True, blank=True)
    error_schema = models.JSONField(_("error schema"), null=True, blank=True)
    declared = models.BooleanField(
        _("declared in code"),
        default=True,
        help_text=_("False once no code declares it any more; its tasks are kept."),
    )
    created_at = models.DateTimeField(_("created at"), db_default=Now())
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        verbose_name = _("task definition")
        verbose_name_plural = _("task definitions")
        ordering = ["name"]
        permissions = [
            ("execute_tasks", _("Can run tasks as an executor (poll, start, notify, outcome)")),
            ("submit_tasks", _("Can create and cancel tasks through the API")),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(concurrency_limit__isnull=True)
                | models.Q(concurrency_limit__gte=1),
                name="tasks_coord_definition_limit_positive",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class ApiToken(models.Model):
    """A bearer token for the HTTP API, tied to a user whose permissions it carries.

    Only a SHA-256 digest of the token is stored; the token itself is shown once,
    when it is issued (:func:`django_tasks_coord.api.auth.issue_token`, the admin or
    ``manage.py tasks_coord_createapitoken``). ``prefix`` (its first characters) tells tokens apart.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="tasks_coord_tokens",
        verbose_name=_("user"),
    )
    name = models.CharField(_("name"), max_length=100, blank=True, default="")
    prefix = models.CharField(_("prefix"), max_length=16, editable=False)
    digest = models.CharField(_("digest"), max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(_("created at"), db_default=Now())
    last_used_at = models.DateTimeField(_("last used at"), null=True, blank=True, editable=False)
    expires_at = models.DateTimeField(
        _("expires at"), null=True, blank=True, help_text=_("Empty: never.")
    )

    class Meta:
        verbose_name = _("API token")
        verbose_name_plural = _("API tokens")
        ordering = ["user", "name"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name or self.user})"
