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
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from django.utils.module_loading import import_string

from django_tasks_coord import db, topics
from django_tasks_coord.enums import ErrorPolicy, WaitingPolicy
from django_tasks_coord.exceptions import InvalidArgumentError, JobDefinitionError, UnknownJobError
from django_tasks_coord.models import CatchUp, JobKind, PeriodicTask, Task
from django_tasks_coord.retry import RetryPolicy
from django_tasks_coord.scheduling.declared import job, sync_declared
from django_tasks_coord.scheduling.planner import first_slot
from django_tasks_coord.scheduling.runner import (
    JOBS_TOPIC,
    SCHEDULE_CHANGED,
    JobContext,
    group_topic,
    run_payload,
)
from django_tasks_coord.scheduling.scheduler import run_topic, running_jobs, timing_of
from django_tasks_coord.timers import Interval, OneTime, Timer, parse
from django_tasks_coord.timers.base import get_zone, zone_name

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
    "sync_declared",
    "unschedule",
]

JobRef = Callable[..., Any] | str


def callable_path(job: JobRef) -> str:
    """The dotted path of a module-level callable; :class:`JobDefinitionError` otherwise."""
    if isinstance(job, str):
        try:
            import_string(job)
        except ImportError as exc:
            raise JobDefinitionError(f"Job callable {job!r} cannot be imported: {exc}") from exc
        return job
    module, qualname = getattr(job, "__module__", None), getattr(job, "__qualname__", "")
    if not callable(job) or not module or "<" in qualname or "." in qualname:
        raise JobDefinitionError(
            f"A job must be a module-level function or its dotted path, not {job!r} "
            "(nested functions, lambdas and methods cannot be found again by another process)."
        )
    return f"{module}.{qualname}"


#: Characters of a random hex suffix in a generated job id (64 bits).
ID_SUFFIX_LENGTH = 16
MAX_JOB_ID_LENGTH = PeriodicTask._meta.get_field("id").max_length or 200


def new_job_id(path: str, kind: JobKind | str) -> str:
    """A new job id, ``"<dotted path>:<kind>:<16 random hex digits>"``, unique on every call.

    The path is shortened from the left (keeping the function's name) if the id would
    not fit the ``periodic_task.id`` column.
    """
    suffix = f":{kind}:{uuid.uuid4().hex[:ID_SUFFIX_LENGTH]}"
    return path[-(MAX_JOB_ID_LENGTH - len(suffix)) :] + suffix


def _retry_data(retry: RetryPolicy | None) -> dict[str, Any] | None:
    if retry is None:
        return None
    if not isinstance(retry, RetryPolicy):
        raise InvalidArgumentError(f"retry must be a RetryPolicy or None, not {retry!r}.")
    data = dataclasses.asdict(retry)
    data["backoff"] = str(retry.backoff)
    return data


def _when(value: datetime | None, argument: str) -> datetime | None:
    if value is not None and (not isinstance(value, datetime) or timezone.is_naive(value)):
        raise InvalidArgumentError(f"{argument} must be an aware datetime or None, not {value!r}.")
    return value


