"""The scheduling API and the scheduler against the database, with an injected ``now``."""

from __future__ import annotations

import logging
import re
from datetime import timedelta

import pytest
from django.db import OperationalError
from django.utils import timezone

from django_tasks_coord import queue, scheduling
from django_tasks_coord.enums import TaskState
from django_tasks_coord.exceptions import (
    InvalidArgumentError,
    JobDefinitionError,
    TimerError,
    UnknownJobError,
)
from django_tasks_coord.models import PeriodicTask, Task
from django_tasks_coord.retry import DEFAULT_RETRY, RetryPolicy
from django_tasks_coord.scheduling import JOBS_TOPIC, scheduler
from django_tasks_coord.scheduling.runner import job_task_type
from tests.testapp import job_functions

pytestmark = pytest.mark.django_db

RECORD = "tests.testapp.job_functions.record"


def runs(job_id):
    return list(Task.objects.filter(topic_id=JOBS_TOPIC, identifier=job_id).order_by("slot"))


def test_schedule_periodic_stores_the_job_and_its_first_slot():
    job_id = scheduling.schedule_periodic(RECORD, "*:0/5", tz="Europe/Berlin", job_id="every-5-min")
    job = PeriodicTask.objects.get(pk=job_id)
    assert job_id == "every-5-min"
    assert (job.kind, job.task, job.timer, job.tz) == (
        "periodic",
        RECORD,
        "*-*-* *:00/5:00",
        "Europe/Berlin",
    )
    assert job.enabled and not job.paused
    assert job.nextrun > timezone.now()
    assert job.nextrun.minute % 5 == 0
    assert job.nextrun.second == 0


def test_each_slot_is_submitted_exactly_once():
    job_id = scheduling.schedule_periodic(RECORD, "*:*:0/10", job_id="j")
    slot = PeriodicTask.objects.get(pk=job_id).nextrun
    first = scheduler.submit_due("node-a", now=slot + timedelta(milliseconds=20))
    again = scheduler.submit_due("node-b", now=slot + timedelta(milliseconds=40))
    assert [t.slot for t in first] == [slot]
    assert again == []
    job = PeriodicTask.objects.get(pk=job_id)
    assert job.nextrun == slot + timedelta(seconds=10)
    assert (job.run_count, job.worker, job.last_slot) == (1, "node-a", slot)
    (run,) = runs(job_id)
    assert (run.identifier, run.slot, run.state) == (job_id, slot, TaskState.PENDING)
    assert run.payload == {
        "task": RECORD,
        "args": [],
        "kwargs": {},
        "max_attempts": DEFAULT_RETRY.max_attempts,
    }


def test_a_worker_starts_a_run_without_reading_its_job(django_assert_num_queries):
    """The retry limit travels with the run, so the worker's pre-run check needs no query."""
    job_id = scheduling.schedule_periodic(
        RECORD, "*:*:0/10", job_id="j", retry=RetryPolicy(max_attempts=7)
    )
    slot = PeriodicTask.objects.get(pk=job_id).nextrun
    (run,) = scheduler.submit_due(now=slot)
    PeriodicTask.objects.filter(pk=job_id).update(retry={"max_attempts": 2})  # changed later
    with django_assert_num_queries(0):
        assert job_task_type.max_attempts_for(run) == 7
    run.payload.pop("max_attempts")  # a run submitted by an older version
    assert job_task_type.max_attempts_for(run) == 2


def test_the_database_refuses_a_second_run_for_the_same_slot():
    job_id = scheduling.schedule_periodic(RECORD, "*:*:0/10", job_id="j")
    slot = PeriodicTask.objects.get(pk=job_id).nextrun
    scheduler.submit_due(now=slot)
    PeriodicTask.objects.filter(pk=job_id).update(
        nextrun=slot
    )  # as if another scheduler went astray
    assert scheduler.submit_due(now=slot) == []
    assert len(runs(job_id)) == 1


def test_nothing_is_due_before_its_slot():
    job_id = scheduling.schedule_periodic(RECORD, "*:*:0/10", job_id="j")
    slot = PeriodicTask.objects.get(pk=job_id).nextrun
    assert scheduler.submit_due(now=slot - timedelta(milliseconds=1)) == []
    assert scheduler.next_due() == slot


