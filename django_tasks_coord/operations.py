"""Day-2 operations: find tasks, revive or cancel them in bulk, pause topics and jobs, look at nodes.

``manage.py tasks_coord`` is a thin shell over this module; the admin's actions call the
same services (:mod:`~django_tasks_coord.revival`, :mod:`~django_tasks_coord.queue`,
:mod:`~django_tasks_coord.topics`, :mod:`~django_tasks_coord.scheduling`). Use it from
Python too::

    from django_tasks_coord import operations
    from django_tasks_coord.operations import Action, TaskFilter

    selection = TaskFilter(topic="invoices", older_than=operations.parse_age("1h"))
    preview = operations.bulk(Action.RETRY, selection, dry_run=True, actor="ops:alice")
    done = operations.bulk(Action.RETRY, selection, actor="ops:alice")

Bulk actions work in batches of :data:`BATCH_SIZE` tasks, each in a transaction of its
own: the candidates are read in sequence order (keyset pagination, no ``OFFSET``), then
locked with ``SKIP LOCKED`` and changed if they are still eligible. A task that changed
meanwhile, or that a node holds locked at that moment, is left alone and counted as
skipped; run the action again for those. Every action is logged on the
``django_tasks_coord.operations`` logger at INFO: who (``actor``), what (the action and
the filter) and how many.
"""

from __future__ import annotations

import enum
import logging
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import (
    BooleanField,
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
)
from django.db.models.functions import Now
from django.utils import timezone

from django_tasks_coord import db, queue, revival, scheduling, topics
from django_tasks_coord.conf import app_settings
from django_tasks_coord.enums import IN_FLIGHT, TaskState
from django_tasks_coord.exceptions import InvalidArgumentError, UnknownJobError, UnknownTaskError
from django_tasks_coord.models import (
    HealthCheck,
    Owner,
    PeriodicTask,
    Task,
    TaskQuerySet,
    TokenHolder,
    Topic,
)
from django_tasks_coord.scheduling.scheduler import jobs_paused

logger = logging.getLogger(__name__)

#: Tasks changed per transaction by :func:`bulk` unless told otherwise.
BATCH_SIZE = 1000
#: The most tasks :func:`list_tasks` returns at once.
MAX_LIST = 10_000


# --- parsing --------------------------------------------------------------------------------

_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_AGE = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_age(value: str) -> timedelta:
    """An age such as ``"90s"``, ``"15m"``, ``"1h30m"``, ``"2d"``, ``"1w"``, or plain seconds (``"300"``).

    Raises :class:`~django_tasks_coord.exceptions.InvalidArgumentError` for anything else
    (a negative or empty age, an unknown unit).
    """
    text = value.strip().lower() if isinstance(value, str) else ""
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return timedelta(seconds=float(text))
    if text and _AGE.sub("", text) == "":
        return timedelta(seconds=sum(float(n) * _AGE_UNITS[unit] for n, unit in _AGE.findall(text)))
    raise InvalidArgumentError(
        f"{value!r} is not an age: write seconds (300) or a number with a unit "
        f"(s, m, h, d, w), possibly several (1h30m)."
    )


def parse_state(value: str) -> TaskState:
    """A task state by its name, case-insensitively (``"failed"``, ``"PENDING"``)."""
    for state in TaskState:
        if isinstance(value, str) and value.strip().upper() == state.name:
            return state
    names = ", ".join(s.name.lower() for s in TaskState)
    raise InvalidArgumentError(f"{value!r} is not a task state; the states are: {names}.")


def state_name(state: int | None) -> str | None:
    """The lowercase name of a task state (``"failed"``), as the JSON output writes it."""
    return None if state is None else TaskState(state).name.lower()


