"""End to end: a cancel reaches a handler running in a real ``runscheduler`` node."""

from __future__ import annotations

import signal

import pytest

from django_tasks_coord import queue
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Task
from tests.processes import reap, runscheduler, wait_for
from tests.testapp.models import Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multiprocess]

HEARTBEAT = 0.5
SETTINGS = {
    "HEARTBEAT_FREQUENCY": HEARTBEAT,
    "POLL_INTERVAL": 0.1,
    "STATUS_INTERVAL": 0,
    "PROGRESS_INTERVAL": 0.2,
}


def test_a_running_handler_stops_within_two_heartbeats_and_ends_canceled(transactional_db):
    queue.register_topic("cancelable")
    checks = queue.push("cancelable", "checks", {"checks": True, "seconds": 60})
    ignores = queue.push("cancelable", "ignores", {"seconds": 3})
    node = runscheduler("--topic", "cancelable", "--workers", "2", settings=SETTINGS)
    try:
        wait_for(lambda: Run.objects.filter(identifier__in=["checks", "ignores"]).count() == 2)
        wait_for(lambda: Task.objects.get(pk=checks.pk).progress is not None)  # written by beats
        asked = {}
        for task in (checks, ignores):
            asked[task.identifier] = queue.cancel(Task.objects.get(pk=task.pk), "operator")
            assert asked[task.identifier].state == TaskState.ACTIVE  # asked, still running
        wait_for(
            lambda: set(Task.objects.values_list("state", flat=True)) == {TaskState.CANCELED},
            timeout=30,
        )
    finally:
        out, err = reap(node, signal.SIGTERM)
    assert node.returncode == 0, err + out
    stopped = Run.objects.get(identifier="checks:stopped").started_at
    delay = (stopped - asked["checks"].cancel_requested_at).total_seconds()
    print(f"cancel delivered after {delay:.3f}s (heartbeat {HEARTBEAT}s)")
    assert delay <= 2 * HEARTBEAT  # the lifeline's next beat delivers it
    for task in Task.objects.all():
        assert (task.state, task.message, task.attempts) == (TaskState.CANCELED, "operator", 1)
        assert task.progress["ticks"] > 0
    assert not Run.objects.filter(identifier="ignores:stopped").exists()  # it returned success
    assert "Delivered" in err + out
