"""Composite steps that resume: each step's final decision recorded as a checkpoint of its
task, and restored when the task runs again (:mod:`django_tasks_coord.composite`).

A step's decision is recorded when it is final for the step: SUCCESS or FILTER without an
exception (a step that failed or was suspended runs again), and only for a task that runs
under a claim (:func:`django_tasks_coord.running.save`). The checkpoint is named
:data:`CHECKPOINT_PREFIX` and the step's name; its value is
``{"result": ..., "message": ..., "continue": ...}``.
"""

from __future__ import annotations

from typing import Any

from django_tasks_coord import running
from django_tasks_coord.enums import Decision, Result
from django_tasks_coord.exceptions import InvalidArgumentError
from django_tasks_coord.models import Task
from django_tasks_coord.store import checkpoints as store_checkpoints

__all__ = ["CHECKPOINT_PREFIX", "record", "restored_decisions"]

#: The checkpoint names of a composite's steps: this prefix and the step's name.
CHECKPOINT_PREFIX = running.RESERVED_PREFIX + "composite:"
#: The results a step's checkpoint records (a step that failed or was suspended runs again).
_RECORDED = (Result.SUCCESS, Result.FILTER)


def _claimed(task: Task) -> bool:
    """Whether ``task`` runs under a claim, so that its steps can be recorded."""
    return task.pk is not None and task.exec_id is not None


def restored_decisions(tasks: list[Task]) -> dict[int, dict[str, Decision]]:
    """The step decisions earlier attempts recorded, by task index and step name."""
    claimed = [task for task in tasks if _claimed(task)]
    if not claimed:
        return {}
    saved = store_checkpoints.read(claimed, prefix=CHECKPOINT_PREFIX)
    restored: dict[int, dict[str, Decision]] = {}
    for i, task in enumerate(tasks):
        for key, value in saved.get(task.pk, {}).items() if _claimed(task) else ():
            decision = _decoded(value)
            if decision is not None:
                restored.setdefault(i, {})[key.removeprefix(CHECKPOINT_PREFIX)] = decision
    return restored


def _decoded(value: Any) -> Decision | None:
    """A step's recorded decision; None for a value this version does not know."""
    try:
        return Decision(
            Result(value["result"]), value.get("message"), continue_=bool(value.get("continue"))
        )
    except (KeyError, TypeError, ValueError, AttributeError, InvalidArgumentError):
        return None


def record(task: Task, name: str, decision: Decision) -> Decision:
    """Record ``decision`` of step ``name`` as a checkpoint of ``task`` if it is final for
    the step (SUCCESS or FILTER, no exception) and the task runs under a claim. Returns
    the decision, or the failure to record it (a lost claim, a database error)."""
    if decision.result not in _RECORDED or decision.exception is not None or not _claimed(task):
        return decision
    value = {
        "result": decision.result.value,
        "message": decision.message,
        "continue": decision.continue_,
    }
    try:
        running.save(task, CHECKPOINT_PREFIX + name, value)
    except Exception as exc:  # noqa: BLE001 - this task fails at this step, the others go on
        return Decision.failure(exc)
    return decision
