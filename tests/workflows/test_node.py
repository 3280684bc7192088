"""The node's workflow advancer: its waits (ticked by hand), and a long-running node whose
own completions wake it."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from django_tasks_coord import queue, workflows
from django_tasks_coord.enums import Decision, Result, TaskState
from django_tasks_coord.handlers import registry
from django_tasks_coord.models import Task
from django_tasks_coord.node import workflows as node_workflows
from django_tasks_coord.workflows import StepState, WorkflowState
from django_tasks_coord.workflows.advance import advance
from tests.node.test_idle import idle_node
from tests.processes import wait_for
from tests.testapp.models import Run
from tests.workflows import tasks
from tests.workflows.conftest import drain


@pytest.mark.django_db
def test_an_idle_advancer_backs_off_and_advancing_or_a_wake_up_resets_it():
    queue.register_topic("work")
    advancer = idle_node(workflow_poll_interval=1.0, max_poll_interval=5.0).workflows
    assert [advancer.tick() for _ in range(4)] == [1.0, 2.0, 4.0, 5.0]
    advancer.wake.set()  # tasks completed on the node
    assert advancer.tick() == 1.0
    workflows.start("w", [workflows.push("work", "x")])
    owner = queue.register_owner("n")
    queue.complete(queue.poll("work", owner=owner)[0], Decision(Result.SUCCESS))
    assert advancer.tick() == 1.0  # it advanced: the next look comes soon again
    assert [advancer.tick() for _ in range(2)] == [1.0, 2.0]  # then it backs off again


@pytest.mark.django_db(transaction=True)
def test_an_advancer_off_starts_no_thread_and_leaves_workflows_to_other_nodes(make_node):
    """WORKFLOW_POLL_INTERVAL 0: the node advances nothing, even its own completions (a
    burst node included); another node's advancer moves the workflow on."""
    queue.register_topic("work")
    registry.register("work", lambda task: Decision(Result.SUCCESS))
    workflow_id = workflows.start(
        "w", workflows.chain(workflows.push("work", "a"), workflows.push("work", "b"))
    )
    node = make_node(topics=["work"], workflow_poll_interval=0)
    assert not node.workflows.enabled
    node.run()  # a burst node: runs "a", then finds nothing more
    snapshot = workflows.get(workflow_id)
    assert snapshot.state == WorkflowState.RUNNING
    assert Task.objects.filter(topic_id="work").count() == 1  # "b" was never enqueued
    advance()  # another node's advancer: "b" enqueued
    make_node(topics=["work"], workflow_poll_interval=0).run()  # runs "b"
    advance()
    assert workflows.get(workflow_id).state == WorkflowState.SUCCEEDED


@pytest.mark.django_db(transaction=True)
def test_a_running_node_advances_on_its_own_completions(make_node, backend_queues):
    steps = workflows.chain(
        *(workflows.task(tasks.step, kwargs={"label": f"s{n}"}, name=f"s{n}") for n in range(5))
    )
    workflow_id = workflows.start("chain", steps)
    # Polls too rare to matter: only the wake-ups of its own completions move it on in time.
    node = make_node(
        burst=False, topics=["default"], workflow_poll_interval=30.0, max_poll_interval=30.0
    )
    thread = threading.Thread(target=node.run)
    thread.start()
    try:
        wait_for(lambda: workflows.get(workflow_id).state != WorkflowState.RUNNING, timeout=20)
    finally:
        node.request_stop()
        thread.join(30)
    assert workflows.get(workflow_id).state == WorkflowState.SUCCEEDED


@pytest.mark.django_db(transaction=True)
def test_a_consumers_decision_value_is_its_steps_result(make_node, backend_queues):
    queue.register_topic("sizes")
    registry.register("sizes", lambda task: Decision(Result.SUCCESS, value={"size": 7}))
    measure = workflows.push("sizes", "photo-1", name="measure")
    report = workflows.task(tasks.gather, name="report", after=measure, results=True)
    workflow_id = workflows.start("sizes", [measure, report])
    drain(make_node, "default", "sizes")
    assert workflows.get(workflow_id).results == {
        "measure": {"size": 7},
        "report": {"measure": {"size": 7}},
    }


@pytest.mark.django_db(transaction=True)
def test_cancelling_a_workflow_stops_its_running_step_cooperatively(make_node, backend_queues):
    steps = workflows.chain(
        workflows.task(tasks.until_canceled, name="long"),
        workflows.task(tasks.step, kwargs={"label": "never"}, name="never"),
    )
    workflow_id = workflows.start("long", steps)
    node = make_node(burst=False, topics=["default"])
    thread = threading.Thread(target=node.run)
    thread.start()
    try:
        wait_for(lambda: Run.objects.filter(identifier="until_canceled").exists(), timeout=20)
        assert workflows.cancel(workflow_id) is True
        wait_for(
            lambda: workflows.get(workflow_id).steps["long"].state == StepState.CANCELED,
            timeout=20,
        )
    finally:
        node.request_stop()
        thread.join(30)
    status = workflows.get(workflow_id)
    assert status.state == WorkflowState.CANCELED
    assert status.steps["never"].state == StepState.CANCELED
    long_task = status.steps["long"]
    assert Task.objects.get(sequence=long_task.task_sequence).state == TaskState.CANCELED
    assert not Run.objects.filter(identifier="never").exists()


@pytest.mark.django_db(transaction=True)
def test_two_nodes_sharing_a_fan_out_run_its_fan_in_once(make_node, backend_queues):
    thumbnails = [
        workflows.task(tasks.thumbnail, kwargs={"photo": n}, name=f"thumb-{n}") for n in range(40)
    ]
    album = workflows.task(tasks.album, name="album", results=True)
    workflow_id = workflows.start("album", workflows.chain(workflows.group(thumbnails), album))
    nodes = [
        make_node(burst=False, topics=["default"], node_id=f"node-{n}", workers=2) for n in range(2)
    ]
    threads = [threading.Thread(target=node.run) for node in nodes]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: workflows.get(workflow_id).state != WorkflowState.RUNNING, timeout=30)
    finally:
        for node in nodes:
            node.request_stop()
        for thread in threads:
            thread.join(30)
    status = workflows.get(workflow_id)
    assert status.state == WorkflowState.SUCCEEDED
    assert Run.objects.filter(identifier="album").count() == 1
    assert status.results["album"]["count"] == 40


@pytest.mark.django_db
def test_a_burst_node_advances_again_a_workflow_its_advancer_thread_held(monkeypatch):
    """The completer's advance skipped the workflow (SKIP LOCKED: the node's own advancer
    thread held it): it looks again, so the step that thread enqueues is committed before
    the completions count as done and the burst decides that nothing is due."""
    advancer = idle_node().workflows
    monkeypatch.setattr(advancer.state, "config", replace(advancer.state.config, burst=True))
    answers = [workflows.Advanced(busy=1), workflows.Advanced(advanced=1), workflows.Advanced()]
    calls = []

    def advance():
        calls.append(1)
        return answers[len(calls) - 1]

    monkeypatch.setattr(node_workflows, "advance", advance)
    monkeypatch.setattr(node_workflows, "BUSY_RETRY", 0.0)
    advancer.wake_after_completions()
    assert len(calls) == 2  # busy: again; advanced, nothing busy and no more: done
