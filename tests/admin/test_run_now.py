"""scheduling.run_now: the service behind the admin's "run now" action."""

from __future__ import annotations

import pytest

from django_tasks_coord import queue, scheduling
from django_tasks_coord.enums import TaskState
from django_tasks_coord.exceptions import UnknownJobError
from django_tasks_coord.models import PeriodicTask
from django_tasks_coord.retry import DEFAULT_RETRY
from django_tasks_coord.scheduling import JOBS_TOPIC
from django_tasks_coord.scheduling.runner import job_task_type
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db

RECORD = "tests.testapp.job_functions.record"


def test_run_now_submits_one_unscheduled_run_that_records_its_outcome():
    job_id = scheduling.schedule_periodic(RECORD, "Mon 09:00", job_id="weekly", kwargs={"x": 1})
    scheduling.pause(job_id)
    before = PeriodicTask.objects.get(pk=job_id)

    run = scheduling.run_now(job_id, requester="alice")

    assert (run.topic_id, run.identifier, run.slot, run.state) == (
        JOBS_TOPIC,
        job_id,
        None,
        TaskState.PENDING,
    )
    assert (run.requester, run.label) == ("alice", "run now")
    assert run.payload == {
        "task": RECORD,
        "args": [],
        "kwargs": {"x": 1},
        "max_attempts": DEFAULT_RETRY.max_attempts,
    }
    (task,) = queue.poll(JOBS_TOPIC)
    (decision,) = job_task_type.run([task])
    queue.complete(task, decision)
    job_task_type.on_outcome(task, decision)
    (recorded,) = Run.objects.all()
    assert (recorded.identifier, recorded.slot) == (job_id, None)
    after = PeriodicTask.objects.get(pk=job_id)
    assert after.last_outcome == TaskState.SUCCEEDED
    assert (after.nextrun, after.run_count, after.paused) == (before.nextrun, 0, True)


def test_run_now_twice_gives_two_runs():
    job_id = scheduling.schedule_periodic(RECORD, "Mon 09:00", job_id="weekly")
    first, second = scheduling.run_now(job_id), scheduling.run_now(job_id)
    assert first.sequence != second.sequence


def test_run_now_of_a_leader_only_job_goes_to_its_group_topic():
    job_id = scheduling.schedule_periodic(
        RECORD, "Mon 09:00", job_id="lead", group="billing", leader_only=True
    )
    assert scheduling.run_now(job_id).topic_id == "tasks_coord.group.billing"


def test_run_now_of_an_unknown_job():
    with pytest.raises(UnknownJobError, match="nope"):
        scheduling.run_now("nope")
