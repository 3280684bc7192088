r"""Scale: claim + complete, and the plans of the claim, the reaper and the admin, on big tables.

For each database (``--databases postgres,mysql``) the task table is grown to each history
size in turn (``--sizes 1000,1000000,10000000`` completed tasks over 10 topics, with
100,000 pending ones on top), with set-based SQL: PostgreSQL ``INSERT ... SELECT ... FROM
generate_series``, MariaDB the SEQUENCE engine (``seq_M_to_N``). Rows go through the Task
model's table, so a partitioned table works the same; topics are registered with
``queue.register_topic`` before their tasks are inserted. After each build the table is
analyzed (PostgreSQL: ``VACUUM ANALYZE``; MariaDB: ``ANALYZE TABLE``).

At each size it measures, with the product's own calls:

- claim + complete: ``--workers`` threads, each with its own owner, each claiming from its
  own topic with ``queue.poll(topic, --batch, owner=..., heartbeat_owner=False)`` and
  completing with ``queue.complete_many`` (what a node's dispatch loop and completer do),
  until ``--tasks`` tasks are done. Throughput = tasks / wall time; claim latency = the
  time of each ``queue.poll`` call (p50, p99). Median of ``--repeat`` runs; between runs
  the completed tasks are deleted, as many fresh pending tasks inserted and the table
  analyzed again, so every run sees the same history and the same queue.
- the plans of the SQL the product really runs (captured with ``CaptureQueriesContext``):
  the claim (``queue.poll``) and its completion (``queue.complete_many``), the reaper
  (``owners.expire`` of a dead owner holding tasks, ``executions.reap`` of timed-out
  executor tasks) and the admin's task changelist (the Django test client as a
  superuser: unfiltered, by state, by topic, by both). PostgreSQL: ``EXPLAIN (ANALYZE,
  BUFFERS)`` (writes rolled back); MariaDB: ``ANALYZE FORMAT=JSON`` (rolled back). Each
  plan gets a verdict: does it scan the task table (or one of its partitions)
  sequentially (PostgreSQL: a ``Seq Scan`` node; MariaDB: ``access_type`` ALL, or a full
  index scan, ``index``)?

Target (issue 11): at 10 million completed tasks, throughput and p99 claim latency no
more than 1.5x worse than at 1 thousand, and no sequential scan of the task table.

Usage::

    ./run bench scale                                   # both databases, 1k / 1M / 10M
    .venv/bin/python -m benchmarks.scale --databases postgres --sizes 1000,100000
    .venv/bin/python -m benchmarks.scale --databases mysql --sizes 1000,10000000 --merge \
        --innodb-buffer-pool 1024                       # MariaDB with a 1 GB buffer pool

``--innodb-buffer-pool MB`` (MariaDB only): the parent sets the server's
``innodb_buffer_pool_size`` to MB with ``SET GLOBAL`` before the MariaDB child starts (MariaDB
10.11 resizes it online; the script waits until ``Innodb_buffer_pool_resize_status`` says it
is done) and always sets the original value back at the end (``finally``: also on an error,
Ctrl-C, SIGTERM or SIGHUP); the values before, during and after are in the results, and the
figures go to a section of their own (results key ``mysql_pool_<MB>mb``), next to the
default-size ones with ``--merge``.

Each database is measured by a child process (this script with ``--child``), on the test
settings (``tests.settings``: the admin is installed) and a database of its own,
``bench_scale``, created fresh and dropped at the end (``--keep`` keeps it). 10 million
rows take several GB per database. Results: ``benchmarks/results/scale.json`` and
``scale.md``.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.common import (
    LABELS,
    RESULTS,
    ROOT,
    SERVERS,
    git_revision,
    load_average,
    machine,
    percentile,
    subprocess_env,
    write_report,
)

DB_NAME = "bench_scale"
#: A second database kept at the smallest size: each measurement alternates runs on it and on
#: the growing one, so that the ratios compare runs taken minutes apart at most.
REF_NAME = "bench_scale_ref"
URLS = {
    "postgres": f"postgres://root@127.0.0.1:5432/{DB_NAME}",
    "mysql": f"mysql://root@127.0.0.1:3306/{DB_NAME}",
}
TOPICS = [f"scale-{k}" for k in range(10)]
#: The pending tasks and the claims are in these topics (one per worker thread, round robin).
CLAIM_TOPICS = TOPICS[:2]
EXEC_DEFINITION = "scale-exec"
IDENTIFIERS = 100_000
HISTORY_DAYS = 28
CHUNK = {"postgres": 1_000_000, "mysql": 250_000}
TARGET_RATIO = 1.5
#: A sequential scan of a relation (a partition) with fewer rows than this is no scale problem:
#: the planner rightly reads a tiny table whole. Bigger ones fail the verdict.
SMALL_ROWS = 10_000
ADMIN_URL = "/admin/django_tasks_coord/task/"
ADMIN_CASES: dict[str, dict[str, str]] = {
    "admin: unfiltered": {},
    "admin: state = failed": {"state__exact": "43"},
    "admin: state = pending": {"state__exact": "10"},
    "admin: one topic": {"topic__name__exact": "scale-3"},
    "admin: one topic, state = pending": {"topic__name__exact": "scale-0", "state__exact": "10"},
}


# --- the parent: one child per database, then the report --------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--databases", default="postgres,mysql", help="postgres, mysql")
    parser.add_argument("--sizes", default="1000,1000000,10000000", help="completed tasks")
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--tasks", type=int, default=10_000, help="claimed per run")
    parser.add_argument("--batch", type=int, default=50, help="queue.poll limit")
    parser.add_argument("--workers", type=int, default=2, help="claiming threads")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="do not drop bench_scale at the end")
    parser.add_argument(
        "--innodb-buffer-pool",
        type=int,
        metavar="MB",
        help="MariaDB: innodb_buffer_pool_size for the run (set online, restored at the end)",
    )
    parser.add_argument(
        "--merge", action="store_true", help="keep the other databases' results in scale.json"
    )
    parser.add_argument(
        "--render", action="store_true", help="rewrite scale.md from scale.json and stop"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.size_list = sorted({int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()})
    if args.child:
        child(args)
        return
    if args.render:
        document = json.loads((RESULTS / "scale.json").read_text())
        write_report("scale", document, lambda: markdown(document))
        return
    vendors = [v.strip() for v in args.databases.split(",") if v.strip()]
    unknown = sorted(set(vendors) - set(URLS))
    if unknown:
        parser.error(f"unknown database(s) {', '.join(unknown)}; choose from {', '.join(URLS)}")
    # SIGTERM / SIGHUP unwind like Ctrl-C, so that the finally blocks below run (the child is
    # killed by subprocess.run, the databases dropped, the buffer pool size restored).
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
    started = time.monotonic()
    meta: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "python": platform.python_version(),
        "revision": git_revision(),
        "sizes": args.size_list,
        "pending": args.pending,
        "tasks": args.tasks,
        "batch": args.batch,
        "workers": args.workers,
        "repeat": args.repeat,
        "load_start": load_average(),
    }
    results: dict[str, Any] = {}
    errors: list[str] = []
    for vendor in vendors:
        print(f"== {LABELS[vendor]}", flush=True)
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
            out = Path(handle.name)
        command = [sys.executable, "-m", "benchmarks.scale", *forward(args)]
        command += ["--child", vendor, "--out", str(out)]
        env = subprocess_env("tests.settings", DATABASE_URL=URLS[vendor])
        pool: dict[str, Any] | None = None
        key = vendor
        try:
            if vendor == "mysql" and args.innodb_buffer_pool:
                key = f"{vendor}_pool_{args.innodb_buffer_pool}mb"
                pool = {"requested_mb": args.innodb_buffer_pool}
                set_buffer_pool(args.innodb_buffer_pool * 2**20, pool)
            try:
                code = subprocess.run(command, cwd=ROOT, env=env).returncode
                if out.stat().st_size:
                    results[key] = {"vendor": vendor, **json.loads(out.read_text())}
                if code:
                    errors.append(f"{key}: the child exited with {code}")
            finally:
                out.unlink(missing_ok=True)
                if not args.keep:
                    drop_database(vendor)
                    drop_database(vendor, REF_NAME)
        finally:
            if pool is not None and "before" in pool:
                pool.update(restore_buffer_pool(pool["before"]))
                print(f"  innodb_buffer_pool_size: {pool}", flush=True)
                if key in results:
                    results[key]["buffer_pool"] = pool
    previous = RESULTS / "scale.json"
    kept: dict[str, Any] = {}
    if args.merge and previous.exists():
        kept = json.loads(previous.read_text())
        for vendor, result in kept.get("results", {}).items():
            if vendor not in results:  # an earlier merge's date is kept
                results[vendor] = {"merged_from": kept["meta"], **result}
        order = list(URLS)
        results = dict(
            sorted(results.items(), key=lambda kv: (order.index(kv[1].get("vendor", kv[0])), kv[0]))
        )
    meta["load_end"] = load_average()
    meta["duration_min"] = round((time.monotonic() - started) / 60, 1)
    document: dict[str, Any] = {"meta": meta, "results": results, "errors": errors}
    if args.merge and previous.exists() and kept.get("notes"):
        document["notes"] = kept["notes"]  # findings written by hand: edit them after the run
    write_report("scale", document, lambda: markdown(document))


def forward(args: argparse.Namespace) -> list[str]:
    """The options a child gets from the parent."""
    return [
        f"--sizes={','.join(map(str, args.size_list))}",
        f"--pending={args.pending}",
        f"--tasks={args.tasks}",
        f"--batch={args.batch}",
        f"--workers={args.workers}",
        f"--repeat={args.repeat}",
    ]


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def buffer_pool_state(cursor: Any) -> tuple[int, str]:
    """MariaDB: (innodb_buffer_pool_size in bytes, Innodb_buffer_pool_resize_status)."""
    cursor.execute("SELECT @@GLOBAL.innodb_buffer_pool_size")
    size = int(cursor.fetchone()[0])
    cursor.execute("SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_resize_status'")
    row = cursor.fetchone()
    return size, (row[1] if row else "") or ""


def resize_buffer_pool(size: int, timeout: float = 600) -> dict[str, Any]:
    """``SET GLOBAL innodb_buffer_pool_size`` and wait until the online resize is done.

    Done: the resize status no longer says it is at work (MariaDB 10.11: "Completed
    resizing buffer pool at ...", or empty when the statement itself waited) and the
    variable holds the new value (rounded up to a chunk at most). A failed resize raises."""
    conn = admin_connect("mysql")
    try:
        cursor = conn.cursor()
        started = time.monotonic()
        cursor.execute("SET GLOBAL innodb_buffer_pool_size = %s", [size])
        while True:
            current, status = buffer_pool_state(cursor)
            if "fail" in status.lower():
                raise RuntimeError(f"innodb_buffer_pool_size resize failed: {status}")
            busy = bool(status) and not status.lower().startswith("completed")
            if not busy and abs(current - size) < 2**27:
                break
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"innodb_buffer_pool_size resize not done: {status!r}")
            time.sleep(0.5)
        return {"bytes": current, "status": status, "wait_s": round(time.monotonic() - started, 1)}
    finally:
        conn.close()


def set_buffer_pool(size: int, pool: dict[str, Any]) -> None:
    """Record the server's buffer pool size in ``pool["before"]`` before anything changes
    (from then on the caller restores it, whatever happens), then resize it to ``size``."""
    conn = admin_connect("mysql")
    try:
        before, _ = buffer_pool_state(conn.cursor())
    finally:
        conn.close()
    pool["before"], pool["before_mb"] = before, round(before / 2**20)
    print(
        f"  innodb_buffer_pool_size {before / 2**20:,.0f} MB -> {size / 2**20:,.0f} MB", flush=True
    )
    done = resize_buffer_pool(size)
    pool.update(
        during=done["bytes"],
        during_mb=round(done["bytes"] / 2**20),
        resize_status=done["status"],
        resize_wait_s=done["wait_s"],
    )


def restore_buffer_pool(before: int) -> dict[str, Any]:
    """Set the buffer pool back to ``before`` bytes (retried: a shrink may be refused while
    the pool is busy); what it is afterwards."""
    last: BaseException | None = None
    for attempt in range(5):
        try:
            done = resize_buffer_pool(before)
            return {
                "after": done["bytes"],
                "after_mb": round(done["bytes"] / 2**20),
                "restored": done["bytes"] == before,
                "restore_wait_s": done["wait_s"],
            }
        except Exception as exc:  # noqa: BLE001 - retried, then reported
            last = exc
            print(f"  restoring innodb_buffer_pool_size failed ({exc}); retrying", flush=True)
            time.sleep(5 * (attempt + 1))
    print(f"  COULD NOT RESTORE innodb_buffer_pool_size to {before}: {last}", flush=True)
    return {"after": None, "restored": False, "restore_error": str(last)}


def server(vendor: str) -> dict[str, Any]:
    return SERVERS[vendor]


def admin_connect(vendor: str) -> Any:
    """An autocommit connection to the server's maintenance database."""
    config = server(vendor)
    if vendor == "postgres":
        import psycopg

        return psycopg.connect(
            host=config["HOST"],
            port=config["PORT"],
            user=config["USER"],
            dbname="postgres",
            autocommit=True,
        )
    import MySQLdb

    return MySQLdb.connect(
        host=config["HOST"], port=config["PORT"], user=config["USER"], passwd=config["PASSWORD"]
    )


def drop_database(vendor: str, name: str = DB_NAME) -> None:
    conn = admin_connect(vendor)
    try:
        if vendor == "postgres":
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        else:
            conn.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
    finally:
        conn.close()


def create_fresh_database(vendor: str, name: str = DB_NAME) -> None:
    drop_database(vendor, name)
    conn = admin_connect(vendor)
    try:
        if vendor == "postgres":
            conn.execute(f'CREATE DATABASE "{name}"')
        else:
            conn.cursor().execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    finally:
        conn.close()


# --- the child: one database, every size -----------------------------------------------------


class Bench:
    """The data set and the measurements on one database (run in a child process)."""

    def __init__(self, vendor: str, args: argparse.Namespace, alias: str = "default") -> None:
        from django.db import connections

        from django_tasks_coord.models import Task

        self.vendor = vendor
        self.args = args
        self.alias = alias
        self.conn = connections[alias]
        self.table = Task._meta.db_table
        self.history_max = 0  # the highest sequence of the completed history
        self.history_rows = 0

    # -- SQL helpers

    def sql(self, statement: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        with self.conn.cursor() as cursor:
            cursor.execute(statement, params or [])
            return list(cursor.fetchall()) if cursor.description else []

    def one(self, statement: str, params: list[Any] | None = None) -> Any:
        rows = self.sql(statement, params)
        return rows[0][0] if rows else None

    def tidy(self) -> float:
        """Planner statistics (and, on PostgreSQL, the visibility map): seconds taken."""
        started = time.perf_counter()
        if self.vendor == "postgres":
            self.sql("SET maintenance_work_mem = '256MB'")
            self.sql(f"VACUUM ANALYZE {self.table}")
        else:
            self.sql(f"ANALYZE TABLE {self.table}")
        return time.perf_counter() - started

    def row_estimates(self) -> dict[str, int]:
        """The planner's row count of the task table and each of its partitions."""
        if self.vendor == "postgres":
            names = [self.table, *self.partitions()]
            rows = self.sql(
                "SELECT relname, GREATEST(reltuples, 0)::bigint FROM pg_class "
                "WHERE relname = ANY(%s) AND relkind = 'r'",
                [names],
            )
            estimates = {name: 0 for name in names}
            estimates.update({name: int(n) for name, n in rows})
            return estimates
        n = self.one(
            "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() "
            "AND TABLE_NAME = %s",
            [self.table],
        )
        return {self.table: int(n or 0)}

    def partitions(self) -> list[str]:
        """The task table's partitions, at any depth (PostgreSQL; none elsewhere)."""
        if self.vendor != "postgres":
            return []
        rows = self.sql(
            "WITH RECURSIVE parts(oid) AS ("
            " SELECT inhrelid FROM pg_inherits WHERE inhparent = %s::regclass"
            " UNION SELECT i.inhrelid FROM pg_inherits i JOIN parts p ON i.inhparent = p.oid)"
            " SELECT c.relname FROM parts JOIN pg_class c ON c.oid = parts.oid ORDER BY 1",
            [self.table],
        )
        return [r[0] for r in rows]

    def schema(self) -> dict[str, Any]:
        """Whether the task table is partitioned, and its indexes."""
        if self.vendor == "postgres":
            kind = self.one("SELECT relkind FROM pg_class WHERE relname = %s", [self.table])
            indexes = [
                r[0]
                for r in self.sql(
                    "SELECT indexdef FROM pg_indexes WHERE tablename = %s ORDER BY indexname",
                    [self.table],
                )
            ]
            parts = self.partitions()
            return {
                "partitioned": kind == "p",
                "partitions": len(parts),
                "partition_names": parts[:50],
                "indexes": indexes,
            }
        partitions = self.one(
            "SELECT COUNT(*) FROM information_schema.PARTITIONS WHERE TABLE_SCHEMA = DATABASE() "
            "AND TABLE_NAME = %s AND PARTITION_NAME IS NOT NULL",
            [self.table],
        )
        indexes = [
            f"{r[0]} ({r[1]})"
            for r in self.sql(
                "SELECT INDEX_NAME, GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX) "
                "FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() "
                "AND TABLE_NAME = %s GROUP BY INDEX_NAME ORDER BY INDEX_NAME",
                [self.table],
            )
        ]
        return {"partitioned": bool(partitions), "partitions": partitions, "indexes": indexes}

    def table_size_mb(self) -> dict[str, float]:
        if self.vendor == "postgres":
            parts = [self.table, *self.partitions()]
            heap = index = 0
            for name in parts:
                heap += self.one("SELECT pg_table_size(%s::regclass)", [name]) or 0
                index += self.one("SELECT pg_indexes_size(%s::regclass)", [name]) or 0
        else:
            heap, index = self.sql(
                "SELECT COALESCE(SUM(DATA_LENGTH), 0), COALESCE(SUM(INDEX_LENGTH), 0) "
                "FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() "
                "AND TABLE_NAME = %s",
                [self.table],
            )[0]
        return {"table_mb": round(heap / 2**20), "indexes_mb": round(index / 2**20)}

    # -- building the data set

    def insert_rows(self, first: int, last: int, *, pending: bool) -> None:
        """Insert tasks numbered ``first`` to ``last`` (inclusive) with one set-based statement.

        History: topics ``scale-0..9`` round robin, 96 % SUCCEEDED, 3 % FAILED, 1 %
        REDUNDANT, created over ``HISTORY_DAYS`` days in number order and finished up to a
        minute later. Pending: the claim topics, created now.
        """
        total = max(self.args.size_list)
        step_us = HISTORY_DAYS * 86400 * 10**6 // max(total, 1)
        if self.vendor == "postgres":
            topic = (
                f"'scale-' || (i % {len(CLAIM_TOPICS)})"
                if pending
                else f"'scale-' || (i % {len(TOPICS)})"
            )
            identifier = f"'id-' || ((i * 7919) % {IDENTIFIERS})"
            payload = "jsonb_build_object('n', i, 'kind', 'invoice', 'amount', i % 1000)"
            number = "generate_series(%s::bigint, %s::bigint) AS s(i)"
            if pending:
                created, started, finished = "now() - interval '1 minute'", "NULL", "NULL"
            else:
                created = f"now() - interval '{HISTORY_DAYS} days' + (i * {step_us}) * interval '1 microsecond'"
                started = f"{created} + interval '1 second'"
                finished = f"{created} + ((i % 60) + 2) * interval '1 second'"
        else:
            topic = (
                f"CONCAT('scale-', i MOD {len(CLAIM_TOPICS)})"
                if pending
                else f"CONCAT('scale-', i MOD {len(TOPICS)})"
            )
            identifier = f"CONCAT('id-', (i * 7919) MOD {IDENTIFIERS})"
            payload = "JSON_OBJECT('n', i, 'kind', 'invoice', 'amount', i MOD 1000)"
            number = f"(SELECT seq AS i FROM seq_{first}_to_{last}) AS s"
            if pending:
                created = "UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE"
                started = finished = "NULL"
            else:
                created = f"UTC_TIMESTAMP(6) - INTERVAL {HISTORY_DAYS} DAY + INTERVAL (i * {step_us}) MICROSECOND"
                started = f"{created} + INTERVAL 1 SECOND"
                finished = f"{created} + INTERVAL ((i MOD 60) + 2) SECOND"
        if pending:
            state, attempts = "10", "0"
        else:
            mod = "%%" if self.vendor == "postgres" else "MOD"
            state = f"CASE WHEN i {mod} 100 < 3 THEN 43 WHEN i {mod} 100 = 3 THEN 45 ELSE 40 END"
            attempts = "1"
        if self.vendor == "postgres":
            topic, identifier, payload, created, started, finished = (
                x.replace("%", "%%")
                for x in (topic, identifier, payload, created, started, finished)
            )
        message = "NULL"
        statement = (
            f"INSERT INTO {self.table} (topic_id, identifier, payload, handler, state, priority, "
            "attempts, created_at, started_at, finished_at, recreated, label, requester, "
            "outcome_reason, concurrency_key, message) "
            f"SELECT {topic}, {identifier}, {payload}, '', {state}, 0, {attempts}, {created}, "
            f"{started}, {finished}, {'false' if self.vendor == 'postgres' else '0'}, '', '', '', '', "
            f"{message} FROM {number}"
        )
        params = [first, last] if self.vendor == "postgres" else []
        self.sql(statement, params)

    def grow(self, size: int) -> dict[str, Any]:
        """Make the history ``size`` completed tasks and the queue ``--pending`` fresh ones."""
        started = time.perf_counter()
        # Everything but the history goes: last size's queue, runs, executor tasks.
        self.sql(f"DELETE FROM {self.table} WHERE sequence > %s", [self.history_max])
        chunk = CHUNK[self.vendor]
        adding = size - self.history_rows
        # MariaDB's 128 MB buffer pool makes row-by-row upkeep of 15 secondary indexes on
        # millions of rows crawl (1M rows: 3 min, slowing down): for a big load they are
        # dropped and built again afterwards, sorted, with their exact definitions.
        keys = self.drop_secondary_keys() if self.vendor == "mysql" and adding >= 200_000 else []
        for first in range(self.history_rows + 1, size + 1, chunk):
            last = min(first + chunk - 1, size)
            self.insert_rows(first, last, pending=False)
            print(
                f"    history {last:>12,} rows  {time.perf_counter() - started:7.1f} s", flush=True
            )
        self.history_rows = max(self.history_rows, size)
        self.history_max = self.one(f"SELECT MAX(sequence) FROM {self.table}") or 0
        history_s = time.perf_counter() - started
        self.insert_pending(self.args.pending)
        pending_s = time.perf_counter() - started - history_s
        indexes_s = 0.0
        if keys:
            indexes_s = self.add_keys(keys)
            print(f"    {len(keys)} indexes built in {indexes_s:.1f} s", flush=True)
        tidy_s = self.tidy()
        return {
            "history_s": round(history_s, 1),
            "pending_s": round(pending_s, 1),
            "indexes_s": round(indexes_s, 1),
            "analyze_s": round(tidy_s, 1),
            "total_s": round(time.perf_counter() - started, 1),
        }

    def drop_secondary_keys(self) -> list[str]:
        """Drop the task table's secondary indexes (MariaDB); their DDL, to add them back."""
        ddl = self.sql(f"SHOW CREATE TABLE {self.table}")[0][1]
        keys = [
            line.strip().rstrip(",")
            for line in ddl.splitlines()
            if line.strip().startswith(("KEY ", "UNIQUE KEY "))
        ]
        names = [re.match(r"(?:UNIQUE )?KEY `([^`]+)`", key).group(1) for key in keys]  # type: ignore[union-attr]
        self.sql("SET foreign_key_checks = 0")  # some back the foreign keys; added back below
        self.sql(f"ALTER TABLE {self.table} " + ", ".join(f"DROP KEY `{n}`" for n in names))
        self.dropped_from = ddl
        return keys

    def add_keys(self, keys: list[str]) -> float:
        started = time.perf_counter()
        self.sql(f"ALTER TABLE {self.table} " + ", ".join(f"ADD {key}" for key in keys))
        self.sql("SET foreign_key_checks = 1")

        def shape(ddl: str) -> list[str]:  # the DDL but its AUTO_INCREMENT counter
            return sorted(re.sub(r" AUTO_INCREMENT=\d+", "", ddl).splitlines())

        if shape(self.sql(f"SHOW CREATE TABLE {self.table}")[0][1]) != shape(self.dropped_from):
            raise RuntimeError("The task table's indexes differ from before the load.")
        return time.perf_counter() - started

    def insert_pending(self, n: int) -> None:
        if n <= 0:
            return
        base = 10**9 + (self.one(f"SELECT MAX(sequence) FROM {self.table}") or 0)
        chunk = CHUNK[self.vendor]
        for first in range(base, base + n, chunk):
            self.insert_rows(first, min(first + chunk - 1, base + n - 1), pending=True)

    def refill(self) -> float:
        """Delete the tasks the last run completed, queue as many fresh ones, analyze."""
        started = time.perf_counter()
        with self.conn.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {self.table} WHERE sequence > %s AND state >= 40",
                [self.history_max],
            )
            done = cursor.rowcount
        self.insert_pending(done)
        self.tidy()
        return time.perf_counter() - started

    def counts(self) -> dict[str, int]:
        rows = self.sql(f"SELECT state, COUNT(*) FROM {self.table} GROUP BY state ORDER BY state")
        return {str(state): n for state, n in rows}

    # -- claim + complete

    def run_once(self) -> dict[str, Any]:
        """``--workers`` threads claim and complete ``--tasks`` tasks; throughput and latency."""
        from benchmarks.common import on

        before = self.io_counters()
        with on(self.alias):
            run = self._run_once()
        after = self.io_counters()
        # Pages read per task: from disk (or the OS cache) and in all (cache hits too).
        run["pages_read_per_task"] = round((after[0] - before[0]) / max(run["tasks"], 1), 2)
        run["pages_per_task"] = round((after[1] - before[1]) / max(run["tasks"], 1), 2)
        return run

    def io_counters(self) -> tuple[int, int]:
        """(pages read into the cache, pages asked for) so far: PostgreSQL this database's
        ``blks_read`` and ``blks_read + blks_hit``; MariaDB the server's InnoDB buffer pool
        reads and read requests (every database on the server)."""
        if self.vendor == "postgres":
            self.sql("SELECT pg_stat_clear_snapshot()")
            read, hit = self.sql(
                "SELECT blks_read, blks_hit FROM pg_stat_database WHERE datname = current_database()"
            )[0]
            return int(read), int(read) + int(hit)
        rows = dict(self.sql("SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_read%%'"))
        return int(rows["Innodb_buffer_pool_reads"]), int(rows["Innodb_buffer_pool_read_requests"])

    def _run_once(self) -> dict[str, Any]:
        from django.db import connections

        from django_tasks_coord import queue

        args = self.args
        per_worker = [args.tasks // args.workers] * args.workers
        per_worker[0] += args.tasks - sum(per_worker)
        owners = [queue.register_owner(f"scale-worker-{k}") for k in range(args.workers)]
        latencies: list[list[float]] = [[] for _ in owners]
        done = [0] * args.workers
        failures: list[BaseException] = []
        barrier = threading.Barrier(args.workers + 1)

        def work(k: int) -> None:
            topic = CLAIM_TOPICS[k % len(CLAIM_TOPICS)]
            try:
                barrier.wait()
                while done[k] < per_worker[k]:
                    t0 = time.perf_counter()
                    tasks = queue.poll(
                        topic,
                        min(args.batch, per_worker[k] - done[k]),
                        owner=owners[k],
                        heartbeat_owner=False,
                    )
                    latencies[k].append(time.perf_counter() - t0)
                    if not tasks:
                        break
                    queue.complete_many(tasks, queue.Result.SUCCESS)
                    done[k] += len(tasks)
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                failures.append(exc)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=work, args=(k,)) for k in range(args.workers)]
        for thread in threads:
            thread.start()
        barrier.wait()
        started = time.perf_counter()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - started
        for owner in owners:
            queue.unregister_owner(owner)
        if failures:
            raise failures[0]
        samples = [s * 1000 for per in latencies for s in per]
        total = sum(done)
        return {
            "tasks": total,
            "wall_s": round(wall, 3),
            "rate": round(total / wall, 1),
            "claims": len(samples),
            "p50_ms": round(percentile(samples, 50), 2),
            "p99_ms": round(percentile(samples, 99), 2),
            "max_ms": round(max(samples), 2),
            "load": load_average(),
        }

    # -- plans

    def explain(self, sql: str) -> dict[str, Any]:
        """The plan of ``sql`` as run (writes rolled back) and whether it scans the task table."""
        from django.db import transaction

        estimates = self.row_estimates()
        names = set(estimates)
        result: dict[str, Any] = {"sql": sql}
        try:
            with transaction.atomic():
                if self.vendor == "postgres":
                    rows = self.sql(f"EXPLAIN (ANALYZE, BUFFERS) {sql}")
                    text = "\n".join(r[0] for r in rows)
                    tree = self.one(f"EXPLAIN (FORMAT JSON) {sql}")
                    if isinstance(tree, str):
                        tree = json.loads(tree)
                else:
                    text = self.one(f"ANALYZE FORMAT=JSON {sql}")
                transaction.set_rollback(True)
        except Exception as exc:  # noqa: BLE001 - a plan that cannot be taken is reported
            result["error"] = f"{type(exc).__name__}: {exc}"
            result["seq_scans"] = result["big_seq_scans"] = []
            return result
        if self.vendor == "postgres":
            result["plan"] = text
            scans = [s for s in seq_scans(tree[0]["Plan"]) if s["relation"] in names]
            # A Seq Scan without a filter right under a LIMIT reads LIMIT rows and stops
            # (e.g. a count capped at 10,001 of a topic's partition): bounded, not counted.
            result["bounded_seq_scans"] = sorted({s["relation"] for s in scans if s["bounded"]})
            result["seq_scans"] = sorted({s["relation"] for s in scans if not s["bounded"]})
            removed = re.findall(r"Rows Removed by Filter: (\d+)", text)
            result["rows_removed_by_filter"] = sum(int(x) for x in removed)
            found = re.search(r"Execution Time: ([\d.]+) ms", text)
            result["execution_ms"] = float(found.group(1)) if found else None
            hits = [int(x) for x in re.findall(r"Buffers: shared hit=(\d+)", text)[:1]]
            reads = [
                int(x) for x in re.findall(r"Buffers: shared (?:hit=\d+ )?read=(\d+)", text)[:1]
            ]
            result["buffers"] = {"hit": hits[0] if hits else 0, "read": reads[0] if reads else 0}
        else:
            plan = json.loads(text)
            result["plan"] = json.dumps(plan, indent=1)
            accesses = list(table_accesses(plan))
            result["seq_scans"] = sorted(
                {t for t, access, _, _ in accesses if access == "ALL" and t in names}
            )
            # An ordered walk of a whole index ("index"), usually cut short by a LIMIT:
            # reported with the rows it really read, not counted as a sequential scan.
            result["index_walks"] = [
                {"table": t, "key": key, "rows_read": r_rows}
                for t, access, key, r_rows in accesses
                if access == "index" and t in names
            ]
            result["rows_read"] = sum(r or 0 for t, _, _, r in accesses if t in names)
            total = plan.get("query_optimization", {})
            result["execution_ms"] = plan.get("query_block", {}).get(
                "r_total_time_ms"
            ) or total.get("r_total_time_ms")
            result["access"] = [f"{t}: {a} {k or ''}".strip() for t, a, k, _ in accesses]
        scanned = result["seq_scans"]
        result["scanned_rows"] = {name: estimates.get(name, 0) for name in scanned}
        result["big_seq_scans"] = sorted(
            n for n, rows in result["scanned_rows"].items() if rows >= SMALL_ROWS
        )
        return result

    def task_queries(self, captured: list[dict[str, str]]) -> list[str]:
        """The captured statements that read or change the task table (not its EXPLAINs)."""
        table = re.compile(rf"\b(FROM|UPDATE|JOIN)\s+[`\"]?{re.escape(self.table)}[`\"]?(\s|$)")
        keep = []
        for query in captured:
            sql = query["sql"].strip()
            head = sql.split(None, 1)[0].upper() if sql else ""
            if head in ("SELECT", "UPDATE", "DELETE") and table.search(sql):
                keep.append(sql)
        return keep

    def plans(self) -> dict[str, list[dict[str, Any]]]:
        """Capture the product's SQL for the claim, the reaper and the admin; explain each.

        Each statement is explained right after the call that ran it, while what it refers
        to (its owner...) still exists; the plan's own run is rolled back.
        """
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        from django_tasks_coord import executions, owners, queue
        from django_tasks_coord.models import Owner

        found: dict[str, list[dict[str, Any]]] = {}

        def capture(name: str, call: Any) -> Any:
            with CaptureQueriesContext(connection) as ctx:
                value = call()
            found[name] = [self.explain(sql) for sql in self.task_queries(ctx.captured_queries)]
            return value

        # The claim and its completion.
        owner = queue.register_owner("scale-plans")
        tasks = capture(
            "claim (queue.poll)",
            lambda: queue.poll(
                CLAIM_TOPICS[0], self.args.batch, owner=owner, heartbeat_owner=False
            ),
        )
        capture("complete (queue.complete_many)", lambda: queue.complete_many(tasks, "success"))
        queue.unregister_owner(owner)

        # The reaper: a dead owner holding tasks, then timed-out executor tasks.
        dead = queue.register_owner("scale-dead")
        queue.poll(CLAIM_TOPICS[1], 20, owner=dead)
        Owner.objects.filter(pk=dead.pk).update(heartbeat=datetime(2000, 1, 1, tzinfo=UTC))
        capture("reaper: owners.expire", lambda: owners.expire())
        for n in range(20):
            executions.create(EXEC_DEFINITION, {"n": n})
        handed = executions.poll([EXEC_DEFINITION], 20)
        for task in handed[:10]:
            executions.start(task.pk, task.exec_id)
        later = datetime.now(UTC).replace(year=datetime.now(UTC).year + 1)
        capture("reaper: executions.reap", lambda: executions.reap(now=later))

        # The admin's task changelist.
        from django.contrib.auth import get_user_model
        from django.test import Client

        user_model = get_user_model()
        user_model.objects.filter(username="scale-bench").delete()
        user = user_model.objects.create_superuser("scale-bench", password="unused")
        client = Client()
        client.force_login(user)
        for name, params in ADMIN_CASES.items():
            client.get(ADMIN_URL, params)  # warm-up (sessions, caches)

            def get(params: dict[str, str] = params, name: str = name) -> None:
                response = client.get(ADMIN_URL, params)
                if response.status_code != 200:
                    raise RuntimeError(f"{name}: HTTP {response.status_code}")

            capture(name, get)
        user.delete()
        return found


