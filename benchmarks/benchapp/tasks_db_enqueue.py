"""Timed ``.enqueue()`` calls for django-tasks-db, run with the peers' virtualenv's Python.

    python -m benchmarks.benchapp.tasks_db_enqueue 10000

Needs ``DJANGO_SETTINGS_MODULE=benchmarks.settings``, ``BENCH_SYSTEM=tasks_db`` and
``BENCH_DATABASE``. Empties the results table, then calls ``noop.enqueue()`` ``count``
times, one call (one autocommitted insert) each, as an application would; prints the
seconds the calls took as JSON.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    import django

    django.setup()
    from django_tasks_db.models import DBTaskResult

    from benchmarks.benchapp.peer_tasks import noop

    count = int(sys.argv[1])
    DBTaskResult.objects.all().delete()
    noop.enqueue()  # the first call sets the backend up; not timed
    DBTaskResult.objects.all().delete()
    started = time.perf_counter()
    for _ in range(count):
        noop.enqueue()
    print(json.dumps({"seconds": time.perf_counter() - started}))


if __name__ == "__main__":
    main()
