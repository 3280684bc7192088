"""Creating, changing and running jobs: the ``schedule_*`` functions and the job switches.

Each ``schedule_*`` call without ``job_id=`` adds a new job with a new id; with
``job_id=``, the job of that id is created or updated in place. Schedules are rows of
``periodic_task``, written here; a run submitted at once (:func:`run_now`) is a task
row, written by the task store (:mod:`django_tasks_coord.store`). Every change wakes
the schedulers (``NOTIFY`` :data:`~django_tasks_coord.scheduling.names.SCHEDULE_CHANGED`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from django_tasks_coord import db, flow, store, topics
from django_tasks_coord.enums import ErrorPolicy
from django_tasks_coord.exceptions import InvalidArgumentError, JobDefinitionError, UnknownJobError
from django_tasks_coord.models import JobKind, PeriodicTask, Task
from django_tasks_coord.retry import RetryPolicy
from django_tasks_coord.scheduling.definition import JobRef, aware, job_fields
from django_tasks_coord.scheduling.names import JOBS_TOPIC, SCHEDULE_CHANGED, run_topic
from django_tasks_coord.scheduling.planner import first_slot, timing_of
from django_tasks_coord.scheduling.runner import run_payload
from django_tasks_coord.timers import Interval, OneTime, Timer, parse
from django_tasks_coord.timers.base import get_zone


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
        topics.register_internal_topic(run_topic(row))
        if new:
            row.save(using=using, force_insert=True)
        else:
            PeriodicTask.objects.using(using).update_or_create(id=job_id, defaults=fields)
        db.notify(db.connection(), SCHEDULE_CHANGED)
    return job_id


def schedule_one_time(job: JobRef, at: datetime, **options: Any) -> str:
    """Run ``job`` once at ``at`` (an aware datetime; in the past: as soon as possible).

    Returns the job id: a new job on every call, unless ``job_id=`` names one to
    create or update in place.
    """
    at = aware(at, "at") or _bad_at()
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
    anchor = aware(start_time, "start_time") or timezone.now()
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


def _job_rows(job_id: str) -> QuerySet[PeriodicTask]:
    rows = PeriodicTask.objects.using(db.alias()).filter(pk=job_id)
    if not rows.exists():
        raise UnknownJobError(f"No job has the id {job_id!r}.")
    return rows


def _changed(rows: QuerySet[PeriodicTask], **changes: Any) -> None:
    rows.update(**changes)
    db.notify(db.connection(), SCHEDULE_CHANGED)


def pause(job_id: str) -> None:
    """Stop firing ``job_id`` until :func:`resume` (a run in progress finishes)."""
    _changed(_job_rows(job_id), paused=True)


def resume(job_id: str) -> None:
    """Fire ``job_id`` again; slots missed while paused follow its missed-slot policy."""
    _changed(_job_rows(job_id), paused=False)


def set_limits(job_id: str, *, rate: str | None = None, concurrency: int | None = None) -> None:
    """Limit the runs of ``job_id`` across all nodes: at most ``rate`` starts per period
    (``"1/h"``, ``"10/m"``...) and ``concurrency`` runs at once; no argument: no limits.

    The limits are an entry of the run topic's ``key_limits``
    (:func:`django_tasks_coord.flow.set_key_limits`; the jobs topic, or the group's topic of
    a leader-only job), that topic keyed by ``"identifier"`` (a run's identifier is its
    job's id). They hold for runs submitted afterwards, and take effect at the next claim
    on every node. Runs held back wait as pending runs do (the job's ``waiting_time`` and
    overlap rules apply to them). A job made leader-only (or moved to another group)
    afterwards needs its limits set again. Raises :class:`UnknownJobError` for an unknown
    job and ``InvalidArgumentError`` for a bad limit.
    """
    flow.validated(rate=rate, concurrency=concurrency)
    job = _job_rows(job_id).get()
    topic = run_topic(job)
    flow.ensure_key(topic, "identifier", internal=True)
    flow.set_key_limits(topic, job_id, rate=rate, concurrency=concurrency, internal=True)


def pause_all() -> None:
    """Stop firing every job, and stop running job runs, until :func:`resume_all`."""
    topics.register_internal_topic(JOBS_TOPIC)
    topics.pause_topic(JOBS_TOPIC)


def resume_all() -> None:
    """Undo :func:`pause_all`; missed slots follow each job's missed-slot policy."""
    topics.register_internal_topic(JOBS_TOPIC)
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
        topics.register_internal_topic(topic)
        return store.insert_run(run)


def unschedule(job_id: str) -> None:
    """Delete the schedule of ``job_id``. Its past runs stay in the task table."""
    _job_rows(job_id).delete()
    db.notify(db.connection(), SCHEDULE_CHANGED)


__all__ = [
    "pause",
    "pause_all",
    "resume",
    "resume_all",
    "run_now",
    "save_job",
    "schedule_one_time",
    "schedule_periodic",
    "schedule_recurring",
    "unschedule",
]
