"""Limits of job runs (``scheduling.set_limits``): an entry per job in the run topic's
``key_limits``, the topic keyed by the run's identifier (the job id), on every database."""

from datetime import timedelta

import pytest
from django.utils import timezone

from django_tasks_coord import queue, scheduling
from django_tasks_coord.exceptions import InvalidArgumentError, UnknownJobError
from django_tasks_coord.models import FlowStart, Task, Topic
from django_tasks_coord.scheduling import JOBS_TOPIC, group_topic, scheduler

pytestmark = pytest.mark.django_db

RECORD = "tests.testapp.job_functions.record"


def catching_up(job_id, **options):
    """A minutely job that missed its last ten slots (all to be run, overlapping)."""
    start = timezone.now() - timedelta(minutes=10, seconds=30)
    scheduling.schedule_recurring(
        RECORD,
        60,
        job_id=job_id,
        start_time=start,
        catch_up="all",
        catch_up_limit=10,
        allow_overlap=True,
        **options,
    )


def test_a_jobs_concurrency_holds_over_its_catch_up_runs():
    catching_up("busy")
    catching_up("free")
    scheduling.set_limits("busy", concurrency=1)
    submitted = scheduler.submit_due()
    assert {run.identifier for run in submitted} == {"busy", "free"}
    assert sum(run.identifier == "busy" for run in submitted) > 1
    first = queue.poll(JOBS_TOPIC, 100)
    started = [run.identifier for run in first]
    assert started.count("busy") == 1
    assert started.count("free") == sum(run.identifier == "free" for run in submitted)
    assert queue.poll(JOBS_TOPIC, 100) == []
    (busy,) = [run for run in first if run.identifier == "busy"]
    queue.complete(busy, queue.Result.SUCCESS)
    assert [run.identifier for run in queue.poll(JOBS_TOPIC, 100)] == ["busy"]


def test_a_jobs_rate_lets_one_catch_up_run_start_per_hour():
    catching_up("hourly")
    scheduling.set_limits("hourly", rate="1/h")
    assert len(scheduler.submit_due()) > 1
    (first,) = queue.poll(JOBS_TOPIC, 100)
    queue.complete(first, queue.Result.SUCCESS)
    assert queue.poll(JOBS_TOPIC, 100) == []
    FlowStart.objects.update(at=timezone.now() - timedelta(hours=1, seconds=1))
    assert len(queue.poll(JOBS_TOPIC, 100)) == 1


def test_job_limits_are_an_entry_of_the_run_topic_and_can_be_removed():
    catching_up("a")
    scheduling.set_limits("a", rate="2/m", concurrency=1)
    row = Topic.objects.get(name=JOBS_TOPIC)
    assert (row.limit_key, row.key_limits) == (
        "identifier",
        {"a": {"rate": "2/m", "concurrency": 1}},
    )
    scheduling.set_limits("a")
    assert Topic.objects.get(name=JOBS_TOPIC).key_limits is None
    scheduler.submit_due()
    assert len(queue.poll(JOBS_TOPIC, 100)) == Task.objects.filter(identifier="a").count()


def test_a_leader_only_jobs_limits_go_to_its_groups_topic():
    scheduling.schedule_recurring(RECORD, 60, job_id="lead", leader_only=True, group="g")
    scheduling.set_limits("lead", concurrency=1)
    row = Topic.objects.get(name=group_topic("g"))
    assert (row.limit_key, row.key_limits) == ("identifier", {"lead": {"concurrency": 1}})


def test_bad_job_limits_are_refused():
    with pytest.raises(UnknownJobError):
        scheduling.set_limits("nobody", concurrency=1)
    catching_up("a")
    with pytest.raises(InvalidArgumentError, match="N/unit"):
        scheduling.set_limits("a", rate="often")
    assert not Topic.objects.filter(name=JOBS_TOPIC, limit_key="identifier").exists()
