"""Running a job: the consumer of the jobs topic, and the context a job is called with.

A run is a task of topic :data:`JOBS_TOPIC` whose identifier is the job id and whose
``slot`` is the time it fires for; its payload holds the callable's dotted path and
arguments as they were when it was submitted.

Importing this module registers nothing: :func:`register` makes :data:`job_task_type`
the consumer of the jobs topic, and the app's ``AppConfig.ready()`` calls it. The topic
names (:data:`JOBS_TOPIC`...) live in :mod:`~django_tasks_coord.scheduling.names` and
are re-exported here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from django.db.models import F
from django.utils import timezone
from django.utils.module_loading import import_string

from django_tasks_coord import coordination, db, signals, store
from django_tasks_coord.enums import Decision, ErrorPolicy, Result, TaskState
from django_tasks_coord.exceptions import FencedError, InvalidArgumentError, JobImportError
from django_tasks_coord.handlers import TaskType, registry
from django_tasks_coord.models import Owner, PeriodicTask, Task
from django_tasks_coord.retry import DEFAULT_RETRY, RetryPolicy
from django_tasks_coord.scheduling.names import (
    GROUP_TOPIC_PREFIX,
    JOBS_TOPIC,
    SCHEDULE_CHANGED,
    group_of,
    group_topic,
)
from django_tasks_coord.scheduling.planner import after_run, timing_of

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobContext:
    """What a job is called with (its first argument).

    ``slot`` is the time the run fires for (not when it started); ``attempt`` counts
    from 1; ``logger`` is named after the job. For a leader-only job, ``group``,
    ``node_id`` and ``term`` say under which leadership it runs: wrap side effects
    in :meth:`fenced` (or call :meth:`still_leader` before them) so that a deposed
    leader cannot perform them.
    """

    job_id: str
    slot: datetime | None
    attempt: int
    logger: logging.Logger
    task: Task
    group: str | None = None
    node_id: str | None = None
    term: int | None = None

    def still_leader(self) -> bool:
        """Whether this node still leads the job's group under :attr:`term` (always True otherwise)."""
        if self.group is None or self.node_id is None or self.term is None:
            return True
        return coordination.is_current(self.group, self.node_id, self.term)

    @contextmanager
    def fenced(self) -> Iterator[None]:
        """The run's commit point: a transaction for its side effects that also completes it.

        It commits only while this node still leads the group under :attr:`term`
        *and* still holds this run (it was not handed to another node meanwhile);
        otherwise :class:`~django_tasks_coord.exceptions.FencedError` is raised and
        your writes roll back. When the block ends without an exception, the run is
        marked SUCCEEDED in the same transaction as your writes, so a slot's fenced
        side effects commit at most once, whatever happens to this node. No lock is
        held while your code runs. Use it once per run, for the last step. Only
        leader-only jobs are fenced.
        """
        if self.group is None or self.node_id is None or self.term is None:
            raise InvalidArgumentError(
                f"Job {self.job_id!r} is not leader-only: it has no term to fence with."
            )
        with coordination.fenced(self.group, self.node_id, self.term):
            yield
            finished = timezone.now()
            if not store.succeed_held_run(self.task, finished_at=finished):
                raise FencedError(
                    f"Run #{self.task.pk} of job {self.job_id!r} is no longer held by "
                    f"{self.node_id}: it was handed to another node."
                )
        self.task.finished_at = finished
        if self.task.state != TaskState.CANCELED:  # unless its cancel was requested
            self.task.state = TaskState.SUCCEEDED


def retry_policy(data: dict[str, Any] | None) -> RetryPolicy:
    """A job's stored retry policy (None: the default policy)."""
    return RetryPolicy(**data) if data else DEFAULT_RETRY


def run_payload(job: PeriodicTask) -> dict[str, Any]:
    """The payload of a run of ``job``: what to call, and the retry limit, as of submission.

    Carrying ``max_attempts`` lets a worker start the run without reading the job row
    first (one database round trip, often a fresh connection, less start lag).
    """
    return {
        "task": job.task,
        "args": job.args,
        "kwargs": job.kwargs,
        "max_attempts": retry_policy(job.retry).max_attempts,
    }


def _owner_name(task: Task) -> str | None:
    if task.owner_id is None:
        return None
    owners = Owner.objects.using(db.alias()).filter(pk=task.owner_id)
    return owners.values_list("name", flat=True).first()


@cache
def _callable(path: str) -> Any:
    return import_string(path)


def import_problem(path: str) -> str | None:
    """Why the job callable ``path`` cannot run in this process, or None if it can."""
    try:
        func = _callable(path)
    except ImportError as exc:
        return f"its callable {path} cannot be imported: {exc}"
    return None if callable(func) else f"{path} is not callable"


def execute_job(task: Task) -> Decision | Result | None:
    """Call the job of run ``task`` with a :class:`JobContext` and the stored arguments.

    A callable that does not import raises :class:`JobImportError`: the run fails without
    a retry, and :meth:`JobTaskType.on_outcome` pauses the job.
    """
    payload = task.payload or {}
    try:
        func = _callable(payload["task"])
    except ImportError as exc:
        raise JobImportError(
            f"Job {task.identifier!r}: its callable {payload['task']} cannot be imported: {exc}"
        ) from exc
    context = JobContext(
        job_id=task.identifier,
        slot=task.slot,
        attempt=task.attempts,
        logger=logging.getLogger(f"django_tasks_coord.jobs.{task.identifier}"),
        task=task,
    )
    group = group_of(task.topic_id)
    if group is not None:
        context = replace(context, group=group, node_id=_owner_name(task), term=task.term)
    outcome = func(context, *payload.get("args", []), **payload.get("kwargs", {}))
    return outcome if isinstance(outcome, Decision | Result) else None


