"""Cancelling a workflow: waiting steps end CANCELED, the tasks of enqueued ones are
canceled (a running one cooperatively), and the workflow ends CANCELED."""

from __future__ import annotations

import pytest

from django_tasks_coord import queue, workflows
from django_tasks_coord.enums import Decision, Result, TaskState
from django_tasks_coord.models import Task
from django_tasks_coord.workflows import StepState, WorkflowState

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _work(db):
    queue.register_topic("work")


def test_cancel_ends_waiting_steps_and_cancels_pending_tasks():
    workflow_id = workflows.start(
        "c", workflows.chain(workflows.push("work", "a", name="a"), workflows.push("work", "b"))
    )
    assert workflows.cancel(workflow_id, "changed my mind") is True
    status = workflows.get(workflow_id)
    assert status.state == WorkflowState.CANCELED
    assert {step.state for step in status.steps.values()} == {StepState.CANCELED}
    assert status.finished_at is not None
    assert Task.objects.get().state == TaskState.CANCELED
    assert workflows.cancel(workflow_id) is False  # ended already
    assert workflows.advance().advanced == 0


def test_cancel_asks_a_running_step_to_stop_and_records_it_once_it_ends():
    workflow_id = workflows.start(
        "c", workflows.chain(workflows.push("work", "a", name="a"), workflows.push("work", "b"))
    )
    owner = queue.register_owner("node-1")
    [task] = queue.poll("work", owner=owner)
    assert workflows.cancel(workflow_id) is True
    status = workflows.get(workflow_id)
    assert status.state == WorkflowState.CANCELED
    assert status.steps["a"].state == StepState.ENQUEUED  # still running: asked to stop
    assert Task.objects.get().cancel_requested_at is not None
    queue.complete(task, Decision(Result.SUCCESS))  # however it ends, it ends CANCELED
    assert workflows.advance().advanced == 1
    status = workflows.get(workflow_id)
    assert status.steps["a"].state == StepState.CANCELED
    assert status.state == WorkflowState.CANCELED
    assert Task.objects.count() == 1  # b never ran


def test_cancelling_an_unknown_workflow_is_refused():
    with pytest.raises(workflows.UnknownWorkflowError):
        workflows.cancel(12345)
    with pytest.raises(workflows.UnknownWorkflowError):
        workflows.get(12345)