def seq_scans(node: dict[str, Any], bounded: bool = False) -> Any:
    """Every Seq Scan node of a PostgreSQL JSON plan: its relation, and whether it is
    bounded (no filter, only pass-through nodes between it and a Limit above)."""
    kind = node.get("Node Type")
    if kind == "Seq Scan":
        yield {"relation": node.get("Relation Name"), "bounded": bounded and "Filter" not in node}
    passes = kind in ("Append", "LockRows", "Subquery Scan", "Result")
    below = kind == "Limit" or (bounded and passes)
    for child in node.get("Plans", []):
        yield from seq_scans(child, below)


def table_accesses(node: Any) -> Any:
    """(table, access_type, key, rows read) of every table access in a MariaDB JSON plan."""
    if isinstance(node, dict):
        table = node.get("table")
        if isinstance(table, dict) and "table_name" in table:
            yield (
                table["table_name"],
                table.get("access_type"),
                table.get("key"),
                table.get("r_rows"),
            )
        for value in node.values():
            yield from table_accesses(value)
    elif isinstance(node, list):
        for value in node:
            yield from table_accesses(value)


def child(args: argparse.Namespace) -> None:
    """Measure one database (``--child VENDOR``) and write the figures to ``--out``."""
    import os

    vendor = args.child
    create_fresh_database(vendor)
    create_fresh_database(vendor, REF_NAME)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    from django.conf import settings

    settings.DATABASES["reference"] = {**settings.DATABASES["default"], "NAME": REF_NAME}
    import django

    django.setup()
    from django.core.management import call_command
    from django.test.utils import setup_test_environment

    from benchmarks.common import on
    from django_tasks_coord import definitions, queue

    setup_test_environment()  # the test client's host, as in benchmarks/admin.py
    for alias in ("default", "reference"):
        call_command("migrate", database=alias, verbosity=0)
        with on(alias):
            for name in TOPICS:
                queue.register_topic(name)  # before its tasks: it makes the topic's partition
    definitions.define(EXEC_DEFINITION, requested_to_start_timeout=60, in_progress_timeout=600)
    definitions.sync()
    bench = Bench(vendor, args)
    reference = Bench(vendor, args, "reference")
    smallest = args.size_list[0]
    out: dict[str, Any] = {
        "server": bench.one("SELECT version()"),
        "settings": server_settings(bench),
        "schema": bench.schema(),
        "reference": {"size": smallest, "build": reference.grow(smallest)},
        "sizes": {},
    }
    print(f"  schema: partitioned={out['schema']['partitioned']}", flush=True)
    for size in args.size_list:
        print(f"  {LABELS[vendor]}: {size:,} completed + {args.pending:,} pending", flush=True)
        build = bench.grow(size)
        entry: dict[str, Any] = {
            "build": build,
            "size": bench.table_size_mb(),
            "counts": bench.counts(),
            "load_before": load_average(),
        }
        print(f"    built in {build['total_s']} s; {entry['size']}", flush=True)
        runs, ref_runs = [], []
        for r in range(args.repeat):
            # Alternate which database goes first (ABBA...), so drift in load cancels out.
            order = [(reference, ref_runs), (bench, runs)]
            for which, into in order if r % 2 == 0 else order[::-1]:
                run = which.run_once()
                into.append(run)
                refill_s = which.refill()
                name = f"ref {human(smallest)}" if which is reference else human(size)
                print(
                    f"    run {r + 1} {name:>8}: {run['rate']:8.0f} tasks/s  claim p50 "
                    f"{run['p50_ms']:6.2f} ms  p99 {run['p99_ms']:6.2f} ms  pages/task read "
                    f"{run['pages_read_per_task']} of {run['pages_per_task']} (refill "
                    f"{refill_s:.1f} s; load {run['load']})",
                    flush=True,
                )
        entry["runs"], entry["reference_runs"] = runs, ref_runs
        for key, source in (("", runs), ("reference_", ref_runs)):
            entry[f"{key}rate"] = round(statistics.median(r["rate"] for r in source), 1)
            entry[f"{key}p50_ms"] = round(statistics.median(r["p50_ms"] for r in source), 2)
            entry[f"{key}p99_ms"] = round(statistics.median(r["p99_ms"] for r in source), 2)
        # Per round: how much worse than the reference run of the same round; then the median.
        pairs = list(zip(ref_runs, runs, strict=True))
        entry["vs_reference"] = {
            "throughput_x_worse": round(
                statistics.median(a["rate"] / b["rate"] for a, b in pairs), 2
            ),
            "p99_x_worse": round(statistics.median(b["p99_ms"] / a["p99_ms"] for a, b in pairs), 2),
            "p50_x_worse": round(statistics.median(b["p50_ms"] / a["p50_ms"] for a, b in pairs), 2),
        }
        for key, source in (("", runs), ("reference_", ref_runs)):
            for name in ("pages_read_per_task", "pages_per_task"):
                entry[f"{key}{name}"] = statistics.median(r[name] for r in source)
        print(f"    against the reference: {entry['vs_reference']}", flush=True)
        entry["plans"] = bench.plans()
        entry["seq_scans"] = {
            name: sorted({t for plan in plans for t in plan["big_seq_scans"]})
            for name, plans in entry["plans"].items()
        }
        bench.refill()
        entry["load_after"] = load_average()
        bad = {k: v for k, v in entry["seq_scans"].items() if v}
        print(
            f"    seq scans of the task table (>= {SMALL_ROWS:,} rows): {bad or 'none'}", flush=True
        )
        out["sizes"][str(size)] = entry
        Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    out["schema_end"] = bench.schema()
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))