class JobTaskType(TaskType):
    """Runs jobs with each job's own retry policy, error policy and fixed-delay rescheduling."""

    def _job(self, task: Task) -> PeriodicTask | None:
        return PeriodicTask.objects.using(db.alias()).filter(pk=task.identifier).first()

    def max_attempts_for(self, task: Task) -> int:
        """The job's retry limit as of the run's submission (read from the job otherwise)."""
        submitted = (task.payload or {}).get("max_attempts")
        if isinstance(submitted, int):
            return submitted
        job = self._job(task)
        return retry_policy(job.retry if job else None).max_attempts

    def retry_at(self, task: Task, decision: Decision, now: datetime) -> datetime | None:
        """Retry with the job's policy, but never into the job's next slot; never a callable
        that does not import (the job is paused instead)."""
        if isinstance(decision.exception, JobImportError):
            return None
        job = self._job(task)
        policy = retry_policy(job.retry if job else None)
        if not policy.can_retry(task.attempts):
            return None
        at = now + policy.delay(task.attempts)
        if job is not None and job.nextrun is not None and at >= job.nextrun:
            logger.info(
                "Job %s: no retry, it would run into the next slot %s.", job.id, job.nextrun
            )
            return None
        return at

    def may_complete(self, task: Task) -> bool:
        """A leader-only run is completed only while its node still leads under the run's term
        (a run without a term was never claimed under one: it is handed back, not completed)."""
        group = group_of(task.topic_id)
        if group is None:
            return True
        if task.term is None:
            return False
        node_id = _owner_name(task)
        return node_id is not None and coordination.is_current(group, node_id, task.term)

    def on_outcome(self, task: Task, decision: Decision) -> None:
        """Record the run's outcome on its job; apply the job's error policy and fixed delay."""
        jobs = PeriodicTask.objects.using(db.alias()).filter(pk=task.identifier)
        job = jobs.first()
        if job is None:
            _send_finished(task, decision)
            return
        now = timezone.now()
        failed = decision.result is Result.FAILURE
        changes: dict[str, Any] = {
            "last_outcome": decision.result.state,
            "last_finished_at": now,
            "consecutive_failures": F("consecutive_failures") + 1 if failed else 0,
        }
        policy = ErrorPolicy.coerce(job.error_policy, "error_policy")
        if isinstance(decision.exception, JobImportError):
            # Every later slot would fail the same way: pause until the code is deployed.
            logger.error(
                "Job %s paused: %s. Deploy the code it names, then resume the job "
                "(scheduling.resume or Resume in the admin).",
                job.id,
                decision.exception,
                extra={"job_id": job.id, "slot": task.slot, "attempt": task.attempts},
            )
            changes.update(paused=True)
        elif failed and policy.logs:
            # A run that failed because the database went away is the outage's doing, which
            # the node reports itself (one WARNING per outage); the job is not at fault.
            lost = decision.exception is not None and db.connection_lost(decision.exception)
            (logger.warning if lost else logger.error)(
                "Job %s failed (slot %s, attempt %s)%s: %s\n%s",
                job.id,
                task.slot,
                task.attempts,
                ", the database connection was lost" if lost else "",
                decision.message or "",
                task.error or "",
                extra={"job_id": job.id, "slot": task.slot, "attempt": task.attempts},
            )
        if failed and policy.terminates and "paused" not in changes:
            logger.warning("Job %s unscheduled by its error policy %s.", job.id, policy.name)
            changes.update(enabled=False, nextrun=None, finished_at=now)
        elif job.fixed_delay and job.enabled:
            timing = timing_of(job)
            interval = timing.timer.period if hasattr(timing.timer, "period") else timedelta(0)
            nextrun = after_run(timing, interval, now)
            changes.update(nextrun=nextrun)
            if nextrun is None:
                changes.update(enabled=False, finished_at=now)
        jobs.update(**changes)
        _send_finished(task, decision)
        nextrun = changes.get("nextrun", job.nextrun)
        if "nextrun" in changes or (nextrun is not None and nextrun <= now):
            # The schedulers must look again: the next run moved (fixed delay), or a due
            # slot was held back while this run was in flight (WAIT). Otherwise they
            # already sleep until the right time, and waking every node is wasted work.
            db.notify(db.connection(), SCHEDULE_CHANGED)


def _send_finished(task: Task, decision: Decision) -> None:
    signals.send(
        signals.job_finished,
        PeriodicTask,
        job_id=task.identifier,
        slot=task.slot,
        task=task,
        decision=decision,
    )


#: The consumer of :data:`JOBS_TOPIC` (and of each group's leader topic, on its leader).
#: Errors are handled per job (``on_outcome``), so the topic-level policy only continues:
#: a failing job never pauses the other jobs.
job_task_type = JobTaskType(name=JOBS_TOPIC, func=execute_job, error_policy=ErrorPolicy.CONTINUE)


def register() -> None:
    """Make :data:`job_task_type` the consumer of :data:`JOBS_TOPIC` (``AppConfig.ready()``)."""
    registry.add(JOBS_TOPIC, job_task_type)


__all__ = [
    "GROUP_TOPIC_PREFIX",
    "JOBS_TOPIC",
    "SCHEDULE_CHANGED",
    "JobContext",
    "JobTaskType",
    "execute_job",
    "group_of",
    "group_topic",
    "import_problem",
    "job_task_type",
    "register",
    "retry_policy",
    "run_payload",
]
