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

``--enqueue-only`` measures the enqueue alone, in four modes (``--modes``), the first three
each paired in the same round with its peer (which of the two goes first alternates from
round to round):

- **single**: ``--tasks`` ``noop.enqueue()`` calls, each autocommitted, beside
  django-tasks-db's;
- **atomic**: the same calls inside one ``transaction.atomic()`` block (its commit timed),
  beside django-tasks-db's;
- **bulk**: ``--bulk-tasks`` calls as our ``noop.enqueue_many`` of ``--batch`` (1,000)
  calls each, beside procrastinate's ``batch_defer`` of as many jobs (PostgreSQL only;
  the helper times its own defers, its start-up excluded).
- **floor** (PostgreSQL and MariaDB): what one autocommitted statement costs, ``--tasks`` of
  each through the raw DB-API connection (``cursor.execute``, one round trip each, the
  statements built before the timed loop), in this process: (a) ``SELECT 1``; (b) an INSERT
  into a minimal table (:data:`FLOOR_TABLE`, made for the run and dropped after it),
  ``RETURNING id`` where the database has it; (c) django-tasks-db's one-row INSERT as its
  ORM sends it (captured once from the peer, ``tasks_db_enqueue --capture-sql``), on the
  peer's database; (d) our ``noop.enqueue()``'s statement, captured with
  ``CaptureQueriesContext``; (e) (d) with ``synchronous_commit = off`` (PostgreSQL; not
  durable, not a mode this project uses: it shows the share of the commit's disk flush).
  Each row's key (c: its UUID, d and e: the identifier) is a fresh UUID per statement.
  Compared with the time per call that 1.5x django-tasks-db's single-mode rate of the same
  run would need.

Targets (issue 20), PostgreSQL: a single ``.enqueue()`` >= 1.5x django-tasks-db's; the bulk
enqueue >= 20,000 tasks/s.

Usage::

    ./run bench django_tasks
    python -m benchmarks.django_tasks --databases postgres --tasks 10000 --repeat 3
    python -m benchmarks.django_tasks --enqueue-only --databases postgres --repeat 3
    python -m benchmarks.django_tasks --enqueue-only --modes floor,single \
        --databases postgres,mysql --tasks 3000 --name django_tasks_enqueue_floor

Results: ``benchmarks/results/django_tasks.json`` and ``benchmarks/results/django_tasks.md``;
with ``--enqueue-only``, ``benchmarks/results/django_tasks_enqueue.{json,md}`` (``--name``
names them otherwise).
Reuses ``benchmarks/throughput.py``'s helpers (servers, processes, the peers).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
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
    mysql_variables,
    postgres_settings,
    query,
    tidy,
    write_report,
)

OURS_DB = "bench_django_tasks"
TASKS_DB_DB = "bench_django_tasks_db"  # not throughput.py's: the two may run at once
PROCRASTINATE_DB = "bench_django_tasks_procrastinate"
PEER_TIME_BOX = 60.0
OURS_DEFAULT = "ours, defaults"
OURS_TUNED = "ours, documented tuning"
#: The modes of ``--enqueue-only``: each one's title, our unit, and its peer.
ENQUEUE_MODES = {
    "single": ("One `.enqueue()` per call (autocommit)", "calls/s", tp.TASKS_DB),
    "atomic": ("Every `.enqueue()` inside one `atomic` block", "calls/s", tp.TASKS_DB),
    "bulk": ("Bulk: `enqueue_many` against `batch_defer`", "tasks/s", tp.PROCRASTINATE),
    "floor": ("Floor: one raw autocommitted statement per round trip", "us/statement", None),
}
#: The floor mode's statements, in the order of a round (reversed every other round).
FLOOR_KINDS = {
    "select_1": "(a) `SELECT 1`",
    "minimal_insert": "(b) INSERT into a minimal table",
    "tasks_db_insert": "(c) django-tasks-db's one-row INSERT, as its ORM sends it",
    "ours": "(d) our `noop.enqueue()` statement, as it sends it",
    "ours_async": "(e) (d) with `synchronous_commit = off`: NOT durable, not a mode we use",
}
#: The floor mode's minimal table, in our benchmark database; created and dropped by the run.
FLOOR_TABLE = "bench_floor"
FLOOR_CREATE = {
    "postgres": f"CREATE TABLE {FLOOR_TABLE} (id bigserial PRIMARY KEY, name text NOT NULL, "
    "args jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now())",
    "mysql": f"CREATE TABLE {FLOOR_TABLE} (id bigint AUTO_INCREMENT PRIMARY KEY, "
    "name varchar(200) NOT NULL, args json NOT NULL, "
    "created_at datetime(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))",
}
FLOOR_ARGS = '{"args": [], "kwargs": {}}'
FLOOR_INSERT = f"INSERT INTO {FLOOR_TABLE} (name, args) VALUES ('noop', '{FLOOR_ARGS}')"
#: The calls of one ``enqueue_many`` (and the jobs of one ``batch_defer``) in the bulk mode.
BATCH = 1000
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


