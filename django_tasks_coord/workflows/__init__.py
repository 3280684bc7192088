"""Workflows: DAGs of tasks of any kind, with fan-out, fan-in exactly once, and failure policies.

::

    from django_tasks_coord import workflows

    thumbnails = [
        workflows.task("photos.tasks.thumbnail", kwargs={"photo": p}, name=f"thumb-{p}")
        for p in photo_ids
    ]
    album = workflows.task("photos.tasks.build_album", name="album", results=True)
    workflow_id = workflows.start("album 42", workflows.chain(workflows.group(thumbnails), album))
    workflows.get(workflow_id).state    # WorkflowState.RUNNING, then SUCCEEDED
    workflows.cancel(workflow_id)

A step becomes a ``@task`` call (:func:`task`), a push for a topic's consumer
(:func:`push`) or a task of an executor definition (:func:`definition`) once all its
parents (``after=``) finished; the nodes advance workflows (docs/workflows.md). This
package re-exports: :mod:`~.graph` (building), :mod:`~.api` (start, get, cancel),
:mod:`~.submit` (what a step becomes) and :mod:`~.advance` (advancing them).
"""

from __future__ import annotations

from django_tasks_coord.exceptions import (
    UnknownWorkflowError,
    WorkflowDefinitionError,
    WorkflowError,
)
from django_tasks_coord.models import OnFailure, StepKind, StepState, WorkflowState
from django_tasks_coord.workflows.advance import Advanced, advance
from django_tasks_coord.workflows.api import StepStatus, WorkflowStatus, cancel, get, start
from django_tasks_coord.workflows.graph import Step, chain, definition, group, push, task

__all__ = [
    "Advanced",
    "OnFailure",
    "Step",
    "StepKind",
    "StepState",
    "StepStatus",
    "UnknownWorkflowError",
    "WorkflowDefinitionError",
    "WorkflowError",
    "WorkflowState",
    "WorkflowStatus",
    "advance",
    "cancel",
    "chain",
    "definition",
    "get",
    "group",
    "push",
    "start",
    "task",
]
