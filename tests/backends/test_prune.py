"""``manage.py tasks_coord_prune`` and the hourly housekeeping job that prunes old results."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_tasks_coord import handlers
from django_tasks_coord.backends import housekeeping
from django_tasks_coord.backends.compat import SOURCE
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Task as TaskRow
from django_tasks_coord.models import Topic
from django_tasks_coord.scheduling import declared
from tests.backends import tasks

BACKEND = "django_tasks_coord.backends.DatabaseBackend"
pytestmark = pytest.mark.django_db


def finished(result_id: str, *, state: TaskState, age: timedelta) -> None:
    TaskRow.objects.filter(identifier=result_id).update(
        state=state, finished_at=timezone.now() - age
    )


@pytest.fixture
def results():
    """Two old finished results, a fresh one, an old waiting one and an old one of another topic."""
    old_ok, old_failed, fresh = (tasks.add.enqueue(i, i).id for i in range(3))
    waiting = tasks.add.enqueue(9, 9).id
    finished(old_ok, state=TaskState.SUCCEEDED, age=timedelta(days=10))
    finished(old_failed, state=TaskState.FAILED, age=timedelta(days=10))
    finished(fresh, state=TaskState.SUCCEEDED, age=timedelta(minutes=1))
    TaskRow.objects.filter(identifier=waiting).update(
        created_at=timezone.now() - timedelta(days=10)
    )
    Topic.objects.create(name="mine")
    TaskRow.objects.create(
        topic_id="mine",
        identifier="x",
        state=TaskState.SUCCEEDED,
        finished_at=timezone.now() - timedelta(days=10),
    )
    return {"old": {old_ok, old_failed}, "kept": {fresh, waiting}}


def prune(*args: str) -> str:
    out = StringIO()
    call_command("tasks_coord_prune", *args, stdout=out)
    return out.getvalue()


def test_prune_deletes_old_finished_results_only(results):
    assert prune("--older-than", "86400", "--dry-run") == (
        "Would delete 2 result(s) of task backend 'default'.\n"
    )
    assert TaskRow.objects.count() == 5
    assert prune("--older-than", "86400") == "Deleted 2 result(s) of task backend 'default'.\n"
    left = set(TaskRow.objects.filter(topic_id="default").values_list("identifier", flat=True))
    assert left == results["kept"]
    assert TaskRow.objects.filter(topic_id="mine").exists()  # not a queue of the backend


def test_prune_uses_the_backends_retention(results, settings):
    settings.TASKS = {
        "default": {
            "BACKEND": BACKEND,
            "QUEUES": ["default"],
            "OPTIONS": {"RESULT_RETENTION": timedelta(days=1)},
        }
    }
    assert prune() == "Deleted 2 result(s) of task backend 'default'.\n"
    assert housekeeping.prune_results() == {"default": 0}


def test_prune_needs_an_age(results):
    with pytest.raises(CommandError, match="--older-than"):
        prune()
    with pytest.raises(CommandError, match="No task backend 'nope'"):
        prune("--backend", "nope", "--older-than", "1")
    with pytest.raises(CommandError, match="at least 0"):
        prune("--older-than", "-1")


def test_prune_refuses_other_backends(settings):
    settings.TASKS = {
        "default": {"BACKEND": BACKEND},
        "dummy": {"BACKEND": f"{SOURCE}.backends.dummy.DummyBackend"},
    }
    with pytest.raises(CommandError, match="not a DatabaseBackend"):
        prune("--backend", "dummy", "--older-than", "1")


@pytest.fixture
def registry():
    before = handlers.registry.consumers()
    yield handlers.registry
    handlers.registry.restore(before)
    declared.forget(housekeeping.PRUNE_JOB)


def test_prepare_node_registers_the_queues_and_the_pruning_job(registry, settings):
    settings.TASKS = {
        "default": {
            "BACKEND": BACKEND,
            "QUEUES": ["default", "high"],
            "OPTIONS": {"RESULT_RETENTION": 3600},
        }
    }
    housekeeping.prepare_node()
    assert {"default", "high"} <= set(Topic.objects.values_list("name", flat=True))
    consumers = registry.consumers()
    assert consumers["default"].max_attempts_for is not None
    assert type(consumers["high"]).__name__ == "DjangoTaskType"
    declaration = declared.declarations()[housekeeping.PRUNE_JOB]
    assert declaration.path == "django_tasks_coord.backends.housekeeping.prune_job"


def test_prepare_node_declares_no_pruning_without_a_retention(registry):
    housekeeping.prepare_node()
    assert housekeeping.PRUNE_JOB not in declared.declarations()


def test_prepare_node_does_nothing_without_a_database_backend(registry, settings):
    settings.TASKS = {"default": {"BACKEND": f"{SOURCE}.backends.dummy.DummyBackend"}}
    housekeeping.prepare_node()
    assert not Topic.objects.exists()
    assert "default" not in registry.consumers()
