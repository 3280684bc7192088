"""The task_pretty view: the task table with state names, for people querying by hand."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from django.db import connection
from django.test import override_settings

from django_tasks_coord import dbviews, queue
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Task


def pretty(where: str = "", params: tuple = ()) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT sequence, topic, identifier, state, owner FROM task_pretty "
            f"{where} ORDER BY sequence",
            params,
        )
        return list(cursor.fetchall())


@pytest.mark.django_db
def test_migrate_creates_the_view_with_state_names_topic_and_owner() -> None:
    assert dbviews.exists(connection)
    queue.register_topic("emails")
    owner = queue.register_owner("node-a")
    done, failed, waiting = (queue.push("emails", name) for name in ("done", "failed", "waiting"))
    queue.complete(queue.poll("emails", owner=owner)[0], "success")
    queue.complete(queue.poll("emails", owner=owner)[0], "failure")
    running = queue.push("emails", "running")
    queue.poll("emails", 2, owner=owner)
    assert pretty() == [
        (done.sequence, "emails", "done", "succeeded", None),
        (failed.sequence, "emails", "failed", "failed", None),
        (waiting.sequence, "emails", "waiting", "active", "node-a"),
        (running.sequence, "emails", "running", "active", "node-a"),
    ]
    assert pretty("WHERE state = %s", ("failed",)) == [
        (failed.sequence, "emails", "failed", "failed", None)
    ]


@pytest.mark.django_db
def test_every_state_has_its_name() -> None:
    queue.register_topic("t")
    task = queue.push("t", "x")
    for state in TaskState:
        Task.objects.filter(pk=task.pk).update(state=state, exec_id=uuid.uuid4())
        assert pretty()[0][3] == state.name.lower()


@pytest.fixture
def view_kept() -> Iterator[None]:
    """The next test finds the view, whatever this one did to it."""
    yield
    if not dbviews.exists(connection):
        dbviews.create(connection)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("view_kept")
def test_migrate_drops_it_when_turned_off_and_makes_it_again_when_on() -> None:
    with override_settings(TASKS_COORD={"TASK_PRETTY_VIEW": False}):
        dbviews.after_migrate(using="default")
        assert not dbviews.exists(connection)
        dbviews.after_migrate(using="default")
        assert not dbviews.exists(connection)
    dbviews.after_migrate(using="default")
    assert dbviews.exists(connection)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("view_kept")
def test_it_is_out_of_the_way_while_migrations_run() -> None:
    dbviews.before_migrate(using="default", plan=[])
    assert dbviews.exists(connection)  # nothing to migrate: left alone
    dbviews.before_migrate(using="default", plan=[("a migration", False)])
    assert not dbviews.exists(connection)
    dbviews.after_migrate(using="default")
    assert dbviews.exists(connection)
