"""Set-up and enqueueing for the peer systems, run with the peers' virtualenv's Python.

``benchmarks/throughput.py`` calls it as a subprocess (the peers are never installed in the
project's own environment)::

    python -m benchmarks.benchapp.peers tasks_db migrate
    python -m benchmarks.benchapp.peers tasks_db enqueue 10000
    python -m benchmarks.benchapp.peers procrastinate schema
    python -m benchmarks.benchapp.peers procrastinate enqueue 10000   # prints its seconds

``tasks_db`` needs ``DJANGO_SETTINGS_MODULE=benchmarks.settings``,
``BENCH_SYSTEM=tasks_db`` and ``BENCH_DATABASE``; ``procrastinate`` needs
``BENCH_PROCRASTINATE_DSN``. Each command empties the system's tables before it
enqueues, so every run starts from the same state.
"""

from __future__ import annotations

import argparse
import json
import os
import time

CHUNK = 1000


def tasks_db_migrate() -> None:
    """Create django-tasks-db's table (its migrations)."""
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def tasks_db_enqueue(count: int) -> None:
    """Empty the results table, then insert ``count`` READY no-op tasks with ``bulk_create``.

    ``bulk_create`` of the rows ``DatabaseBackend.enqueue`` would create, one statement per
    1,000: the fastest way in, and the rows are identical (``run_after`` is set as the
    model's ``pre_save`` receiver would, since ``bulk_create`` sends no signals).
    """
    import django

    django.setup()
    from django.db import transaction
    from django_tasks_db.models import DBTaskResult, get_date_max

    from benchmarks.benchapp.peer_tasks import noop

    DBTaskResult.objects.all().delete()
    backend = noop.get_backend()
    with transaction.atomic():
        for start in range(0, count, CHUNK):
            DBTaskResult.objects.bulk_create(
                DBTaskResult(
                    args_kwargs={"args": [], "kwargs": {}},
                    priority=noop.priority,
                    task_path=noop.module_path,
                    queue_name=noop.queue_name,
                    run_after=get_date_max(),
                    backend_name=backend.alias,
                )
                for _ in range(start, min(count, start + CHUNK))
            )


def procrastinate_schema() -> None:
    """Apply procrastinate's schema if the database does not have it yet."""
    import psycopg

    from benchmarks.benchapp.procrastinate_app import app

    with psycopg.connect(os.environ["BENCH_PROCRASTINATE_DSN"]) as conn:
        exists = conn.execute("SELECT to_regclass('procrastinate_jobs')").fetchone()
    if exists and exists[0]:
        return
    with app.open():
        app.schema_manager.apply_schema()


def procrastinate_enqueue(count: int) -> None:
    """Empty procrastinate's tables, then defer ``count`` no-op jobs with ``batch_defer``,
    ``CHUNK`` per call; print the seconds the defers took as JSON (``{"seconds": ...}``:
    the app's start-up, its connection pool opened, is not part of them)."""
    import psycopg

    from benchmarks.benchapp.procrastinate_app import app, noop

    with psycopg.connect(os.environ["BENCH_PROCRASTINATE_DSN"], autocommit=True) as conn:
        conn.execute(
            "TRUNCATE procrastinate_events, procrastinate_periodic_defers, procrastinate_jobs, "
            "procrastinate_workers RESTART IDENTITY CASCADE"
        )
    with app.open():
        started = time.perf_counter()
        for start in range(0, count, CHUNK):
            noop.batch_defer(*({} for _ in range(start, min(count, start + CHUNK))))
        seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("system", choices=["tasks_db", "procrastinate"])
    parser.add_argument("action", choices=["migrate", "schema", "enqueue"])
    parser.add_argument("count", type=int, nargs="?", default=0)
    args = parser.parse_args()
    if args.system == "tasks_db":
        tasks_db_enqueue(args.count) if args.action == "enqueue" else tasks_db_migrate()
    else:
        procrastinate_enqueue(args.count) if args.action == "enqueue" else procrastinate_schema()


if __name__ == "__main__":
    main()
