"""A node's retention housekeeping: a bounded pass every RETENTION_INTERVAL, in its own thread."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import DatabaseError
from django.utils import timezone

from django_tasks_coord import queue, retention
from django_tasks_coord.enums import TaskState
from django_tasks_coord.exceptions import ConfigurationError
from django_tasks_coord.models import Task
from django_tasks_coord.node import NodeConfig
from tests.factories import TaskFactory, TopicFactory
from tests.node.conftest import run


class Clock:
    """Monotonic seconds that only move when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def old_tasks(topic: str, n: int, *, state: TaskState = TaskState.SUCCEEDED) -> list[Task]:
    when = timezone.now() - timedelta(days=10)
    tasks = TaskFactory.create_batch(
        n, topic=TopicFactory(name=topic), state=state, finished_at=when
    )
    Task.objects.filter(pk__in=[t.pk for t in tasks]).update(created_at=when)
    return tasks


@pytest.fixture
def clock() -> Clock:
    return Clock()


def keeper(clock: Clock, **options) -> retention.Housekeeper:
    return retention.Housekeeper(60, threading.Event(), clock=clock, **options)


@pytest.mark.django_db
def test_a_pass_runs_at_start_then_once_per_interval(clock, django_assert_num_queries):
    old_tasks("a", 3)
    retention.set_policy("a", keep_completed_days=7)
    housekeeper = keeper(clock)
    assert housekeeper.tick() == {"a": 3}
    old_tasks("a", 2)
    clock.now += 59
    with django_assert_num_queries(0):
        assert housekeeper.tick() is None  # not due: no query at all
    clock.now += 1
    assert housekeeper.tick() == {"a": 2}
    assert not Task.objects.exists()


@pytest.mark.django_db
def test_without_any_policy_a_pass_is_one_query(clock, django_assert_num_queries):
    old_tasks("a", 3)
    housekeeper = keeper(clock)
    with django_assert_num_queries(1):
        assert housekeeper.tick() == {}
    assert Task.objects.count() == 3


@pytest.mark.django_db
def test_a_pass_is_bounded_and_a_backlog_brings_the_next_one_forward(clock):
    old_tasks("a", 5)
    retention.set_policy("a", keep_completed_rows=0)
    housekeeper = keeper(clock, batch_size=2, max_batches=1)
    assert housekeeper.tick() == {"a": 2}
    assert housekeeper.next_pass == clock.now + 1.0  # a backlog: at least a second's pause
    clock.now += 1
    assert housekeeper.tick() == {"a": 2}
    clock.now += 1
    assert housekeeper.tick() == {"a": 1}  # done: the budget was not used up
    assert housekeeper.next_pass == clock.now + 60


@pytest.mark.django_db
def test_topics_take_turns_when_the_budget_runs_out(clock):
    old_tasks("a", 4)
    old_tasks("b", 4)
    retention.set_policy("a", keep_completed_rows=0)
    retention.set_policy("b", keep_completed_rows=0)
    housekeeper = keeper(clock, batch_size=2, max_batches=1)
    assert housekeeper.tick() == {"a": 2}
    clock.now += 1
    assert housekeeper.tick() == {"b": 2}
    clock.now += 1
    assert housekeeper.tick() == {"a": 2}


@pytest.mark.django_db
def test_a_sweep_goes_on_where_the_last_pass_stopped(clock):
    """Candidates that are no victims (finished recently, created long ago) are not read again
    at every pass: the sweep of a state resumes after the last sequence it read."""
    late = old_tasks("a", 4)
    Task.objects.filter(pk__in=[t.pk for t in late]).update(finished_at=timezone.now())
    victims = old_tasks("a", 2)
    retention.set_policy("a", keep_completed_days=7)
    housekeeper = keeper(clock, batch_size=2, max_batches=2)
    assert housekeeper.tick() == {"a": 0}  # two windows of late finishers: the budget is spent
    clock.now += 1
    assert housekeeper.tick() == {"a": 2}
    assert set(Task.objects.values_list("pk", flat=True)) == {t.pk for t in late}
    del victims


@pytest.mark.django_db
def test_a_failing_pass_is_logged_and_retried_at_the_next_interval(clock, monkeypatch, caplog):
    def broken() -> list[retention.Policy]:
        raise DatabaseError("connection lost")

    monkeypatch.setattr(retention, "policies", broken)
    housekeeper = keeper(clock, node="n1")
    assert housekeeper.tick() == {}
    assert "Retention pass failed (connection lost)" in caplog.text
    assert housekeeper.next_pass == clock.now + 60


def test_retention_interval_is_a_node_setting(settings):
    settings.TASKS_COORD = {"RETENTION_INTERVAL": 0}
    assert NodeConfig.from_settings().retention_interval == 0
    with pytest.raises(ConfigurationError, match="RETENTION_INTERVAL"):
        NodeConfig.from_settings(retention_interval=-1)


def test_a_running_node_applies_the_policies(make_node, work_topic):
    old = old_tasks("work", 3)
    kept = old_tasks("work", 2, state=TaskState.FAILED)
    retention.set_policy("work", keep_completed_days=7)
    queue.push("work", "x", {"result": "SUCCESS"})
    assert run(make_node()) == 0
    assert set(Task.objects.filter(state=TaskState.FAILED).values_list("pk", flat=True)) == {
        t.pk for t in kept
    }
    assert not Task.objects.filter(pk__in=[t.pk for t in old]).exists()
    assert Task.objects.filter(identifier="x", state=TaskState.SUCCEEDED).exists()


def test_a_node_with_retention_off_deletes_nothing(make_node, work_topic):
    old_tasks("work", 3)
    retention.set_policy("work", keep_completed_days=7)
    assert run(make_node(retention_interval=0)) == 0
    assert Task.objects.count() == 3
