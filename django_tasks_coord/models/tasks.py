"""Topics, owners and tasks: the rows of the queue."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from django_tasks_coord.db import PendingIndex
from django_tasks_coord.enums import COMPLETED_MAX, COMPLETED_MIN, TaskState
from django_tasks_coord.models.querysets import UNFINISHED_IDENTIFIER, TaskQuerySet


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

    # Flow control (django_tasks_coord.flow, docs/flow-control.md): read under the topic's
    # row lock by every limited claim, so a change takes effect at the next claim.
    rate_limit = models.CharField(
        _("rate limit"),
        max_length=32,
        blank=True,
        default="",
        db_default="",
        help_text=_('At most this many task starts per period, e.g. "50/s", "1000/m", "10/h".'),
    )
    concurrency_limit = models.PositiveIntegerField(
        _("concurrency limit"),
        null=True,
        blank=True,
        help_text=_("At most this many tasks active at once."),
    )
    limit_key = models.CharField(
        _("limit key"),
        max_length=200,
        blank=True,
        default="",
        db_default="",
        help_text=_(
            'What partitions the limits (each key gets them whole): "identifier", '
            '"payload.<path>" or "callable:<name>"; empty: the topic as a whole. '
            "Applies to tasks pushed after it is set."
        ),
    )
    fair = models.BooleanField(
        _("fair claims"),
        default=False,
        db_default=False,
        help_text=_("Claim round-robin across limit keys instead of oldest first."),
    )
    total_rate_limit = models.CharField(
        _("total rate limit"),
        max_length=32,
        blank=True,
        default="",
        db_default="",
        help_text=_(
            "At most this many task starts per period for the topic as a whole, whatever "
            "the limit key (the rate limit then holds per key)."
        ),
    )
    total_concurrency_limit = models.PositiveIntegerField(
        _("total concurrency limit"),
        null=True,
        blank=True,
        help_text=_(
            "At most this many tasks of the topic active at once, whatever the limit key "
            "(the concurrency limit then holds per key)."
        ),
    )
    key_limits = models.JSONField(
        _("limits of key values"),
        null=True,
        blank=True,
        default=None,
        help_text=_(
            'Limits of particular key values instead of the per-key ones, e.g. {"acme": '
            '{"rate": "10/s", "concurrency": 2}}. @task functions with rate or concurrency '
            "and job runs with limits are entries here."
        ),
    )
    fair_cursor = models.CharField(
        _("fair claims' cursor"),
        max_length=255,
        blank=True,
        default="",
        db_default="",
        editable=False,
        help_text=_("The key a fair claim served last: the next one starts after it."),
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
    cancel_requests = models.PositiveBigIntegerField(
        _("cancel requests"),
        default=0,
        db_default=0,
        help_text=_(
            "Counts cancel requests of running tasks it holds; its heartbeat reads it "
            "(django_tasks_coord.running)."
        ),
    )

    class Meta:
        verbose_name = _("node")
        verbose_name_plural = _("nodes")
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


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
    cancel_requested_at = models.DateTimeField(
        _("cancel requested at"),
        null=True,
        blank=True,
        help_text=_(
            "A cancel was requested while it ran: its handler is asked to stop, and it ends "
            "CANCELED however the handler ends."
        ),
    )
    progress = models.JSONField(
        _("progress"),
        null=True,
        blank=True,
        help_text=_("What its handler last reported of its progress (a small JSON value)."),
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
    def cancel_is_requested(self) -> bool:
        """True once a cancel was requested while the task ran (as this object last saw it)."""
        return self.cancel_requested_at is not None

    @property
    def is_completed(self) -> bool:
        """True once the task reached a completed state."""
        return COMPLETED_MIN <= self.state <= COMPLETED_MAX


class FlowStart(models.Model):
    """Task starts under a rate limit: ``count`` tasks of ``topic`` and ``key`` claimed at
    ``at`` (the database clock), one row per key and claim; rows older than the limit's
    period are deleted by the claims themselves (:mod:`django_tasks_coord.store.flow`)."""

    topic = models.CharField(_("topic"), max_length=100)
    key = models.CharField(_("key"), max_length=255, blank=True, default="")
    at = models.DateTimeField(_("at"))
    count = models.PositiveIntegerField(_("count"))

    class Meta:
        verbose_name = _("rate-limited start")
        verbose_name_plural = _("rate-limited starts")
        default_permissions = ()
        indexes = [models.Index(fields=["topic", "at"], name="tasks_coord_flow_start_at")]

    def __str__(self) -> str:
        return f"{self.topic}[{self.key}] {self.count} at {self.at}"