# --- selecting tasks ------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskFilter:
    """Which tasks an operation looks at. Empty fields do not filter.

    ``older_than``/``newer_than`` compare the task's ``created_at`` with the time the
    operation starts (this machine's clock).
    """

    topic: str | None = None
    states: tuple[TaskState, ...] = ()
    identifier: str | None = None
    older_than: timedelta | None = None
    newer_than: timedelta | None = None

    @property
    def is_empty(self) -> bool:
        """True when nothing narrows the selection (every task of every topic)."""
        return not (
            self.topic or self.states or self.identifier or self.older_than or self.newer_than
        )

    def queryset(self, now: datetime | None = None) -> TaskQuerySet:
        """The tasks selected, unordered. Raises if the topic is not registered."""
        now = now or timezone.now()
        rows = Task.objects.using(db.alias()).all()
        if self.topic is not None:
            rows = rows.for_topic(topics.topic_name(self.topic))
        if self.states:
            rows = rows.filter(state__in=list(self.states))
        if self.identifier is not None:
            rows = rows.filter(identifier=self.identifier)
        if self.older_than is not None:
            rows = rows.filter(created_at__lte=now - self.older_than)
        if self.newer_than is not None:
            rows = rows.filter(created_at__gte=now - self.newer_than)
        return rows

    def describe(self) -> str:
        """The filter in words, for logs and messages."""
        parts = [
            f"topic={self.topic}" if self.topic else "",
            f"state={','.join(str(state_name(s)) for s in self.states)}" if self.states else "",
            f"identifier={self.identifier}" if self.identifier is not None else "",
            f"older_than={self.older_than}" if self.older_than is not None else "",
            f"newer_than={self.newer_than}" if self.newer_than is not None else "",
        ]
        return " ".join(p for p in parts if p) or "all tasks"


def list_tasks(selection: TaskFilter, *, limit: int = 50, before: int | None = None) -> list[Task]:
    """The selected tasks, newest (highest sequence) first: at most ``limit``, below ``before``.

    To page on, pass the last sequence returned as ``before``.
    """
    if not 0 < limit <= MAX_LIST:
        raise InvalidArgumentError(f"limit must be between 1 and {MAX_LIST}, not {limit}.")
    rows = selection.queryset().select_related("owner")
    if before is not None:
        rows = rows.filter(sequence__lt=before)
    return list(rows.order_by("-sequence")[:limit])


def get_task(sequence: int) -> Task:
    """The task with this sequence; :class:`~django_tasks_coord.exceptions.UnknownTaskError` if none."""
    task = Task.objects.using(db.alias()).select_related("owner").filter(pk=sequence).first()
    if task is None:
        raise UnknownTaskError(f"No task has the sequence {sequence}.")
    return task


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def task_data(task: Task, *, full: bool = False) -> dict[str, Any]:
    """A task as JSON-ready data (the keys ``manage.py tasks_coord ... --json`` writes).

    ``full`` adds the payload, the result, the message and errors, and the attempt log.
    """
    data: dict[str, Any] = {
        "sequence": task.sequence,
        "topic": task.topic_id,
        "identifier": task.identifier,
        "state": state_name(task.state),
        "attempts": task.attempts,
        "priority": task.priority,
        "label": task.label,
        "owner": task.owner.name if task.owner_id is not None and task.owner else None,
        "created_at": _iso(task.created_at),
        "execute_at": _iso(task.execute_at),
        "started_at": _iso(task.started_at),
        "finished_at": _iso(task.finished_at),
        "recreated": task.recreated,
        "original": task.original_id,
    }
    if full:
        data |= {
            "payload": task.payload,
            "result": task.result,
            "message": task.message,
            "error": task.error,
            "error_detail": task.error_detail,
            "attempt_log": task.attempt_log,
            "handler": task.handler,
            "requester": task.requester,
            "outcome_reason": task.outcome_reason,
            "exec_id": None if task.exec_id is None else str(task.exec_id),
            "deadline": _iso(task.deadline),
            "slot": _iso(task.slot),
            "term": task.term,
            "concurrency_key": task.concurrency_key,
        }
    return data


# --- bulk actions ---------------------------------------------------------------------------


class Action(enum.StrEnum):
    """What :func:`bulk` does to each selected task."""

    RETRY = "retry"  #: FAILED tasks go back to PENDING in place (``queue.reset``)
    RESET = "reset"  #: completed tasks go back to PENDING in place (``queue.reset``)
    RECREATE = "recreate"  #: completed tasks get a new PENDING copy (``queue.recreate``)
    CANCEL = "cancel"  #: not completed tasks become CANCELED (``queue.cancel``)

    @property
    def eligible(self) -> tuple[TaskState, ...]:
        """The states a task must be in for this action."""
        if self is Action.RETRY:
            return (TaskState.FAILED,)
        if self is Action.CANCEL:
            return (TaskState.PENDING, *IN_FLIGHT)
        return tuple(TaskState.completed_states())


@dataclass(frozen=True)
class Batch:
    """One committed batch of :func:`bulk`, as passed to its ``on_batch`` callback."""

    number: int  #: 1, 2, ...
    matched: int  #: tasks read as candidates
    changed: int  #: tasks changed (0 in a dry run)
    last_sequence: int  #: where the next batch starts (exclusive)