def test_one_time_job_runs_once_and_finishes():
    at = timezone.now() + timedelta(minutes=1)
    job_id = scheduling.schedule_one_time(job_functions.record, at, args=[1, 2])
    assert re.fullmatch(r"tests\.testapp\.job_functions\.record:one_time:[0-9a-f]{16}", job_id)
    (run,) = scheduler.submit_due(now=at)
    assert run.payload["args"] == [1, 2]
    job = PeriodicTask.objects.get(pk=job_id)
    assert (job.enabled, job.nextrun, job.run_count) == (False, None, 1)
    assert job.finished_at is not None
    assert scheduler.submit_due(now=at + timedelta(days=1)) == []


def test_one_time_job_in_the_past_runs_as_soon_as_possible():
    job_id = scheduling.schedule_one_time(
        RECORD, timezone.now() - timedelta(hours=1), job_id="late"
    )
    assert len(scheduler.submit_due()) == 1
    assert not PeriodicTask.objects.get(pk=job_id).enabled


def test_recurring_max_count_start_and_end():
    start = timezone.now() + timedelta(minutes=1)
    job_id = scheduling.schedule_recurring(
        RECORD, 30, max_count=3, start_time=start, job_id="r", allow_overlap=True
    )
    assert PeriodicTask.objects.get(pk=job_id).nextrun == start
    for i in range(3):
        (run,) = scheduler.submit_due(now=start + timedelta(seconds=30 * i))
        assert run.slot == start + timedelta(seconds=30 * i)
    job = PeriodicTask.objects.get(pk=job_id)
    assert (job.enabled, job.run_count, job.nextrun) == (False, 3, None)
    assert scheduler.submit_due(now=start + timedelta(seconds=90)) == []


def test_recurring_stops_at_end_time():
    start = timezone.now() + timedelta(minutes=1)
    job_id = scheduling.schedule_recurring(
        RECORD,
        60,
        start_time=start,
        end_time=start + timedelta(seconds=90),
        job_id="e",
        allow_overlap=True,
    )
    for i in range(3):
        scheduler.submit_due(now=start + timedelta(seconds=60 * i))
    assert [t.slot for t in runs(job_id)] == [start, start + timedelta(seconds=60)]
    assert not PeriodicTask.objects.get(pk=job_id).enabled


def test_recurring_without_start_runs_one_interval_from_now():
    before = timezone.now()
    job_id = scheduling.schedule_recurring(RECORD, timedelta(minutes=5), job_id="r")
    nextrun = PeriodicTask.objects.get(pk=job_id).nextrun
    assert before + timedelta(minutes=5) <= nextrun <= timezone.now() + timedelta(minutes=5)


def test_scheduling_the_same_id_again_updates_it():
    scheduling.schedule_periodic(RECORD, "hourly", job_id="j")
    scheduling.schedule_periodic(RECORD, "daily", job_id="j", args=[7])
    job = PeriodicTask.objects.get()
    assert (job.timer, job.args) == ("*-*-* 00:00:00", [7])


SCHEDULE_CALLS = {
    "one_time": lambda **options: scheduling.schedule_one_time(
        RECORD, timezone.now() - timedelta(seconds=1), **options
    ),
    "recurring": lambda **options: scheduling.schedule_recurring(
        RECORD, 60, start_time=timezone.now() - timedelta(seconds=1), **options
    ),
    "periodic": lambda **options: scheduling.schedule_periodic(RECORD, "*:*:0/10", **options),
}


@pytest.mark.parametrize("kind", SCHEDULE_CALLS)
def test_each_call_without_a_job_id_schedules_a_new_job(kind):
    # A reminder per user: the same function twice, with different arguments.
    first = SCHEDULE_CALLS[kind](args=[1])
    second = SCHEDULE_CALLS[kind](args=[2])
    assert first != second
    for job_id in (first, second):
        assert re.fullmatch(rf"{re.escape(RECORD)}:{kind}:[0-9a-f]{{16}}", job_id)
    jobs = PeriodicTask.objects.order_by("args")
    assert [(job.id, job.args) for job in jobs] == [(first, [1]), (second, [2])]
    now = max(job.nextrun for job in jobs)
    assert sorted(run.identifier for run in scheduler.submit_due(now=now)) == sorted(
        [first, second]
    )
    ran = {run_job()[0].identifier, run_job()[0].identifier}  # both run
    assert ran == {first, second}


