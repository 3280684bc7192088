"""``--burst`` in-process: the slots due at its start are its own to submit and run.

Its scheduler thread is silenced here, so nothing but the burst itself can submit them
(end to end, with the thread racing the dispatcher: ``test_burst_e2e.py``).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from django_tasks_coord import queue, scheduling
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Owner, PeriodicTask, Task
from django_tasks_coord.scheduling import JOBS_TOPIC
from django_tasks_coord.scheduling.loop import SchedulerLoop
from tests.node.conftest import due_daily_job, run
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

RECORD = "tests.testapp.job_functions.record"


@pytest.fixture
def no_scheduler_thread(monkeypatch):
    monkeypatch.setattr(SchedulerLoop, "tick", lambda self: None)  # the thread ends at once


def test_a_burst_submits_and_runs_the_slots_due_at_its_start(
    make_node, work_topic, no_scheduler_thread
):
    once = scheduling.schedule_one_time(RECORD, timezone.now() - timedelta(seconds=1), job_id="o")
    daily, slot = due_daily_job(RECORD, "d")  # no other slot of it falls due meanwhile
    later = scheduling.schedule_one_time(RECORD, timezone.now() + timedelta(hours=1), job_id="l")
    queue.push("work", "t")
    assert run(make_node(topics=[JOBS_TOPIC, "work"])) == 0
    assert sorted(Run.objects.values_list("identifier", flat=True)) == sorted([once, daily, "t"])
    assert Run.objects.get(identifier=daily).slot == slot
    assert set(Task.objects.values_list("state", flat=True)) == {TaskState.SUCCEEDED}
    assert PeriodicTask.objects.get(pk=later).enabled  # not due: left for later
    assert not Owner.objects.exists()


def test_without_the_scheduler_a_burst_submits_nothing(make_node, work_topic, no_scheduler_thread):
    scheduling.schedule_one_time(RECORD, timezone.now() - timedelta(seconds=1), job_id="o")
    assert run(make_node(topics=[JOBS_TOPIC, "work"], scheduler=False)) == 0
    assert not Task.objects.exists()  # SCHEDULER off: another node submits it
