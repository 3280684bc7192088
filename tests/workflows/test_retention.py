"""Retention of finished workflows: WORKFLOW_KEEP_COMPLETED_DAYS and WORKFLOW_KEEP_FAILED_DAYS,
applied by retention.apply_workflows and by the nodes' retention passes, in batches."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.core.checks import run_checks
from django.test import override_settings
from django.utils import timezone

from django_tasks_coord import queue, retention, workflows
from django_tasks_coord.models import Task, Workflow, WorkflowState, WorkflowStep

pytestmark = pytest.mark.django_db


def started(name: str, state: WorkflowState, *, days: float) -> int:
    """A workflow of two steps, ended ``state`` ``days`` ago (RUNNING: still running)."""
    queue.register_topic("wf")
    first = workflows.push("wf", f"{name}-1", {}, name="first")
    workflow_id = workflows.start(name, [first, workflows.push("wf", f"{name}-2", {}, after=first)])
    if state != WorkflowState.RUNNING:
        ended = timezone.now() - timedelta(days=days)
        Workflow.objects.filter(pk=workflow_id).update(state=state, finished_at=ended)
    return workflow_id


def kept() -> set[str]:
    return set(Workflow.objects.values_list("name", flat=True))


def test_nothing_goes_by_default_and_no_query_runs(django_assert_num_queries):
    started("old", WorkflowState.SUCCEEDED, days=1000)
    with django_assert_num_queries(0):
        assert retention.apply_workflows() == 0
    assert kept() == {"old"}


@override_settings(TASKS_COORD={"WORKFLOW_KEEP_COMPLETED_DAYS": 7, "WORKFLOW_KEEP_FAILED_DAYS": 30})
def test_finished_workflows_go_with_their_steps_after_their_class_limit():
    started("ok-old", WorkflowState.SUCCEEDED, days=8)
    started("ok-new", WorkflowState.SUCCEEDED, days=6)
    started("canceled-old", WorkflowState.CANCELED, days=8)
    started("failed-8", WorkflowState.FAILED, days=8)
    started("failed-31", WorkflowState.FAILED, days=31)
    running = started("running", WorkflowState.RUNNING, days=0)
    Workflow.objects.filter(pk=running).update(created_at=timezone.now() - timedelta(days=100))
    tasks = Task.objects.count()
    assert retention.apply_workflows() == 3
    assert kept() == {"ok-new", "failed-8", "running"}
    assert set(WorkflowStep.objects.values_list("workflow__name", flat=True)) == kept()
    assert Task.objects.count() == tasks  # the tasks go by their topics' policies
    assert workflows.get(running).state == WorkflowState.RUNNING


@override_settings(TASKS_COORD={"WORKFLOW_KEEP_COMPLETED_DAYS": 0})
def test_batches_and_the_budget_bound_a_call():
    for n in range(5):
        started(f"w{n}", WorkflowState.SUCCEEDED, days=0.01)
    assert retention.apply_workflows(batch_size=2, max_batches=1) == 2
    assert kept() == {"w2", "w3", "w4"}  # oldest first
    assert retention.apply_workflows(batch_size=2) == 3
    assert not WorkflowStep.objects.exists()


@override_settings(TASKS_COORD={"WORKFLOW_KEEP_FAILED_DAYS": 1})
def test_the_nodes_retention_pass_deletes_them_too():
    started("failed", WorkflowState.FAILED, days=2)
    started("done", WorkflowState.SUCCEEDED, days=2)  # completed: no limit set
    housekeeper = retention.Housekeeper(60, threading.Event(), clock=lambda: 0.0)
    assert housekeeper.tick() == {}  # no topic has a policy
    assert housekeeper.workflows_deleted == 1
    assert kept() == {"done"}


@pytest.mark.parametrize("value", [-1, 1.5, "7", True])
def test_a_bad_setting_is_a_system_check_error(value):
    with override_settings(TASKS_COORD={"WORKFLOW_KEEP_COMPLETED_DAYS": value}):
        errors = [m for m in run_checks() if m.id == "tasks_coord.E003"]
    assert any("WORKFLOW_KEEP_COMPLETED_DAYS" in m.msg for m in errors), errors