def enqueue_ours(vendor: str, count: int, mode: str = "single", batch: int = BATCH) -> float:
    """Empty our task table, then time ``count`` ``noop.enqueue()`` calls; return seconds.

    ``mode``: ``single``, each call autocommitted; ``atomic``, all of them inside one
    ``atomic`` block (its commit timed too); ``bulk``, ``noop.enqueue_many`` of ``batch``
    calls at a time.
    """
    from django.db import transaction
    from django.test.utils import override_settings

    from django_tasks_coord import queue
    from django_tasks_coord.models import Owner, Task

    alias = tp.alias_of(vendor, OURS_DB)
    with override_settings(TASKS_COORD={"DATABASE": alias}):
        from benchmarks.benchapp.coord_tasks import noop

        queue.known_topics.clear()  # the topic cache is per process, not per database

        Task.objects.using(alias).all().delete()
        Owner.objects.using(alias).all().delete()
        calls = [((), {})] * batch
        # The first call registers the topic (and builds the mode's statement); not timed.
        if mode == "bulk":
            noop.enqueue_many(calls[:2])
        else:
            noop.enqueue()
        Task.objects.using(alias).all().delete()
        started = time.perf_counter()
        if mode == "bulk":
            for start in range(0, count, batch):
                noop.enqueue_many(calls[: count - start])
        elif mode == "atomic":
            with transaction.atomic(using=alias):
                for _ in range(count):
                    noop.enqueue()
        else:
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


def enqueue_tasks_db(peers: tp.Peers, vendor: str, count: int, mode: str = "single") -> float:
    """Time ``count`` ``noop.enqueue()`` calls of django-tasks-db (its virtualenv), each
    autocommitted or (``mode`` ``atomic``) all in one ``atomic`` block; seconds."""
    env = tasks_db_env(peers, vendor)
    cmd = [peers.python, "-m", "benchmarks.benchapp.tasks_db_enqueue", count]
    _, output = tp.run([*cmd, *(["--atomic"] if mode == "atomic" else [])], env)
    return seconds_of(output)


def tasks_db_env(peers: tp.Peers, vendor: str) -> dict[str, str]:
    """The environment of django-tasks-db's helpers on ``vendor``; its database and table are
    made on first use."""
    env = tp.django_env(database(vendor, TASKS_DB_DB), system="tasks_db")
    if f"tasks_db-{vendor}" not in peers._ready:
        create_database(database(vendor, TASKS_DB_DB))
        tp.run([peers.python, "-m", "benchmarks.benchapp.peers", "tasks_db", "migrate"], env)
        peers._ready.add(f"tasks_db-{vendor}")
    return env


