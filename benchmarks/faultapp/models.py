"""One row per committed run of the fault suite's leader-only job."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now


class FencedRun(models.Model):
    """A run of the leader-only job, written inside ``ctx.fenced()`` (so only if it committed).

    No unique constraint on ``slot``: a slot committed twice must be *counted*, not turned
    into a failing (and retried) run.
    """

    job_id = models.CharField(max_length=200)
    slot = models.DateTimeField(null=True)
    term = models.PositiveBigIntegerField(null=True)
    node = models.CharField(max_length=200)
    pid = models.PositiveIntegerField()
    recorded_at = models.DateTimeField(db_default=Now())

    def __str__(self) -> str:
        return f"{self.job_id} slot {self.slot} term {self.term} on {self.node}"
