"""The scheduler every node runs: submit each due slot of each job exactly once.

Due jobs are claimed with ``SELECT ... FOR UPDATE SKIP LOCKED`` (serialized writes on
SQLite); in the same transaction the runs are pushed to the jobs topic and
``nextrun`` advances, so a slot is submitted once however many nodes run the
scheduler, and a node that dies mid-way leaves nothing behind (the transaction rolls
back). The unique (topic, identifier, slot) constraint on tasks is the backstop.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import IntegrityError
from django.db.models import Exists, Min, OuterRef, Q
from django.utils import timezone

from django_tasks_coord import db
from django_tasks_coord.enums import COMPLETED_MIN, TaskState, WaitingPolicy
from django_tasks_coord.models import CatchUp, JobKind, PeriodicTask, Task, Topic
from django_tasks_coord.queue import _insert
from django_tasks_coord.scheduling.planner import JobTiming, plan
from django_tasks_coord.scheduling.runner import JOBS_TOPIC
from django_tasks_coord.timers import Interval, parse

logger = logging.getLogger(__name__)


def timing_of(job: PeriodicTask) -> JobTiming:
    """The planner's view of a job row."""
    timer = parse(job.timer, tz=job.tz or None)
    if job.kind == JobKind.RECURRING and isinstance(timer, Interval) and job.start_time:
        timer = Interval(timer.period, anchor=job.start_time, tz=timer.tz)
    return JobTiming(
        timer=timer,
        max_count=job.max_count,
        run_count=job.run_count,
        start_time=job.start_time,
        end_time=job.end_time,
        catch_up=CatchUp(job.catch_up),
        catch_up_limit=job.catch_up_limit,
        waiting_time=job.waiting_time,
        fixed_delay=job.fixed_delay,
    )


def _run_in_flight() -> Exists:
    return Exists(
        Task.objects.filter(topic_id=JOBS_TOPIC, identifier=OuterRef("id"), state__lt=COMPLETED_MIN)
    )


def schedulable() -> Q:
    """Jobs that may fire: enabled, not paused, and not waiting (WAIT) for their previous run."""
    may_overlap = Q(allow_overlap=True) | ~Q(waiting_policy=WaitingPolicy.WAIT.value)
    return Q(enabled=True, paused=False, nextrun__isnull=False) & (
        may_overlap | Q(~_run_in_flight())
    )


def jobs_paused() -> bool:
    """True while ``pause_all`` is in force (the jobs topic is paused)."""
    return Topic.objects.using(db.alias()).filter(name=JOBS_TOPIC, paused=True).exists()


def next_due() -> datetime | None:
    """When the next job is due (None: no job is scheduled)."""
    jobs = PeriodicTask.objects.using(db.alias()).filter(schedulable())
    due: datetime | None = jobs.aggregate(m=Min("nextrun"))["m"]
    return due


def submit_due(node: str = "", now: datetime | None = None, limit: int = 500) -> list[Task]:
    """Submit the runs of every due job (up to ``limit`` jobs); return the run tasks pushed."""
    using, conn = db.alias(), db.connection()
    now = now or timezone.now()
    if jobs_paused():
        return []
    submitted: list[Task] = []
    with db.write_transaction():
        due = (
            PeriodicTask.objects.using(using)
            .filter(schedulable(), nextrun__lte=now)
            .order_by("nextrun")
            .select_for_update(**db.lock_kwargs(conn))[:limit]
        )
        for job in due:
            submitted.extend(_submit(job, node, now, using))
        if submitted:
            db.notify(conn, JOBS_TOPIC)
    return submitted


def _submit(job: PeriodicTask, node: str, now: datetime, using: str) -> list[Task]:
    try:
        timing = timing_of(job)
    except ValueError as exc:  # a timer that no longer parses (code changed): disable, don't crash
        logger.error("Job %s disabled: its timer %r does not parse: %s", job.id, job.timer, exc)
        job.enabled, job.nextrun = False, None
        job.save(using=using, update_fields=["enabled", "nextrun", "updated_at"])
        return []
    assert job.nextrun is not None
    decision = plan(timing, job.nextrun, now)
    runs, nextrun, finished = decision.submit, decision.nextrun, decision.finished
    if runs and not job.allow_overlap and _has_run_in_flight(job, using):
        # IGNORE / LOG_AND_IGNORE: the previous run is still going; these slots are skipped.
        if job.waiting_policy == WaitingPolicy.LOG_AND_IGNORE.value:
            logger.warning(
                "Job %s: slot %s skipped, the previous run has not finished.", job.id, runs[-1]
            )
        runs, nextrun, finished = [], decision.following, decision.following is None
    if decision.dropped:
        logger.warning(
            "Job %s: %s missed slot(s) not run (missed-slot policy %s), e.g. %s.",
            job.id,
            decision.dropped,
            job.catch_up,
            ", ".join(s.isoformat() for s in decision.dropped_slots[-3:]),
            extra={"job_id": job.id},
        )
    tasks = [
        Task(
            topic_id=JOBS_TOPIC,
            identifier=job.id,
            slot=slot,
            priority=job.priority,
            payload={"task": job.task, "args": job.args, "kwargs": job.kwargs},
        )
        for slot in runs
    ]
    try:
        with db.write_transaction():
            created = _insert(tasks, using) if tasks else []
    except IntegrityError:
        logger.error(
            "Job %s: a run for slot(s) %s exists already; not submitted twice.", job.id, runs
        )
        created = []
    job.nextrun = nextrun
    job.run_count += len(created)
    job.worker, job.marked = node, now
    if created:
        job.last_slot = created[-1].slot
    if finished:
        job.enabled, job.finished_at = False, now
    job.save(
        using=using,
        update_fields=[
            "nextrun",
            "run_count",
            "worker",
            "marked",
            "last_slot",
            "enabled",
            "finished_at",
            "updated_at",
        ],
    )
    for task in created:
        logger.info(
            "Job %s: submitted the run for slot %s.", job.id, task.slot, extra={"job_id": job.id}
        )
    return created


def _has_run_in_flight(job: PeriodicTask, using: str) -> bool:
    runs = Task.objects.using(using).filter(topic_id=JOBS_TOPIC, identifier=job.id)
    return runs.filter(state__lt=COMPLETED_MIN).exists()


def running_jobs() -> list[str]:
    """Ids of the jobs with a run in progress on any node."""
    runs = Task.objects.using(db.alias()).filter(
        topic_id=JOBS_TOPIC, state__in=(TaskState.ACTIVE, TaskState.REQUESTED)
    )
    return sorted(set(runs.values_list("identifier", flat=True)))


__all__ = ["next_due", "running_jobs", "schedulable", "submit_due", "timing_of"]
