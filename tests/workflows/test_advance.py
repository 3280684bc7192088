"""Advancing, without nodes: outcomes recorded, a fan-in enqueued exactly once (stale
advancers, a crash mid-way, two advancers racing), the steps of every kind."""

from __future__ import annotations

import itertools
import threading

import pytest
from django.db import OperationalError, connections
from django.test.utils import CaptureQueriesContext

from django_tasks_coord import db, executions, partitions, queue, workflows
from django_tasks_coord.enums import Decision, Result
from django_tasks_coord.models import Task, Workflow, WorkflowStep
from django_tasks_coord.store import workflows as store
from django_tasks_coord.workflows import StepState, WorkflowState
from django_tasks_coord.workflows.advance import ready_workflows, record_outcomes, settle
from tests.api import defs  # noqa: F401  (declares the test definitions)
from tests.conftest import skip_unless_row_locks


@pytest.fixture
def work(db):
    return queue.register_topic("work")


def fan_in(parents: int, name: str = "fan") -> int:
    """A workflow of ``parents`` pushes to ``work`` and a fan-in push after them all."""
    group = [workflows.push("work", f"{name}-{n}", {"n": n}, name=f"p{n}") for n in range(parents)]
    join = workflows.push("work", f"{name}-join", {}, name="join", results=True)
    return workflows.start(name, workflows.chain(workflows.group(group), join))


def complete_all(topic: str = "work") -> int:
    owner = queue.register_owner(f"completer-{next(_owners)}")
    done = 0
    while tasks := queue.poll(topic, 100, owner=owner):
        queue.complete_many(tasks, Decision(Result.SUCCESS))
        done += len(tasks)
    return done


_owners = itertools.count()


def joins(name: str = "fan") -> int:
    return Task.objects.filter(identifier=f"{name}-join").count()


@pytest.mark.django_db
def test_the_fan_in_is_enqueued_once_its_last_parent_ended_with_their_results(work):
    workflow_id = fan_in(3)
    owner = queue.register_owner("n")
    first_two = queue.poll("work", 2, owner=owner)
    queue.complete_many(first_two, Decision(Result.SUCCESS))
    assert workflows.advance().advanced == 1
    assert joins() == 0  # one parent still runs
    assert complete_all() == 1
    assert workflows.advance().advanced == 1
    join = Task.objects.get(identifier="fan-join")
    assert join.payload == {"results": {"p0": None, "p1": None, "p2": None}}
    assert workflows.get(workflow_id).steps["join"].task_sequence == join.sequence
    complete_all()
    workflows.advance()
    assert workflows.get(workflow_id).state == WorkflowState.SUCCEEDED
    assert workflows.advance().advanced == 0  # nothing left to do


@pytest.mark.django_db
def test_a_stale_advancer_pushes_nothing_the_guard_of_the_step_refuses(work):
    workflow_id = fan_in(3)
    complete_all()
    workflow = Workflow.objects.get(pk=workflow_id)
    with db.write_transaction():  # the parents' outcomes are recorded: the fan-in is ready
        record_outcomes(list(WorkflowStep.objects.filter(state=StepState.ENQUEUED)))
    seen_by_one = list(WorkflowStep.objects.filter(workflow=workflow).order_by("id"))
    seen_by_two = list(WorkflowStep.objects.filter(workflow=workflow).order_by("id"))
    with db.write_transaction():
        settle(workflow, seen_by_one)
    with db.write_transaction():  # as if no lock had kept it out: it read the same rows
        settle(Workflow.objects.get(pk=workflow_id), seen_by_two)
    assert joins() == 1


