"""Django's ``@task`` API on this project's backend, beside django-tasks-db, in one run.

For each database asked for (``--databases``, default PostgreSQL and SQLite), each round:

- **enqueue**: ``--tasks`` calls of ``noop.enqueue()`` (Django's API, one call and one
  autocommitted insert each), timed around the loop. Ours runs in this process with
  ``DatabaseBackend``; django-tasks-db's in its peers' virtualenv
  (``benchmarks.benchapp.tasks_db_enqueue``), on a database of its own on the same server.
- **drain**: one worker process drains what was enqueued. Ours: ``runscheduler --burst``
  with the default settings, and with settings tuned for no-op tasks (:data:`TUNED`);
  django-tasks-db: ``db_worker --batch --interval 0`` (one task at a time), stopped after
  ``PEER_TIME_BOX`` seconds and timed on the tasks it finished (its rate does not depend
  on how far into the queue it is). Tasks/s = tasks / (last finish - first start), read
  from each system's own table, so process start-up is excluded; the wall time is
  reported beside it.

Targets (issue 8): ours drains at least 10x faster than django-tasks-db on PostgreSQL,
and no slower on SQLite.

Usage::

    ./run bench django_tasks
    python -m benchmarks.django_tasks --databases postgres,sqlite --tasks 10000 --repeat 1

Results: ``benchmarks/results/django_tasks.json`` and ``benchmarks/results/django_tasks.md``.
Reuses ``benchmarks/throughput.py``'s helpers (servers, processes, the peers' virtualenv).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import UTC, datetime
from typing import Any

from benchmarks import throughput as tp
from benchmarks.cluster import run_node
from benchmarks.common import (
    BASE_APPS,
    LABELS,
    bench_env,
    create_database,
    database,
    git_revision,
    load_average,
    machine,
    query,
    tidy,
    write_report,
)

OURS_DB = "bench_django_tasks"
TASKS_DB_DB = "bench_django_tasks_db"  # not throughput.py's: the two may run at once
PEER_TIME_BOX = 60.0
OURS_DEFAULT = "ours, defaults"
OURS_TUNED = "ours, tuned"
TASKS_DB = "django-tasks-db"
SYSTEMS = (OURS_DEFAULT, OURS_TUNED, TASKS_DB)
#: Node settings for a no-op drain. A Django task's worker waits for its outcome's batched
#: write, so more worker threads mean bigger batches (threads that wait cost no CPU).
TUNED = {"WORKERS": 32, "BUFFER": 1000, "BATCH_SIZE": 500}


def configure(vendors: list[str]) -> None:
    """Set Django up in this process with our benchmark database and django-tasks-db's per vendor."""
    import django
    from django.conf import settings

    databases = {}
    for vendor in vendors:
        for name in (OURS_DB, TASKS_DB_DB):
            databases[tp.alias_of(vendor, name)] = database(vendor, name)
    databases["default"] = databases[tp.alias_of(vendors[0], OURS_DB)]
    settings.configure(
        DATABASES=databases,
        INSTALLED_APPS=list(BASE_APPS),
        USE_TZ=True,
        TIME_ZONE="UTC",
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        LOGGING_CONFIG=None,
        TASKS={
            "default": {
                "BACKEND": "django_tasks_coord.backends.DatabaseBackend",
                "QUEUES": ["default"],
            }
        },
    )
    django.setup()


def migrate_ours(vendor: str) -> None:
    from django.core.management import call_command

    create_database(database(vendor, OURS_DB))
    call_command("migrate", database=tp.alias_of(vendor, OURS_DB), verbosity=0)


def enqueue_ours(vendor: str, count: int) -> float:
    """Empty our task table, then time ``count`` ``noop.enqueue()`` calls; return seconds."""
    from django.test.utils import override_settings

    from django_tasks_coord import queue
    from django_tasks_coord.models import Owner, Task

    alias = tp.alias_of(vendor, OURS_DB)
    with override_settings(TASKS_COORD={"DATABASE": alias}):
        from benchmarks.benchapp.coord_tasks import noop

        queue.known_topics.clear()  # the topic cache is per process, not per database

        Task.objects.using(alias).all().delete()
        Owner.objects.using(alias).all().delete()
        noop.enqueue()  # the first call registers the topic; not timed
        Task.objects.using(alias).all().delete()
        started = time.perf_counter()
        for _ in range(count):
            noop.enqueue()
        elapsed = time.perf_counter() - started
    tidy(alias, Task._meta.db_table)
    return elapsed