def seconds_of(output: str) -> float:
    """The ``{"seconds": ...}`` a timing helper printed last."""
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
            measured(drains, vendor, OURS_DEFAULT, drain_ours(vendor, args.tasks, {}), round_)
            fill_ours(vendor, args.tasks)
            measured(drains, vendor, OURS_TUNED, drain_ours(vendor, args.tasks, TUNED), round_)
            enqueues[tp.TASKS_DB].append(args.tasks / enqueue_tasks_db(peers, vendor, args.tasks))
            for setup in tp.PEER_SETUPS:
                if setup.system == "procrastinate" and vendor != "postgres":
                    continue
                drain = peers.drain(vendor, setup, args.tasks)
                measured(drains, vendor, setup.label, drain, round_)
        results[vendor] = {
            "drain": {name: tp.median_of(values) for name, values in drains.items()},
            "enqueue_per_s": {
                name: round(statistics.median(values)) for name, values in enqueues.items()
            },
            "ratio_matrix": tp.ratio_matrix(drains, [OURS_DEFAULT, OURS_TUNED]),
            "best": {s: tp.best_of(drains, s) for s in ("tasks_db", "procrastinate")},
        }
    return {"results": results, "peer_versions": peers.versions}


def run_enqueues(args: argparse.Namespace, vendors: list[str]) -> dict[str, Any]:
    """``--enqueue-only``: each round runs every mode of ``args.modes`` on each database, ours
    and its peer one after the other (which goes first alternates from round to round); the
    floor mode's statements one kind after the other."""
    peers = tp.Peers(TASKS_DB_DB, PEER_TIME_BOX, PROCRASTINATE_DB)
    results: dict[str, Any] = {}
    for vendor in vendors:
        migrate_ours(vendor)
        modes = [m for m in args.modes if m != "bulk" or vendor == "postgres" or args.bulk_alone]
        modes = [m for m in modes if m != "floor" or vendor != "sqlite"]  # no round trip there
        rates: dict[str, dict[str, list[float]]] = {
            m: {"ours": [], "peer": []} for m in modes if m != "floor"
        }
        floor = floor_statements(peers, vendor, args.tasks) if "floor" in modes else {}
        floors: dict[str, list[float]] = {kind: [] for kind in floor}
        for round_ in range(args.repeat):
            for mode in modes:
                if mode == "floor":
                    for kind, micros in time_floor(floor, reverse=bool(round_ % 2)).items():
                        floors[kind].append(micros)
                    print(
                        f"{vendor} round {round_} floor (us/statement): "
                        + ", ".join(f"{kind} {us[-1]:.0f}" for kind, us in floors.items()),
                        flush=True,
                    )
                    continue
                count = args.bulk_tasks if mode == "bulk" else args.tasks
                runs = {
                    "ours": lambda: enqueue_ours(vendor, count, mode, args.batch),  # noqa: B023
                    "peer": lambda: peer_seconds(peers, vendor, count, mode),  # noqa: B023
                }
                for side in sorted(runs, reverse=bool(round_ % 2)):  # ours first in round 0
                    if side == "peer" and mode == "bulk" and vendor != "postgres":
                        continue  # procrastinate runs on PostgreSQL only
                    rates[mode][side].append(count / runs[side]())
                print(
                    f"{vendor} round {round_} {mode}: "
                    + ", ".join(f"{side} {r[-1]:,.0f}/s" for side, r in rates[mode].items() if r),
                    flush=True,
                )
        results[vendor] = {m: enqueue_figures(rates[m]) for m in modes if m != "floor"}
        if floor:
            drop_floor(vendor)
            results[vendor]["floor"] = floor_figures(vendor, floors)
    return {"results": results, "peer_versions": peers.versions}


def unique_statements(sql: str, key: str, count: int) -> list[str]:
    """``count`` copies of ``sql``, each with a fresh UUID where ``sql`` has the UUID ``key``
    (written as the statement writes it: 32 hex digits, or with hyphens)."""
    value = uuid.UUID(key)
    for written, fresh in ((value.hex, lambda: uuid.uuid4().hex), (str(value), uuid.uuid4)):
        if sql.count(written) == 1:
            return [sql.replace(written, str(fresh())) for _ in range(count)]
    raise ValueError(f"{key} is not in the statement once: {sql}")


def captured_statement(queries: list[str], what: str) -> str:
    """The one statement of ``queries`` (one call's captured SQL); raise if it sent more."""
    if len(queries) != 1:
        raise RuntimeError(f"{what} sent {len(queries)} statements, not one: {queries}")
    return queries[0]


