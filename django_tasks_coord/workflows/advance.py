"""Advancing workflows: record the steps whose task ended, start the steps now ready.

Any node may advance any workflow (:class:`~django_tasks_coord.node.workflows.WorkflowAdvancer`
calls :func:`advance`). Each workflow is advanced in one short transaction that holds its
row lock (``SKIP LOCKED`` where the database has it: a workflow another node is advancing is
left to that node, and looked at again soon): the steps' outcomes are recorded, every
dependant whose parents all finished gets its task (the step's conditional ``WAITING →
ENQUEUED`` and the task's insert commit together), failures reach the dependants as their
parents' policies say, and the workflow ends once every step did. A crash rolls the whole
transaction back, and any node does it again: a fan-in step is enqueued exactly once.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db.models import Exists, OuterRef, QuerySet

from django_tasks_coord import db
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import (
    OnFailure,
    StepState,
    Task,
    Workflow,
    WorkflowState,
    WorkflowStep,
)
from django_tasks_coord.store import workflows as store
from django_tasks_coord.workflows import submit

__all__ = ["Advanced", "advance", "advance_workflow", "settle"]

#: What a step becomes once its task ended in each final state (SUSPENDED is not final:
#: a suspended task is kept for later, and may run again).
STEP_OF_TASK = {
    TaskState.SUCCEEDED: StepState.SUCCEEDED,
    TaskState.FILTERED: StepState.SKIPPED,
    TaskState.FAILED: StepState.FAILED,
    TaskState.CANCELED: StepState.CANCELED,
    TaskState.REDUNDANT: StepState.CANCELED,
}


@dataclass(frozen=True)
class Advanced:
    """What one :func:`advance` did: workflows advanced, and those it left because another
    transaction held them (look again soon)."""

    advanced: int = 0
    busy: int = 0
    more: bool = False  #: it stopped at its limit: there may be more to do now


def _enqueued(using: str) -> QuerySet[WorkflowStep]:
    """The ENQUEUED steps whose task was inserted."""
    return WorkflowStep.objects.using(using).filter(
        state=StepState.ENQUEUED, task_sequence__isnull=False
    )


@functools.lru_cache(maxsize=16)
def _enqueued_topics_sql(alias: str) -> tuple[str, tuple[Any, ...]]:
    """The SQL of :func:`enqueued_topics`, compiled once: it holds no value of the moment."""
    topics = _enqueued(alias).order_by().values_list("task_topic", flat=True).distinct()
    sql, params = topics.query.get_compiler(using=alias).as_sql()
    return sql, tuple(params)


def enqueued_topics(using: str) -> list[str]:
    """The topics of the ENQUEUED steps' tasks: one short statement, asked after every
    batch of completions, whose SQL is built once (without workflows, the whole cost)."""
    conn = connections[using]
    sql, params = _enqueued_topics_sql(using)
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        return [topic for (topic,) in cursor.fetchall()]


def ready_workflows(limit: int) -> list[int]:
    """Ids of workflows with an ENQUEUED step whose task ended (or is gone), oldest first.

    The topics of the ENQUEUED steps are read first (:func:`enqueued_topics`; none:
    nothing to look at). On PostgreSQL the task table is partitioned by topic, and a
    subquery that takes its topic from the outer row cannot be pruned when it is planned:
    every partition would be planned (twice) and probed for each ENQUEUED step, on every
    round of every node, a cost that grows with the topics times the steps in flight. So
    there the subquery names those topics, and looks into their partitions only.
    """
    using = db.alias()
    topics = enqueued_topics(using)
    if not topics:
        return []
    task = Task.objects.using(using).filter(
        topic_id=OuterRef("task_topic"), sequence=OuterRef("task_sequence")
    )
    if db.supports_partitioning(db.connection()):
        task = task.filter(topic_id__in=topics)
    ended = task.filter(state__in=list(STEP_OF_TASK))
    steps = (
        _enqueued(using)
        .filter(Exists(ended) | ~Exists(task))
        .order_by("workflow_id")
        .values_list("workflow_id", flat=True)
        .distinct()
    )
    return list(steps[:limit])


def advance(limit: int = 100) -> Advanced:
    """Advance up to ``limit`` workflows that have a step whose task ended, each in a
    transaction of its own."""
    found = ready_workflows(limit)
    advanced = busy = 0
    for workflow_id in found:
        if advance_workflow(workflow_id):
            advanced += 1
        else:
            busy += 1
    return Advanced(advanced, busy, more=len(found) >= limit)


def advance_workflow(workflow_id: int) -> bool:
    """Advance one workflow under its row lock; False if another transaction holds it."""
    with db.write_transaction():
        workflow = store.lock(workflow_id, skip_locked=True)
        if workflow is None:
            return not Workflow.objects.using(db.alias()).filter(pk=workflow_id).exists()
        steps = list(
            WorkflowStep.objects.using(db.alias()).filter(workflow=workflow).order_by("id")
        )
        settle(workflow, steps)
    return True


def settle(workflow: Workflow, steps: Sequence[WorkflowStep]) -> None:
    """Record the outcomes of ``steps`` whose task ended, start or end the steps waiting on
    them, and end the workflow once every step ended. The caller holds the workflow's
    row lock (or just inserted it), in a transaction."""
    record_outcomes([step for step in steps if step.state == StepState.ENQUEUED])
    if workflow.state == WorkflowState.RUNNING:
        by_name = {step.name: step for step in steps}
        changed = True
        while changed:  # steps come parents first: one pass suffices; another is cheap
            changed = False
            for step in steps:
                if step.state == StepState.WAITING and _resolve(step, by_name):
                    changed = True
    if all(StepState(step.state).is_final for step in steps):
        store.end_workflow(workflow, final_state(steps))


def record_outcomes(steps: Sequence[WorkflowStep]) -> None:
    """End the ENQUEUED ``steps`` whose task ended, with its result; a step whose task is
    gone (deleted) ends FAILED."""
    if not steps:
        return
    sequences = [step.task_sequence for step in steps if step.task_sequence is not None]
    rows: dict[tuple[str, int | None], Mapping[str, Any]] = {
        (row["topic_id"], row["sequence"]): row
        for row in Task.objects.using(db.alias())
        .filter(sequence__in=sequences, topic_id__in={step.task_topic for step in steps})
        .values("topic_id", "sequence", "state", "result", "message", "error")
    }
    for step in steps:
        row = rows.get((step.task_topic, step.task_sequence))
        if row is None:
            message = f"Its task {step.task_topic}#{step.task_sequence} was deleted."
            store.end_step(step, StepState.FAILED, message=message)
            continue
        state = STEP_OF_TASK.get(TaskState(row["state"]))
        if state is not None:
            store.end_step(step, state, result=row["result"], message=_message(row))


def _message(row: Mapping[str, Any]) -> str:
    """What a task's row says of how it ended: its message, else its error's last line."""
    if row["message"]:
        return str(row["message"])
    error = (row["error"] or "").strip()
    return error.splitlines()[-1] if error else ""


def _resolve(step: WorkflowStep, by_name: dict[str, WorkflowStep]) -> bool:
    """Start or end the WAITING ``step`` if its parents allow; whether it changed."""
    parents = [by_name[name] for name in step.after]
    for parent in parents:
        state = StepState(parent.state)
        if state.is_final and not state.is_success and parent.on_failure != OnFailure.CONTINUE:
            ends = StepState.FAILED if parent.on_failure == OnFailure.FAIL else StepState.CANCELED
            message = f"Not run: its parent {parent.name!r} ended {state.label}."
            # It passes the same on: its dependants follow its parent's policy, not its own.
            policy = OnFailure(parent.on_failure)
            return store.end_step(step, ends, message=message, on_failure=policy)
    if not all(StepState(parent.state).is_final for parent in parents):
        return False
    results = {parent.name: parent.result for parent in parents} if step.pass_results else None
    enqueue(step, results)
    return True


def enqueue(step: WorkflowStep, results: dict[str, Any] | None) -> None:
    """Create the task of the WAITING ``step`` (in a savepoint); a step whose task cannot
    be created (its definition refuses the params, its function is gone) ends FAILED."""
    try:
        with transaction.atomic(using=db.alias()):
            if not store.claim_step(step):  # changed meanwhile: nothing to push
                step.refresh_from_db(fields=["state"])
                return
            created = submit.create(step, results)
            store.record_task(step, created.topic, created.identifier, created.sequence)
    except DatabaseError:
        raise
    except Exception as exc:  # noqa: BLE001 - any refusal of the task ends the step, not the node
        step.state = StepState.WAITING  # the savepoint rolled the claim back
        store.end_step(step, StepState.FAILED, message=f"Its task could not be created: {exc}")


def final_state(steps: Sequence[WorkflowStep]) -> WorkflowState:
    """How a workflow whose steps all ended ends: FAILED if a step failed, else CANCELED if
    one was canceled (steps whose policy is ``continue`` aside), else SUCCEEDED."""
    counted = [step.state for step in steps if step.on_failure != OnFailure.CONTINUE]
    if StepState.FAILED in counted:
        return WorkflowState.FAILED
    if StepState.CANCELED in counted:
        return WorkflowState.CANCELED
    return WorkflowState.SUCCEEDED