def drain_ours(vendor: str, count: int, settings: dict[str, Any]) -> tp.Drain:
    """Drain the queue with one ``runscheduler --burst`` process."""
    from django.db.models import Count, Max, Min, Q

    from django_tasks_coord.enums import TaskState
    from django_tasks_coord.models import Task

    env = bench_env(database(vendor, OURS_DB), tasks_coord=settings, BENCH_TASKS_BACKEND="1")
    code, wall, output = run_node(env, "--burst", "--topic", "default", "-v", "0")
    if code:
        raise RuntimeError(f"runscheduler --burst exited with {code}:\n{output}")
    row = (
        Task.objects.using(tp.alias_of(vendor, OURS_DB))
        .filter(topic_id="default")
        .aggregate(
            done=Count("pk", filter=Q(state=TaskState.SUCCEEDED)),
            first=Min("started_at"),
            last=Max("finished_at"),
        )
    )
    what = f"runscheduler (output: {output[-1500:]!r})"
    return tp.drain_from([(row["done"], row["first"], row["last"])], wall, count, what)


class TasksDb:
    """django-tasks-db, run from the peers' virtualenv."""

    def __init__(self) -> None:
        self.python = tp.peers_python()
        self.versions = tp.peer_versions(self.python)
        self._ready: set[str] = set()

    def env(self, vendor: str) -> dict[str, str]:
        return tp.django_env(database(vendor, TASKS_DB_DB), system="tasks_db")

    def enqueue(self, vendor: str, count: int) -> float:
        env = self.env(vendor)
        if vendor not in self._ready:
            create_database(database(vendor, TASKS_DB_DB))
            tp.run([self.python, "-m", "benchmarks.benchapp.peers", "tasks_db", "migrate"], env)
            self._ready.add(vendor)
        _, output = tp.run([self.python, "-m", "benchmarks.benchapp.tasks_db_enqueue", count], env)
        seconds: float = json.loads(output.strip().splitlines()[-1])["seconds"]
        tidy(tp.alias_of(vendor, TASKS_DB_DB), tp.TASKS_DB_TABLE)
        return seconds

    def drain(self, vendor: str, count: int) -> tp.Drain:
        cmd = [self.python, "manage.py", "db_worker", "--batch", "--no-startup-delay"]
        wall, _ = tp.run(
            [*cmd, "--interval", "0", "-v", "0"], self.env(vendor), time_box=PEER_TIME_BOX
        )
        rows = query(
            tp.alias_of(vendor, TASKS_DB_DB),
            "SELECT SUM(CASE WHEN status = 'SUCCESSFUL' THEN 1 ELSE 0 END), "
            f"MIN(started_at), MAX(finished_at) FROM {tp.TASKS_DB_TABLE}",
        )
        return tp.drain_from(rows, wall, count, "db_worker", partial=True)


