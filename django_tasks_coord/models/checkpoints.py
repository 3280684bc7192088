"""Checkpoints: what a running task's handler recorded as done, to resume from after a crash.

One row per task and name (:func:`django_tasks_coord.running.checkpoint`,
:func:`~django_tasks_coord.running.step`, the steps of a
:class:`~django_tasks_coord.composite.Composite`), written only under the claim of the
attempt that records it (:mod:`django_tasks_coord.store.checkpoints`, the one module that
writes this table).
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from django_tasks_coord.models.tasks import Task


class Checkpoint(models.Model):
    """A JSON value a task's handler stored under ``name``; kept across the task's attempts.

    The reference to the task has no database constraint: on PostgreSQL the task table may
    be partitioned by topic (its primary key is then ``(topic_id, sequence)``), and a
    task's checkpoints are deleted with it by the task store instead
    (:mod:`django_tasks_coord.store.prune`).
    """

    id = models.BigAutoField(primary_key=True)
    task = models.ForeignKey(
        Task,
        on_delete=models.DO_NOTHING,
        db_constraint=False,  # see the class docstring: deleted by the store with the task
        db_index=False,  # the unique (task, name) serves look-ups by task
        related_name="checkpoints",
        verbose_name=_("task"),
    )
    name = models.CharField(_("name"), max_length=200)
    value = models.JSONField(_("value"), null=True, blank=True)
    attempt = models.PositiveIntegerField(
        _("attempt"), help_text=_("The task's attempt that wrote it (its attempts count then).")
    )
    exec_id = models.UUIDField(
        _("execution id"), help_text=_("The claim it was written under (fencing).")
    )
    written_at = models.DateTimeField(_("written at"), db_default=Now())

    class Meta:
        verbose_name = _("checkpoint")
        verbose_name_plural = _("checkpoints")
        default_permissions = ()
        constraints = [
            models.UniqueConstraint(fields=["task", "name"], name="tasks_coord_checkpoint_name"),
        ]

    def __str__(self) -> str:
        return f"#{self.task_id} {self.name}"
