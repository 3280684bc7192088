"""Django's ``@task`` API on this project's backend, beside django-tasks-db and procrastinate.

For each database asked for (``--databases``, default PostgreSQL and SQLite), each round:

- **enqueue**: ``--tasks`` calls of ``noop.enqueue()`` (Django's API, one call and one
  autocommitted insert each), timed around the loop. Ours runs in this process with
  ``DatabaseBackend``; django-tasks-db's in its peers' virtualenv
  (``benchmarks.benchapp.tasks_db_enqueue``), on a database of its own on the same server.
- **drain**: one ``runscheduler --burst`` process drains the queue, with the default
  settings (after the timed enqueue) and with the documented tuning (:data:`TUNED`, the
  queue filled again with ``push_many`` copies of an enqueued task, not timed). The peers,
  in the same round, at their defaults and at their best documented settings
  (``throughput.PEER_SETUPS``): django-tasks-db with one worker (``CONN_MAX_AGE=0``), and
  with 2 and 4 workers and ``CONN_MAX_AGE=None``; procrastinate with concurrency 1 and 8
  (PostgreSQL only). Each peer is stopped after ``PEER_TIME_BOX`` seconds and timed on the
  tasks it finished.

Two rates per drain: tasks / (last finish - first start), read from each system's own
table (process start-up excluded), and the whole process: tasks / wall time of the worker
process(es), start-up and exit included. Ratios are taken per round, then their median.

Targets (issue 20), PostgreSQL: our drain with the defaults >= 3,000 tasks/s and >= 5x
django-tasks-db at its best settings.

Usage::

    ./run bench django_tasks
    python -m benchmarks.django_tasks --databases postgres --tasks 10000 --repeat 3

Results: ``benchmarks/results/django_tasks.json`` and ``benchmarks/results/django_tasks.md``.
Reuses ``benchmarks/throughput.py``'s helpers (servers, processes, the peers).
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
    tidy,
    write_report,
)

OURS_DB = "bench_django_tasks"
TASKS_DB_DB = "bench_django_tasks_db"  # not throughput.py's: the two may run at once
PROCRASTINATE_DB = "bench_django_tasks_procrastinate"
PEER_TIME_BOX = 60.0
OURS_DEFAULT = "ours, defaults"
OURS_TUNED = "ours, documented tuning"
#: The tuning docs/howto/production.md documents for many short tasks (see its
#: "Throughput" bullet); measured here beside the defaults so that the docs stay honest.
TUNED = {"BATCH_SIZE": 500}


def configure(vendors: list[str]) -> None:
    """Set Django up in this process with our benchmark database and django-tasks-db's per vendor."""
    import django
    from django.conf import settings

    databases = {}
    for vendor in vendors:
        for name in (OURS_DB, TASKS_DB_DB) + ((PROCRASTINATE_DB,) if vendor == "postgres" else ()):
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


def fill_ours(vendor: str, count: int) -> None:
    """Empty our task table and push ``count`` copies of an enqueued no-op (``push_many``,
    1,000 at a time: the rows ``enqueue()`` writes, each with its own id); not timed."""
    from django.test.utils import override_settings

    from django_tasks_coord import queue
    from django_tasks_coord.models import Owner, Task

    alias = tp.alias_of(vendor, OURS_DB)
    with override_settings(TASKS_COORD={"DATABASE": alias}):
        from benchmarks.benchapp.coord_tasks import noop

        queue.known_topics.clear()
        Task.objects.using(alias).all().delete()
        Owner.objects.using(alias).all().delete()
        model = Task.objects.using(alias).get(identifier=noop.enqueue().id)
        Task.objects.using(alias).all().delete()
        for start in range(0, count, 1000):
            items = [(f"t{i}", model.payload) for i in range(start, min(count, start + 1000))]
            queue.push_many("default", items, handler=model.handler)
    tidy(alias, Task._meta.db_table)


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


def enqueue_tasks_db(peers: tp.Peers, vendor: str, count: int) -> float:
    """Time ``count`` ``noop.enqueue()`` calls of django-tasks-db (its virtualenv); seconds."""
    env = tp.django_env(database(vendor, TASKS_DB_DB), system="tasks_db")
    if f"tasks_db-{vendor}" not in peers._ready:
        create_database(database(vendor, TASKS_DB_DB))
        tp.run([peers.python, "-m", "benchmarks.benchapp.peers", "tasks_db", "migrate"], env)
        peers._ready.add(f"tasks_db-{vendor}")
    _, output = tp.run([peers.python, "-m", "benchmarks.benchapp.tasks_db_enqueue", count], env)
    seconds: float = json.loads(output.strip().splitlines()[-1])["seconds"]
    return seconds


