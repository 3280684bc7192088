"""Failure policies, run by real (in-process, burst) nodes: a failed step fails, cancels or
lets run its dependants; the workflow ends FAILED, CANCELED or SUCCEEDED."""

from __future__ import annotations

import pytest

from django_tasks_coord import workflows
from django_tasks_coord.workflows import StepState, WorkflowState
from tests.testapp.models import Run
from tests.workflows import tasks
from tests.workflows.conftest import drain

pytestmark = pytest.mark.django_db(transaction=True)


def diamond(on_failure: str | None) -> list[workflows.Step]:
    """root → (boom, fine) → join → after: ``boom`` fails with the policy ``on_failure``."""
    root = workflows.task(tasks.step, kwargs={"label": "root"}, name="root")
    boom = workflows.task(tasks.fail, kwargs={"message": "no"}, name="boom", on_failure=on_failure)
    fine = workflows.task(tasks.step, kwargs={"label": "fine"}, name="fine")
    join = workflows.task(tasks.gather, kwargs={"label": "join"}, name="join", results=True)
    last = workflows.task(tasks.step, kwargs={"label": "last"}, name="last")
    return workflows.chain(root, workflows.group(boom, fine), join, last)


def states(workflow_id: int) -> dict[str, StepState]:
    return {name: step.state for name, step in workflows.get(workflow_id).steps.items()}


def test_by_default_a_failed_step_fails_its_dependants_and_the_workflow(make_node, backend_queues):
    workflow_id = workflows.start("diamond", diamond(None))
    drain(make_node)
    status = workflows.get(workflow_id)
    assert status.state == WorkflowState.FAILED
    assert states(workflow_id) == {
        "root": StepState.SUCCEEDED,
        "boom": StepState.FAILED,
        "fine": StepState.SUCCEEDED,  # its sibling is not stopped
        "join": StepState.FAILED,
        "last": StepState.FAILED,
    }
    assert "boom" in status.steps["join"].message
    assert "no" in status.steps["boom"].message  # the task's error
    assert not Run.objects.filter(identifier__in=["join", "last"]).exists()


def test_cancel_cancels_the_dependants(make_node, backend_queues):
    workflow_id = workflows.start("diamond", diamond("cancel"))
    drain(make_node)
    assert workflows.get(workflow_id).state == WorkflowState.FAILED  # boom itself failed
    found = states(workflow_id)
    assert (found["boom"], found["join"], found["last"]) == (
        StepState.FAILED,
        StepState.CANCELED,
        StepState.CANCELED,
    )


def test_continue_runs_the_dependants_anyway(make_node, backend_queues):
    workflow_id = workflows.start("diamond", diamond("continue"))
    drain(make_node)
    status = workflows.get(workflow_id)
    assert status.state == WorkflowState.SUCCEEDED  # a failure it continues past counts not
    assert status.steps["boom"].state == StepState.FAILED
    assert status.results["join"] == {"boom": None, "fine": "fine"}
    assert status.steps["last"].state == StepState.SUCCEEDED


def test_the_workflow_default_applies_to_steps_without_a_policy(make_node, backend_queues):
    workflow_id = workflows.start("diamond", diamond(None), on_failure="continue")
    drain(make_node)
    assert workflows.get(workflow_id).state == WorkflowState.SUCCEEDED
