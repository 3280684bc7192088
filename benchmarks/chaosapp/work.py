"""The chaos run's leader-only job. Not named ``jobs.py``: nothing here is declared."""

from __future__ import annotations

import os
import random
import time

from benchmarks.chaosapp.models import LeaderRun


def leader_run(ctx, work_min: float = 0.05, work_max: float = 0.2, in_fence: bool = False) -> None:
    """Simulate a little work, then record the run inside ``ctx.fenced()`` (its commit point).

    A deposed leader gets ``FencedError`` from ``ctx.fenced()`` and records nothing; the
    run goes back to the queue for the current leader. ``in_fence``: do the work inside
    the fenced block instead (a slow fenced write), holding the ``token_holder`` lock.
    """
    started = time.time()
    work = random.uniform(work_min, work_max)
    if not in_fence:
        time.sleep(work)  # simulated work before the side effect
    with ctx.fenced():
        if in_fence:
            time.sleep(work)
        LeaderRun.objects.create(
            job_id=ctx.job_id,
            slot=ctx.slot,
            term=ctx.term,
            node=ctx.node_id or "",
            attempt=ctx.attempt,
            task_sequence=ctx.task.sequence,
            pid=os.getpid(),
            started=started,
            ended=time.time(),
        )