@pytest.mark.parametrize("kind", SCHEDULE_CALLS)
def test_an_explicit_job_id_updates_the_job_in_place(kind):
    assert SCHEDULE_CALLS[kind](job_id="reminder", args=[1]) == "reminder"
    PeriodicTask.objects.filter(pk="reminder").update(paused=True)
    assert SCHEDULE_CALLS[kind](job_id="reminder", args=[2]) == "reminder"
    job = PeriodicTask.objects.get()  # still one job
    assert (job.id, job.args, job.paused) == ("reminder", [2], True)


def test_a_generated_id_fits_the_job_id_column():
    path = "a" * 250
    job_id = scheduling.new_job_id(path, "recurring")
    assert len(job_id) == PeriodicTask._meta.get_field("id").max_length == 200
    assert re.fullmatch(r"a+:recurring:[0-9a-f]{16}", job_id)


@pytest.mark.parametrize(
    ("call", "error", "fragment"),
    [
        (lambda: scheduling.schedule_periodic(RECORD, "*:50/10"), TimerError, "50/10"),
        (
            lambda: scheduling.schedule_periodic("tests.nope.job", "hourly"),
            JobDefinitionError,
            "cannot be imported",
        ),
        (
            lambda: scheduling.schedule_periodic(lambda ctx: None, "hourly"),
            JobDefinitionError,
            "module-level",
        ),
        (
            lambda: scheduling.schedule_recurring(
                RECORD, 10, start_time=timezone.now(), end_time=timezone.now() - timedelta(1)
            ),
            JobDefinitionError,
            "before start_time",
        ),
        (lambda: scheduling.schedule_recurring(RECORD, 0), InvalidArgumentError, "interval"),
        (
            lambda: scheduling.schedule_recurring(RECORD, 10, max_count=0),
            InvalidArgumentError,
            "max_count",
        ),
        (
            lambda: scheduling.schedule_periodic(RECORD, "hourly", catch_up="sometimes"),
            InvalidArgumentError,
            "catch_up",
        ),
        (lambda: scheduling.schedule_periodic(RECORD, "*-02-30"), JobDefinitionError, "never run"),
        (
            lambda: scheduling.schedule_one_time(RECORD, timezone.now().replace(tzinfo=None)),
            InvalidArgumentError,
            "aware",
        ),
    ],
)
def test_bad_definitions_fail_at_schedule_time(call, error, fragment):
    with pytest.raises(error, match=fragment):
        call()
    assert not PeriodicTask.objects.exists()


def test_pause_and_resume_a_job():
    job_id = scheduling.schedule_periodic(RECORD, "*:*:0/10", job_id="j", waiting_time=5)
    slot = PeriodicTask.objects.get(pk=job_id).nextrun
    scheduling.pause(job_id)
    assert scheduler.submit_due(now=slot + timedelta(seconds=35)) == []
    scheduling.resume(job_id)
    (run,) = scheduler.submit_due(now=slot + timedelta(seconds=35))  # missed slots: once (default)
    assert run.slot == slot + timedelta(seconds=30)
    with pytest.raises(UnknownJobError, match="nope"):
        scheduling.pause("nope")


def test_pause_all_and_resume_all():
    job_id = scheduling.schedule_periodic(RECORD, "*:*:0/10", job_id="j")
    slot = PeriodicTask.objects.get(pk=job_id).nextrun
    scheduling.pause_all()
    assert scheduler.submit_due(now=slot) == []
    scheduling.resume_all()
    assert len(scheduler.submit_due(now=slot)) == 1


def test_no_overlap_waits_for_the_previous_run():
    job_id = scheduling.schedule_periodic(RECORD, "*:*:0/10", job_id="j", waiting_time=60)
    slot = PeriodicTask.objects.get(pk=job_id).nextrun
    scheduler.submit_due(now=slot)
    (running,) = queue.poll(JOBS_TOPIC)
    assert scheduler.submit_due(now=slot + timedelta(seconds=10)) == []  # WAIT: not submitted
    assert scheduling.running_jobs() == [job_id]
    queue.complete(running, queue.Result.SUCCESS)
    (late,) = scheduler.submit_due(now=slot + timedelta(seconds=12))
    assert late.slot == slot + timedelta(seconds=10)
    assert scheduling.running_jobs() == []