@dataclass
class BulkResult:
    """What :func:`bulk` did (or, in a dry run, would do).

    ``matched`` tasks were selected; ``changed`` were changed (in a dry run: 0);
    ``skipped`` were left alone because they changed meanwhile or a node held them
    locked; ``by_topic`` counts the matched tasks per topic; ``created`` are the new
    tasks' sequences (``recreate`` only).
    """

    action: Action
    selection: TaskFilter
    dry_run: bool
    batch_size: int
    matched: int = 0
    changed: int = 0
    batches: int = 0
    first_sequence: int | None = None
    last_sequence: int | None = None
    by_topic: Counter[str] = field(default_factory=Counter)
    created: list[int] = field(default_factory=list)

    @property
    def skipped(self) -> int:
        """Tasks matched but not changed (always 0 in a dry run)."""
        return 0 if self.dry_run else self.matched - self.changed

    def data(self) -> dict[str, Any]:
        """JSON-ready data (the keys ``manage.py tasks_coord <action> --json`` writes)."""
        return {
            "action": self.action.value,
            "dry_run": self.dry_run,
            "filter": self.selection.describe(),
            "matched": self.matched,
            "changed": self.changed,
            "skipped": self.skipped,
            "batches": self.batches,
            "batch_size": self.batch_size,
            "first_sequence": self.first_sequence,
            "last_sequence": self.last_sequence,
            "by_topic": dict(sorted(self.by_topic.items())),
            "created": self.created,
        }


def _apply(
    action: Action, tasks: list[Task], states: tuple[TaskState, ...], message: str | None
) -> list[Task]:
    """Change one batch through the queue's services; return the tasks changed (or made)."""
    if action is Action.CANCEL:
        return queue.cancel_many(tasks, message, states=states)
    if action is Action.RECREATE:
        return revival.recreate_many(tasks, states=states)
    return revival.reset_many(tasks, states=states)


def bulk(
    action: Action | str,
    selection: TaskFilter,
    *,
    dry_run: bool = False,
    batch_size: int = BATCH_SIZE,
    limit: int | None = None,
    actor: str = "",
    on_batch: Callable[[Batch], object] | None = None,
    message: str | None = None,
) -> BulkResult:
    """Apply ``action`` to the selected tasks, ``batch_size`` per transaction; return the counts.

    Only tasks in a state the action accepts are selected (:attr:`Action.eligible`);
    ``selection.states`` narrows that further and must be among them. ``limit`` stops
    after that many tasks. A dry run reads the same batches and changes nothing: its
    ``matched`` and ``by_topic`` are what a run at that moment would change, save
    tasks that change meanwhile. ``on_batch`` is called after each batch is committed.
    The outcome is logged with ``actor`` (who asked). ``message`` is stored on each
    canceled task (``cancel`` only).
    """
    try:
        action = Action(action)
    except ValueError:
        choices = ", ".join(a.value for a in Action)
        raise InvalidArgumentError(f"{action!r} is not an action; use one of {choices}.") from None
    if not 0 < batch_size <= MAX_LIST:
        raise InvalidArgumentError(
            f"batch_size must be between 1 and {MAX_LIST}, not {batch_size}."
        )
    if message is not None and action is not Action.CANCEL:
        raise InvalidArgumentError(f"message is for cancel only, not {action.value}.")
    if limit is not None and limit < 1:
        raise InvalidArgumentError(f"limit must be at least 1, not {limit}.")
    wrong = [s for s in selection.states if s not in action.eligible]
    if wrong:
        accepted = ", ".join(str(state_name(s)) for s in action.eligible)
        raise InvalidArgumentError(
            f"{action.value} applies to tasks that are {accepted}; not to "
            f"{', '.join(str(state_name(s)) for s in wrong)} tasks."
        )
    states = selection.states or action.eligible
    candidates = selection.queryset().filter(state__in=list(states))
    result = BulkResult(action, selection, dry_run, batch_size)
    last = 0
    while limit is None or result.matched < limit:
        size = batch_size if limit is None else min(batch_size, limit - result.matched)
        keys = list(
            candidates.filter(sequence__gt=last)
            .order_by("sequence")
            .values_list("topic_id", "sequence")[:size]
        )
        if not keys:
            break
        last = keys[-1][1]
        result.batches += 1
        result.matched += len(keys)
        result.by_topic.update(topic for topic, _ in keys)
        if result.first_sequence is None:
            result.first_sequence = keys[0][1]
        result.last_sequence = last
        changed = 0
        if not dry_run:
            batch = [Task(topic_id=topic, sequence=sequence) for topic, sequence in keys]
            done = _apply(action, batch, states, message)
            changed = len(done)
            if action is Action.RECREATE:
                result.created.extend(t.sequence for t in done)
            result.changed += changed
        if on_batch is not None:
            on_batch(Batch(result.batches, len(keys), changed, last))
    _log(result, actor)
    return result


