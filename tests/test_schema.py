"""The claim indexes exist in the shape each database allows, and the claim query uses them."""

import pytest
from django.db import connection

from django_tasks_coord import queue
from django_tasks_coord.models import Task
from django_tasks_coord.topics import register_internal_topic
from tests.plans import explain

pytestmark = pytest.mark.django_db


def index_definitions() -> dict[str, dict]:
    with connection.cursor() as cursor:
        return connection.introspection.get_constraints(cursor, Task._meta.db_table)


def test_claim_indexes_exist():
    indexes = index_definitions()
    assert "tasks_coord_claim_fifo" in indexes
    assert "tasks_coord_claim_lifo" in indexes
    fifo = indexes["tasks_coord_claim_fifo"]["columns"]
    if connection.features.supports_partial_indexes:
        assert fifo == ["topic_id", "priority", "sequence"]
    else:
        assert fifo == ["topic_id", "state", "priority", "sequence"]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL partial index")
def test_claim_index_is_partial_on_postgresql():
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'tasks_coord_claim_fifo'")
        (definition,) = cursor.fetchone()
    assert "WHERE (state = 10)" in definition
    assert "priority DESC" in definition


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL planner")
@pytest.mark.parametrize(("order", "index"), [("fifo", "claim_fifo"), ("lifo", "claim_lifo")])
def test_the_claim_query_is_served_by_its_index(order, index):
    queue.register_topic("jobs")
    queue.push_many("jobs", [(f"t{i}", None) for i in range(200)])
    sequence = "sequence" if order == "fifo" else "-sequence"
    qs = Task.objects.for_topic("jobs").due().order_by("-priority", sequence)[:10]
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_tasks_coord_task")
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off")
        sql, params = qs.query.sql_with_params()
        plan = explain(sql, params)
    assert f"tasks_coord_{index}" in plan
    assert "Sort" not in plan  # the index gives the order


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL partial index")
def test_timeout_and_unfinished_indexes_are_partial_on_postgresql():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE indexname IN "
            "('tasks_coord_unfinished', 'tasks_coord_deadline')"
        )
        definitions = dict(cursor.fetchall())
    assert "WHERE (state < 40)" in definitions["tasks_coord_unfinished"]
    assert "state = ANY" in definitions["tasks_coord_deadline"]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL planner")
def test_due_jobs_look_up_their_unfinished_run_by_identifier():
    """Right after a scheduler pushed many runs (statistics not refreshed yet), the
    due-jobs query must look each job's run up by (topic, identifier), not walk every
    unfinished row once per job: that made each batch of a 10,000-job second slower
    than the last (from 50 to 500 ms) in benchmarks/scheduling.py."""
    from django.db.models import BooleanField, ExpressionWrapper

    from django_tasks_coord.models import PeriodicTask
    from django_tasks_coord.scheduling import JOBS_TOPIC, scheduler
    from django_tasks_coord.scheduling.scheduler import _run_in_flight

    register_internal_topic(JOBS_TOPIC)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_tasks_coord_task")  # statistics of an empty table
    queue.push_many(JOBS_TOPIC, [(f"job-{i}", None) for i in range(2000)])
    qs = (
        PeriodicTask.objects.filter(scheduler.schedulable())
        .annotate(run_in_flight=ExpressionWrapper(_run_in_flight(), output_field=BooleanField()))
        .order_by("nextrun")[:500]
    )
    sql, params = qs.query.sql_with_params()
    plan = explain(sql, params)
    assert "tasks_coord_unfinished" in plan
