"""What a step becomes: a task of its kind, checked when the workflow starts, created when
its parents finished.

- ``task``: a Django ``@task`` enqueued on one of this app's ``DatabaseBackend``s, with the
  result id ``workflow-<workflow id>-<step id>`` (so ``get_result`` finds it);
- ``push``: :func:`queue.push <django_tasks_coord.queue.push>` to the topic, for its
  consumer;
- ``definition``: :func:`executions.create <django_tasks_coord.executions.create>`, for an
  external executor.

Every one of them writes in the caller's transaction: the advancer's, which also marks
the step ENQUEUED, so a step and its task are written together or not at all.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from django.utils.module_loading import import_string

from django_tasks_coord import db, definitions, executions, queue
from django_tasks_coord.exceptions import TasksCoordError, WorkflowDefinitionError
from django_tasks_coord.models import StepKind, Task, WorkflowStep
from django_tasks_coord.topics import topic_name
from django_tasks_coord.validation import check_identifier, check_payload

__all__ = ["Created", "check", "create"]


@dataclass(frozen=True)
class Created:
    """The task a step became."""

    topic: str
    identifier: str
    sequence: int


def _django_task(path: str, backend: str, step: str) -> tuple[Any, Any]:
    """The ``@task`` at ``path`` bound to ``backend``, and that backend; refused unless the
    backend is one of this app's (it takes a chosen result id)."""
    try:
        function = import_string(path)
    except ImportError as exc:
        raise WorkflowDefinitionError(f"Step {step!r}: cannot import {path!r}: {exc}") from exc
    if not callable(getattr(function, "using", None)) or not hasattr(function, "enqueue"):
        raise WorkflowDefinitionError(
            f"Step {step!r}: {path!r} is not a Django @task function (decorate it with @task)."
        )
    try:
        bound = function.using(backend=backend)
        found = bound.get_backend()
    except Exception as exc:  # Django's InvalidTaskBackend, InvalidTask
        raise WorkflowDefinitionError(f"Step {step!r}: backend {backend!r}: {exc}") from exc
    if not callable(getattr(found, "enqueue_as", None)):
        raise WorkflowDefinitionError(
            f"Step {step!r}: backend {backend!r} is not a django_tasks_coord DatabaseBackend; "
            f"workflow steps run on this app's backends only."
        )
    return bound, found


def check(kind: StepKind, target: str, arguments: Any, *, step: str, extra: dict[str, Any]) -> None:
    """Refuse a step whose task could not be created: an unknown ``@task`` function or
    backend, topic or definition, a bad identifier, params the definition's schema refuses.
    ``extra``: the step's ``backend`` and ``identifier``."""
    try:
        if kind == StepKind.TASK:
            _django_task(target, extra["backend"], step)
            check_payload(arguments, f"the arguments of step {step!r}")
        elif kind == StepKind.PUSH:
            topic_name(target)
            check_identifier(extra["identifier"])
        else:
            found = definitions.get(target)
            if not extra.get("results"):
                found.validate("params", arguments)
    except WorkflowDefinitionError:
        raise
    except TasksCoordError as exc:
        raise WorkflowDefinitionError(f"Step {step!r}: {exc}") from exc


def _with_results(arguments: Any, results: dict[str, Any] | None, kind: StepKind) -> Any:
    """The step's arguments, given its parents' ``results`` (if it takes them)."""
    if results is None:
        return arguments
    arguments = copy.deepcopy(arguments)
    if kind == StepKind.TASK:
        arguments["kwargs"]["results"] = results
        return arguments
    return {**(arguments or {}), "results": results}


def create(step: WorkflowStep, results: dict[str, Any] | None) -> Created:
    """Create the task ``step`` becomes (in the caller's transaction), with ``results``
    (its parents' results by name, or None) added to its arguments."""
    arguments = _with_results(step.args, results, StepKind(step.kind))
    if step.kind == StepKind.TASK:
        bound, backend = _django_task(step.target, step.backend, step.name)
        identifier = f"workflow-{step.workflow_id}-{step.pk}"
        backend.enqueue_as(bound, arguments["args"], arguments["kwargs"], identifier=identifier)
        topic = bound.queue_name
        sequence = (
            Task.objects.using(db.alias())
            .filter(topic_id=topic, identifier=identifier)
            .order_by("-sequence")
            .values_list("sequence", flat=True)
            .first()
        )
        assert sequence is not None  # just inserted, in this transaction
        return Created(topic, identifier, sequence)
    if step.kind == StepKind.PUSH:
        task = queue.push(step.target, step.identifier, arguments)
    else:
        label = f"workflow #{step.workflow_id}: {step.name}"[:255]
        task = executions.create(step.target, arguments, label=label)
    return Created(task.topic_id, task.identifier, task.sequence)