def our_enqueue_sql(vendor: str) -> tuple[str, str]:
    """The statement one ``noop.enqueue()`` sends on ``vendor`` (parameters interpolated, as
    ``CaptureQueriesContext`` records it) and the identifier in it."""
    from django.db import connections
    from django.test.utils import CaptureQueriesContext, override_settings

    from django_tasks_coord import queue

    alias = tp.alias_of(vendor, OURS_DB)
    with override_settings(TASKS_COORD={"DATABASE": alias}):
        from benchmarks.benchapp.coord_tasks import noop

        queue.known_topics.clear()
        noop.enqueue()  # registers the topic
        with CaptureQueriesContext(connections[alias]) as captured:
            result = noop.enqueue()
    queries = [q["sql"] for q in captured.captured_queries]
    return captured_statement(queries, "noop.enqueue()"), result.id


def tasks_db_enqueue_sql(peers: tp.Peers, vendor: str) -> tuple[str, str]:
    """The statement django-tasks-db's ``noop.enqueue()`` sends on ``vendor``, as its helper
    captured it (``--capture-sql``, parameters interpolated), and its result's id."""
    cmd = [peers.python, "-m", "benchmarks.benchapp.tasks_db_enqueue", "--capture-sql"]
    _, output = tp.run(cmd, tasks_db_env(peers, vendor))
    captured = json.loads(output.strip().splitlines()[-1])
    return captured_statement(captured["queries"], "django-tasks-db's enqueue()"), captured["id"]


def floor_statements(
    peers: tp.Peers, vendor: str, count: int
) -> dict[str, tuple[str, str | None, list[str]]]:
    """The floor mode's statements on ``vendor``, ``count`` of each kind (:data:`FLOOR_KINDS`):
    by kind, the alias they run on, the table they fill (None: none) and the statements.

    Creates :data:`FLOOR_TABLE` (again) in our benchmark database.
    """
    from django.db import connections

    from django_tasks_coord.models import Task

    ours = tp.alias_of(vendor, OURS_DB)
    peer = tp.alias_of(vendor, TASKS_DB_DB)
    minimal = FLOOR_INSERT
    if connections[ours].features.can_return_columns_from_insert:
        minimal += " RETURNING id"
    query(ours, f"DROP TABLE IF EXISTS {FLOOR_TABLE}")
    query(ours, FLOOR_CREATE[vendor])
    ours_sql, ours_key = our_enqueue_sql(vendor)
    peer_sql, peer_key = tasks_db_enqueue_sql(peers, vendor)
    table = Task._meta.db_table
    statements: dict[str, tuple[str, str | None, list[str]]] = {
        "select_1": (ours, None, ["SELECT 1"] * count),
        "minimal_insert": (ours, FLOOR_TABLE, [minimal] * count),
        "tasks_db_insert": (peer, tp.TASKS_DB_TABLE, unique_statements(peer_sql, peer_key, count)),
        "ours": (ours, table, unique_statements(ours_sql, ours_key, count)),
    }
    if vendor == "postgres":
        statements["ours_async"] = (ours, table, unique_statements(ours_sql, ours_key, count))
    return statements


def time_floor(
    statements: dict[str, tuple[str, str | None, list[str]]], *, reverse: bool = False
) -> dict[str, float]:
    """One round of the floor mode: each kind's statements executed one by one on the raw
    DB-API connection (autocommit), its table emptied first (not timed); microseconds per
    statement, by kind. ``ours_async`` runs with ``synchronous_commit = off`` for the session,
    reset after."""
    from django.db import connections

    micros = {}
    for kind in sorted(statements, key=list(FLOOR_KINDS).index, reverse=reverse):
        alias, table, sqls = statements[kind]
        if table:
            query(alias, f"DELETE FROM {table}")
        connection = connections[alias]
        connection.ensure_connection()
        if not connection.get_autocommit():
            raise RuntimeError(f"{alias} is not in autocommit mode")
        with connection.connection.cursor() as cursor:
            if kind == "ours_async":
                cursor.execute("SET synchronous_commit = off")
            try:
                started = time.perf_counter()
                for sql in sqls:
                    cursor.execute(sql)
                micros[kind] = (time.perf_counter() - started) / len(sqls) * 1e6
            finally:
                if kind == "ours_async":
                    cursor.execute("RESET synchronous_commit")
    for alias, table in sorted({(a, t) for a, t, _ in statements.values() if t}):
        query(alias, f"DELETE FROM {table}")
        tidy(alias, table)
    return micros


