"""Signals: sent by a real node (threads, real database) after each change is written."""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Iterator
from datetime import timedelta
from importlib.util import find_spec

import pytest
from django.db import DatabaseError
from django.db.backends.utils import CursorWrapper
from django.dispatch import Signal
from django.utils import timezone

from django_tasks_coord import handlers, queue, scheduling, signals
from django_tasks_coord.enums import Result, TaskState
from django_tasks_coord.models import PeriodicTask, Task, TokenHolder
from django_tasks_coord.node.leadership import Leadership
from django_tasks_coord.scheduling import JOBS_TOPIC, scheduler
from django_tasks_coord.topics import register_internal_topic
from tests.node.conftest import run

#: Django's task framework (django.tasks, or the backport on Django 5.2): the @task tests need it.
HAS_TASKS = bool(find_spec("django.tasks") or find_spec("django_tasks"))
needs_tasks = pytest.mark.skipif(not HAS_TASKS, reason="needs Django's task framework")
if HAS_TASKS:
    from django_tasks_coord.backends.compat import TaskResultStatus, task_finished

pytestmark = pytest.mark.django_db(transaction=True)

ALL = {
    name: getattr(signals, name)
    for name in (
        "task_claimed",
        "task_retried",
        "task_completed",
        "job_submitted",
        "job_finished",
        "leader_elected",
        "leader_demoted",
    )
}


@pytest.fixture
def received() -> Iterator[list[tuple[str, type, dict]]]:
    """Every signal of the module, in the order sent: (name, sender, kwargs)."""
    log: list[tuple[str, type, dict]] = []
    receivers = {}
    for name, signal in ALL.items():

        def receiver(sender, signal, _name=name, **kwargs):
            state = kwargs["task"].state if "task" in kwargs else None
            log.append((_name, sender, {**kwargs, "state_when_sent": state}))

        receivers[name] = receiver
        signal.connect(receiver, weak=False)
    yield log
    for name, signal in ALL.items():
        signal.disconnect(receivers[name])


def test_task_signals_follow_a_task_through_the_node(make_node, work_topic, received):
    # The flaky task's retry must come after the burst: an hour away, not the consumer's 0.2 s,
    # which a loaded machine can reach before the burst decides nothing is due. The autouse
    # _restore_registry puts the consumer back.
    work = handlers.registry.consumers()["work"]
    slow_retry = dataclasses.replace(work.retry, retry_interval=3600)
    handlers.registry.add("work", dataclasses.replace(work, retry=slow_retry))
    ok = queue.push("work", "ok")
    filtered = queue.push("work", "filtered", {"result": "FILTER"})
    flaky = queue.push("work", "flaky", {"fail_times": 1})
    node = make_node(node_id="signals-node")
    assert run(node) == 0

    claimed = [kw["task"].sequence for name, _, kw in received if name == "task_claimed"]
    assert sorted(claimed) == sorted([ok.sequence, filtered.sequence, flaky.sequence])
    assert {kw["node"] for name, _, kw in received if name.startswith("task_")} == {"signals-node"}
    assert all(sender is Task for name, sender, _ in received)

    completed = {kw["task"].sequence: kw for name, _, kw in received if name == "task_completed"}
    assert set(completed) == {ok.sequence, filtered.sequence}
    assert completed[ok.sequence]["decision"].result is Result.SUCCESS
    assert completed[filtered.sequence]["decision"].result is Result.FILTER
    # Sent after the outcome was written.
    assert Task.objects.get(pk=ok.pk).state == TaskState.SUCCEEDED

    (retried,) = [kw for name, _, kw in received if name == "task_retried"]
    assert retried["task"].sequence == flaky.sequence
    assert retried["decision"].result is Result.FAILURE
    assert retried["retry_at"] > timezone.now() - timedelta(seconds=5)
    assert Task.objects.get(pk=flaky.pk).state == TaskState.PENDING

    order = [kw["task"].sequence for name, _, kw in received if name != "task_claimed"]
    first_claim = next(i for i, (name, _, _) in enumerate(received) if name == "task_claimed")
    assert first_claim == 0 and len(order) == 3


def test_a_failing_receiver_is_logged_and_the_node_goes_on(make_node, work_topic, caplog):
    def broken(sender, **kwargs):
        raise RuntimeError("receiver bug")

    signals.task_completed.connect(broken, weak=False)
    signals.task_claimed.connect(broken, weak=False)
    try:
        queue.push_many("work", [("a", None), ("b", None)])
        with caplog.at_level(logging.ERROR, logger="django_tasks_coord.signals"):
            assert run(make_node()) == 0
    finally:
        signals.task_completed.disconnect(broken)
        signals.task_claimed.disconnect(broken)
    assert set(Task.objects.values_list("state", flat=True)) == {TaskState.SUCCEEDED}
    failures = [r for r in caplog.records if r.name == "django_tasks_coord.signals"]
    assert len(failures) == 4  # two claims, two completions
    assert "receiver bug" in failures[0].getMessage()
    assert failures[0].exc_info is not None


