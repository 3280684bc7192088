"""Queue throughput on each database: push (single, batch), poll + complete (batch 1/10/100).

Beside each poll + complete figure, the same run measures a plain raw-SQL claim loop
(``SKIP LOCKED`` select, ``UPDATE`` to active, ``UPDATE`` to done; no ORM, no checks) on
the same table and data: the ceiling the queue API is compared with.

Usage::

    ./run bench queue_drain                     # every database that answers
    python -m benchmarks.queue_drain --databases sqlite,postgres --tasks 3000 --repeat 5

Results: ``benchmarks/results/queue.json`` and ``benchmarks/results/queue.md`` (medians
of ``--repeat`` runs; the machine is shared, so compare ratios taken in one run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, configure_django, create_database

URLS = {
    "sqlite": f"sqlite:///{Path(tempfile.gettempdir()) / 'bench_tasks_coord.sqlite3'}",
    "postgres": os.environ.get("POSTGRES_URL", "postgres://root@127.0.0.1:5432/bench_tasks_coord"),
    "mysql": os.environ.get("MYSQL_URL", "mysql://root@127.0.0.1:3306/bench_tasks_coord"),
}


def configure(aliases: list[str]) -> None:
    import environ

    databases = {alias: environ.Env.db_url_config(URLS[alias]) for alias in aliases}
    for alias, config in databases.items():
        if alias == "mysql":
            config["OPTIONS"] = {"charset": "utf8mb4"}
        if alias == "sqlite":
            config["OPTIONS"] = {"timeout": 30}
    databases["default"] = databases[aliases[0]]
    configure_django(databases)


def create_alias_database(alias: str) -> None:
    """Create the benchmark database of ``alias`` on its server if it does not exist yet."""
    from django.db import connections

    create_database(connections.databases[alias])


def reset_table(alias: str) -> None:
    from django.db import connections

    from django_tasks_coord.models import Owner, Task

    Task.objects.using(alias).all().delete()
    Owner.objects.using(alias).all().delete()
    conn = connections[alias]
    if conn.vendor == "postgresql":
        with conn.cursor() as cursor:
            cursor.execute(f"VACUUM ANALYZE {Task._meta.db_table}")


def timed(fn: Callable[[], int]) -> float:
    """Run ``fn`` (which returns how many tasks it handled) and return tasks per second."""
    start = time.perf_counter()
    handled = fn()
    return handled / (time.perf_counter() - start)


def bench_push_single(n: int) -> float:
    from django_tasks_coord import queue

    def run() -> int:
        for i in range(n):
            queue.push("bench", f"id-{i % 100}", {"i": i})
        return n

    return timed(run)


def bench_push_batch(n: int, batch: int = 100) -> float:
    from django_tasks_coord import queue

    def run() -> int:
        for start in range(0, n, batch):
            queue.push_many(
                "bench", [(f"id-{i % 100}", {"i": i}) for i in range(start, start + batch)]
            )
        return n

    return timed(run)


def fill(n: int) -> None:
    from django_tasks_coord import queue

    for start in range(0, n, 1000):
        queue.push_many(
            "bench", [(f"id-{i % 100}", {"i": i}) for i in range(start, min(n, start + 1000))]
        )


def bench_poll_complete(batch: int) -> float:
    from django_tasks_coord import queue

    owner = queue.register_owner()

    def run() -> int:
        handled = 0
        while tasks := queue.poll("bench", batch, owner=owner):
            queue.complete_many(tasks, queue.Result.SUCCESS)
            handled += len(tasks)
        return handled

    rate = timed(run)
    queue.unregister_owner(owner)
    return rate


def bench_raw(alias: str, batch: int) -> float:
    """The ceiling: a raw SQL claim loop on the same table (select SKIP LOCKED, two UPDATEs)."""
    from django.db import connections, transaction

    from django_tasks_coord.models import Task

    conn = connections[alias]
    table = Task._meta.db_table
    exec_id = Task._meta.get_field("exec_id").get_db_prep_value(uuid.uuid4(), conn)
    lock = " FOR UPDATE SKIP LOCKED" if conn.vendor != "sqlite" else ""
    select = (
        f"SELECT sequence FROM {table} WHERE topic_id = %s AND state = 10 "
        f"ORDER BY priority DESC, sequence LIMIT {batch}{lock}"
    )

    def run() -> int:
        handled = 0
        with conn.cursor() as cursor:
            while True:
                with transaction.atomic(using=alias):
                    cursor.execute(select, ["bench"])
                    ids = [row[0] for row in cursor.fetchall()]
                    if not ids:
                        return handled
                    marks = ", ".join(["%s"] * len(ids))
                    cursor.execute(
                        f"UPDATE {table} SET state = 30, exec_id = %s, attempts = attempts + 1 WHERE sequence IN ({marks})",
                        [exec_id, *ids],
                    )
                with transaction.atomic(using=alias):
                    cursor.execute(
                        f"UPDATE {table} SET state = 40 WHERE sequence IN ({marks})", ids
                    )
                handled += len(ids)

    return timed(run)


def run_database(alias: str, tasks: int, repeat: int) -> dict[str, Any]:
    from django.core.management import call_command
    from django.db import connections
    from django.test.utils import override_settings

    from django_tasks_coord import queue

    create_alias_database(alias)
    call_command("migrate", database=alias, verbosity=0)
    samples: dict[str, list[float]] = {}

    def sample(name: str, value: float) -> None:
        samples.setdefault(name, []).append(value)
        print(f"  {alias:8} {name:28} {value:10.0f} tasks/s", flush=True)

    with override_settings(TASKS_COORD={"DATABASE": alias}):
        queue.register_topic("bench")
        for _ in range(repeat):
            reset_table(alias)
            sample("push (single)", bench_push_single(min(tasks, 2000)))
            reset_table(alias)
            sample("push_many (batch 100)", bench_push_batch(tasks))
            for batch in (1, 10, 100):
                reset_table(alias)
                fill(tasks)
                sample(f"poll+complete (batch {batch})", bench_poll_complete(batch))
                reset_table(alias)
                fill(tasks)
                sample(f"raw SQL ceiling (batch {batch})", bench_raw(alias, batch))
        reset_table(alias)
    conn = connections[alias]
    return {
        "vendor": conn.vendor,
        "server": ".".join(map(str, conn.mysql_version))
        if conn.vendor == "mysql"
        else str(getattr(conn, "pg_version", "")),
        "medians": {name: round(statistics.median(values)) for name, values in samples.items()},
        "samples": {name: [round(v) for v in values] for name, values in samples.items()},
    }


def reachable(alias: str) -> bool:
    from django.db import connections

    if alias == "sqlite":
        return True
    try:
        create_alias_database(alias)
        connections[alias].ensure_connection()
    except Exception as exc:  # noqa: BLE001 - report and skip any unreachable server
        print(f"skipping {alias}: {exc}")
        return False
    return True


def write_results(results: dict[str, Any], tasks: int, repeat: int) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "tasks": tasks,
        "repeat": repeat,
    }
    (RESULTS / "queue.json").write_text(
        json.dumps({"meta": meta, "results": results}, indent=2) + "\n"
    )
    lines = [
        "# Queue benchmark",
        "",
        f"{meta['date']}, Python {meta['python']}, {meta['machine']}; {tasks} tasks per figure, "
        f"median of {repeat} runs, tasks/s. The raw SQL ceiling is a claim loop on the same table "
        "(SKIP LOCKED select, UPDATE to active, UPDATE to done) with no ORM and no checks.",
        "",
        "| measure | " + " | ".join(results) + " |",
        "| --- | " + " | ".join("---:" for _ in results) + " |",
    ]
    names = list(next(iter(results.values()))["medians"]) if results else []
    for name in names:
        lines.append(
            f"| {name} | " + " | ".join(str(r["medians"][name]) for r in results.values()) + " |"
        )
    for batch in (1, 10, 100):
        ratios = []
        for r in results.values():
            m = r["medians"]
            ratios.append(
                f"{m[f'poll+complete (batch {batch})'] / m[f'raw SQL ceiling (batch {batch})']:.2f}"
            )
        lines.append(f"| queue / ceiling (batch {batch}) | " + " | ".join(ratios) + " |")
    (RESULTS / "queue.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--databases", default="sqlite,postgres,mysql")
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    aliases = [a for a in args.databases.split(",") if a]
    configure(aliases)
    results = {
        alias: run_database(alias, args.tasks, args.repeat) for alias in aliases if reachable(alias)
    }
    write_results(results, args.tasks, args.repeat)


if __name__ == "__main__":
    main()