def drop_floor(vendor: str) -> None:
    """Drop the floor mode's minimal table."""
    query(tp.alias_of(vendor, OURS_DB), f"DROP TABLE IF EXISTS {FLOOR_TABLE}")


def floor_figures(vendor: str, floors: dict[str, list[float]]) -> dict[str, Any]:
    """Each kind's median microseconds per statement and its rounds, and the server settings
    that decide what a durable commit costs."""
    alias = tp.alias_of(vendor, OURS_DB)
    if vendor == "postgres":
        names = ("server_version", "fsync", "synchronous_commit", "wal_sync_method")
        server = postgres_settings(alias, names)
    else:
        server = mysql_variables(alias)
    return {
        "us": {kind: round(statistics.median(us)) for kind, us in floors.items()},
        "rounds": {kind: [round(u) for u in us] for kind, us in floors.items()},
        "server": server,
    }


def peer_seconds(peers: tp.Peers, vendor: str, count: int, mode: str) -> float:
    """The peer of ``mode``'s seconds for ``count`` calls: django-tasks-db's ``.enqueue()``
    calls (single, atomic), procrastinate's defers (bulk)."""
    if mode == "bulk":
        return peers.procrastinate_defer(count)
    return enqueue_tasks_db(peers, vendor, count, mode)


def enqueue_figures(rates: dict[str, list[float]]) -> dict[str, Any]:
    """Ours and the peer's median rate, the ratio of each round's pair (both measured in that
    round), and those ratios' median (None without a peer)."""
    ours, peer = rates["ours"], rates["peer"]
    ratios = [o / p for o, p in zip(ours, peer, strict=True)] if peer else []
    return {
        "ours": round(statistics.median(ours)),
        "peer": round(statistics.median(peer)) if peer else None,
        "rounds": {"ours": [round(r) for r in ours], "peer": [round(r) for r in peer]},
        "ratios": [round(r, 2) for r in ratios],
        "ratio": round(statistics.median(ratios), 2) if ratios else None,
    }


