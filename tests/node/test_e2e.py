"""End to end: real ``manage.py runscheduler`` processes, stopped with SIGTERM and killed with SIGKILL."""

from __future__ import annotations

import itertools
import signal
import time

import pytest

from django_tasks_coord import queue
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Owner, Task
from tests.processes import reap, runscheduler, wait_for
from tests.testapp.models import Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multiprocess]

FAST = {
    "HEARTBEAT_FREQUENCY": 0.2,
    "POLL_INTERVAL": 0.1,
    "STATUS_INTERVAL": 0,
    "REAP_INTERVAL": 0.3,
}


def states(topic: str = "work") -> list[int]:
    return list(Task.objects.filter(topic_id=topic).values_list("state", flat=True))


def test_burst_drains_and_exits(work_topic_registered):
    queue.push_many("work", [(f"t{i}", {}) for i in range(200)])
    proc = runscheduler("--burst", "--topic", "work", "--workers", "4", settings=FAST)
    out, err = reap_when_done(proc)
    assert proc.returncode == 0, err + out
    assert states() == [TaskState.SUCCEEDED] * 200
    assert Run.objects.count() == 200
    assert not Owner.objects.exists()
    assert "Burst mode: nothing is due, exiting." in out


def test_sigterm_mid_run_loses_nothing(work_topic_registered):
    queue.push_many("work", [(f"t{i}", {"sleep": 0.3}) for i in range(20)])
    proc = runscheduler("--topic", "work", "--workers", "2", settings={**FAST, "BUFFER": 3})
    wait_for(lambda: Run.objects.count() >= 3)
    proc.send_signal(signal.SIGTERM)
    out, err = reap_when_done(proc)
    assert proc.returncode == 0, err + out
    assert TaskState.ACTIVE not in states()  # nothing left claimed
    assert not Owner.objects.exists()
    finished = Task.objects.filter(state=TaskState.SUCCEEDED).count()
    assert 0 < finished < 20
    # Buffered tasks that never started were released without using an attempt.
    assert set(Task.objects.filter(state=TaskState.PENDING).values_list("attempts", flat=True)) <= {
        0
    }
    drain = runscheduler("--burst", "--topic", "work", "--workers", "4", settings=FAST)
    reap_when_done(drain)
    assert states() == [TaskState.SUCCEEDED] * 20
    assert Run.objects.count() == 20  # every task ran exactly once


def test_sigkill_mid_task_another_node_reruns_it(work_topic_registered):
    settings = {**FAST, "LIVENESS_INTERVAL": 2.0}
    task = queue.push("work", "long", {"sleep": 60, "only_first_attempt_sleeps": True})
    doomed = runscheduler("--topic", "work", "--node-id", "doomed", settings=settings)
    wait_for(lambda: Run.objects.filter(node="doomed").exists())
    reap(doomed, signal.SIGKILL)
    killed_at = time.monotonic()
    assert doomed.returncode == -signal.SIGKILL
    rescuer = runscheduler("--topic", "work", "--node-id", "rescuer", settings=settings)
    try:
        wait_for(
            lambda: Task.objects.filter(pk=task.pk, state=TaskState.SUCCEEDED).exists(), timeout=60
        )
        rescued_after = time.monotonic() - killed_at
    finally:
        reap(rescuer, signal.SIGTERM)
    runs = list(Run.objects.order_by("attempt").values_list("attempt", "node"))
    assert runs == [(1, "doomed"), (2, "rescuer")]
    assert Task.objects.get(pk=task.pk).attempts == 2
    assert rescued_after >= 1.5  # not before the liveness interval (minus the time the kill took)
    assert not Owner.objects.filter(name="doomed").exists()


def test_paused_topic_is_not_processed_by_any_node(work_topic_registered):
    queue.register_topic("noop")
    queue.pause_topic("work")
    nodes = [runscheduler("--topic", "work", "--topic", "noop", settings=FAST) for _ in range(2)]
    try:
        wait_for(lambda: Owner.objects.count() == 2)
        queue.push_many("work", [(f"t{i}", {}) for i in range(10)])
        sentinels = queue.push_many("noop", [(f"s{i}", {}) for i in range(10)])
        # Both nodes are processing (the sentinels get done), yet the paused topic waits.
        wait_for(
            lambda: (
                Task.objects.filter(
                    pk__in=[t.pk for t in sentinels], state=TaskState.SUCCEEDED
                ).count()
                == 10
            )
        )
        assert states() == [TaskState.PENDING] * 10
        queue.resume_topic("work")
        wait_for(lambda: states() == [TaskState.SUCCEEDED] * 10)
    finally:
        for node in nodes:
            reap(node, signal.SIGTERM)
    assert all(node.returncode == 0 for node in nodes)


def test_retries_follow_the_backoff(work_topic_registered):
    task = queue.push(
        "work", "flaky", {"fail_times": 3}
    )  # FAST_RETRY: 0.2s, exponential, no jitter
    proc = runscheduler("--topic", "work", settings=FAST)
    try:
        wait_for(lambda: Task.objects.filter(pk=task.pk, state=TaskState.SUCCEEDED).exists())
    finally:
        reap(proc, signal.SIGTERM)
    starts = list(Run.objects.order_by("attempt").values_list("attempt", "started_at"))
    assert [attempt for attempt, _ in starts] == [1, 2, 3, 4]
    gaps = [(b - a).total_seconds() for (_, a), (_, b) in itertools.pairwise(starts)]
    for gap, delay in zip(gaps, [0.2, 0.4, 0.8], strict=True):
        assert delay - 0.01 <= gap < delay + 1.0, gaps


def reap_when_done(proc, timeout: float = 120):
    """Wait for a process that exits by itself; kill it if it does not."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return reap(proc, signal.SIGKILL if proc.poll() is None else None)


@pytest.fixture
def work_topic_registered(transactional_db):
    return queue.register_topic("work")


def test_a_second_signal_stops_at_once_and_still_releases_claims(work_topic_registered):
    task = queue.push("work", "stuck", {"sleep": 60})
    proc = runscheduler("--topic", "work", "--shutdown-max-wait", "60", settings=FAST)
    wait_for(lambda: Run.objects.filter(identifier="stuck").exists())
    proc.send_signal(signal.SIGTERM)  # graceful: would wait up to 60s for the task
    time.sleep(0.5)  # two separate signals, as an operator pressing Ctrl-C twice
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)  # immediate
    out, err = reap_when_done(proc, timeout=30)
    assert time.monotonic() - started < 15, out + err
    assert proc.returncode == 0, err + out
    stored = Task.objects.get(pk=task.pk)
    assert stored.state == TaskState.PENDING  # released, not left ACTIVE
    assert stored.attempts == 1
    assert not Owner.objects.exists()