def measured(
    drains: dict[str, list[tp.Drain]], vendor: str, name: str, drain: tp.Drain, round_: int
) -> None:
    """Keep ``drain`` (of round ``round_``) with the others of ``name``, and print it."""
    drain.round = round_
    drains.setdefault(name, []).append(drain)
    print(
        f"{vendor} {name}: drain {drain.rate:,.0f}/s, whole process "
        f"{drain.wall_rate:,.0f}/s ({drain.tasks} tasks)",
        flush=True,
    )


def run_all(args: argparse.Namespace, vendors: list[str]) -> dict[str, Any]:
    """Every measurement, interleaved: each round runs each system once on each database."""
    peers = tp.Peers(TASKS_DB_DB, PEER_TIME_BOX, PROCRASTINATE_DB)
    results: dict[str, Any] = {}
    for vendor in vendors:
        migrate_ours(vendor)
        drains: dict[str, list[tp.Drain]] = {}
        enqueues: dict[str, list[float]] = {OURS_DEFAULT: [], tp.TASKS_DB: []}

        for round_ in range(args.repeat):
            seconds = enqueue_ours(vendor, args.tasks)
            enqueues[OURS_DEFAULT].append(args.tasks / seconds)
            if args.enqueue_only:
                enqueues[tp.TASKS_DB].append(
                    args.tasks / enqueue_tasks_db(peers, vendor, args.tasks)
                )
                print(
                    f"{vendor} round {round_}: enqueue ours {enqueues[OURS_DEFAULT][-1]:,.0f}/s, "
                    f"django-tasks-db {enqueues[tp.TASKS_DB][-1]:,.0f}/s",
                    flush=True,
                )
                continue
            measured(drains, vendor, OURS_DEFAULT, drain_ours(vendor, args.tasks, {}), round_)
            fill_ours(vendor, args.tasks)
            measured(drains, vendor, OURS_TUNED, drain_ours(vendor, args.tasks, TUNED), round_)
            enqueues[tp.TASKS_DB].append(args.tasks / enqueue_tasks_db(peers, vendor, args.tasks))
            for setup in tp.PEER_SETUPS:
                if setup.system == "procrastinate" and vendor != "postgres":
                    continue
                drain = peers.drain(vendor, setup, args.tasks)
                measured(drains, vendor, setup.label, drain, round_)
        if args.enqueue_only:
            results[vendor] = {"enqueue_per_s": enqueue_figures(enqueues)}
            continue
        results[vendor] = {
            "drain": {name: tp.median_of(values) for name, values in drains.items()},
            "enqueue_per_s": {
                name: round(statistics.median(values)) for name, values in enqueues.items()
            },
            "ratio_matrix": tp.ratio_matrix(drains, [OURS_DEFAULT, OURS_TUNED]),
            "best": {s: tp.best_of(drains, s) for s in ("tasks_db", "procrastinate")},
        }
    return {"results": results, "peer_versions": peers.versions}


def enqueue_figures(enqueues: dict[str, list[float]]) -> dict[str, Any]:
    """Each system's median enqueue rate, and ours over django-tasks-db's, per round then
    their median (the ratio of each round's pair, both measured in that round)."""
    ours, peer = enqueues[OURS_DEFAULT], enqueues[tp.TASKS_DB]
    return {
        OURS_DEFAULT: round(statistics.median(ours)),
        tp.TASKS_DB: round(statistics.median(peer)),
        "rounds": {OURS_DEFAULT: [round(r) for r in ours], tp.TASKS_DB: [round(r) for r in peer]},
        "ratio": round(statistics.median(o / p for o, p in zip(ours, peer, strict=True)), 2),
    }