def enqueue_markdown(data: dict[str, Any], meta: dict[str, Any]) -> str:
    """The report of an ``--enqueue-only`` run: a table per mode."""
    versions = data["peer_versions"]
    peers = {
        tp.TASKS_DB: f"django-tasks-db {versions.get('django-tasks-db', '?')}",
        tp.PROCRASTINATE: f"procrastinate {versions.get('procrastinate', '?')}",
    }
    bulk = (
        f" (bulk: {meta['bulk_tasks']:,} calls, {meta['batch']:,} per call)"
        if "bulk" in meta["modes"]
        else ""
    )
    lines = [
        "# `django.tasks` enqueue: this project's backend beside django-tasks-db and procrastinate",
        "",
        f"{meta['tasks']:,} `noop.enqueue()` calls (floor: statements) per system, mode and "
        f"round{bulk}; medians of "
        f"{meta['repeat']} interleaved round(s), each pair in the same round; ratios per round, "
        f"then their median. {meta['machine']}; load average {meta['load_average']} at the "
        f"start, {meta['load_average_end']} at the end; revision {meta['revision']}; "
        f"{meta['date']}.",
    ]
    for mode, (title, unit, peer) in ENQUEUE_MODES.items():
        rows = [(v, f[mode]) for v, f in data["results"].items() if mode in f]
        if mode == "floor" or not peer or not rows:
            continue
        lines += [
            "",
            f"## {title}, beside {peers[peer]}",
            "",
            f"| database | ours ({unit}) | peer ({unit}) | ours / peer | ratio per round | "
            "rounds (ours; peer) |",
            "| --- | ---: | ---: | ---: | --- | --- |",
        ]
        for vendor, e in rows:
            rounds = "; ".join(
                ", ".join(f"{r:,}" for r in e["rounds"][s]) for s in ("ours", "peer")
            )
            peer_rate = "-" if e["peer"] is None else f"{e['peer']:,}"
            ratio = "-" if e["ratio"] is None else f"{e['ratio']:.2f}x"
            per_round = ", ".join(f"{r:.2f}" for r in e["ratios"]) or "-"
            lines.append(
                f"| {LABELS[vendor]} | {e['ours']:,} | {peer_rate} | {ratio} | {per_round} | "
                f"{rounds} |"
            )
    lines += floor_markdown(data["results"])
    modes = "" if meta["modes"] == list(ENQUEUE_MODES) else f" --modes {','.join(meta['modes'])}"
    if meta.get("name", "django_tasks_enqueue") != "django_tasks_enqueue":
        modes += f" --name {meta['name']}"
    pg = data["results"].get("postgres", {})
    lines += ["", "## Targets (issue 20), PostgreSQL", ""]
    if pg.get("single", {}).get("ratio") is not None:
        ratio = pg["single"]["ratio"]
        lines.append(
            f"- single `.enqueue()` >= 1.5x django-tasks-db: {ratio:.2f}x "
            f"({'met' if ratio >= 1.5 else 'NOT met'})."
        )
        if "floor" in pg:
            lines.append(f"  {floor_verdict(pg)}")
    if "bulk" in pg:
        rate = pg["bulk"]["ours"]
        lines.append(
            f"- bulk `@task` enqueue >= 20,000 tasks/s: {rate:,} "
            f"({'met' if rate >= 20_000 else 'NOT met'})."
        )
    lines += [
        "",
        "How: ours with `DatabaseBackend` in this process (one untimed call first registers the "
        "topic); django-tasks-db in its own process (`benchmarks.benchapp.tasks_db_enqueue`, "
        "`--atomic` for the atomic mode), on a database of its own on the same server; "
        "procrastinate's `batch_defer` in its own process (`benchmarks.benchapp.peers "
        "procrastinate enqueue`), timed by that process, its app's start-up excluded. Rate: "
        "calls (bulk: tasks) / seconds of the calling loop, an atomic block's commit included. "
        f"Floor: see its section. `python -m benchmarks.django_tasks --enqueue-only{modes}`.",
        "",
    ]
    return "\n".join(lines)


def floor_verdict(figures: dict[str, Any]) -> str:
    """What 1.5x django-tasks-db's single-mode rate of the run would need per call, against
    the floor mode's minimal durable INSERT (b) on the same database."""
    peer = figures["single"]["peer"]
    need = 1e6 / (1.5 * peer)
    us = figures["floor"]["us"]
    minimal = us["minimal_insert"]
    verdict = (
        f"below the {minimal} us of the minimal durable INSERT (b): no call that commits its row "
        "durably, even in one round trip of the smallest statement, can reach it on this machine"
        if need < minimal
        else f"above the {minimal} us of the minimal durable INSERT (b): the floor does not rule "
        f"the target out ({need - minimal:.0f} us a call to spare beyond it)"
    )
    ours = us["ours"]
    return (
        f"1.5x django-tasks-db's {peer:,} calls/s (this run) would need {need:.0f} us per call, "
        f"{verdict}. django-tasks-db's own INSERT (c) took {us['tasks_db_insert']} us; ours (d) "
        f"{ours} us, {'over' if ours > need else 'within'} the {need:.0f} us on its own."
    )


