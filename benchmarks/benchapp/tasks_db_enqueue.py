"""Timed ``.enqueue()`` calls for django-tasks-db, run with the peers' virtualenv's Python.

    python -m benchmarks.benchapp.tasks_db_enqueue 10000
    python -m benchmarks.benchapp.tasks_db_enqueue 10000 --atomic
    python -m benchmarks.benchapp.tasks_db_enqueue --capture-sql

Needs ``DJANGO_SETTINGS_MODULE=benchmarks.settings``, ``BENCH_SYSTEM=tasks_db`` and
``BENCH_DATABASE``. Empties the results table, then calls ``noop.enqueue()`` ``count``
times, as an application would: one call (one autocommitted insert) each, or with
``--atomic`` every call inside one ``transaction.atomic()`` block (its commit timed too);
prints the seconds the calls took as JSON.

``--capture-sql`` times nothing: it makes one ``noop.enqueue()`` call under Django's
``CaptureQueriesContext`` and prints, as JSON, the statements it sent (``queries``, their
parameters interpolated: Django's ``last_executed_query``, with psycopg's client-side binding
and with MySQLdb the very string the driver sent) and the result's ``id`` (its primary key,
which appears in the statement), then empties the table again.
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("count", type=int, nargs="?", default=0)
    parser.add_argument("--atomic", action="store_true", help="all calls in one atomic block")
    parser.add_argument(
        "--capture-sql", action="store_true", help="print the SQL of one call (JSON), time nothing"
    )
    args = parser.parse_args()

    import django

    django.setup()
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext
    from django_tasks_db.models import DBTaskResult

    from benchmarks.benchapp.peer_tasks import noop

    DBTaskResult.objects.all().delete()
    noop.enqueue()  # the first call sets the backend up; not timed
    DBTaskResult.objects.all().delete()
    if args.capture_sql:
        with CaptureQueriesContext(connection) as captured:
            result = noop.enqueue()
        DBTaskResult.objects.all().delete()
        queries = [q["sql"] for q in captured.captured_queries]
        print(json.dumps({"queries": queries, "id": str(result.id)}))
        return
    started = time.perf_counter()
    if args.atomic:
        with transaction.atomic():
            for _ in range(args.count):
                noop.enqueue()
    else:
        for _ in range(args.count):
            noop.enqueue()
    print(json.dumps({"seconds": time.perf_counter() - started}))


if __name__ == "__main__":
    main()
