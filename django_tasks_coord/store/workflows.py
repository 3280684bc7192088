"""Workflow rows: the one place that writes :class:`~django_tasks_coord.models.Workflow` and
:class:`~django_tasks_coord.models.WorkflowStep` rows.

Every change of a step's state is a conditional ``UPDATE`` (``WHERE state = <expected>``)
that says whether it happened: the callers (:mod:`django_tasks_coord.workflows`) hold the
workflow's row lock (:func:`lock`) for the whole transaction, and the conditions make a
second writer that got there anyway (a bug, a lock the database did not take) change
nothing instead of enqueuing a step twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from django_tasks_coord import db
from django_tasks_coord.models import OnFailure, StepState, Workflow, WorkflowState, WorkflowStep
from django_tasks_coord.store.prune import Budget

__all__ = [
    "claim_step",
    "create",
    "delete_finished",
    "end_step",
    "end_waiting",
    "end_workflow",
    "lock",
    "record_task",
]


def create(name: str, options: dict[str, Any], steps: Sequence[WorkflowStep]) -> Workflow:
    """Insert a workflow and its ``steps`` (WAITING); return it. Each step gets its id
    (read back by name: MariaDB's bulk insert returns none). Call it in a transaction."""
    using = db.alias()
    workflow = Workflow.objects.using(using).create(name=name, options=options)
    for step in steps:
        step.workflow = workflow
    WorkflowStep.objects.using(using).bulk_create(steps)
    ids = dict(
        WorkflowStep.objects.using(using).filter(workflow=workflow).values_list("name", "id")
    )
    for step in steps:
        step.pk = ids[step.name]
    return workflow


def lock(workflow_id: int, *, skip_locked: bool) -> Workflow | None:
    """The workflow's row, locked until the transaction ends (``skip_locked``: None if
    another transaction holds it, where the database can tell; None if it does not exist).
    On SQLite :func:`db.write_transaction` serialized the transaction already."""
    conn = db.connection()
    rows = Workflow.objects.using(db.alias()).filter(pk=workflow_id)
    skip = skip_locked and conn.features.has_select_for_update_skip_locked
    return rows.select_for_update(skip_locked=skip).first()


def claim_step(step: WorkflowStep) -> bool:
    """WAITING → ENQUEUED, if the step still waits; whether it did (then the caller pushes
    its task, in the same transaction)."""
    now = timezone.now()
    changed = (
        WorkflowStep.objects.using(db.alias())
        .filter(pk=step.pk, state=StepState.WAITING)
        .update(state=StepState.ENQUEUED, enqueued_at=now)
    )
    if changed:
        step.state, step.enqueued_at = StepState.ENQUEUED, now
    return changed == 1


def record_task(step: WorkflowStep, topic: str, identifier: str, sequence: int) -> None:
    """Remember the task an ENQUEUED step became."""
    WorkflowStep.objects.using(db.alias()).filter(pk=step.pk).update(
        task_topic=topic, task_identifier=identifier, task_sequence=sequence
    )
    step.task_topic, step.task_identifier, step.task_sequence = topic, identifier, sequence


def end_step(
    step: WorkflowStep,
    state: StepState,
    *,
    result: Any = None,
    message: str = "",
    on_failure: OnFailure | None = None,
) -> bool:
    """A WAITING or ENQUEUED step ends ``state`` with ``result`` and ``message`` (and, for a
    step ended by its parent's policy, that ``on_failure``, which its own dependants then
    follow); whether it did (False: it had ended already)."""
    now = timezone.now()
    changes: dict[str, Any] = {
        "state": state,
        "result": result,
        "message": message[:10_000],
        "finished_at": now,
    }
    if on_failure is not None:
        changes["on_failure"] = on_failure
    changed = (
        WorkflowStep.objects.using(db.alias())
        .filter(pk=step.pk, state=step.state)
        .exclude(state__in=[s for s in StepState if s.is_final])
        .update(**changes)
    )
    if changed:
        for field, value in changes.items():
            setattr(step, field, value)
    return changed == 1


def end_waiting(workflow: Workflow, state: StepState, message: str) -> int:
    """Every step of ``workflow`` still WAITING ends ``state``; how many did."""
    return (
        WorkflowStep.objects.using(db.alias())
        .filter(workflow=workflow, state=StepState.WAITING)
        .update(state=state, message=message, finished_at=timezone.now())
    )


def end_workflow(workflow: Workflow, state: WorkflowState) -> bool:
    """A RUNNING workflow ends ``state``; whether it did."""
    now = timezone.now()
    changed = (
        Workflow.objects.using(db.alias())
        .filter(pk=workflow.pk, state=WorkflowState.RUNNING)
        .update(state=state, finished_at=now)
    )
    if changed:
        workflow.state, workflow.finished_at = state, now
    return changed == 1


def delete_finished(
    states: Sequence[WorkflowState], *, before: datetime, batch_size: int, budget: Budget
) -> int:
    """Delete the workflows in ``states`` (final ones) that ended before ``before``, with
    their steps; return how many workflows went.

    In batches of ``batch_size`` workflows, oldest id first, each batch one short
    transaction that deletes the steps, then the workflows. On PostgreSQL and
    MySQL/MariaDB the batch's rows are locked with ``SKIP LOCKED`` (a workflow that a
    node is locking is left for a later pass); SQLite serializes the transaction. Stops
    when none is left or ``budget`` is spent.
    """
    assert all(WorkflowState(state) != WorkflowState.RUNNING for state in states)
    using = db.alias()
    conn = db.connection()
    victims = Workflow.objects.using(using).filter(state__in=list(states), finished_at__lt=before)
    deleted = 0
    while not budget.spent:
        candidates = list(victims.order_by("id").values_list("id", flat=True)[:batch_size])
        if not candidates:
            break
        budget.take()
        chosen = victims.filter(pk__in=candidates)
        if conn.features.has_select_for_update_skip_locked:
            with transaction.atomic(using=using):
                ids = list(
                    chosen.select_for_update(**db.lock_kwargs(conn)).values_list("id", flat=True)
                )
                deleted += _delete(ids)
        else:
            with db.write_transaction():
                deleted += _delete(list(chosen.values_list("id", flat=True)))
        if len(candidates) < batch_size:
            break
    return deleted


def _delete(ids: list[int]) -> int:
    """Delete the workflows ``ids`` and their steps (in the caller's transaction)."""
    if not ids:
        return 0
    using = db.alias()
    WorkflowStep.objects.using(using).filter(workflow_id__in=ids).delete()
    return Workflow.objects.using(using).filter(pk__in=ids).delete()[0]
