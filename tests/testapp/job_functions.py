"""Jobs used by the scheduling tests. Deliberately not named jobs.py: nothing here is declared."""

import os
import time

from django.utils import timezone

from tests.testapp.models import Run


def record(ctx, *args, **kwargs):
    """Record the run (job id, slot, attempt), then optionally sleep or fail."""
    Run.objects.create(
        topic="jobs",
        identifier=ctx.job_id,
        sequence=ctx.task.sequence,
        attempt=ctx.attempt,
        slot=ctx.slot,
        node=ctx.task.owner.name if ctx.task.owner_id else "",
        started_at=timezone.now(),
        pid=os.getpid(),
    )
    if kwargs.get("sleep"):
        time.sleep(kwargs["sleep"])  # simulated work
    if ctx.attempt <= kwargs.get("fail_times", 0):
        raise RuntimeError(f"job attempt {ctx.attempt} fails on purpose")


def noop(ctx):
    return None


def fenced_record(ctx, sleep=0.0):
    """A leader-only job whose only side effect (a Run row with its term) is fenced."""
    if sleep:
        time.sleep(sleep)  # simulated work before the side effect
    with ctx.fenced():
        Run.objects.create(
            topic="leader",
            identifier=ctx.job_id,
            sequence=ctx.task.sequence,
            attempt=ctx.attempt,
            slot=ctx.slot,
            term=ctx.term,
            node=ctx.node_id or "",
            started_at=timezone.now(),
            pid=os.getpid(),
        )