def test_no_overlap_ignore_skips_the_slot():
    job_id = scheduling.schedule_periodic(
        RECORD, "*:*:0/10", job_id="j", waiting_policy="log_and_ignore"
    )
    slot = PeriodicTask.objects.get(pk=job_id).nextrun
    scheduler.submit_due(now=slot)
    queue.poll(JOBS_TOPIC)
    assert scheduler.submit_due(now=slot + timedelta(seconds=10)) == []
    assert PeriodicTask.objects.get(pk=job_id).nextrun == slot + timedelta(seconds=20)


def test_overlap_allowed():
    job_id = scheduling.schedule_periodic(RECORD, "*:*:0/10", job_id="j", allow_overlap=True)
    slot = PeriodicTask.objects.get(pk=job_id).nextrun
    scheduler.submit_due(now=slot)
    queue.poll(JOBS_TOPIC)
    assert len(scheduler.submit_due(now=slot + timedelta(seconds=10))) == 1


def test_unschedule_keeps_the_history():
    job_id = scheduling.schedule_periodic(RECORD, "*:*:0/10", job_id="j")
    scheduler.submit_due(now=PeriodicTask.objects.get(pk=job_id).nextrun)
    scheduling.unschedule(job_id)
    assert not PeriodicTask.objects.exists()
    assert len(runs(job_id)) == 1
    with pytest.raises(UnknownJobError):
        scheduling.unschedule(job_id)


def run_job(now=None):
    """Poll one run and execute it like a node does (handler, retry decision, completion)."""
    (task,) = queue.poll(JOBS_TOPIC)
    (decision,) = job_task_type.run([task])
    retry_at = job_task_type.retry_at(task, decision, now or timezone.now())
    if decision.result is queue.Result.FAILURE and retry_at is not None:
        queue.release(task, execute_at=retry_at, decision=decision)
        return task, retry_at
    queue.complete(task, decision)
    job_task_type.on_outcome(task, decision)
    return task, None


def test_a_run_gets_its_context_and_records_the_outcome():
    from tests.testapp.models import Run

    job_id = scheduling.schedule_periodic(RECORD, "*:*:0/10", job_id="j", kwargs={"x": 1})
    slot = PeriodicTask.objects.get(pk=job_id).nextrun
    scheduler.submit_due(now=slot)
    run_job()
    (run,) = Run.objects.all()
    assert (run.identifier, run.slot, run.attempt) == (job_id, slot, 1)
    job = PeriodicTask.objects.get(pk=job_id)
    assert (job.last_outcome, job.consecutive_failures) == (TaskState.SUCCEEDED, 0)


def test_retries_stop_before_the_next_slot():
    retry = RetryPolicy(max_attempts=5, retry_interval=4, backoff="fixed", jitter=0)
    job_id = scheduling.schedule_periodic(
        RECORD, "*:*:0/10", job_id="j", retry=retry, kwargs={"fail_times": 9}
    )
    slot = PeriodicTask.objects.get(pk=job_id).nextrun
    scheduler.submit_due(now=slot)
    task, retry_at = run_job(now=slot)
    assert retry_at == slot + timedelta(seconds=4)
    failure = queue.Decision(queue.Result.FAILURE)
    assert job_task_type.retry_at(task, failure, slot + timedelta(seconds=5)) == slot + timedelta(
        seconds=9
    )
    assert (
        job_task_type.retry_at(task, failure, slot + timedelta(seconds=7)) is None
    )  # +11 passes the slot at +10


def test_terminating_error_policy_unschedules_the_job():
    job_id = scheduling.schedule_periodic(
        RECORD,
        "*:*:0/10",
        job_id="j",
        policy="log_and_terminate",
        retry=RetryPolicy(max_attempts=1),
        kwargs={"fail_times": 1},
    )
    scheduler.submit_due(now=PeriodicTask.objects.get(pk=job_id).nextrun)
    run_job()
    job = PeriodicTask.objects.get(pk=job_id)
    assert (job.enabled, job.last_outcome, job.consecutive_failures) == (False, TaskState.FAILED, 1)