def floor_markdown(results: dict[str, Any]) -> list[str]:
    """The floor mode's section: microseconds per statement, by database, beside the full
    ``.enqueue()`` calls of the single mode (when it ran)."""
    vendors = [v for v, f in results.items() if "floor" in f]
    if not vendors:
        return []
    header = " | ".join(f"{LABELS[v]} (us) | rounds" for v in vendors)
    lines = [
        "",
        f"## {ENQUEUE_MODES['floor'][0]}",
        "",
        f"| statement | {header} |",
        "| --- |" + " ---: | --- |" * len(vendors),
    ]
    for kind, label in FLOOR_KINDS.items():
        cells = []
        for v in vendors:
            floor = results[v]["floor"]
            rounds = ", ".join(str(u) for u in floor["rounds"].get(kind, []))
            cells.append(f"{floor['us'][kind]:,} | {rounds}" if kind in floor["us"] else "- | -")
        lines.append(f"| {label} | {' | '.join(cells)} |")
    if all("single" in results[v] for v in vendors):
        for side, label in (("ours", "ours"), ("peer", "django-tasks-db's")):
            cells = [f"{1e6 / results[v]['single'][side]:,.0f} | -" for v in vendors]
            lines.append(f"| full `.enqueue()`, {label} (single mode) | {' | '.join(cells)} |")
    lines += [""]
    for v in vendors:
        server = ", ".join(f"{k} {val}" for k, val in results[v]["floor"]["server"].items())
        verdict = f" {floor_verdict(results[v])}" if "single" in results[v] else ""
        lines.append(f"- {LABELS[v]} ({server}).{verdict}")
    lines += [
        "",
        "How: in this process, on the raw DB-API connection (psycopg, MySQLdb) in autocommit, "
        "each statement one `cursor.execute` (one round trip; the driver reads the whole result "
        "in it), the statements built before the timed loop, each kind's table emptied before it "
        "(not timed). (b): a table of a bigserial/auto-increment primary key, a short text, a "
        f"small JSON document and a creation timestamp defaulting to now (`{FLOOR_INSERT}`, "
        "with `RETURNING id` where the database has it). (c): the INSERT that django-tasks-db's "
        "`noop.enqueue()` sends, its parameters interpolated (captured once by "
        "`benchmarks.benchapp.tasks_db_enqueue --capture-sql`), replayed on its own database. "
        "(d): the statement our `noop.enqueue()` sends (`CaptureQueriesContext`; on PostgreSQL "
        "the INSERT, its `COMMIT` and the wake-up's `pg_notify`, one query string). Each row's "
        "key (c: the UUID primary key; d, e: the identifier) is a fresh UUID per statement. "
        "(e) is (d) in a session with `synchronous_commit = off`: commits that do not wait for "
        "the disk, NOT durable and not a mode this project uses; (d) minus (e) is the flush's "
        "share. Full `.enqueue()`: 1 / the single mode's median rate in the same run.",
    ]
    return lines


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
    parser.add_argument(
        "--modes",
        default=",".join(ENQUEUE_MODES),
        help="with --enqueue-only: the modes to run (single, atomic, bulk, floor)",
    )
    parser.add_argument(
        "--name",
        default="django_tasks_enqueue",
        help="with --enqueue-only: results/NAME.json and .md",
    )
    parser.add_argument("--bulk-tasks", type=int, default=20_000, help="calls of the bulk mode")
    parser.add_argument("--batch", type=int, default=BATCH, help="calls per enqueue_many")
    parser.add_argument(
        "--bulk-alone",
        action="store_true",
        help="run the bulk mode off PostgreSQL too (ours alone: procrastinate needs PostgreSQL)",
    )
    args = parser.parse_args()
    args.modes = [m for m in args.modes.split(",") if m]
    if unknown := set(args.modes) - set(ENQUEUE_MODES):
        parser.error(f"unknown modes: {', '.join(sorted(unknown))}")
    vendors = [v for v in args.databases.split(",") if v]
    vendors = [v for v in vendors if v == "sqlite" or tp.reachable(v)]
    configure(vendors)
    load_at_start = load_average()
    data = run_enqueues(args, vendors) if args.enqueue_only else run_all(args, vendors)
    meta = {
        "tasks": args.tasks,
        "repeat": args.repeat,
        "machine": machine(),
        "load_average": load_at_start,
        "load_average_end": load_average(),
        "revision": git_revision(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "tuned": TUNED,
    }
    if args.enqueue_only:
        meta.update(modes=args.modes, bulk_tasks=args.bulk_tasks, batch=args.batch, name=args.name)
        write_report(args.name, {"meta": meta, **data}, lambda: enqueue_markdown(data, meta))
        return
    write_report("django_tasks", {"meta": meta, **data}, lambda: markdown(data, meta))


if __name__ == "__main__":
    main()
