"""Workflows: DAGs of tasks (:mod:`django_tasks_coord.workflows`), one row per workflow and step.

A step becomes a task of any kind (a ``@task`` call, a push to a consumer's topic, a task
of an executor definition) once its parents finished; the step row remembers which task
(``task_topic`` and ``task_sequence``) and, once that task ended, its outcome and result.
Only the task store writes these rows (:mod:`django_tasks_coord.store.workflows`).
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _


class WorkflowState(models.TextChoices):
    """Where a workflow is: running until every step is final."""

    RUNNING = "running", _("running")
    SUCCEEDED = "succeeded", _("succeeded")
    FAILED = "failed", _("failed")
    CANCELED = "canceled", _("canceled")


class StepState(models.TextChoices):
    """Where a step is. WAITING: for its parents; ENQUEUED: its task exists and has not
    ended; the others are final (SKIPPED: its task was FILTERED, nothing to do)."""

    WAITING = "waiting", _("waiting")
    ENQUEUED = "enqueued", _("enqueued")
    SUCCEEDED = "succeeded", _("succeeded")
    FAILED = "failed", _("failed")
    CANCELED = "canceled", _("canceled")
    SKIPPED = "skipped", _("skipped")

    @property
    def is_final(self) -> bool:
        """Whether the step has ended (it never changes again)."""
        return self not in (StepState.WAITING, StepState.ENQUEUED)

    @property
    def is_success(self) -> bool:
        """Whether its dependants run after it whatever its failure policy (SUCCEEDED, SKIPPED)."""
        return self in (StepState.SUCCEEDED, StepState.SKIPPED)


class StepKind(models.TextChoices):
    """What task a step becomes."""

    TASK = "task", _("@task function")
    PUSH = "push", _("topic push (a consumer)")
    DEFINITION = "definition", _("executor definition")


class OnFailure(models.TextChoices):
    """What a step that ended FAILED or CANCELED does to its dependants."""

    FAIL = "fail", _("fail its dependants")
    CANCEL = "cancel", _("cancel its dependants")
    CONTINUE = "continue", _("run its dependants anyway")


class Workflow(models.Model):
    """A DAG of steps started together (:func:`django_tasks_coord.workflows.start`)."""

    name = models.CharField(_("name"), max_length=200)
    state = models.CharField(
        _("state"), max_length=16, choices=WorkflowState.choices, default=WorkflowState.RUNNING
    )
    created_at = models.DateTimeField(_("created at"), db_default=Now())
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    options = models.JSONField(_("options"), default=dict, blank=True)

    class Meta:
        verbose_name = _("workflow")
        verbose_name_plural = _("workflows")
        indexes = [models.Index(fields=["state", "id"], name="tasks_coord_workflow_state")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(state__in=WorkflowState.values),
                name="tasks_coord_workflow_state_valid",
            )
        ]

    def __str__(self) -> str:
        return f"workflow #{self.pk} {self.name} ({self.state})"


class WorkflowStep(models.Model):
    """One step of a workflow: what task it becomes, after which steps, and how it ended."""

    workflow = models.ForeignKey(
        Workflow, on_delete=models.CASCADE, related_name="steps", verbose_name=_("workflow")
    )
    name = models.CharField(_("name"), max_length=200)
    kind = models.CharField(_("kind"), max_length=16, choices=StepKind.choices)
    target = models.CharField(
        _("target"),
        max_length=255,
        help_text=_("The @task function's path, the topic, or the definition's name."),
    )
    backend = models.CharField(_("backend"), max_length=100, blank=True, default="")
    identifier = models.CharField(_("identifier"), max_length=255, blank=True, default="")
    args = models.JSONField(
        _("arguments"),
        null=True,
        blank=True,
        help_text=_("A task's args and kwargs, a push's payload or a definition's params."),
    )
    after = models.JSONField(_("after"), default=list, blank=True)
    on_failure = models.CharField(
        _("on failure"), max_length=16, choices=OnFailure.choices, default=OnFailure.FAIL
    )
    pass_results = models.BooleanField(
        _("pass results"),
        default=False,
        help_text=_("Its parents' results are given to it, by step name, as 'results'."),
    )
    state = models.CharField(
        _("state"), max_length=16, choices=StepState.choices, default=StepState.WAITING
    )
    task_topic = models.CharField(_("task topic"), max_length=100, blank=True, default="")
    task_identifier = models.CharField(_("task identifier"), max_length=255, blank=True, default="")
    task_sequence = models.BigIntegerField(_("task sequence"), null=True, blank=True)
    result = models.JSONField(_("result"), null=True, blank=True)
    message = models.TextField(_("message"), blank=True, default="")
    enqueued_at = models.DateTimeField(_("enqueued at"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)

    class Meta:
        verbose_name = _("workflow step")
        verbose_name_plural = _("workflow steps")
        ordering = ["workflow", "id"]
        indexes = [
            # The advancers' look for steps whose task ended: WHERE state = 'enqueued'.
            models.Index(fields=["state", "workflow"], name="tasks_coord_step_state"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["workflow", "name"], name="tasks_coord_step_name"),
            models.CheckConstraint(
                condition=models.Q(state__in=StepState.values), name="tasks_coord_step_state_valid"
            ),
            models.CheckConstraint(
                condition=models.Q(kind__in=StepKind.values), name="tasks_coord_step_kind_valid"
            ),
            models.CheckConstraint(
                condition=models.Q(on_failure__in=OnFailure.values),
                name="tasks_coord_step_on_failure_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} of workflow #{self.workflow_id} ({self.state})"
