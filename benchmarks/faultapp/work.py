"""The fault suite's scheduled jobs, scheduled by ``benchmarks/faults.py`` by dotted path."""

from __future__ import annotations

import os

from benchmarks.faultapp.models import FencedRun
from benchmarks.faultapp.record import started


def periodic(ctx) -> None:
    """A periodic job any node may run: recorded per slot."""
    started("periodic", ctx.slot.isoformat() if ctx.slot else "-", ctx.task.owner_id)


def fenced(ctx) -> None:
    """The leader-only job: recorded, then its side effect committed inside ``ctx.fenced()``."""
    started("fenced", ctx.slot.isoformat() if ctx.slot else "-", ctx.task.owner_id)
    with ctx.fenced():
        FencedRun.objects.create(
            job_id=ctx.job_id,
            slot=ctx.slot,
            term=ctx.term,
            node=ctx.node_id or "",
            pid=os.getpid(),
        )
