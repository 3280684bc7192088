"""Benchmark: the admin's task changelist on a large task table (PostgreSQL).

Run from the repository root::

    python -m benchmarks.admin [--rows 1000000] [--repeat 7] [--no-write]

Fills a dedicated PostgreSQL database (``bench_admin`` on 127.0.0.1:5432, or
``BENCH_ADMIN_URL``) with ``--rows`` tasks spread over 10 topics and 50,000
identifiers (1 % failed, 0.1 % pending, the rest succeeded; created one second apart)
using ``generate_series``, analyzes it, then times whole requests of the task
changelist through Django's test client as a superuser: unfiltered, by state, by
topic, by identifier, a search, a date range, recreated, and a deep page. Each
figure is the median of ``--repeat`` requests (after one warm-up request); the target
is a filtered changelist under 500 ms. The table is kept between runs (only missing
rows are added). Results go to ``benchmarks/results/admin.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from datetime import UTC, datetime
from typing import Any

from benchmarks.common import RESULTS, create_database, load_average

TARGET_MS = 500
URL = "/admin/django_tasks_coord/task/"
CASES: dict[str, dict[str, str]] = {
    "unfiltered": {},
    "state = failed": {"state__exact": "43"},
    "one topic": {"topic__name__exact": "topic-3"},
    "one topic, state = failed": {"topic__name__exact": "topic-3", "state__exact": "43"},
    "identifier": {"identifier": "id-777"},
    "search (identifier)": {"q": "id-777"},
    "finished in a date range": {"finished_at__gte": "2000-01-01 00:00:00+00:00"},
    "recreated": {"recreated": "1"},
    "state = failed, page 20": {"state__exact": "43", "p": "20"},
}


def setup(url: str) -> None:
    """Create the database if needed and set Django up on it (the test settings' apps)."""
    import environ

    create_database(environ.Env.db_url_config(url))
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    import django

    django.setup()


def fill(rows: int) -> dict[str, Any]:
    """Migrate and add the missing task rows; return how many there are and how long it took."""
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM django_tasks_coord_task")
        have = cursor.fetchone()[0]
        if have < rows:
            cursor.execute(
                "INSERT INTO django_tasks_coord_topic (name, paused, consecutive_failures, "
                "created_at) SELECT 'topic-' || i, false, 0, now() FROM generate_series(0, 9) i "
                "ON CONFLICT DO NOTHING"
            )
            cursor.execute(
                """
                INSERT INTO django_tasks_coord_task (topic_id, identifier, payload, handler, state,
                    priority, attempts, created_at, finished_at, recreated, label, requester,
                    outcome_reason, concurrency_key, message)
                SELECT 'topic-' || (i %% 10), 'id-' || (i %% 50000), '{"n": 1}'::jsonb, '',
                       CASE WHEN i %% 100 = 0 THEN 43 WHEN i %% 1000 = 1 THEN 10 ELSE 40 END,
                       0, 1, now() - (%s - i) * interval '1 second',
                       CASE WHEN i %% 1000 = 1 THEN NULL
                            ELSE now() - (%s - i) * interval '1 second' + interval '1 second' END,
                       false, '', '', '', '', NULL
                FROM generate_series(%s, %s) i
                """,
                [rows, rows, have, rows - 1],
            )
            cursor.execute("VACUUM ANALYZE django_tasks_coord_task")
        cursor.execute("SELECT count(*) FROM django_tasks_coord_task")
        total = cursor.fetchone()[0]
    return {"rows": total, "added": max(rows - have, 0), "fill_s": time.perf_counter() - started}


def measure(repeat: int) -> dict[str, dict[str, Any]]:
    """Median/max request time of each changelist case, with what the page counted."""
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.test.utils import setup_test_environment

    user_model = get_user_model()
    user_model.objects.filter(username="bench").delete()
    user = user_model.objects.create_superuser("bench", password="unused")
    setup_test_environment()
    client = Client()
    client.force_login(user)
    results = {}
    for name, params in CASES.items():
        client.get(URL, params)  # warm-up: plans, caches
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            response = client.get(URL, params)
            times.append((time.perf_counter() - started) * 1000)
            if response.status_code != 200:
                raise RuntimeError(f"{name}: HTTP {response.status_code}")
        changelist = response.context["cl"]
        results[name] = {
            "params": params,
            "median_ms": round(statistics.median(times), 1),
            "max_ms": round(max(times), 1),
            "result_count": changelist.result_count,
            "estimated": bool(getattr(changelist.paginator, "estimated", False)),
            "capped": bool(getattr(changelist.paginator, "capped", False)),
        }
        print(f"  {name:28s} median {results[name]['median_ms']:7.1f} ms", flush=True)
    user.delete()
    return results


def markdown(meta: dict[str, Any], cases: dict[str, dict[str, Any]]) -> str:
    """The results page."""
    lines = [
        "# Admin benchmark: the task changelist on a large table",
        "",
        f"{meta['date']}; {meta['machine']}; Python {meta['python']}, Django {meta['django']}, "
        f"PostgreSQL {meta['server']}; {meta['rows']:,} task rows; median of {meta['repeat']} "
        f"whole requests (test client, superuser) after a warm-up; load average "
        f"{meta['load_before']} -> {meta['load_after']}.",
        "",
        f"Target: a filtered changelist under {TARGET_MS} ms.",
        "",
        "| list | median ms | max ms | count shown | estimated | capped | under target |",
        "| --- | ---: | ---: | ---: | --- | --- | --- |",
    ]
    for name, r in cases.items():
        lines.append(
            f"| {name} | {r['median_ms']} | {r['max_ms']} | {r['result_count']:,} | "
            f"{'yes' if r['estimated'] else 'no'} | {'yes' if r['capped'] else 'no'} | "
            f"{'yes' if r['median_ms'] < TARGET_MS else '**no**'} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    url = os.environ.get("BENCH_ADMIN_URL", "postgres://root@127.0.0.1:5432/bench_admin")
    setup(url)
    import django
    from django.db import connection

    load_before = load_average(" / ")
    filled = fill(args.rows)
    print(f"{filled['rows']:,} rows ({filled['added']:,} added in {filled['fill_s']:.1f} s)")
    if filled["rows"] < 300_000:  # fewer failed tasks than 20 pages of them
        CASES["state = failed, page 20"]["p"] = "2"
    cases = measure(args.repeat)
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
        "python": platform.python_version(),
        "django": django.get_version(),
        "server": connection.cursor().connection.info.parameter_status("server_version"),
        "rows": filled["rows"],
        "repeat": args.repeat,
        "load_before": load_before,
        "load_after": load_average(" / "),
    }
    if args.no_write:
        return
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "admin.json").write_text(json.dumps({"meta": meta, "cases": cases}, indent=2))
    (RESULTS / "admin.md").write_text(markdown(meta, cases))
    print(f"written: {RESULTS / 'admin.json'}, {RESULTS / 'admin.md'}")


if __name__ == "__main__":
    main()