def job_fields(
    job: JobRef,
    kind: JobKind,
    timer: Timer,
    *,
    job_id: str | None = None,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    priority: int = 0,
    group: str = "",
    leader_only: bool = False,
    max_count: int = -1,
    start_time: datetime | None = None,
    end_time: datetime | None = None,
    policy: ErrorPolicy | str | None = None,
    waiting_policy: WaitingPolicy | str = WaitingPolicy.WAIT,
    waiting_time: float | timedelta = 60.0,
    retry: RetryPolicy | None = None,
    fixed_delay: bool = False,
    allow_overlap: bool = False,
    catch_up: CatchUp | str = CatchUp.ONCE,
    catch_up_limit: int = 10,
    declared: bool = False,
) -> tuple[str, dict[str, Any]]:
    """Validate a job definition; return its id and the ``periodic_task`` columns it sets.

    The keyword arguments are the common options of every ``schedule_*`` function;
    see docs/scheduling.md. Without ``job_id``, the id is a new one (:func:`new_job_id`).
    """
    path = callable_path(job)
    job_id = new_job_id(path, kind) if job_id is None else job_id
    if not isinstance(job_id, str) or not 0 < len(job_id) <= MAX_JOB_ID_LENGTH:
        raise InvalidArgumentError(
            f"job_id must be a str of 1 to {MAX_JOB_ID_LENGTH} characters, not {job_id!r}."
        )
    start_time, end_time = _when(start_time, "start_time"), _when(end_time, "end_time")
    if leader_only and not group:
        raise JobDefinitionError(f"Job {job_id!r} is leader-only but names no group.")
    if start_time and end_time and end_time < start_time:
        raise JobDefinitionError(
            f"Job {job_id!r}: end_time {end_time} is before start_time {start_time}."
        )
    if (
        isinstance(max_count, bool)
        or not isinstance(max_count, int)
        or max_count < -1
        or max_count == 0
    ):
        raise InvalidArgumentError(
            f"max_count must be -1 (unlimited) or a positive int, not {max_count!r}."
        )
    if isinstance(waiting_time, timedelta):
        waiting_time = waiting_time.total_seconds()
    fields: dict[str, Any] = {
        "kind": kind,
        "task": path,
        "timer": str(timer),
        "tz": zone_name(timer.tz),
        "args": list(args),
        "kwargs": dict(kwargs or {}),
        "priority": priority,
        "group": group,
        "leader_only": bool(leader_only),
        "max_count": max_count,
        "start_time": start_time,
        "end_time": end_time,
        "error_policy": str(ErrorPolicy.coerce(policy or ErrorPolicy.LOG_AND_CONTINUE, "policy")),
        "waiting_policy": str(WaitingPolicy.coerce(waiting_policy, "waiting_policy")),
        "waiting_time": float(waiting_time),
        "retry": _retry_data(retry),
        "fixed_delay": bool(fixed_delay),
        "allow_overlap": bool(allow_overlap),
        "catch_up": str(CatchUp(catch_up))
        if catch_up in CatchUp.values
        else _bad_catch_up(catch_up),
        "catch_up_limit": catch_up_limit,
        "declared": declared,
    }
    return job_id, fields


def save_job(job: JobRef, kind: JobKind, timer: Timer, **options: Any) -> str:
    """Create or update a job (validated first; its first slot recomputed) and return its id.

    With ``job_id``, the job of that id is created or updated in place; without, a new
    job with a new id is inserted (never replacing another).
    """
    new = options.get("job_id") is None
    job_id, fields = job_fields(job, kind, timer, **options)
    fields.update(enabled=True, finished_at=None, run_count=0)
    row = PeriodicTask(id=job_id, **fields)
    row.nextrun = first_slot(timing_of(row), timezone.now())
    if row.nextrun is None:
        raise JobDefinitionError(
            f"Job {job_id!r} would never run: {timer} has no slot within its bounds."
        )
    fields["nextrun"] = row.nextrun
    using = db.alias()
    with db.write_transaction():
        topics.register_topic(group_topic(row.group) if row.leader_only else JOBS_TOPIC)
        if new:
            row.save(using=using, force_insert=True)
        else:
            PeriodicTask.objects.using(using).update_or_create(id=job_id, defaults=fields)
        db.notify(db.connection(), SCHEDULE_CHANGED)
    return job_id


def _bad_catch_up(value: object) -> str:
    raise InvalidArgumentError(f"catch_up={value!r} is not one of {', '.join(CatchUp.values)}.")


def schedule_one_time(job: JobRef, at: datetime, **options: Any) -> str:
    """Run ``job`` once at ``at`` (an aware datetime; in the past: as soon as possible).

    Returns the job id: a new job on every call, unless ``job_id=`` names one to
    create or update in place.
    """
    at = _when(at, "at") or _bad_at()
    return save_job(job, JobKind.ONE_TIME, OneTime(at), start_time=at, max_count=1, **options)


def _bad_at() -> datetime:
    raise InvalidArgumentError("at must be an aware datetime.")


