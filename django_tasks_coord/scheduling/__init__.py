"""Scheduling: one-time, recurring and periodic jobs, each slot submitted exactly once.

::

    from django_tasks_coord import scheduling

    scheduling.schedule_periodic("reports.jobs.daily", "Mon..Fri 09:00", tz="Europe/Berlin")
    scheduling.schedule_recurring(cleanup, 300, max_count=12)
    scheduling.schedule_one_time(send_reminder, at, args=[42])

    @scheduling.job("*:0/15", name="sync-prices")       # in an app's jobs.py
    def sync_prices(ctx):
        ctx.logger.info("slot %s, attempt %s", ctx.slot, ctx.attempt)

Each ``schedule_*`` call without ``job_id=`` adds a new job with a new id (scheduling
the same function twice gives two jobs); with ``job_id=``, the job of that id is
created or updated in place, and declared jobs are kept by name.

A job is a module-level callable (or its dotted path) called as
``job(ctx, *args, **kwargs)`` with a :class:`JobContext`. Schedules live in the
``periodic_task`` table; every ``runscheduler`` node submits due slots (exactly
once, whatever the number of nodes) as tasks of the jobs topic, and its workers run
them. See docs/scheduling.md.

This module re-exports; the implementation lives in its submodules:
:mod:`~django_tasks_coord.scheduling.jobs` (the ``schedule_*`` functions and the job
switches), :mod:`~django_tasks_coord.scheduling.definition` (validating a job's
options), :mod:`~django_tasks_coord.scheduling.declared` (``@job``),
:mod:`~django_tasks_coord.scheduling.planner` (which slots are due),
:mod:`~django_tasks_coord.scheduling.scheduler` (submitting them),
:mod:`~django_tasks_coord.scheduling.runner` (running them) and
:mod:`~django_tasks_coord.scheduling.names` (topic names, no side effects).
"""

from __future__ import annotations

# The documented API (``__all__``), then names importable from here as before (``as``: a
# deliberate re-export, not part of the documented API).
from django_tasks_coord.scheduling.declared import job, sync_declared
from django_tasks_coord.scheduling.definition import ID_SUFFIX_LENGTH as ID_SUFFIX_LENGTH
from django_tasks_coord.scheduling.definition import MAX_JOB_ID_LENGTH as MAX_JOB_ID_LENGTH
from django_tasks_coord.scheduling.definition import JobRef as JobRef
from django_tasks_coord.scheduling.definition import callable_path as callable_path
from django_tasks_coord.scheduling.definition import job_fields as job_fields
from django_tasks_coord.scheduling.definition import new_job_id as new_job_id
from django_tasks_coord.scheduling.jobs import (
    pause,
    pause_all,
    resume,
    resume_all,
    run_now,
    schedule_one_time,
    schedule_periodic,
    schedule_recurring,
    set_limits,
    unschedule,
)
from django_tasks_coord.scheduling.jobs import save_job as save_job
from django_tasks_coord.scheduling.names import JOBS_TOPIC
from django_tasks_coord.scheduling.names import SCHEDULE_CHANGED as SCHEDULE_CHANGED
from django_tasks_coord.scheduling.names import group_topic as group_topic
from django_tasks_coord.scheduling.names import run_topic as run_topic
from django_tasks_coord.scheduling.planner import timing_of as timing_of
from django_tasks_coord.scheduling.runner import JobContext
from django_tasks_coord.scheduling.runner import run_payload as run_payload
from django_tasks_coord.scheduling.scheduler import running_jobs

__all__ = [
    "JOBS_TOPIC",
    "JobContext",
    "job",
    "pause",
    "pause_all",
    "resume",
    "resume_all",
    "run_now",
    "running_jobs",
    "schedule_one_time",
    "schedule_periodic",
    "schedule_recurring",
    "set_limits",
    "sync_declared",
    "unschedule",
]
