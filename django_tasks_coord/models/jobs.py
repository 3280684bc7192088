"""Scheduled jobs: one row per job, claimed by the nodes' schedulers."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from django_tasks_coord.enums import TaskState


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