def enqueue_markdown(data: dict[str, Any], meta: dict[str, Any]) -> str:
    """The report of an ``--enqueue-only`` run."""
    lines = [
        "# `django.tasks` enqueue: this project's backend beside django-tasks-db",
        "",
        f"{meta['tasks']:,} `noop.enqueue()` calls per system and round, one call (one "
        f"autocommitted insert) per task; median of {meta['repeat']} interleaved round(s), "
        f"ratios per round then their median. {meta['machine']} (load average "
        f"{meta['load_average']}); revision {meta['revision']}; {meta['date']}.",
        "",
        "| database | ours (calls/s) | django-tasks-db (calls/s) | ours / django-tasks-db | "
        "rounds (ours; django-tasks-db) |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for vendor, figures in data["results"].items():
        e = figures["enqueue_per_s"]
        rounds = "; ".join(
            ", ".join(f"{r:,}" for r in e["rounds"][name]) for name in (OURS_DEFAULT, tp.TASKS_DB)
        )
        lines.append(
            f"| {LABELS[vendor]} | {e[OURS_DEFAULT]:,} | {e[tp.TASKS_DB]:,} | "
            f"{e['ratio']:.2f}x | {rounds} |"
        )
    pg = data["results"].get("postgres")
    if pg:
        ratio = pg["enqueue_per_s"]["ratio"]
        lines += [
            "",
            "Target (issue 20): single `.enqueue()` on PostgreSQL >= 1.5x django-tasks-db: "
            f"{ratio:.2f}x ({'met' if ratio >= 1.5 else 'NOT met'}).",
        ]
    lines += [
        "",
        "How: ours with `DatabaseBackend` in this process; django-tasks-db "
        f"{data['peer_versions'].get('django-tasks-db', '?')} in its own process "
        "(`benchmarks.benchapp.tasks_db_enqueue`), on a database of its own on the same "
        "server; rate: calls / seconds of the calling loop. "
        "`python -m benchmarks.django_tasks --enqueue-only`.",
        "",
    ]
    return "\n".join(lines)


def targets(data: dict[str, Any]) -> list[str]:
    """The issue's targets on PostgreSQL, each with its figure."""
    pg = data["results"].get("postgres")
    if not pg:
        return []
    lines = []
    rate = pg["drain"][OURS_DEFAULT]["rate"]
    lines.append(
        f"- `@task` drain with the defaults >= 3,000 tasks/s: {rate:,} "
        f"({'met' if rate >= 3000 else 'NOT met'})."
    )
    best = pg["best"].get("tasks_db")
    ratio = pg["ratio_matrix"].get(f"{OURS_DEFAULT} / {best}") if best else None
    if ratio:
        lines.append(
            f"- `@task` drain with the defaults >= 5x django-tasks-db at its best ({best}): "
            f"{ratio['drain']:.2f}x ({'met' if ratio['drain'] >= 5 else 'NOT met'}); "
            f"whole process {ratio['wall']:.2f}x."
        )
    return lines


def markdown(data: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [
        "# `django.tasks`: this project's backend beside django-tasks-db and procrastinate",
        "",
        f"{meta['tasks']:,} no-op tasks per drain; median of {meta['repeat']} round(s), every "
        f"system once per round. {meta['machine']} (load average {meta['load_average']}); "
        f"revision {meta['revision']}; {meta['date']}.",
        "",
    ]
    for vendor, figures in data["results"].items():
        lines += [
            f"## {LABELS[vendor]}",
            "",
            "| system | drain (tasks/s) | whole process (tasks/s) | tasks done |",
            "| --- | ---: | ---: | ---: |",
        ]
        for name, r in figures["drain"].items():
            done = sorted({s["tasks"] for s in r["samples"]})
            lines.append(
                f"| {name} | {r['rate']:,} | {r['wall_rate']:,} | "
                f"{', '.join(f'{d:,}' for d in done)} |"
            )
        lines += [
            "",
            "| enqueue, one `.enqueue()` call per task | calls/s |",
            "| --- | ---: |",
            *(f"| {name} | {rate:,} |" for name, rate in figures["enqueue_per_s"].items()),
            "",
            *tp.ratio_lines(
                {
                    "ratio_matrix": {vendor: figures["ratio_matrix"]},
                    "best": {vendor: figures["best"]},
                },
                [vendor],
            ),
        ]
    lines += ["## Targets (issue 20)", "", *targets(data), ""]
    lines += [
        "## How",
        "",
        "- ours: `DatabaseBackend`; the timed enqueue in this process; drains with "
        f"`runscheduler --burst`, the defaults and the documented tuning (`{json.dumps(TUNED)}`).",
        "- drain rate: tasks / (last finish - first start) from each system's own table; whole "
        "process: tasks / wall time of the worker process(es); enqueue rate: calls / seconds "
        "of the calling loop.",
        *tp.peers_method({"peers": data["peer_versions"], "tasks": meta["tasks"]}, PEER_TIME_BOX),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--databases", default="postgres,sqlite")
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--enqueue-only",
        action="store_true",
        help="only the enqueue comparison (no drains); results in django_tasks_enqueue.*",
    )
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
        "tuned": TUNED,
    }
    if args.enqueue_only:
        write_report(
            "django_tasks_enqueue", {"meta": meta, **data}, lambda: enqueue_markdown(data, meta)
        )
        return
    write_report("django_tasks", {"meta": meta, **data}, lambda: markdown(data, meta))


if __name__ == "__main__":
    main()
