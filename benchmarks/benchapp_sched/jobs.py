"""The scheduling benchmark's job: it records when it started.

``stamp`` takes ``time.time()`` on its first line and returns it as the run's message,
with the slot it was called for and the process that ran it, so the benchmark reads
every start from the task table (all processes run on one machine and share its clock).
"""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING

from django_tasks_coord.enums import Decision, Result

if TYPE_CHECKING:
    from django_tasks_coord.scheduling import JobContext


def stamp(ctx: JobContext) -> Decision:
    """Record the start (wall clock, seconds since the epoch), the slot and the process id."""
    started = time.time()
    slot = ctx.slot.timestamp() if ctx.slot is not None else None
    return Decision(
        Result.SUCCESS, message=json.dumps({"started": started, "slot": slot, "pid": os.getpid()})
    )


def noop(ctx: JobContext) -> None:
    """Do nothing (the submission-rate schedules; their runs are never executed)."""
