"""``runscheduler --burst`` end to end: what is due at its start runs (scheduled jobs too), then
it exits promptly; an idle node stops promptly on Ctrl-C.

The time bounds are generous (the machine is shared): the fixes turn waits of many seconds
(the intervals set below) into a fraction of a second, measured in ``benchmarks/burst_exit.py``.
"""

from __future__ import annotations

import signal
import time
from datetime import timedelta

import pytest
from django.db.models import Max
from django.utils import timezone

from django_tasks_coord import queue, scheduling, topics
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Owner, PeriodicTask, Task
from django_tasks_coord.scheduling import JOBS_TOPIC
from tests.node.conftest import due_daily_job
from tests.processes import Output, runscheduler, wait_for
from tests.testapp.models import Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multiprocess]

RECORD = "tests.testapp.job_functions.record"
#: Long waits everywhere: a node that sleeps through one of them instead of being woken
#: misses the bounds below by far.
SLOW = {
    "POLL_INTERVAL": 10.0,
    "MAX_POLL_INTERVAL": 10.0,
    "NOTIFIED_POLL_INTERVAL": 10.0,
    "HEARTBEAT_FREQUENCY": 5.0,
    "LIVENESS_INTERVAL": 60.0,
    "REAP_INTERVAL": 30.0,
    "STATUS_INTERVAL": 0,
}
#: Seconds a node may take to exit once nothing is left (a process exit included).
PROMPT = 4.0


@pytest.fixture
def work_topic_registered(transactional_db):
    return queue.register_topic("work")


def burst(*args: str) -> Output:
    return Output(runscheduler("--burst", *args, settings=SLOW))


def exited_after_last_run(output: Output) -> float:
    """Seconds from the last task's completion to the exit of the burst."""
    ended, out, err = output.finish()
    assert output.proc.returncode == 0, err + out
    exited_wall = time.time() - (time.monotonic() - ended)
    last = Task.objects.aggregate(m=Max("finished_at"))["m"]
    assert last is not None
    return exited_wall - last.timestamp()


def test_burst_runs_a_due_one_time_job_then_exits():
    job_id = scheduling.schedule_one_time(
        RECORD, timezone.now() - timedelta(seconds=1), job_id="due-once"
    )
    output = burst()
    assert exited_after_last_run(output) < PROMPT
    assert list(Run.objects.values_list("identifier", flat=True)) == [job_id]
    assert list(Task.objects.values_list("state", flat=True)) == [TaskState.SUCCEEDED]
    assert not PeriodicTask.objects.get(pk=job_id).enabled  # done: its one run is over
    assert not Owner.objects.exists()
    assert "Burst mode: nothing is due, exiting." in output.text()


def test_burst_runs_due_queue_tasks_and_a_due_periodic_slot(work_topic_registered):
    topics.register_internal_topic(JOBS_TOPIC)
    queue.push_many("work", [(f"t{i}", {}) for i in range(20)])
    job_id, slot = due_daily_job(RECORD, "daily")  # its last slot is due, no other meanwhile
    output = burst("--workers", "4")
    assert exited_after_last_run(output) < PROMPT
    assert Run.objects.filter(topic="work").count() == 20
    assert list(Run.objects.filter(identifier=job_id).values_list("slot", flat=True)) == [slot]
    assert set(Task.objects.values_list("state", flat=True)) == {TaskState.SUCCEEDED}
    assert PeriodicTask.objects.get(pk=job_id).nextrun > timezone.now()  # the next slot waits
    assert not Owner.objects.exists()


def test_an_idle_burst_exits_promptly():
    output = burst()
    said = output.line_at("Burst mode: nothing is due, exiting.")
    ended, out, err = output.finish()
    assert output.proc.returncode == 0, err + out
    assert ended - said < PROMPT
    assert not Owner.objects.exists()


def test_a_burst_exits_promptly_after_its_last_task(work_topic_registered):
    queue.push_many("work", [(f"t{i}", {}) for i in range(5)])
    output = burst("--topic", "work")
    assert exited_after_last_run(output) < PROMPT
    assert set(Task.objects.values_list("state", flat=True)) == {TaskState.SUCCEEDED}


def test_an_idle_node_stops_promptly_on_ctrl_c():
    output = Output(runscheduler(settings=SLOW))
    output.line_at("started")
    wait_for(lambda: Owner.objects.exists())
    time.sleep(1.0)  # let it settle into its idle waits: what the stop must interrupt
    sent = time.monotonic()
    output.proc.send_signal(signal.SIGINT)
    ended, out, err = output.finish()
    assert output.proc.returncode == 0, err + out
    assert ended - sent < PROMPT
    assert "Traceback" not in err
    assert not Owner.objects.exists()
