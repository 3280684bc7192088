"""This project's consumers for the benchmark, registered when ``runscheduler`` starts.

- ``noop``: does nothing (the throughput drain).
- ``sleepy``: sleeps ``payload["sleep"]`` seconds (flow control's concurrency limits).
- ``latency``: stores ``time.time()`` taken on its first line as the task's message, so the
  benchmark can compare when the handler started with when the push committed (both
  processes run on one machine and share its clock).
"""

from __future__ import annotations

import time

from django_tasks_coord import handlers
from django_tasks_coord.enums import Decision, Result
from django_tasks_coord.models import Task


@handlers.consumer("noop")
def noop(task: Task) -> None:
    """Do nothing: the task succeeds."""


@handlers.consumer("latency")
def latency(task: Task) -> Decision:
    """Record when the handler started (wall clock, seconds since the epoch)."""
    started = time.time()
    return Decision(Result.SUCCESS, message=repr(started))


@handlers.consumer("sleepy")
def sleepy(task: Task) -> None:
    """Sleep ``payload["sleep"]`` seconds (simulated work: flow_control.py's concurrency)."""
    time.sleep((task.payload or {}).get("sleep", 0))
