"""An identifier's unfinished tasks: ``TaskQuerySet.unfinished_of`` and its index.

On every database ``unfinished_of`` selects what ``identifier=..., state__lt=40`` selects.
On MySQL/MariaDB it compares the virtual column ``unfinished_identifier`` (migration
0011), so that the ``(topic_id, unfinished_identifier)`` index serves it; finished tasks
all have NULL there, and finishing one moves its index entry to the end of its topic's
range instead of to its identifier's page in the whole history
(``benchmarks/results/scale.md``). The plan tests run the product's real SQL (the
no-overlap check of the due-jobs query, ``Insertion.REPLACE``/``SUPERSEDE`` and a poll
condition) and fail if a query compares ``identifier`` and ``state`` instead.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection
from django.db.models import BooleanField, Exists, ExpressionWrapper, OuterRef
from django.test.utils import CaptureQueriesContext

from django_tasks_coord import queue, scheduling
from django_tasks_coord.enums import COMPLETED_MIN, Condition, Insertion, TaskState
from django_tasks_coord.models import UNFINISHED_IDENTIFIER, PeriodicTask, Task
from django_tasks_coord.scheduling import JOBS_TOPIC, scheduler
from django_tasks_coord.topics import register_internal_topic

pytestmark = pytest.mark.django_db

mysql_only = pytest.mark.skipif(connection.vendor != "mysql", reason="MySQL/MariaDB virtual column")


def one_task_in_each_state(topic: str, identifier: str) -> dict[TaskState, Task]:
    tasks = {}
    for state in TaskState:
        (task,) = queue.push_many(topic, [(identifier, state.value)])
        Task.objects.filter(pk=task.pk).update(state=state, exec_id=uuid.uuid4())
        tasks[state] = task
    return tasks


def test_unfinished_of_selects_the_unfinished_tasks_of_its_identifiers(topic: Any) -> None:
    a = one_task_in_each_state("jobs", "a")
    b = one_task_in_each_state("jobs", "b")
    one_task_in_each_state("jobs", "c")
    unfinished = {s for s in TaskState if s.value < COMPLETED_MIN}
    assert unfinished and unfinished != set(TaskState)
    tasks = Task.objects.for_topic("jobs")

    assert {t.pk for t in tasks.unfinished_of("a")} == {a[s].pk for s in unfinished}
    assert {t.pk for t in tasks.unfinished_of(["a", "b"])} == {
        t.pk for t in (*[a[s] for s in unfinished], *[b[s] for s in unfinished])
    }
    assert not tasks.unfinished_of([]).exists()
    assert not tasks.unfinished_of("nobody").exists()
    assert set(tasks.unfinished_of(["a", "b", "c"])) == set(tasks.filter(state__lt=COMPLETED_MIN))


def test_unfinished_of_an_outer_reference(topic: Any) -> None:
    """As a subquery: does a later unfinished task of the same identifier exist?"""
    queue.push_many("jobs", [("a", 1), ("b", 1), ("c", 1), ("a", 2), ("c", 2)])
    queue.complete_many(queue.poll("jobs", 3), queue.Decision(queue.Result.SUCCESS))
    Task.objects.filter(identifier="c", payload=2).update(state=TaskState.FAILED)
    later_unfinished = Task.objects.filter(
        topic_id=OuterRef("topic_id"), sequence__gt=OuterRef("sequence")
    ).unfinished_of(OuterRef("identifier"))
    finished = Task.objects.for_topic("jobs").filter(state__gte=COMPLETED_MIN)
    followed = finished.annotate(followed=Exists(later_unfinished)).values_list(
        "identifier", "followed"
    )
    assert sorted(followed) == [("a", True), ("b", False), ("c", False), ("c", False)]


@mysql_only
def test_the_virtual_column_holds_the_identifier_until_the_task_finishes(topic: Any) -> None:
    tasks = one_task_in_each_state("jobs", "a")
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT sequence, {UNFINISHED_IDENTIFIER} FROM django_tasks_coord_task "
            "WHERE topic_id = 'jobs'"
        )
        column = dict(cursor.fetchall())
    assert column == {
        task.pk: ("a" if state.value < COMPLETED_MIN else None) for state, task in tasks.items()
    }


@mysql_only
def test_the_unfinished_index_is_over_the_virtual_column() -> None:
    with connection.cursor() as cursor:
        indexes = connection.introspection.get_constraints(cursor, Task._meta.db_table)
    assert indexes["tasks_coord_unfinished"]["columns"] == ["topic_id", UNFINISHED_IDENTIFIER]


# --- plans (MySQL/MariaDB) ------------------------------------------------------------------

HISTORY_PER_IDENTIFIER = 100
IDENTIFIERS = 100


#: ``ANALYZE TABLE`` commits the transaction it runs in (an implicit commit on MySQL and
#: MariaDB), so the plan tests cannot run inside the usual rolled-back transaction: they
#: flush the tables after themselves instead.
analyzes = pytest.mark.django_db(transaction=True)


def build_history(topic: str) -> None:
    """100 identifiers with 100 finished tasks each and one pending task each, analyzed."""
    Task.objects.bulk_create(
        Task(topic_id=topic, identifier=f"id-{i % IDENTIFIERS}", state=TaskState.SUCCEEDED)
        for i in range(IDENTIFIERS * HISTORY_PER_IDENTIFIER)
    )
    queue.push_many(topic, [(f"id-{i}", None) for i in range(IDENTIFIERS)])
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE TABLE {Task._meta.db_table}")
        cursor.fetchall()


def task_table_keys(sql: str, params: Any = ()) -> list[set[str]]:
    """For each read of the task table in ``sql``'s MySQL/MariaDB plan, the indexes it uses.

    An ``index_merge`` read uses several; a full scan uses none (an empty set).
    """
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN FORMAT=JSON {sql}", params)
        plan = json.loads(cursor.fetchone()[0])
    reads: list[set[str]] = []

    def keys(node: Any) -> Iterator[str]:
        if isinstance(node, dict):
            if "key" in node:
                yield node["key"]
            for value in node.values():
                yield from keys(value)
        elif isinstance(node, list):
            for value in node:
                yield from keys(value)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("table_name") in (Task._meta.db_table, "U0", "U1"):
                reads.append(set(keys({k: v for k, v in node.items() if k != "table_name"})))
                return
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(plan)
    return reads


def statements(call: Callable[[], Any], start: str) -> list[str]:
    """The statements ``call`` sends that start with ``start``, with their parameters inlined."""
    with CaptureQueriesContext(connection) as captured:
        call()
    return [q["sql"] for q in captured.captured_queries if q["sql"].startswith(start)]


@mysql_only
@analyzes
@pytest.mark.parametrize("insertion", [Insertion.REPLACE, Insertion.SUPERSEDE])
def test_insertion_modes_find_unfinished_tasks_by_the_index(
    topic: Any, insertion: Insertion
) -> None:
    build_history("jobs")
    (update,) = statements(lambda: queue.push("jobs", "id-7", insertion=insertion), "UPDATE")
    (read,) = task_table_keys(update)
    assert "tasks_coord_unfinished" in read
    assert Task.objects.unfinished_of("id-7").count() == 1


@mysql_only
@analyzes
def test_a_poll_condition_finds_earlier_unfinished_tasks_by_the_index(topic: Any) -> None:
    build_history("jobs")
    claims = statements(
        lambda: queue.poll("jobs", 10, condition=Condition.SINGULAR_BY_IDENTIFIER), ""
    )
    # The tasks the condition lets through are picked by a plain SELECT, before the claim
    # locks them (a locking statement's subquery would wait for rows locked elsewhere).
    (picked,) = [
        sql for sql in claims if sql.startswith("SELECT") and "`unfinished_identifier`" in sql
    ]
    assert "FOR UPDATE" not in picked
    reads = task_table_keys(picked)
    assert any("tasks_coord_unfinished" in read for read in reads), reads


@mysql_only
@analyzes
def test_the_no_overlap_check_finds_a_jobs_run_by_the_index() -> None:
    register_internal_topic(JOBS_TOPIC)
    for i in range(IDENTIFIERS):
        scheduling.schedule_recurring("tests.testapp.job_functions.record", 60, job_id=f"id-{i}")
    build_history(JOBS_TOPIC)
    qs = (
        PeriodicTask.objects.filter(scheduler.schedulable())
        .annotate(
            run_in_flight=ExpressionWrapper(scheduler._run_in_flight(), output_field=BooleanField())
        )
        .order_by("nextrun")[:500]
    )
    sql, params = qs.query.sql_with_params()
    reads = task_table_keys(sql, params)
    assert reads and all("tasks_coord_unfinished" in read for read in reads), reads
