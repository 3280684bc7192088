"""The fault suite's queue consumers and ``@task``: record the start, do nothing else."""

from __future__ import annotations

import time

from benchmarks.faultapp.record import started
from django_tasks_coord import handlers
from django_tasks_coord.backends.compat import task
from django_tasks_coord.models import Task


@handlers.consumer("fq")
def steady(item: Task) -> None:
    """A task of the steady stream: recorded, then it works ``payload["sleep"]`` s, if any."""
    started("fq", item.identifier, item.owner_id)
    if item.payload:
        time.sleep(item.payload["sleep"])  # simulated work


@handlers.consumer("burst")
def burst(item: Task) -> None:
    """A task of the 100,000-task burst: recorded, then it succeeds."""
    started("burst", item.identifier, item.owner_id)


@task
def record(key: str) -> None:
    """A Django ``@task``: recorded (by process: a task function does not see its owner)."""
    started("task", key, None)