def _log(result: BulkResult, actor: str) -> None:
    who = actor or "unknown"
    extra = {
        "actor": who,
        "action": result.action.value,
        "dry_run": result.dry_run,
        "matched": result.matched,
        "changed": result.changed,
        "skipped": result.skipped,
    }
    if result.dry_run:
        logger.info(
            "Dry run of %s by %s: would change %d task(s) (%s).",
            result.action.value,
            who,
            result.matched,
            result.selection.describe(),
            extra=extra,
        )
        return
    logger.info(
        "%s by %s: changed %d of %d task(s) in %d batch(es) of up to %d (%s).",
        result.action.value.capitalize(),
        who,
        result.changed,
        result.matched,
        result.batches,
        result.batch_size,
        result.selection.describe(),
        extra=extra,
    )
    if result.skipped:
        logger.warning(
            "%s by %s: skipped %d task(s) that changed meanwhile or were locked by a node; "
            "run it again for them.",
            result.action.value.capitalize(),
            who,
            result.skipped,
            extra=extra,
        )


# --- topics and jobs ------------------------------------------------------------------------


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
        "nextrun": _iso(job.nextrun),
        "last_slot": _iso(job.last_slot),
        "last_outcome": state_name(job.last_outcome),
        "last_finished_at": _iso(job.last_finished_at),
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


# --- nodes and leaders ----------------------------------------------------------------------


def age_of(field: str) -> ExpressionWrapper[Any]:
    """How long ago ``field`` was (database clock, like every heartbeat comparison)."""
    return ExpressionWrapper(Now() - F(field), output_field=DurationField())


def alive_since() -> Any:
    """The oldest heartbeat that is still alive: now minus ``LIVENESS_INTERVAL`` (database clock)."""
    return db.ago(app_settings.liveness_interval)


def alive_of(field: str) -> ExpressionWrapper[Any]:
    """``field`` is within ``LIVENESS_INTERVAL`` of the database clock."""
    recent = Q(**{f"{field}__gte": alive_since()})
    return ExpressionWrapper(recent, output_field=BooleanField())


def owners_with_health() -> QuerySet[Owner]:
    """Owners with ``age`` (of the heartbeat), ``alive`` and ``held`` (tasks in flight)."""
    held = (
        Task.objects.filter(owner_id=OuterRef("pk"), state__in=IN_FLIGHT)
        .order_by()
        .values("owner_id")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return Owner.objects.annotate(
        age=age_of("heartbeat"), alive=alive_of("heartbeat"), held=Subquery(held)
    )


def holders_with_health() -> QuerySet[TokenHolder]:
    """Token holders with the ``age`` of the holder's heartbeat in the group, and ``alive``."""
    beat = HealthCheck.objects.filter(
        group_id=OuterRef("group_id"), task_id=OuterRef("task_id")
    ).values("last_heartbeat")[:1]
    return TokenHolder.objects.annotate(holder_beat=Subquery(beat)).annotate(
        age=age_of("holder_beat"), alive=alive_of("holder_beat")
    )


def _seconds(delta: timedelta | None) -> float | None:
    return None if delta is None else round(max(delta.total_seconds(), 0.0), 3)


def list_nodes() -> list[dict[str, Any]]:
    """Every registered node (owner), alive or dead, with its heartbeat age and tasks held."""
    return [
        {
            "name": o.name,
            "host": o.host,
            "pid": o.pid,
            "alive": bool(getattr(o, "alive", False)),
            "heartbeat_age_seconds": _seconds(getattr(o, "age", None)),
            "tasks_held": getattr(o, "held", None) or 0,
            "started_at": _iso(o.started_at),
            "heartbeat": _iso(o.heartbeat),
        }
        for o in owners_with_health().using(db.alias()).order_by("name")
    ]


def list_leaders() -> list[dict[str, Any]]:
    """Every coordination group with its token holder (the leader, "" if none), term and health."""
    return [
        {
            "group": h.group_id,
            "leader": h.task_id or None,
            "term": h.term,
            "alive": bool(h.task_id) and bool(getattr(h, "alive", False)),
            "heartbeat_age_seconds": _seconds(getattr(h, "age", None)) if h.task_id else None,
            "acquired_at": _iso(h.acquired_at),
            "released_at": _iso(h.released_at),
        }
        for h in holders_with_health().using(db.alias()).order_by("group_id")
    ]