@pytest.mark.django_db(transaction=True)
def test_a_crash_mid_way_rolls_back_and_the_next_advance_does_it_once(work, monkeypatch):
    fan_in(3)
    complete_all()
    record = store.record_task

    def crash(*args, **kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(store, "record_task", crash)
    with pytest.raises(OperationalError):
        workflows.advance()
    assert joins() == 0  # the push was rolled back with the rest
    assert set(WorkflowStep.objects.values_list("state", flat=True)) == {
        StepState.ENQUEUED,
        StepState.WAITING,
    }
    monkeypatch.setattr(store, "record_task", record)
    assert workflows.advance().advanced == 1
    assert joins() == 1


@pytest.mark.django_db
def test_a_step_whose_task_was_deleted_fails(work):
    workflow_id = workflows.start("gone", workflows.push("work", "x", name="x"))  # one step
    queue.purge("work", Task.objects.get().sequence + 1)
    workflows.advance()
    status = workflows.get(workflow_id)
    assert status.steps["x"].state == StepState.FAILED
    assert "deleted" in status.steps["x"].message
    assert status.state == WorkflowState.FAILED


@pytest.mark.django_db
def test_a_filtered_task_skips_its_step_and_its_dependants_run(work):
    workflow_id = workflows.start(
        "skip", workflows.chain(workflows.push("work", "x", name="x"), workflows.push("work", "y"))
    )
    owner = queue.register_owner("n")
    queue.complete(queue.poll("work", owner=owner)[0], Decision(Result.FILTER))
    workflows.advance()
    status = workflows.get(workflow_id)
    assert status.steps["x"].state == StepState.SKIPPED
    assert Task.objects.filter(identifier="y").exists()


@pytest.mark.django_db
def test_a_definition_step_gets_its_executors_result(work):
    first = workflows.definition("test/basic", {"a": 1}, name="ext")
    then = workflows.push("work", "after", {}, name="after", after=first, results=True)
    workflow_id = workflows.start("ext", [first, then])
    [handed] = executions.poll(["test/basic"], start=True)
    executions.succeed(handed.pk, handed.exec_id, {"sum": 3})
    workflows.advance()
    status = workflows.get(workflow_id)
    assert status.steps["ext"].result == {"sum": 3}
    assert Task.objects.get(identifier="after").payload == {"results": {"ext": {"sum": 3}}}


@skip_unless_row_locks()
@pytest.mark.django_db(transaction=True)
def test_two_advancers_racing_enqueue_every_fan_in_exactly_once(work):
    names = [f"w{n}" for n in range(12)]
    for name in names:
        fan_in(20, name)
    complete_all()
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def advancer() -> None:
        try:
            barrier.wait()
            for _ in range(50):
                if not workflows.advance(limit=3).advanced and not Task.objects.filter(
                    identifier__endswith="-join"
                ).count() < len(names):
                    break
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=advancer) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert all(joins(name) == 1 for name in names), {name: joins(name) for name in names}


@pytest.mark.django_db
def test_the_ready_query_plans_only_the_partitions_of_the_enqueued_steps_topics(work):
    """PostgreSQL: a subquery on the task table whose topic comes from the outer row is
    planned over every partition (every topic's), on every round of every node."""
    conn = db.connection()
    if not partitions.is_partitioned(conn):
        pytest.skip("the task table is partitioned by topic on PostgreSQL only")
    queue.register_topic("other")
    fan_in(2)
    complete_all()
    with CaptureQueriesContext(conn) as captured:
        assert ready_workflows(10)
    with conn.cursor() as cursor:
        cursor.execute("EXPLAIN " + captured.captured_queries[-1]["sql"])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert partitions.partition_name("work") in plan
    assert partitions.partition_name("other") not in plan, plan


@pytest.mark.django_db
def test_with_no_step_enqueued_one_prebuilt_statement_asks_and_ends(work, monkeypatch):
    """The completer asks after every batch of completions: without workflows in flight,
    one short statement, built once (not a query compiled per batch, nor the join)."""
    from django.db.models.sql import compiler

    conn = db.connection()
    ready_workflows(10)  # builds it
    compiled = []
    real = compiler.SQLCompiler.as_sql
    monkeypatch.setattr(
        compiler.SQLCompiler,
        "as_sql",
        lambda self, *a, **k: compiled.append(1) or real(self, *a, **k),
    )
    with CaptureQueriesContext(conn) as captured:
        assert ready_workflows(10) == []
        assert ready_workflows(10) == []
    assert not compiled
    assert len(captured.captured_queries) == 2
    assert all("EXISTS" not in query["sql"].upper() for query in captured.captured_queries)
    fan_in(2)  # the same prebuilt statement sees steps enqueued now
    complete_all()
    assert ready_workflows(10)
