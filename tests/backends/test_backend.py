"""The backend in-process: signals from a node's workers, periodic tasks, options, checks."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from django_tasks_coord import queue
from django_tasks_coord.backends import DatabaseBackend
from django_tasks_coord.backends.compat import (
    InvalidTask,
    TaskResultStatus,
    task_backends,
    task_finished,
    task_started,
)
from django_tasks_coord.backends.periodic import fire
from django_tasks_coord.enums import Insertion
from django_tasks_coord.models import PeriodicTask
from django_tasks_coord.models import Task as TaskRow
from django_tasks_coord.node import Node, NodeConfig
from django_tasks_coord.retry import RetryPolicy
from django_tasks_coord.scheduling import declared
from django_tasks_coord.scheduling.runner import JOBS_TOPIC, JobContext
from tests.backends import tasks

BACKEND = "django_tasks_coord.backends.DatabaseBackend"


def run_node(*topics: str) -> None:
    """A burst node in a thread of this process (so that its signals reach this test)."""
    config = NodeConfig.from_settings(
        burst=True,
        poll_interval=0.05,
        status_interval=0,
        heartbeat_frequency=0.1,
        liveness_interval=5.0,
        scheduler=False,
        topics=list(topics),
    )
    node = Node(config)
    thread = threading.Thread(target=node.run)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the node did not finish"


@pytest.mark.django_db(transaction=True)
def test_task_started_and_task_finished_come_from_the_worker_with_the_backend_as_sender():
    seen = []

    def started(sender, task_result, **kwargs):
        seen.append(("started", sender, task_result.status, task_result.attempts))

    def finished(sender, task_result, **kwargs):
        seen.append(("finished", sender, task_result.status, task_result.attempts))

    task_started.connect(started)
    task_finished.connect(finished)
    try:
        ok = tasks.add.enqueue(1, 2)
        failing = tasks.fail.enqueue("no")
        run_node("default")
    finally:
        task_started.disconnect(started)
        task_finished.disconnect(finished)
    assert sorted(seen, key=lambda s: (s[0], s[2])) == [
        ("finished", DatabaseBackend, TaskResultStatus.FAILED, 1),
        ("finished", DatabaseBackend, TaskResultStatus.SUCCESSFUL, 1),
        ("started", DatabaseBackend, TaskResultStatus.RUNNING, 1),
        ("started", DatabaseBackend, TaskResultStatus.RUNNING, 1),
    ]
    assert tasks.add.get_result(ok.id).return_value == 3
    assert tasks.fail.get_result(failing.id).status == TaskResultStatus.FAILED


class RenamedBackend(DatabaseBackend):
    """The same backend under another class: the sender of its tasks' signals."""


@pytest.mark.django_db(transaction=True)
def test_the_signals_sender_follows_a_change_of_the_tasks_setting(settings):
    """The sender's class is looked up once per alias, and again once ``TASKS`` changes."""
    senders = []

    def started(sender, **kwargs):
        senders.append(sender)

    task_started.connect(started)
    try:
        tasks.add.enqueue(1, 2)
        run_node("default")
        settings.TASKS = {
            "default": {**settings.TASKS["default"], "BACKEND": f"{__name__}.RenamedBackend"}
        }
        tasks.add.using().enqueue(3, 4)
        run_node("default")
    finally:
        task_started.disconnect(started)
    assert senders == [DatabaseBackend, RenamedBackend]


@pytest.mark.django_db(transaction=True)
def test_a_retried_failure_is_not_finished():
    seen = []

    def finished(sender, task_result, **kwargs):
        seen.append((task_result.status, task_result.attempts))

    task_finished.connect(finished)
    try:
        result = tasks.flaky.enqueue(1)
        run_node("default")
    finally:
        task_finished.disconnect(finished)
    assert seen == [(TaskResultStatus.SUCCESSFUL, 2)]
    assert tasks.flaky.get_result(result.id).return_value == {"attempt": 2}


@pytest.fixture
def periodic():
    from django_tasks_coord.backends.periodic import declare
    from tests.backends import periodic_tasks

    declare(periodic_tasks.every_minute)  # again: an earlier test may have forgotten it
    yield periodic_tasks.every_minute
    declared.forget(periodic_tasks.every_minute.module_path)


@pytest.mark.django_db(transaction=True)
def test_a_timer_declares_a_job_that_enqueues_the_task_once_per_slot(periodic):
    path = periodic.module_path
    assert path in declared.declarations()
    declared.sync_declared()
    job = PeriodicTask.objects.get(pk=path)
    assert job.task == "django_tasks_coord.backends.periodic.fire"
    assert job.args == [path]
    assert job.timer == "*-*-* *:*:00"
    assert job.catch_up == "skip"
    slot = timezone.now().replace(second=0, microsecond=0)
    ctx = JobContext(job_id=path, slot=slot, attempt=1, logger=declared.logger, task=TaskRow())
    fire(ctx, path)
    fire(ctx, path)  # the job run retried after its node died: the slot is not enqueued twice
    [row] = TaskRow.objects.filter(topic_id="default")
    assert row.identifier == f"{path}@{slot.isoformat()}"
    run_node("default")
    result = periodic.get_result(row.identifier)
    assert result.return_value == "tick"


