"""Starting, reading and cancelling workflows (re-exported by :mod:`django_tasks_coord.workflows`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django_tasks_coord import db, executions, queue
from django_tasks_coord.exceptions import (
    InvalidArgumentError,
    TaskStateError,
    UnknownTaskError,
    UnknownWorkflowError,
    WorkflowDefinitionError,
)
from django_tasks_coord.models import (
    OnFailure,
    StepKind,
    StepState,
    Task,
    Workflow,
    WorkflowState,
    WorkflowStep,
)
from django_tasks_coord.store import workflows as store
from django_tasks_coord.validation import check_payload, check_text
from django_tasks_coord.workflows import submit
from django_tasks_coord.workflows.advance import settle
from django_tasks_coord.workflows.graph import MAX_NAME, Step, flatten

__all__ = ["StepStatus", "WorkflowStatus", "cancel", "get", "start"]


def start(
    name: str,
    steps: Step | Iterable[Step | Iterable[Step]],
    *,
    on_failure: OnFailure | str = OnFailure.FAIL,
    options: dict[str, Any] | None = None,
) -> int:
    """Start a workflow of ``steps`` (a step, or steps, groups, chains) and return its id.

    Every step is checked first (:class:`WorkflowDefinitionError`: a cycle, an unknown
    parent, an unknown topic, definition or ``@task`` function, arguments that are not
    JSON), then the workflow, its steps and the tasks of the steps without parents are
    written in one transaction (the caller's, if one is open). ``on_failure`` is the
    default of the steps that do not set theirs; ``options`` is free JSON kept with it.
    """
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
        raise WorkflowDefinitionError(
            f"A workflow's name must be a str of 1 to {MAX_NAME} characters, not {name!r}."
        )
    check_text(name, "name")
    try:
        default = OnFailure(on_failure)
    except ValueError:
        raise WorkflowDefinitionError(
            f"on_failure={on_failure!r} is not one of "
            f"{', '.join(repr(c.value) for c in OnFailure)}."
        ) from None
    options = {} if options is None else options
    if not isinstance(options, dict):
        raise WorkflowDefinitionError(f"options must be a dict, not {options!r}.")
    try:
        check_payload(options, "options")
    except InvalidArgumentError as exc:
        raise WorkflowDefinitionError(str(exc)) from exc
    flat = flatten([steps] if isinstance(steps, Step) else steps, default)
    for step in flat:
        extra = {"backend": step.backend, "identifier": step.identifier, "results": step.results}
        submit.check(step.kind, step.target, step.arguments, step=str(step.name), extra=extra)
    rows = [
        WorkflowStep(
            name=str(step.name),
            kind=step.kind,
            target=step.target,
            backend=step.backend,
            identifier=step.identifier,
            args=step.arguments,
            after=list(step.after),
            on_failure=step.on_failure or default,
            pass_results=step.results,
        )
        for step in flat
    ]
    with db.write_transaction():
        workflow = store.create(name, options, rows)
        settle(workflow, rows)
    return int(workflow.pk)


@dataclass(frozen=True)
class StepStatus:
    """One step as :func:`get` found it."""

    name: str
    kind: StepKind
    target: str
    state: StepState
    after: list[str]
    result: Any
    message: str
    task_topic: str  #: empty until it is ENQUEUED
    task_sequence: int | None
    enqueued_at: datetime | None
    finished_at: datetime | None


@dataclass(frozen=True)
class WorkflowStatus:
    """A workflow and its steps (in the order they were given, parents first)."""

    id: int
    name: str
    state: WorkflowState
    created_at: datetime
    finished_at: datetime | None
    options: dict[str, Any]
    steps: dict[str, StepStatus]

    @property
    def results(self) -> dict[str, Any]:
        """The result of each step, by name (None until it succeeded)."""
        return {name: step.result for name, step in self.steps.items()}


def get(workflow_id: int) -> WorkflowStatus:
    """The workflow ``workflow_id`` and its steps; :class:`UnknownWorkflowError` if none."""
    workflow = Workflow.objects.using(db.alias()).filter(pk=workflow_id).first()
    if workflow is None:
        raise UnknownWorkflowError(f"No workflow has the id {workflow_id!r}.")
    steps = WorkflowStep.objects.using(db.alias()).filter(workflow=workflow).order_by("id")
    return WorkflowStatus(
        id=workflow.pk,
        name=workflow.name,
        state=WorkflowState(workflow.state),
        created_at=workflow.created_at,
        finished_at=workflow.finished_at,
        options=workflow.options,
        steps={
            step.name: StepStatus(
                name=step.name,
                kind=StepKind(step.kind),
                target=step.target,
                state=StepState(step.state),
                after=list(step.after),
                result=step.result,
                message=step.message,
                task_topic=step.task_topic,
                task_sequence=step.task_sequence,
                enqueued_at=step.enqueued_at,
                finished_at=step.finished_at,
            )
            for step in steps
        },
    )


def cancel(workflow_id: int, message: str | None = None) -> bool:
    """Cancel a running workflow: its waiting steps end CANCELED, the tasks of its
    enqueued steps are canceled (a running one is asked to stop, cooperatively: see
    ``queue.cancel``), and the workflow ends CANCELED. False if it had ended already."""
    with db.write_transaction():
        workflow = store.lock(workflow_id, skip_locked=False)
        if workflow is None:
            raise UnknownWorkflowError(f"No workflow has the id {workflow_id!r}.")
        if workflow.state != WorkflowState.RUNNING:
            return False
        store.end_waiting(workflow, StepState.CANCELED, message or "The workflow was canceled.")
        store.end_workflow(workflow, WorkflowState.CANCELED)
        steps = list(
            WorkflowStep.objects.using(db.alias()).filter(workflow=workflow).order_by("id")
        )
        for step in steps:
            if step.state == StepState.ENQUEUED:
                _cancel_task(step, message)
        settle(workflow, steps)  # the steps whose task was canceled at once
    return True


def _cancel_task(step: WorkflowStep, message: str | None) -> None:
    """Cancel the task of an ENQUEUED step (ask it to stop if it runs); no-op if it ended."""
    try:
        if step.kind == StepKind.DEFINITION:
            assert step.task_sequence is not None
            executions.cancel(step.task_sequence)
            return
        assert step.task_sequence is not None
        task = (
            Task.objects.using(db.alias())
            .filter(topic_id=step.task_topic, sequence=step.task_sequence)
            .first()
        )
        if task is not None:
            queue.cancel(task, message)
    except (TaskStateError, UnknownTaskError):
        pass  # it ended (or was deleted) meanwhile: its outcome is recorded like any other