def run_all(args: argparse.Namespace, vendors: list[str]) -> dict[str, Any]:
    peers = TasksDb()
    results: dict[str, Any] = {}
    for vendor in vendors:
        migrate_ours(vendor)
        samples: dict[str, dict[str, list[Any]]] = {
            s: {"enqueue_per_s": [], "drain": []} for s in SYSTEMS
        }
        for round_ in range(args.repeat):
            for system in (OURS_DEFAULT, OURS_TUNED):
                seconds = enqueue_ours(vendor, args.tasks)
                settings = {} if system == OURS_DEFAULT else TUNED
                drain = drain_ours(vendor, args.tasks, settings)
                drain.round = round_
                samples[system]["enqueue_per_s"].append(args.tasks / seconds)
                samples[system]["drain"].append(drain)
                print(
                    f"{vendor} {system}: enqueue {args.tasks / seconds:,.0f}/s, drain {drain.rate:,.0f}/s"
                )
            seconds = peers.enqueue(vendor, args.tasks)
            drain = peers.drain(vendor, args.tasks)
            drain.round = round_
            samples[TASKS_DB]["enqueue_per_s"].append(args.tasks / seconds)
            samples[TASKS_DB]["drain"].append(drain)
            print(
                f"{vendor} {TASKS_DB}: enqueue {args.tasks / seconds:,.0f}/s, drain {drain.rate:,.0f}/s"
            )
        results[vendor] = {
            system: {
                "enqueue_per_s": statistics.median(data["enqueue_per_s"]),
                "drain_per_s": statistics.median(d.rate for d in data["drain"]),
                "drain_wall_s": statistics.median(d.wall_s for d in data["drain"]),
                "drained": [d.tasks for d in data["drain"]],
                "samples": {
                    "enqueue_per_s": data["enqueue_per_s"],
                    "drain_per_s": [d.rate for d in data["drain"]],
                },
            }
            for system, data in samples.items()
        }
        theirs = results[vendor][TASKS_DB]["drain_per_s"]
        for system in (OURS_DEFAULT, OURS_TUNED):
            results[vendor][system]["drain_x_tasks_db"] = (
                results[vendor][system]["drain_per_s"] / theirs
            )
    return {"results": results, "peer_versions": peers.versions}


def markdown(data: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [
        "# `django.tasks`: this project's backend beside django-tasks-db",
        "",
        f"{meta['tasks']:,} `noop.enqueue()` calls, then one worker process drains them; median of "
        f"{meta['repeat']} round(s). {meta['machine']} (load average {meta['load_average']}); "
        f"revision {meta['revision']}; {meta['date']}.",
        "",
        "| database | system | enqueue (calls/s) | drain (tasks/s) | drain vs django-tasks-db |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for vendor, systems in data["results"].items():
        for system, figures in systems.items():
            ratio = figures.get("drain_x_tasks_db")
            lines.append(
                f"| {LABELS[vendor]} | {system} | {figures['enqueue_per_s']:,.0f} | "
                f"{figures['drain_per_s']:,.0f} | {f'{ratio:.1f}x' if ratio else '1x'} |"
            )
    targets = []
    for vendor, need in (("postgres", 10.0), ("sqlite", 1.0)):
        if vendor in data["results"]:
            best = max(
                data["results"][vendor][s]["drain_x_tasks_db"] for s in (OURS_DEFAULT, OURS_TUNED)
            )
            default = data["results"][vendor][OURS_DEFAULT]["drain_x_tasks_db"]
            targets.append(
                f"- {LABELS[vendor]}: drain at least {need:g}x django-tasks-db's: "
                f"{'met' if default >= need else 'NOT met'} with the defaults ({default:.1f}x), "
                f"{'met' if best >= need else 'NOT met'} at best ({best:.1f}x)."
            )
    lines += [
        "",
        "Targets:",
        "",
        *targets,
        "",
        "How:",
        "",
        "- ours: `DatabaseBackend`; enqueue in this process; drain with `runscheduler --burst` "
        f"(defaults: 5 workers, buffer 10, batch 100; tuned: {TUNED}). Each task's outcome (return "
        "value, attempt log) is written in a batch with the others finished meanwhile.",
        f"- django-tasks-db {data['peer_versions'].get('django-tasks-db', '?')}: enqueue in its "
        "own process; `db_worker --batch --interval 0` (one task at a time), stopped after "
        f"{PEER_TIME_BOX:.0f} s and timed on the tasks it finished.",
        "- drain rate: tasks / (last finish - first start) from each system's own table; "
        "enqueue rate: calls / seconds of the calling loop.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--databases", default="postgres,sqlite")
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    vendors = [v for v in args.databases.split(",") if v]
    vendors = [v for v in vendors if v == "sqlite" or tp.reachable(v)]
    configure(vendors)
    data = run_all(args, vendors)
    meta = {
        "tasks": args.tasks,
        "repeat": args.repeat,
        "machine": machine(),
        "load_average": load_average(),
        "revision": git_revision(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }
    write_report("django_tasks", {"meta": meta, **data}, lambda: markdown(data, meta))


if __name__ == "__main__":
    main()
