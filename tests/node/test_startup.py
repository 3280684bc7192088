"""A node's start-up makes silent mistakes loud: consumer topics registered, unknown topics
and jobs whose callable does not import warned about, such a job paused after one run."""

from __future__ import annotations

import logging

import pytest

from django_tasks_coord import handlers, queue, scheduling
from django_tasks_coord.enums import TaskState
from django_tasks_coord.exceptions import ReservedTopicError, TasksCoordError
from django_tasks_coord.models import PeriodicTask, Task, Topic
from django_tasks_coord.scheduling import JOBS_TOPIC
from django_tasks_coord.topics import register_internal_topic
from tests.node.conftest import run


def declared_consumer(task):
    return None


def test_a_declared_consumers_topic_is_registered_at_start(make_node):
    handlers.consumer("declared-only")(declared_consumer)
    assert not Topic.objects.filter(name="declared-only").exists()
    assert run(make_node(topics=None)) == 0
    assert Topic.objects.filter(name="declared-only").exists()
    assert (
        not Topic.objects.filter(name__startswith="tasks_coord.").exclude(name=JOBS_TOPIC).exists()
    )
    # ...so its tasks can be pushed and the next node runs them.
    task = queue.push("declared-only", "one")
    assert run(make_node(topics=["declared-only"])) == 0
    task.refresh_from_db()
    assert task.state == TaskState.SUCCEEDED


def test_an_unknown_topic_is_warned_about(make_node, caplog):
    caplog.set_level(logging.WARNING, logger="django_tasks_coord")
    queue.register_topic("registered-no-consumer")
    assert run(make_node(topics=["no-such-topc", "work", "registered-no-consumer"])) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    unknown = [w for w in warnings if "has no consumer and is not registered" in w]
    assert len(unknown) == 1, warnings
    assert unknown[0].startswith("Topic 'no-such-topc' has no consumer and is not registered")


def test_register_topic_refuses_the_reserved_prefix(transactional_db):
    with pytest.raises(ReservedTopicError, match="reserved") as raised:
        queue.register_topic("tasks_coord.mine")
    assert isinstance(raised.value, TasksCoordError)
    assert not Topic.objects.filter(name="tasks_coord.mine").exists()
    register_internal_topic(JOBS_TOPIC)  # the package's own topics still register
    assert Topic.objects.filter(name=JOBS_TOPIC).exists()


def broken_job(job_id: str) -> None:
    scheduling.schedule_recurring("tests.testapp.job_functions.noop", 3600, job_id=job_id)
    PeriodicTask.objects.filter(pk=job_id).update(task="tests.testapp.job_functions.gone")


def test_a_job_whose_callable_does_not_import_is_warned_about_at_start(make_node, caplog):
    caplog.set_level(logging.WARNING, logger="django_tasks_coord")
    broken_job("ghost")
    scheduling.schedule_recurring("tests.testapp.job_functions.noop", 3600, job_id="fine")
    assert run(make_node(topics=["work"])) == 0
    warnings = [r.getMessage() for r in caplog.records if "Job '" in r.getMessage()]
    assert warnings == [
        "Job 'ghost': its callable tests.testapp.job_functions.gone cannot be imported: "
        'Module "tests.testapp.job_functions" does not define a "gone" attribute/class; '
        "its next run will fail and pause it. Deploy the code or unschedule the job."
    ]


def test_a_job_whose_callable_does_not_import_is_paused_after_one_run(make_node, caplog):
    caplog.set_level(logging.ERROR, logger="django_tasks_coord")
    broken_job("ghost")
    run_task = scheduling.run_now("ghost")
    assert run(make_node(topics=[JOBS_TOPIC])) == 0
    run_task.refresh_from_db()
    assert run_task.state == TaskState.FAILED
    assert run_task.attempts == 1  # no retry: every attempt would fail the same way
    assert "JobImportError" in run_task.error
    job = PeriodicTask.objects.get(pk="ghost")
    assert job.paused and job.enabled
    assert Task.objects.filter(identifier="ghost").count() == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert [e for e in errors if e.startswith("Job ghost paused: ")] == [
        "Job ghost paused: Job 'ghost': its callable tests.testapp.job_functions.gone cannot "
        'be imported: Module "tests.testapp.job_functions" does not define a "gone" '
        "attribute/class. Deploy the code it names, then resume the job (scheduling.resume "
        "or Resume in the admin)."
    ]
    # Resuming is how it is re-enabled (once the code is deployed).
    scheduling.resume("ghost")
    assert not PeriodicTask.objects.get(pk="ghost").paused


@pytest.mark.multiprocess
@pytest.mark.django_db(transaction=True)
def test_runscheduler_warns_about_an_unknown_topic_without_a_traceback():
    from tests.processes import reap, runscheduler

    out, err = reap(runscheduler("--burst", "--topic", "no-such-topc", "--topic", "work"))
    assert "Traceback" not in out + err
    assert "WARNING django_tasks_coord.node: Topic 'no-such-topc' has no consumer and is not " in (
        out
    )
    assert "Topic 'work'" not in out  # the test app declares its consumer: registered
    assert Topic.objects.filter(name="work").exists()