def server_settings(bench: Bench) -> dict[str, Any]:
    if bench.vendor == "postgres":
        names = ["shared_buffers", "work_mem", "random_page_cost", "synchronous_commit", "jit"]
        return {n: bench.one(f"SHOW {n}") for n in names}
    rows = bench.sql(
        "SHOW VARIABLES WHERE Variable_name IN ('innodb_buffer_pool_size', "
        "'innodb_flush_log_at_trx_commit', 'innodb_change_buffering')"
    )
    return dict(rows)


# --- the report --------------------------------------------------------------------------------


def ratios(result: dict[str, Any]) -> dict[str, Any] | None:
    """The largest size against the reference database (the smallest size), per round.

    Also the plain ratio of the medians of the smallest and the largest size, which were
    measured minutes to an hour apart (noisier on a shared machine)."""
    sizes = result["sizes"]
    if not sizes:
        return None
    keys = sorted(sizes, key=int)
    small, large = sizes[keys[0]], sizes[keys[-1]]
    vs = large["vs_reference"]
    return {
        "small": int(result.get("reference", {}).get("size", keys[0])),
        "large": int(keys[-1]),
        **vs,
        "met": vs["throughput_x_worse"] <= TARGET_RATIO and vs["p99_x_worse"] <= TARGET_RATIO,
        "across_sizes": {
            "throughput_x_worse": round(small["rate"] / large["rate"], 2),
            "p99_x_worse": round(large["p99_ms"] / small["p99_ms"], 2),
        },
    }