@pytest.mark.django_db(transaction=True)
def test_a_node_submits_and_runs_a_periodic_task(periodic):
    from django_tasks_coord.scheduling import scheduler

    queue.register_topic("default")  # as every node does at start-up (prepare_node)
    declared.sync_declared()
    PeriodicTask.objects.filter(pk=periodic.module_path).update(
        nextrun=timezone.now().replace(second=0, microsecond=0)
    )
    assert scheduler.submit_due("test-node")
    run_node(JOBS_TOPIC, "default")
    [row] = TaskRow.objects.filter(topic_id="default")
    assert periodic.get_result(row.identifier).return_value == "tick"


def test_options_of_the_task_class():
    assert tasks.flaky.retry == tasks.FAST
    assert tasks.too_slow.timeout == 0.5
    refreshed = tasks.refresh_user.using(unique_key="fixed", max_attempts=2, timeout=timedelta(1))
    assert (refreshed.unique_key, refreshed.max_attempts, refreshed.timeout) == ("fixed", 2, 86400)
    assert refreshed.func is tasks.refresh_user.func


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"timeout": -1}, "timeout"),
        ({"insertion": "sideways"}, "insertion"),
        ({"unique_key": ""}, "unique_key"),
        ({"timer": "not a timer"}, "not a timer"),
        ({"retry": "often"}, "retry"),
    ],
)
def test_invalid_options_are_refused_at_declaration(options, match):
    from django_tasks_coord.backends.compat import task

    with pytest.raises(InvalidTask, match=match):
        task(**options)(tasks.add.func)


def test_reserved_queue_names_are_refused(settings):
    settings.TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": []}}
    with pytest.raises(InvalidTask, match="cannot be a topic"):
        tasks.add.using(queue_name="tasks_coord.jobs")


@pytest.mark.django_db
def test_the_stored_task(settings):
    settings.TASKS = {
        "default": {
            "BACKEND": BACKEND,
            "OPTIONS": {"RETRY": {"max_attempts": 7}, "TIMEOUT": 12},
        }
    }
    result = tasks.add.using(priority=5).enqueue(1, 2)
    row = TaskRow.objects.get(identifier=result.id)
    assert row.topic_id == "default"
    assert row.handler == "tests.backends.tasks.add"
    assert row.priority == 5
    assert row.payload["retry"]["max_attempts"] == 7
    assert row.payload["timeout"] == 12
    assert row.payload["args"] == [1, 2]
    flaky = tasks.flaky.enqueue(1)
    assert TaskRow.objects.get(identifier=flaky.id).payload["retry"]["max_attempts"] == 3


def test_unique_keys_use_the_insertion_mode(settings):
    backend = task_backends["default"]
    identifier, insertion = backend._identifier(tasks.refresh_user, (3,), {})
    assert identifier == "tests.backends.tasks.refresh_user:user-3"
    assert insertion is Insertion.SUPERSEDE
    _, insertion = backend._identifier(tasks.add, (1, 2), {})
    assert insertion is Insertion.APPEND


def test_checks(settings):
    settings.TASKS = {
        "default": {
            "BACKEND": BACKEND,
            "QUEUES": ["default", "tasks_coord.mine"],
            "OPTIONS": {"COLOUR": "blue", "RESULT_RETENTION": -1, "DATABASE": "other"},
        }
    }
    ids = sorted(message.id for message in task_backends["default"].check())
    assert ids == ["tasks_coord.E020", "tasks_coord.E020", "tasks_coord.E021", "tasks_coord.E022"]
    settings.TASKS = {"default": {"BACKEND": BACKEND, "OPTIONS": {"RETRY": RetryPolicy()}}}
    assert list(task_backends["default"].check()) == []


@pytest.mark.django_db
def test_system_checks_pass_with_the_test_settings():
    call_command("check", fail_level="ERROR")


@pytest.mark.parametrize("on_commit", [True, False])
def test_tables_on_their_own_database_wait_for_the_default_databases_commit(
    monkeypatch, settings, on_commit
):
    """With ENQUEUE_ON_COMMIT, an enqueue in a transaction on ``default`` is pushed at its commit."""
    from types import SimpleNamespace

    from django.db import transaction

    settings.TASKS = {"default": {"BACKEND": BACKEND, "OPTIONS": {"ENQUEUE_ON_COMMIT": on_commit}}}
    monkeypatch.setattr(DatabaseBackend, "database", property(lambda self: "tasks"))
    connections = {
        "tasks": SimpleNamespace(in_atomic_block=False),
        "default": SimpleNamespace(in_atomic_block=True),
    }
    monkeypatch.setattr(transaction, "get_connection", lambda using=None: connections[using])
    deferred = []
    monkeypatch.setattr(
        transaction, "on_commit", lambda func, using=None, robust=False: deferred.append(using)
    )
    pushed = []
    monkeypatch.setattr(DatabaseBackend, "_push", lambda self, *args: pushed.append(args))
    tasks.add.enqueue(1, 2)
    if on_commit:
        assert (deferred, pushed) == (["default"], [])
    else:
        assert deferred == []
        assert len(pushed) == 1


def test_the_backend_supports_all_of_djangos_features():
    backend = task_backends["default"]
    assert isinstance(backend, DatabaseBackend)
    assert backend.supports_defer
    assert backend.supports_async_task
    assert backend.supports_get_result
    assert backend.supports_priority
    assert backend.task_class.__name__ == "CoordTask"