@pytest.mark.parametrize(
    ("exception", "level"),
    [
        (RuntimeError("job attempt 1 fails on purpose"), logging.ERROR),
        (OperationalError("server closed the connection unexpectedly"), logging.WARNING),
    ],
)
def test_a_run_failed_by_a_lost_connection_is_a_warning_not_an_error(exception, level, caplog):
    """During a database outage a job fails through no fault of its own: the node reports
    the outage, and an alert on ERROR lines must not fire for every job that ran then."""
    job_id = scheduling.schedule_periodic(RECORD, "*:*:0/10", job_id="j")
    scheduler.submit_due(now=PeriodicTask.objects.get(pk=job_id).nextrun)
    (task,) = queue.poll(JOBS_TOPIC)
    decision = queue.Decision(queue.Result.FAILURE, exception=exception)
    queue.complete(task, decision)
    with caplog.at_level(logging.WARNING, logger="django_tasks_coord.scheduling.runner"):
        job_task_type.on_outcome(task, decision)
    (record,) = [r for r in caplog.records if r.getMessage().startswith("Job j failed")]
    assert record.levelno == level
    job = PeriodicTask.objects.get(pk=job_id)
    assert (job.last_outcome, job.consecutive_failures) == (TaskState.FAILED, 1)


def test_fixed_delay_counts_from_the_end_of_the_run():
    start = timezone.now() - timedelta(seconds=1)
    job_id = scheduling.schedule_recurring(
        RECORD, 30, start_time=start, fixed_delay=True, job_id="fd"
    )
    scheduler.submit_due()
    assert PeriodicTask.objects.get(pk=job_id).nextrun is None  # waiting for the run to end
    before = timezone.now()
    run_job()
    nextrun = PeriodicTask.objects.get(pk=job_id).nextrun
    assert before + timedelta(seconds=30) <= nextrun <= timezone.now() + timedelta(seconds=30)


def test_declared_jobs_are_synchronized():
    from django_tasks_coord.scheduling import declared

    scheduling.job("*:0/15", name="declared-a")(job_functions.noop)
    scheduling.job("hourly", name="declared-b")(job_functions.record)
    assert declared.sync_declared()["created"] == ["declared-a", "declared-b"]
    nextrun = PeriodicTask.objects.get(pk="declared-a").nextrun
    PeriodicTask.objects.filter(pk="declared-a").update(run_count=5)
    again = declared.sync_declared()
    assert again["unchanged"] == ["declared-a", "declared-b"]
    assert PeriodicTask.objects.get(pk="declared-a").run_count == 5  # untouched
    assert PeriodicTask.objects.get(pk="declared-a").nextrun == nextrun
    declared.forget("declared-b")
    scheduling.job("*:0/30", name="declared-a")(job_functions.noop)
    changes = declared.sync_declared()
    assert (changes["updated"], changes["disabled"]) == (["declared-a"], ["declared-b"])
    assert PeriodicTask.objects.get(pk="declared-a").timer == "*-*-* *:00/30:00"
    assert PeriodicTask.objects.get(pk="declared-b").enabled is False  # kept, with its history


def test_declared_jobs_keep_their_names_across_restarts():
    from django_tasks_coord.scheduling import declared

    def start_node():
        """What a node does at start-up: import the jobs modules (declare), then sync."""
        declared.forget("tests.testapp.job_functions.noop")
        scheduling.job("*:0/15")(job_functions.noop)  # named by its dotted path
        scheduling.job("hourly", name="declared-report")(job_functions.record)
        return declared.sync_declared()

    names = ["declared-report", "tests.testapp.job_functions.noop"]
    assert sorted(start_node()["created"]) == names
    PeriodicTask.objects.update(run_count=3)
    before = {job.id: job.nextrun for job in PeriodicTask.objects.all()}
    for _ in range(2):
        assert sorted(start_node()["unchanged"]) == names
    assert {job.id: job.nextrun for job in PeriodicTask.objects.all()} == before  # no new job
    assert set(PeriodicTask.objects.values_list("run_count", flat=True)) == {3}


def test_declaring_a_name_twice_is_refused():
    scheduling.job("hourly", name="twice")(job_functions.noop)
    with pytest.raises(JobDefinitionError, match="declared twice"):
        scheduling.job("daily", name="twice")(job_functions.record)


def test_declaring_a_bad_timer_fails_at_import():
    with pytest.raises(TimerError):
        scheduling.job("Fri..Mon")