def section_title(vendor: str, result: dict[str, Any]) -> str:
    """The database, and for MariaDB the size of its buffer pool during the run."""
    label = LABELS[vendor]
    if vendor != "mysql":
        return label
    size = int(result["settings"].get("innodb_buffer_pool_size", 0)) // 2**20
    if result.get("buffer_pool"):
        return f"{label}, buffer pool sized to the working set ({size:,} MB)"
    return f"{label}, the server's default buffer pool ({size:,} MB)"


def pool_line(result: dict[str, Any]) -> str:
    """What ``--innodb-buffer-pool`` did to the server: the values before, during, after."""
    pool = result.get("buffer_pool")
    if not pool:
        return ""
    after = f"{pool['after_mb']:,} MB" if pool.get("after") is not None else "NOT RESTORED"
    return (
        f" `innodb_buffer_pool_size` set for this run with `SET GLOBAL` (online resize): "
        f"{pool['before_mb']:,} MB before, {pool['during_mb']:,} MB during the run, {after} "
        f"after ({'restored' if pool.get('restored') else '**not restored**'})."
    )


def targets(results: dict[str, Any]) -> list[str]:
    """One line per measured configuration: is the target met at the largest size?"""
    lines = [
        "## Targets at a glance",
        "",
        "| database, configuration | sizes | throughput x worse | p99 x worse (p50) | "
        "seq scans of the task table | target |",
        "| --- | --- | ---: | ---: | --- | --- |",
    ]
    for key, result in results.items():
        vendor = result.get("vendor", key)
        r = ratios(result)
        if not r:
            continue
        sizes = result["sizes"]
        largest = sizes[max(sizes, key=int)]
        scans = sorted({t for v in largest["seq_scans"].values() for t in v})
        met = r["met"] and not scans
        lines.append(
            f"| {section_title(vendor, result)} | {human(r['large'])} vs {human(r['small'])} | "
            f"{r['throughput_x_worse']}x | {r['p99_x_worse']}x ({r['p50_x_worse']}x) | "
            f"{', '.join(scans) or 'none'} | {'met' if met else '**missed**'} |"
        )
    return [*lines, ""]