def schedule_recurring(
    job: JobRef,
    interval: float | timedelta,
    *,
    max_count: int = -1,
    start_time: datetime | None = None,
    end_time: datetime | None = None,
    policy: ErrorPolicy | str | None = None,
    retry: RetryPolicy | None = None,
    **options: Any,
) -> str:
    """Run ``job`` every ``interval`` (seconds or timedelta), at fixed rate from ``start_time``.

    The first run is at ``start_time``, or one interval from now; ``max_count`` runs at
    most (-1: no limit); no run after ``end_time``. ``fixed_delay=True``: the next run
    starts one interval after the previous run ended instead. Returns the job id: a new
    job on every call, unless ``job_id=`` names one to create or update in place.
    """
    period = interval if isinstance(interval, timedelta) else _seconds(interval)
    anchor = _when(start_time, "start_time") or timezone.now()
    timer = Interval(period, anchor=anchor, tz=get_zone(None))
    return save_job(
        job,
        JobKind.RECURRING,
        timer,
        max_count=max_count,
        start_time=start_time,
        end_time=end_time,
        policy=policy,
        retry=retry,
        **options,
    )


def _seconds(value: object) -> timedelta:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise InvalidArgumentError(
            f"interval must be a positive number of seconds or a timedelta, not {value!r}."
        )
    return timedelta(seconds=value)


def schedule_periodic(
    job: JobRef, timer: str | Timer, *, tz: str | None = None, **options: Any
) -> str:
    """Run ``job`` at every elapse of ``timer``: a systemd calendar event, a cron expression,
    or anything :func:`django_tasks_coord.timers.parse` accepts, in zone ``tz`` (default:
    ``TIME_ZONE``). Returns the job id: a new job on every call, unless ``job_id=`` names
    one to create or update in place.
    """
    return save_job(job, JobKind.PERIODIC, parse(timer, tz=tz), **options)


def _job_rows(job_id: str) -> Any:
    rows = PeriodicTask.objects.using(db.alias()).filter(pk=job_id)
    if not rows.exists():
        raise UnknownJobError(f"No job has the id {job_id!r}.")
    return rows


def _changed(rows: Any, **changes: Any) -> None:
    rows.update(**changes)
    db.notify(db.connection(), SCHEDULE_CHANGED)


def pause(job_id: str) -> None:
    """Stop firing ``job_id`` until :func:`resume` (a run in progress finishes)."""
    _changed(_job_rows(job_id), paused=True)


def resume(job_id: str) -> None:
    """Fire ``job_id`` again; slots missed while paused follow its missed-slot policy."""
    _changed(_job_rows(job_id), paused=False)


def pause_all() -> None:
    """Stop firing every job, and stop running job runs, until :func:`resume_all`."""
    topics.register_topic(JOBS_TOPIC)
    topics.pause_topic(JOBS_TOPIC)


def resume_all() -> None:
    """Undo :func:`pause_all`; missed slots follow each job's missed-slot policy."""
    topics.register_topic(JOBS_TOPIC)
    topics.resume_topic(JOBS_TOPIC)
    db.notify(db.connection(), SCHEDULE_CHANGED)


def run_now(job_id: str, *, requester: str = "") -> Task:
    """Submit a run of ``job_id`` at once, outside its schedule, and return the run task.

    The run has no slot (``ctx.slot`` is None), does not count towards ``max_count`` and
    leaves ``nextrun`` alone; it runs even if the job is paused or disabled (an
    operator asked for it), but waits while :func:`pause_all` is in force. Its outcome
    is recorded on the job like any run's. ``requester`` (who asked, e.g. the admin
    user) is stored on the task.
    """
    job = _job_rows(job_id).get()
    topic = run_topic(job)
    run = Task(
        topic_id=topic,
        identifier=job.id,
        priority=job.priority,
        payload=run_payload(job),
        requester=requester[:255],
        label="run now",
    )
    with db.write_transaction():
        topics.register_topic(topic)
        created = Task.objects.using(db.alias()).insert([run])[0]
        db.notify(db.connection(), topic)
    return created


def unschedule(job_id: str) -> None:
    """Delete the schedule of ``job_id``. Its past runs stay in the task table."""
    _job_rows(job_id).delete()
    db.notify(db.connection(), SCHEDULE_CHANGED)
