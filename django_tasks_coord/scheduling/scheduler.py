"""The scheduler every node runs: submit each due slot of each job exactly once.

Due jobs are claimed with ``SELECT ... FOR UPDATE SKIP LOCKED`` (serialized writes on
SQLite); in the same transaction the runs are inserted into the jobs topic (by the task
store, :func:`django_tasks_coord.store.insert_runs`) and ``nextrun`` advances, so a
slot is submitted once however many nodes run the scheduler, and a node that dies
mid-way leaves nothing behind (the transaction rolls back). The unique (topic,
identifier, slot) constraint on tasks is the backstop.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db.models import (
    BooleanField,
    CharField,
    Exists,
    ExpressionWrapper,
    F,
    Min,
    OuterRef,
    Q,
    QuerySet,
    Value,
)
from django.db.models.functions import Concat
from django.utils import timezone

from django_tasks_coord import db, signals, store
from django_tasks_coord.enums import TaskState, WaitingPolicy
from django_tasks_coord.models import PeriodicTask, Task, Topic
from django_tasks_coord.scheduling.names import GROUP_TOPIC_PREFIX, JOBS_TOPIC, run_topic
from django_tasks_coord.scheduling.planner import plan, timing_of
from django_tasks_coord.scheduling.runner import run_payload

logger = logging.getLogger(__name__)


def _run_in_flight() -> Q:
    """A job has an unfinished run, looked up by (topic, identifier) so the index serves it."""
    runs = Task.objects.unfinished_of(OuterRef("id"))
    leader_topic = Concat(Value(GROUP_TOPIC_PREFIX), OuterRef("group"), output_field=CharField())
    return (Q(leader_only=False) & Q(Exists(runs.filter(topic_id=JOBS_TOPIC)))) | (
        Q(leader_only=True) & Q(Exists(runs.filter(topic_id=leader_topic)))
    )


def schedulable() -> Q:
    """Jobs that may fire: enabled, not paused, and not waiting (WAIT) for their previous run."""
    may_overlap = Q(allow_overlap=True) | ~Q(waiting_policy=WaitingPolicy.WAIT.value)
    return Q(enabled=True, paused=False, nextrun__isnull=False) & (may_overlap | ~_run_in_flight())


def _paused_jobs_topic() -> QuerySet[Topic]:
    """The jobs topic if it is paused: ``pause_all`` is in force."""
    return Topic.objects.using(db.alias()).filter(name=JOBS_TOPIC, paused=True)


def jobs_paused() -> bool:
    """True while ``pause_all`` is in force (the jobs topic is paused)."""
    return _paused_jobs_topic().exists()


def _not_all_paused() -> Q:
    """No ``pause_all`` in force: folded into the scheduler's queries (no extra round trip)."""
    return ~Q(Exists(_paused_jobs_topic()))


def next_due() -> datetime | None:
    """When the next job is due (None: no job is scheduled, or ``pause_all`` is in force)."""
    jobs = PeriodicTask.objects.using(db.alias()).filter(schedulable(), _not_all_paused())
    due: datetime | None = jobs.aggregate(m=Min("nextrun"))["m"]
    return due


def submit_due(node: str = "", now: datetime | None = None, limit: int = 500) -> list[Task]:
    """Submit the runs of every due job (up to ``limit`` jobs); return the run tasks pushed.

    One transaction: the due rows are locked (SKIP LOCKED), every job is planned in
    Python, all runs are inserted with one statement, and the jobs are updated with
    one statement per distinct outcome (jobs due at the same time usually share
    one). If the insert conflicts (a run exists for a slot), the jobs are redone one
    by one so that only the conflicting job skips its slot.
    """
    using, conn = db.alias(), db.connection()
    now = now or timezone.now()
    with db.write_transaction():
        due = list(
            PeriodicTask.objects.using(using)
            .filter(schedulable(), _not_all_paused(), nextrun__lte=now)
            .annotate(
                run_in_flight=ExpressionWrapper(_run_in_flight(), output_field=BooleanField())
            )
            .order_by("nextrun")
            .select_for_update(**db.lock_kwargs(conn))[:limit]
        )
        if not due:
            return []
        missed: Counter[str] = Counter()
        planned = [(job, _plan_job(job, now, missed)) for job in due]
        created = _insert_runs(planned, using)
        added = Counter(task.identifier for task in created)
        _save_jobs([job for job, _ in planned], added, missed, node, now, using)
    for task in created:
        logger.info(
            "Job %s: submitted the run for slot %s.",
            task.identifier,
            task.slot,
            extra={"job_id": task.identifier, "slot": task.slot, "node": node or None},
        )
        signals.send(
            signals.job_submitted,
            PeriodicTask,
            job_id=task.identifier,
            slot=task.slot,
            task=task,
            node=node or None,
        )
    return created