def io(entry: dict[str, Any]) -> str:
    """Pages per task read into the cache, of all asked for, and the reference's (medians)."""
    if "pages_per_task" not in entry:
        return "-"
    return (
        f"{entry['pages_read_per_task']} of {entry['pages_per_task']} "
        f"({entry['reference_pages_read_per_task']} of {entry['reference_pages_per_task']})"
    )


def human(n: int) -> str:
    for unit, div in (("M", 10**6), ("k", 10**3)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return f"{n:,}"


def markdown(document: dict[str, Any]) -> str:
    meta, results = document["meta"], document["results"]
    lines = [
        "# Scale: claim + complete and plans with a big history",
        "",
        f"{meta['date']}; {meta['machine']}; Python {meta['python']}; django-tasks-coord "
        f"{meta['revision']}. Load average at start / end: {meta['load_start']} / "
        f"{meta['load_end']}; total run time {meta['duration_min']} min.",
        "",
        f"Each size: that many completed tasks over {len(TOPICS)} topics (96 % succeeded, 3 % "
        f"failed, 1 % redundant; created over {HISTORY_DAYS} days; {IDENTIFIERS:,} identifiers) "
        f"plus {meta['pending']:,} pending tasks in {len(CLAIM_TOPICS)} topics. A run: "
        f"{meta['workers']} threads, each with its own owner and topic, claim with `queue.poll"
        f"(topic, {meta['batch']}, owner=..., heartbeat_owner=False)` and complete with "
        f"`queue.complete_many` until {meta['tasks']:,} tasks are done. Throughput = tasks / "
        "wall time; claim latency = the time of each `queue.poll` call. Figures: medians of "
        f"{meta['repeat']} runs; between runs the completed tasks are deleted, as many fresh "
        "pending ones inserted and the table analyzed (PostgreSQL: `VACUUM ANALYZE`). A "
        "second database, the *reference*, stays at the smallest size; every run on the "
        "growing database is paired with one on the reference (taken in turns, ABBA), and "
        "the ratios are medians of the per-pair ratios: the machine is shared and its load "
        "changes over the hour the sizes take to build. Target: at the largest size, "
        f"throughput and p99 no more than {TARGET_RATIO}x worse than at the smallest, and no "
        "sequential scan of the task table.",
        "",
    ]
    lines += targets(results)
    for key_, result in results.items():
        vendor = result.get("vendor", key_)
        schema = result.get("schema_end") or result["schema"]
        label = LABELS[vendor]
        part = (
            f"partitioned ({schema['partitions']} partitions)"
            if schema["partitioned"]
            else "not partitioned"
        )
        merged = result.get("merged_from")
        earlier = (
            f" Measured in an earlier run ({merged['date']}, revision {merged['revision']}, load "
            f"{merged['load_start']} -> {merged['load_end']})."
            if merged
            else ""
        )
        lines += [
            f"## {section_title(vendor, result)}",
            "",
            f"{result['server']}; task table {part}; settings {json.dumps(result['settings'])}."
            f"{earlier}{pool_line(result)}",
            "",
            "| completed tasks | claim+complete tasks/s | claim p50 ms | claim p99 ms | "
            f"reference ({human(result.get('reference', {}).get('size', 0))}) in the same "
            "rounds: tasks/s, p50, p99 | x worse than the reference: throughput, p99 (p50) | "
            f"seq scans of the task table (>= {SMALL_ROWS:,} rows) | pages per task: read from "
            "disk / OS cache, of all (reference) | runs (tasks/s) | build s "
            "(history + queue + indexes + analyze) | table + indexes MB | load before -> after |",
            "| ---: | ---: | ---: | ---: | --- | --- | --- | --- | --- | ---: | ---: | --- |",
        ]
        sizes = result["sizes"]
        for key in sorted(sizes, key=int):
            entry = sizes[key]
            build, size = entry["build"], entry["size"]
            scans = sorted({t for v in entry["seq_scans"].values() for t in v})
            runs = ", ".join(f"{r['rate']:,.0f}" for r in entry["runs"])
            vs = entry["vs_reference"]
            lines.append(
                f"| {int(key):,} | {entry['rate']:,.0f} | {entry['p50_ms']} | {entry['p99_ms']} | "
                f"{entry['reference_rate']:,.0f}, {entry['reference_p50_ms']}, "
                f"{entry['reference_p99_ms']} | {vs['throughput_x_worse']}x, {vs['p99_x_worse']}x "
                f"({vs['p50_x_worse']}x) | {', '.join(scans) or 'none'} | {io(entry)} | {runs} | "
                f"{build['total_s']} ({build['history_s']} + {build['pending_s']} + "
                f"{build.get('indexes_s', 0)} + {build['analyze_s']}) | {size['table_mb']:,} + "
                f"{size['indexes_mb']:,} | {entry['load_before']} -> {entry['load_after']} |"
            )
        r = ratios(result)
        if r:
            across = r["across_sizes"]
            lines += [
                "",
                f"**{human(r['large'])} against {human(r['small'])}** (median of per-round "
                f"ratios against the reference): throughput {r['throughput_x_worse']}x worse, "
                f"p99 claim latency {r['p99_x_worse']}x worse (p50 {r['p50_x_worse']}x); "
                f"target <= {TARGET_RATIO}x: {'met' if r['met'] else '**missed**'}. Medians of "
                f"the {human(r['large'])} rows against those of the smallest size's rows, "
                f"measured at another time: throughput {across['throughput_x_worse']}x, p99 "
                f"{across['p99_x_worse']}x.",
            ]
        # Verdicts: query x size.
        keys = sorted(sizes, key=int)
        names: list[str] = []
        for key in keys:
            names += [n for n in sizes[key]["plans"] if n not in names]
        lines += [
            "",
            "Plans of the SQL the product ran (every statement on the task table), per size: "
            "`index` = no sequential scan of the task table"
            + (
                " (no access type ALL); an ordered walk of a whole index (type `index`, cut "
                "short by a LIMIT) is noted with the rows it read"
                if vendor == "mysql"
                else " (no Seq Scan node on it or its partitions)"
            )
            + f"; a relation under {SMALL_ROWS:,} rows (a small partition) read whole is noted "
            "but no failure. `xN`: N statements alike; slowest: the longest execution of the call's "
            "statements in its plan's run.",
            "",
            "| query | " + " | ".join(human(int(k)) for k in keys) + " |",
            "| --- | " + " | ".join("---" for _ in keys) + " |",
        ]
        for name in names:
            cells = []
            for key in keys:
                plans = sizes[key]["plans"].get(name, [])
                if not plans:
                    cells.append("-")
                    continue
                cells.append(cell(plans))
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        # The plans themselves, at the largest size.
        largest = sizes[keys[-1]] if keys else None
        if largest:
            lines += [
                "",
                "<details><summary>Plans at "
                f"{human(int(keys[-1]))} completed tasks ({label})</summary>",
                "",
            ]
            for name, plans in largest["plans"].items():
                for i, plan in enumerate(plans, 1):
                    lines += [
                        f"#### {name} ({i}/{len(plans)})",
                        "",
                        "```sql",
                        shorten(plan["sql"]),
                        "```",
                        "",
                        "```",
                        plan.get("plan") or plan.get("error", ""),
                        "```",
                        "",
                    ]
            lines += ["</details>", ""]
        lines += ["", "Indexes of the task table:", ""]
        lines += [f"- `{ix}`" for ix in schema["indexes"][:40]]
        lines.append("")
    if document["errors"]:
        lines += ["## Errors", ""] + [f"- {e}" for e in document["errors"]] + [""]
    if document.get("notes"):  # findings added to scale.json by hand after a run
        lines += ["## Findings", ""] + [f"- {n}" for n in document["notes"]] + [""]
    lines += [
        "Building: PostgreSQL inserts through the (partitioned or not) table with all its "
        "indexes in place. MariaDB's 128 MB buffer pool makes the upkeep of 17 secondary "
        "indexes crawl for millions of rows, so for a load of 200,000 rows or more they are "
        "dropped and added back afterwards (same DDL, checked; also with a bigger buffer pool, "
        "so that the builds compare), built sorted: an index built "
        "that way is more compact than one grown row by row.",
        "",
        "All plans at every size are in `scale.json`. Sizes are built one after another in one "
        "database (1k, then grown to 1M, then to 10M), so the rows of different sizes are taken "
        "many minutes apart on a shared machine; the ratios come from runs paired with the "
        "reference database instead.",
        "",
    ]
    return "\n".join(lines)


def cell(plans: list[dict[str, Any]]) -> str:
    """The verdicts of one call's statements (alike ones counted) and the slowest plan's time."""
    counted: dict[str, int] = {}
    for plan in plans:
        text = "error: " + plan["error"][:80] if plan.get("error") else verdict(plan)
        counted[text] = counted.get(text, 0) + 1
    times = [p["execution_ms"] for p in plans if isinstance(p.get("execution_ms"), int | float)]
    parts = [f"{text} x{n}" if n > 1 else text for text, n in counted.items()]
    return "; ".join(parts) + (f"; slowest {max(times):.1f} ms" if times else "")


def verdict(plan: dict[str, Any]) -> str:
    """A plan's cell: ``index``, or which (big) relations it scans whole."""
    scanned = plan.get("scanned_rows", {})
    big = {n: r for n, r in scanned.items() if r >= SMALL_ROWS}
    if big:
        return "**SEQ SCAN " + ", ".join(f"{n} (~{r:,} rows)" for n, r in big.items()) + "**"
    notes = []
    bounded = plan.get("bounded_seq_scans", [])
    if bounded:
        notes.append(f"bounded Seq Scan (no filter, under a LIMIT) of {', '.join(bounded)}")
    if scanned:
        most = max(scanned.values())
        notes.append(f"+{len(scanned)} small relation(s) read whole, <= {most:,} rows")
    removed = plan.get("rows_removed_by_filter") or 0
    if removed >= 1000:
        notes.append(f"{removed:,} rows removed by filter")
    for walk in plan.get("index_walks", []):
        if (walk["rows_read"] or 0) >= 1000:
            notes.append(f"walks {walk['key']}, {walk['rows_read']:,.0f} rows read")
    return "index" + (f" ({'; '.join(notes)})" if notes else "")


def shorten(sql: str, limit: int = 1500) -> str:
    """A long ``IN (...)`` list cut down for reading."""
    sql = re.sub(r"IN \(([^()]{200,})\)", lambda m: f"IN ({m.group(1)[:80]}, ...)", sql)
    return sql if len(sql) <= limit else sql[:limit] + " ..."


if __name__ == "__main__":
    main()
