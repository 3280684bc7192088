"""Workflows run end to end by real (in-process, burst) nodes: chain, group, fan-in."""

from __future__ import annotations

import pytest

from django_tasks_coord import workflows
from django_tasks_coord.models import Task
from tests.testapp.models import Run
from tests.workflows import tasks
from tests.workflows.conftest import drain

pytestmark = pytest.mark.django_db(transaction=True)


def runs(label: str) -> int:
    return Run.objects.filter(topic="workflow", identifier=label).count()


def test_a_chain_runs_its_steps_in_order(make_node, backend_queues):
    steps = workflows.chain(
        workflows.task(tasks.step, kwargs={"label": "a"}, name="a"),
        workflows.task(tasks.step, kwargs={"label": "b"}, name="b"),
        workflows.task(tasks.step, kwargs={"label": "c"}, name="c"),
    )
    workflow_id = workflows.start("chain", steps)
    assert Task.objects.count() == 1  # only the root is enqueued at the start
    drain(make_node)
    status = workflows.get(workflow_id)
    assert status.state == workflows.WorkflowState.SUCCEEDED
    assert status.results == {"a": "a", "b": "b", "c": "c"}
    order = list(Run.objects.order_by("id").values_list("identifier", flat=True))
    assert order == ["a", "b", "c"]
    assert status.steps["b"].enqueued_at >= status.steps["a"].finished_at


def test_a_group_fans_out_and_a_fan_in_of_100_parents_runs_once_with_their_results(
    make_node, backend_queues
):
    thumbnails = [
        workflows.task(tasks.thumbnail, kwargs={"photo": n}, name=f"thumb-{n}") for n in range(100)
    ]
    album = workflows.task(tasks.album, name="album", results=True)
    workflow_id = workflows.start("album", workflows.chain(workflows.group(thumbnails), album))
    assert Task.objects.count() == 100
    drain(make_node)
    status = workflows.get(workflow_id)
    assert status.state == workflows.WorkflowState.SUCCEEDED
    assert runs("album") == 1
    assert status.results["album"] == {"count": 100, "total": sum(n * 10 for n in range(100))}
    assert all(runs(f"thumbnail-{n}") == 1 for n in range(100))


def test_push_steps_run_by_a_consumer_in_a_chain(make_node, backend_queues, work_topic):
    first = workflows.push("work", "first", {"x": 1}, name="first")
    gather = workflows.task(tasks.gather, name="gather", after=first, results=True)
    workflow_id = workflows.start("mixed", [first, gather])
    drain(make_node)
    status = workflows.get(workflow_id)
    assert status.state == workflows.WorkflowState.SUCCEEDED
    assert status.steps["first"].task_topic == "work"
    assert status.results["gather"] == {"first": None}  # the consumer returned nothing