def _save_jobs(
    jobs: list[PeriodicTask],
    added: Counter[str],
    missed: Counter[str],
    node: str,
    now: datetime,
    using: str,
) -> None:
    """Write the planned jobs back: one UPDATE per group of jobs with the same new values."""
    groups: dict[tuple[Any, ...], list[str]] = defaultdict(list)
    for job in jobs:
        key = (job.nextrun, job.last_slot, job.enabled, job.finished_at, added[job.id])
        groups[(*key, missed[job.id])].append(job.id)
    rows = PeriodicTask.objects.using(using)
    for (nextrun, last_slot, enabled, finished_at, runs, dropped), ids in groups.items():
        for start in range(0, len(ids), 1000):
            rows.filter(pk__in=ids[start : start + 1000]).update(
                nextrun=nextrun,
                last_slot=last_slot,
                enabled=enabled,
                finished_at=finished_at,
                run_count=F("run_count") + runs,
                missed_slots=F("missed_slots") + dropped,
                worker=node,
                marked=now,
                updated_at=now,
            )


def _insert_runs(planned: Sequence[tuple[PeriodicTask, list[Task]]], using: str) -> list[Task]:
    """Insert the planned runs; a job whose runs conflict with an existing one submits none."""
    created: list[Task] = []
    inserted = store.insert_runs([tasks for _, tasks in planned], using=using)
    for (job, tasks), runs in zip(planned, inserted, strict=True):
        if runs is None:
            logger.error(
                "Job %s: a run for slot(s) %s exists already; not submitted twice.",
                job.id,
                [t.slot for t in tasks],
            )
        else:
            created.extend(runs)
    return created


def _plan_job(job: PeriodicTask, now: datetime, missed: Counter[str]) -> list[Task]:
    """Plan one due job: update the row in memory and return the runs to insert.

    Slots that will never run (dropped by the missed-slot policy, or skipped because the
    previous run is still going) are counted in ``missed``.
    """
    job.updated_at = now
    try:
        timing = timing_of(job)
    except ValueError as exc:  # a timer that no longer parses (code changed): disable, don't crash
        logger.error("Job %s disabled: its timer %r does not parse: %s", job.id, job.timer, exc)
        job.enabled, job.nextrun = False, None
        return []
    assert job.nextrun is not None
    decision = plan(timing, job.nextrun, now)
    slots, nextrun, finished = decision.submit, decision.nextrun, decision.finished
    if slots and not job.allow_overlap and getattr(job, "run_in_flight", False):
        # IGNORE / LOG_AND_IGNORE (WAIT jobs are not due while a run is in flight):
        # the previous run is still going, so these slots are skipped.
        if job.waiting_policy == WaitingPolicy.LOG_AND_IGNORE.value:
            logger.warning(
                "Job %s: slot %s skipped, the previous run has not finished.", job.id, slots[-1]
            )
        missed[job.id] += len(slots)
        slots, nextrun, finished = [], decision.following, decision.following is None
    if decision.dropped:
        missed[job.id] += decision.dropped
        logger.warning(
            "Job %s: %s missed slot(s) not run (missed-slot policy %s), e.g. %s.",
            job.id,
            decision.dropped,
            job.catch_up,
            ", ".join(s.isoformat() for s in decision.dropped_slots[-3:]),
            extra={"job_id": job.id},
        )
    job.nextrun = nextrun
    if slots:
        job.last_slot = slots[-1]
    if finished:
        job.enabled, job.finished_at = False, now
    payload = run_payload(job)
    return [
        Task(
            topic_id=run_topic(job),
            identifier=job.id,
            slot=slot,
            priority=job.priority,
            payload=payload,
        )
        for slot in slots
    ]


def running_jobs() -> list[str]:
    """Ids of the jobs with a run in progress on any node."""
    runs = Task.objects.using(db.alias()).filter(
        Q(topic_id=JOBS_TOPIC) | Q(topic__name__startswith=GROUP_TOPIC_PREFIX),
        state__in=(TaskState.ACTIVE, TaskState.REQUESTED),
    )
    return sorted(set(runs.values_list("identifier", flat=True)))


__all__ = ["next_due", "run_topic", "running_jobs", "schedulable", "submit_due", "timing_of"]
