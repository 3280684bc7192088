"""Topics and jobs: list them, pause and resume them, run a job now.

Each change goes through the service that owns it (:mod:`django_tasks_coord.topics`,
:mod:`django_tasks_coord.scheduling`) and is logged on the
``django_tasks_coord.operations`` logger with who asked (``actor``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from django_tasks_coord import db, scheduling, topics
from django_tasks_coord.exceptions import UnknownJobError
from django_tasks_coord.models import PeriodicTask, Task, Topic
from django_tasks_coord.operations.selection import iso, state_name
from django_tasks_coord.scheduling.scheduler import jobs_paused

#: The logger of every operation (documented in docs/reference/logging.md).
logger = logging.getLogger("django_tasks_coord.operations")


def list_topics() -> list[dict[str, Any]]:
    """Every topic with its paused flag and failure streak (no task counts: they cost a scan)."""
    rows = Topic.objects.using(db.alias()).order_by("name")
    return [
        {"name": t.name, "paused": t.paused, "consecutive_failures": t.consecutive_failures}
        for t in rows
    ]


def set_topics_paused(names: Sequence[str], paused: bool, *, actor: str = "") -> dict[str, bool]:
    """Pause (or resume) each topic through ``queue.pause_topic``/``resume_topic``.

    Returns, per topic, whether it changed (False: it was paused, or running, already).
    Every name is checked before any topic changes.
    """
    checked = [topics.topic_name(name) for name in names]
    service = topics.pause_topic if paused else topics.resume_topic
    changed = {name: service(name) for name in checked}
    logger.info(
        "%s topic(s) %s by %s (%d changed).",
        "Paused" if paused else "Resumed",
        ", ".join(checked),
        actor or "unknown",
        sum(changed.values()),
        extra={
            "actor": actor or "unknown",
            "action": "pause-topic" if paused else "resume-topic",
            "changed": sum(changed.values()),
        },
    )
    return changed


def job_data(job: PeriodicTask) -> dict[str, Any]:
    """A scheduled job as JSON-ready data."""
    return {
        "id": job.id,
        "kind": job.kind,
        "callable": job.task,
        "timer": job.timer,
        "tz": job.tz,
        "group": job.group,
        "leader_only": job.leader_only,
        "enabled": job.enabled,
        "paused": job.paused,
        "nextrun": iso(job.nextrun),
        "last_slot": iso(job.last_slot),
        "last_outcome": state_name(job.last_outcome),
        "last_finished_at": iso(job.last_finished_at),
        "consecutive_failures": job.consecutive_failures,
    }


def list_jobs() -> list[PeriodicTask]:
    """Every scheduled job, by id."""
    return list(PeriodicTask.objects.using(db.alias()).order_by("id"))


def all_jobs_paused() -> bool:
    """Whether ``scheduling.pause_all`` is in force."""
    return jobs_paused()


def set_jobs_paused(
    job_ids: Sequence[str], paused: bool, *, every: bool = False, actor: str = ""
) -> list[str]:
    """Pause (or resume) jobs through ``scheduling.pause``/``resume``; return their ids.

    ``every``: ``scheduling.pause_all``/``resume_all`` instead (the switch for every job,
    which also holds runs not started yet). Every id is checked before any job changes.
    """
    if every:
        (scheduling.pause_all if paused else scheduling.resume_all)()
        logger.info("%s all jobs by %s.", "Paused" if paused else "Resumed", actor or "unknown")
        return []
    known = set(
        PeriodicTask.objects.using(db.alias())
        .filter(pk__in=list(job_ids))
        .values_list("pk", flat=True)
    )
    for job_id in job_ids:
        if job_id not in known:
            raise UnknownJobError(f"No job has the id {job_id!r}.")
    for job_id in job_ids:
        (scheduling.pause if paused else scheduling.resume)(job_id)
    logger.info(
        "%s job(s) %s by %s.",
        "Paused" if paused else "Resumed",
        ", ".join(job_ids),
        actor or "unknown",
        extra={
            "actor": actor or "unknown",
            "action": "pause-job" if paused else "resume-job",
            "changed": len(job_ids),
        },
    )
    return list(job_ids)


def run_job(job_id: str, *, actor: str = "") -> Task:
    """Submit one run of ``job_id`` now (``scheduling.run_now``); ``actor`` is its requester."""
    run = scheduling.run_now(job_id, requester=actor)
    logger.info(
        "Run now of job %s by %s: task %d.",
        job_id,
        actor or "unknown",
        run.sequence,
        extra={
            "actor": actor or "unknown",
            "action": "run-job",
            "job_id": job_id,
            "task_sequence": run.sequence,
        },
    )
    return run
