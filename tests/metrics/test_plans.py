"""A scrape of the metrics view stays index-driven on a big task table (PostgreSQL).

The data set of ``tests/queue/test_scale_plans.py`` (200,000 finished tasks over six topics,
3,000 pending; ``TASKS_COORD_PLAN_ROWS`` sets another size), plus jobs whose runs failed
lately and coordination groups. Every statement a scrape runs on the task table is explained
with the same rules as the claim's and the admin's: no ``Seq Scan`` of the task table or a
partition (unless bounded by a LIMIT it keeps every row of), no scan reading more than
20,000 rows. Plans, not times, are asserted; the time of one scrape is printed (``-s``):

    TASKS_COORD_PLAN_ROWS=1000000 DATABASE_URL=postgres://... pytest -s tests/metrics/test_plans.py
"""

from __future__ import annotations

import os
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_tasks_coord import coordination, scheduling, topics
from django_tasks_coord.metrics import state
from django_tasks_coord.models import PeriodicTask
from django_tasks_coord.scheduling import JOBS_TOPIC
from tests.queue.test_scale_plans import (
    COMPLETED,
    PENDING,
    TOPICS,
    build,
    scans_of,
    sql,
)

pytestmark = [
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="plans of PostgreSQL (generate_series)"
    ),
    pytest.mark.django_db,
]

ROWS = int(os.environ.get("TASKS_COORD_PLAN_ROWS", COMPLETED))
RECORD = "tests.testapp.job_functions.record"


def task_statements(call):
    """Run ``call``; return its value and the queries it ran on the task table (a ``UNION
    ALL`` of parenthesized SELECTs included; the planner's estimates, ``EXPLAIN``, left out)."""
    with CaptureQueriesContext(connection) as captured:
        value = call()
    found = [
        q["sql"]
        for q in captured.captured_queries
        if q["sql"].lstrip("(").startswith("SELECT")
        and 'FROM "django_tasks_coord_task"' in q["sql"]
    ]
    return value, found


def job_history(job_ids: list[str], runs: int) -> None:
    """``runs`` finished runs per job in the jobs topic, the last ones failed."""
    topics.register_internal_topic(JOBS_TOPIC)
    for job_id in job_ids:
        sql(
            "INSERT INTO django_tasks_coord_task (topic_id, identifier, payload, handler, state, "
            "priority, attempts, created_at, started_at, finished_at, recreated, label, "
            "requester, outcome_reason, concurrency_key) SELECT %s, %s, NULL, '', "
            "CASE WHEN i > %s - 50 THEN 43 ELSE 40 END, 0, 1, now(), now(), "
            "now() - (%s - i) * interval '1 minute', false, '', '', '', '' "
            "FROM generate_series(1, %s) AS s(i)",
            [JOBS_TOPIC, job_id, runs, runs, runs],
        )
    PeriodicTask.objects.filter(pk__in=job_ids).update(last_outcome=43)
    sql("ANALYZE django_tasks_coord_task")


def test_a_scrape_uses_indexes_at_scale() -> None:
    build(completed=ROWS, pending=PENDING)
    jobs = [
        scheduling.schedule_periodic(RECORD, "hourly", job_id=f"plans-job-{n}") for n in range(20)
    ]
    job_history(jobs, runs=2_000)
    coordination.join("plans-group", "plans-node")
    coordination.try_acquire("plans-group", "plans-node", state.app_settings.liveness_interval)

    started = time.perf_counter()
    read, statements = task_statements(state.read)
    elapsed = time.perf_counter() - started
    print(
        f"\nmetrics scrape at {ROWS:,} finished + {PENDING:,} pending tasks: {elapsed * 1000:.0f} ms"
    )

    assert read.tasks[(TOPICS[0], "pending")] == PENDING  # exact: below the threshold
    assert (TOPICS[1], "succeeded") in read.estimated  # ~32,000: the planner's estimate
    assert all(job.last_success is not None for job in read.jobs)
    assert len(statements) == 3, statements  # counts, oldest pending, jobs
    assert scans_of(statements) == {}


def test_the_counts_would_be_caught_without_their_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not vacuous: counting a topic's states with a plain GROUP BY reads its whole history."""
    build(completed=60_000, pending=1_000)
    topics = list(TOPICS)

    def uncapped() -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                'SELECT topic_id, state, COUNT(*) FROM "django_tasks_coord_task" '
                "WHERE topic_id = ANY(%s) GROUP BY topic_id, state",
                [topics],
            )

    _, statements = task_statements(uncapped)
    assert scans_of(statements)