def test_job_signals(make_node, received):
    register_internal_topic(JOBS_TOPIC)
    at = timezone.now() - timedelta(seconds=1)
    job_id = scheduling.schedule_one_time("tests.testapp.job_functions.noop", at, job_id="once")
    (run_task,) = scheduler.submit_due("node-a")
    (submitted,) = [(s, kw) for name, s, kw in received if name == "job_submitted"]
    assert submitted[0] is PeriodicTask
    assert submitted[1]["job_id"] == job_id
    assert submitted[1]["task"].pk == run_task.pk
    assert submitted[1]["slot"] == run_task.slot
    assert submitted[1]["node"] == "node-a"

    assert run(make_node(topics=[JOBS_TOPIC], scheduler=False)) == 0
    (finished,) = [(s, kw) for name, s, kw in received if name == "job_finished"]
    assert finished[0] is PeriodicTask
    assert finished[1]["job_id"] == job_id
    assert finished[1]["slot"] == run_task.slot
    assert finished[1]["decision"].result is Result.SUCCESS
    assert finished[1]["state_when_sent"] == TaskState.SUCCEEDED


@pytest.fixture
def outcome_writes_fail(monkeypatch):
    """The next ``left`` UPDATEs that write a task's result fail (the batch, then its retry)."""
    failures = {"left": 2}
    execute = CursorWrapper.execute

    def failing(self, sql, params=None):
        table, column = r'UPDATE [`"]django_tasks_coord_task[`"]', r'[`"]result[`"] ='
        if failures["left"] and re.match(table, sql) and re.search(column, sql):
            failures["left"] -= 1
            raise DatabaseError("injected: the outcome write failed")
        return execute(self, sql, params)

    monkeypatch.setattr(CursorWrapper, "execute", failing)
    return failures


@needs_tasks
def test_a_task_outcome_is_signalled_once_after_it_is_stored(make_node, outcome_writes_fail):
    """A @task succeeds but its outcome write fails: it expires and runs again. Only the
    stored outcome is announced, once (it was announced twice: the lost one and the retry's)."""
    from tests.backends import tasks

    seen = []

    def stored_state(task_pk):
        return Task.objects.filter(pk=task_pk).values_list("state", flat=True).get()

    def completed(sender, task, decision, **kwargs):
        seen.append(("task_completed", decision.result, stored_state(task.pk)))

    def finished(sender, task_result, **kwargs):
        row = Task.objects.get(identifier=task_result.id)
        seen.append(("task_finished", task_result.status, stored_state(row.pk)))

    signals.task_completed.connect(completed, weak=False)
    task_finished.connect(finished, weak=False)
    try:
        result = tasks.add.enqueue(1, 2)
        assert run(make_node(topics=["default"])) == 0  # its outcome is not stored
        assert outcome_writes_fail["left"] == 0
        assert run(make_node(topics=["default"])) == 0  # the task runs again
    finally:
        signals.task_completed.disconnect(completed)
        task_finished.disconnect(finished)
    assert tasks.add.get_result(result.id).return_value == 3
    assert sorted(seen) == [
        ("task_completed", Result.SUCCESS, TaskState.SUCCEEDED),  # sent after the commit
        ("task_finished", TaskResultStatus.SUCCESSFUL, TaskState.SUCCEEDED),
    ]


@needs_tasks
def test_a_task_canceled_while_it_runs_is_announced_canceled(make_node, received):
    """A @task succeeds after a cancel was requested while it ran: it ends CANCELED, and
    the completion announced is that one, never a success."""
    from tests.backends import tasks

    finished = []

    def on_finished(sender, task_result, **kwargs):
        finished.append(task_result.status)

    task_finished.connect(on_finished, weak=False)
    try:
        result = tasks.cancelled_while_running.enqueue()
        assert run(make_node(topics=["default"])) == 0
    finally:
        task_finished.disconnect(on_finished)
    row = Task.objects.get(identifier=result.id)
    assert (row.state, row.message) == (TaskState.CANCELED, "canceled by a test")
    names = [name for name, _, _ in received]
    assert names == ["task_claimed", "task_completed"]
    assert received[1][2]["state_when_sent"] == TaskState.CANCELED
    assert finished == [TaskResultStatus.FAILED]


def test_leader_signals(received):
    lead = Leadership("g", "n1", liveness=5.0, heartbeat=0.1, on_change=lambda term: None)
    lead.start()
    lead.stop()
    events = [(name, sender, kw) for name, sender, kw in received if name.startswith("leader_")]
    assert [name for name, _, _ in events] == ["leader_elected", "leader_demoted"]
    assert all(sender is TokenHolder for _, sender, _ in events)
    elected, demoted = events[0][2], events[1][2]
    assert (elected["group"], elected["node"]) == ("g", "n1")
    assert elected["term"] >= 1
    assert demoted["term"] == elected["term"]
    assert demoted["reason"] == "this node is stopping"


def test_signals_are_plain_django_signals():
    assert all(isinstance(signal, Signal) for signal in ALL.values())
    assert set(signals.__all__) == {*ALL, "send"}


def test_log_records_carry_structured_fields(make_node, work_topic, caplog):
    flaky = queue.push("work", "flaky", {"fail_times": 1})
    with caplog.at_level(logging.INFO, logger="django_tasks_coord"):
        assert run(make_node(node_id="logging-node")) == 0
    (retry,) = [r for r in caplog.records if "retrying in" in r.getMessage()]
    assert (retry.node, retry.topic, retry.task_sequence, retry.attempt) == (
        "logging-node",
        "work",
        flaky.sequence,
        1,
    )
    stopped = [r for r in caplog.records if r.getMessage().startswith("Node logging-node stopped")]
    assert stopped[0].node == "logging-node"
    assert stopped[0].retried == 1
