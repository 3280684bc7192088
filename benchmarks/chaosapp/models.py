"""One row per committed run of the chaos run's leader-only job."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now


class LeaderRun(models.Model):
    """A run of the leader-only job, written inside ``ctx.fenced()`` (so only if it committed).

    ``started``/``ended`` are the host's wall clock (``time.time()``; every node runs on
    the same machine): when the job function began, before its simulated work, and the
    last moment inside the fenced block, just before the commit. ``recorded_at`` is the
    database clock of the insert. No unique constraint on ``slot``: a slot recorded twice
    must be *counted*, not turned into a failing (and retried) run.
    """

    job_id = models.CharField(max_length=200)
    slot = models.DateTimeField(null=True)
    term = models.PositiveBigIntegerField(null=True)
    node = models.CharField(max_length=200)
    attempt = models.PositiveIntegerField()
    task_sequence = models.BigIntegerField()
    pid = models.PositiveIntegerField()
    started = models.FloatField()
    ended = models.FloatField()
    recorded_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["started"]

    def __str__(self) -> str:
        return f"{self.job_id} slot {self.slot} term {self.term} on {self.node}"
