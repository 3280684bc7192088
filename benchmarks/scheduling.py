"""Scheduling: how late job runs start, and how fast one node submits due schedules.

Measured on each database asked for (``--databases``):

- **start lag**: three real ``runscheduler`` nodes (one on SQLite) process the
  jobs topic while ``--jobs`` recurring jobs fire every second, their slots spread evenly
  over the second, until ``--slots`` slots (after a warm-up) have run. The job
  (``benchapp_sched/jobs.py``) stores ``time.time()`` taken on its first line; lag = that
  start - the run's slot. From the task row, each lag splits into *submit* (slot ->
  ``created_at``: the scheduler woke up and inserted the run), *claim* (``created_at`` ->
  ``started_at``: the insert's transaction committed, a node heard of it and claimed it)
  and *dispatch* (``started_at`` -> handler start: a worker thread picked the run up).
  PostgreSQL runs the default node settings (LISTEN/NOTIFY wake-ups), then the same with
  persistent connections (``CONN_MAX_AGE=60``); MariaDB, which polls, runs with
  ``POLL_INTERVAL`` 0.2 s and with the default 1 s (:data:`LAG_CONFIGS`).
- **submission rate**: ``--schedules`` recurring jobs, all due in the same second (rows as
  ``scheduling.schedule_recurring`` stores them: one made by the API, the others copied
  from it with ``bulk_create``), each with one finished run (its previous slot) in the
  task table, both tables analyzed: a system that has been running. *In process*:
  ``scheduler.submit_due(node, now=...)`` called until nothing is due (it claims at most
  500 jobs per call), ``--repeat`` rounds, each with the time of every SQL statement; one
  more round with an empty task table, one under cProfile. *With a node*: one
  ``runscheduler`` process (processing an empty topic, so the runs stay queued) submits
  them at their due second; timed until the last run is visible.

Usage::

    ./run bench scheduling
    python -m benchmarks.scheduling --databases postgres,mysql,sqlite --slots 200 --schedules 10000

Results: ``benchmarks/results/scheduling.json`` and ``benchmarks/results/scheduling.md``.
Targets (PostgreSQL): start lag p99 < 100 ms; 10,000 schedules due in one second all
submitted within 5 s.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import json
import math
import os
import platform
import pstats
import re
import sqlite3
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.cluster import Cluster
from benchmarks.common import (
    LABELS,
    ROOT,
    SERVERS,
    as_datetime,
    bench_env,
    configure_django,
    git_revision,
    machine,
    mysql_variables,
    on,
    percentile,
    postgres_settings,
    query,
    write_report,
)

DB_NAME = "bench_scheduling"

STAMP = "benchmarks.benchapp_sched.jobs.stamp"
NOOP = "benchmarks.benchapp_sched.jobs.noop"
#: The topic the submission-rate node processes: registered, always empty, so the runs it
#: submits stay queued and only the scheduler works.
IDLE_TOPIC = "bench.idle"
#: Slots of each job left out at the start (connections, imports, first queries).
WARMUP_SLOTS = 2


@dataclasses.dataclass(frozen=True)
class LagConfig:
    """One start-lag measurement: node settings, and how many jobs and slots.

    ``settings`` are ``TASKS_COORD`` overrides of the nodes, except ``CONN_MAX_AGE``, which
    goes to their ``DATABASES`` entry. ``jobs``: None takes ``--jobs``; ``slots`` caps
    ``--slots`` (a single job every second collects one slot a second).
    """

    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    jobs: int | None = None
    slots: int | None = None

    def label(self, jobs: int) -> str:
        extra = ", ".join(f"{k}={v}" for k, v in self.settings.items()) or "defaults"
        return f"{extra}; {jobs} job{'s' if jobs > 1 else ''}"


#: The start-lag measurements of each database.
LAG_CONFIGS: dict[str, list[LagConfig]] = {
    "postgres": [LagConfig(), LagConfig({"CONN_MAX_AGE": 60}), LagConfig(jobs=1, slots=60)],
    "mysql": [LagConfig({"POLL_INTERVAL": 0.2}), LagConfig(), LagConfig(jobs=1, slots=60)],
    "sqlite": [LagConfig(), LagConfig(jobs=1, slots=60)],
}
#: Every node runs with these (no status lines: the benchmark reads the database).
QUIET = {"STATUS_INTERVAL": 0}
LAG_TARGET_MS = 100.0
SUBMIT_TARGET_S = 5.0
HOUR = timedelta(hours=1)
#: PostgreSQL flushes a session's statistics at most every second while it works and within
#: 10 s once it idles: wait this long before reading ``pg_stat_database``.
STATS_SETTLE_S = 11.0
#: The statement kind (:meth:`SqlTimer.kind`) of the scheduler's due-jobs query (``SELECT ...
#: FOR UPDATE SKIP LOCKED``; plain ``SELECT`` on SQLite): the only read of ``periodic_task``.
SELECT_DUE = "SELECT periodic_task (due jobs)"


# --- databases ------------------------------------------------------------------------------


def database(vendor: str) -> dict[str, Any]:
    """The ``DATABASES`` entry of the benchmark database on ``vendor`` (SQLite: a temp file)."""
    return common.database(vendor, DB_NAME)


def configure(vendors: list[str]) -> None:
    """Set up Django in this process with one alias per database (named like the vendor)."""
    databases = {vendor: database(vendor) for vendor in vendors}
    databases["default"] = databases[vendors[0]]
    configure_django(databases)


def reachable(vendor: str) -> bool:
    """Whether ``vendor``'s server answers (creating the benchmark database on the way)."""
    return common.reachable(vendor, DB_NAME)


def prepare(vendor: str) -> None:
    """Migrate, then empty the tables the benchmark uses (tasks, schedules, owners)."""
    from django.core.management import call_command

    from django_tasks_coord import scheduling, topics
    from django_tasks_coord.models import Owner

    call_command("migrate", database=vendor, verbosity=0)
    clear_schedules(vendor)
    with on(vendor):
        Owner.objects.using(vendor).all().delete()
        topics.register_internal_topic(scheduling.JOBS_TOPIC)
        topics.register_topic(IDLE_TOPIC)
        scheduling.resume_all()


def clear_schedules(vendor: str) -> None:
    """Delete every schedule and every task (nodes may be running: owners stay)."""
    from django_tasks_coord.models import PeriodicTask, Task

    Task.objects.using(vendor).all().delete()
    PeriodicTask.objects.using(vendor).all().delete()


def tidy(vendor: str) -> None:
    """Refresh planner statistics after refilling the tables; hold no connection afterwards."""
    from django_tasks_coord.models import PeriodicTask, Task

    common.tidy(vendor, Task._meta.db_table, PeriodicTask._meta.db_table)


# --- nodes ----------------------------------------------------------------------------------


def node_env(vendor: str, settings: dict[str, Any]) -> dict[str, str]:
    """Environment of a ``runscheduler`` subprocess: ``benchmarks.settings``, no benchmark app.

    ``settings`` are ``TASKS_COORD`` overrides, except ``CONN_MAX_AGE`` (a database setting).
    """
    settings = dict(settings)
    config = database(vendor)
    if "CONN_MAX_AGE" in settings:
        config["CONN_MAX_AGE"] = settings.pop("CONN_MAX_AGE")
    return bench_env(config, app="none", tasks_coord={**QUIET, **settings})


@contextmanager
def nodes(
    vendor: str, count: int, topic: str, settings: dict[str, Any]
) -> Iterator[Callable[..., None]]:
    """Run ``count`` nodes processing ``topic``; yield ``wait_for(condition, what, timeout)``.

    Yields once every node has registered (and, on PostgreSQL, listens). ``wait_for``
    checks ``condition`` every ``every`` s (50 ms) and fails with the nodes' output when a node died or
    ``timeout`` passed. On the way out every node gets SIGTERM and must exit with 0.
    """
    with Cluster(node_env(vendor, settings)) as cluster:
        cluster.start_many(count, "--topic", topic, "-v", "0")
        cluster.wait_ready(vendor, timeout=60)
        yield cluster.wait_for
    if any(cluster.codes):
        raise RuntimeError(
            f"{LABELS[vendor]} nodes exited with {cluster.codes}.\n{cluster.output()}"
        )


# --- statistics -----------------------------------------------------------------------------


def summary_ms(values: list[float]) -> dict[str, float]:
    """Median, p95, p99, min and max of durations given in seconds, in milliseconds."""
    ms = [v * 1000 for v in values]
    return {
        "median_ms": round(statistics.median(ms), 2),
        "p95_ms": round(percentile(ms, 95), 2),
        "p99_ms": round(percentile(ms, 99), 2),
        "min_ms": round(min(ms), 2),
        "max_ms": round(max(ms), 2),
    }


# --- start lag ------------------------------------------------------------------------------


def transactions(vendor: str) -> tuple[int, float] | None:
    """PostgreSQL: transactions committed or rolled back in the benchmark database so far,
    and when, read after :data:`STATS_SETTLE_S` (``pg_stat_database`` is per database, so
    other benchmarks do not count). None elsewhere."""
    if vendor != "postgres":
        return None
    time.sleep(STATS_SETTLE_S)
    rows = query(
        vendor,
        "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
        [DB_NAME],
    )
    return int(rows[0][0]), time.monotonic()


def start_lag(vendor: str, config: LagConfig, slots: int, jobs: int) -> dict[str, Any]:
    """Run ``jobs`` jobs every second on the nodes until ``slots`` slots (after warm-up) ran.

    Job ``i`` fires at ``T0 + i/jobs`` s, ``T0 + 1 + i/jobs`` s... (``end_time`` stops
    it), so slots are spread evenly over each second. Returns the lag of every measured
    slot (its handler start - the slot) and its three stages.
    """
    from django.utils import timezone

    from django_tasks_coord import scheduling
    from django_tasks_coord.enums import COMPLETED_MIN, TaskState
    from django_tasks_coord.models import PeriodicTask, Task

    count = 1 if vendor == "sqlite" else 3
    jobs, slots = config.jobs or jobs, min(config.slots or slots, slots)
    settings = config.settings
    per_job = math.ceil(slots / jobs) + WARMUP_SLOTS
    prepare(vendor)
    tidy(vendor)
    with on(vendor), nodes(vendor, count, scheduling.JOBS_TOPIC, settings) as wait_for:
        idle = transactions(vendor)  # then the nodes' own traffic with nothing to do
        busy = transactions(vendor)
        t0 = (timezone.now() + timedelta(seconds=2)).replace(microsecond=0)
        ids = []
        for i in range(jobs):
            start = t0 + timedelta(seconds=i / jobs)
            ids.append(
                scheduling.schedule_recurring(
                    STAMP,
                    1,
                    start_time=start,
                    end_time=start + timedelta(seconds=per_job - 1),
                    job_id=f"lag-{i}",
                )
            )
        runs = Task.objects.using(vendor).filter(identifier__in=ids)
        done = runs.filter(state=TaskState.SUCCEEDED)
        print(
            f"  {LABELS[vendor]}: {jobs} job(s) x {per_job} slots on {count} node(s)...", flush=True
        )
        polls = 0
        enabled = PeriodicTask.objects.using(vendor).filter(pk__in=ids, enabled=True)
        unfinished = runs.filter(state__lt=COMPLETED_MIN)

        def finished() -> bool:
            """Every job is past its end (disabled) and every run it submitted has ended.

            Not a count of runs: a slot the scheduler drops (more than one interval late,
            see ``gaps``) never gets one."""
            nonlocal polls
            polls += 3
            return done.count() >= jobs * per_job or not (enabled.exists() or unfinished.exists())

        wait_for(finished, "completion of every run", per_job + 60, every=0.5)
        end = transactions(vendor)
    traffic = None
    if idle and busy and end:
        idle_rate = (busy[0] - idle[0]) / (busy[1] - idle[1])
        during = end[0] - busy[0] - polls - 2 * jobs  # less this process's own statements
        traffic = {
            "idle_transactions_per_s": round(idle_rate, 1),
            "transactions_per_slot": round(
                (during - idle_rate * (end[1] - busy[1])) / (jobs * per_job), 1
            ),
        }
    rows = list(
        runs.values_list("identifier", "slot", "state", "created_at", "started_at", "message")
    )
    not_ok = [r for r in rows if r[2] != TaskState.SUCCEEDED]
    lag, submit, claim, dispatch, pids = [], [], [], [], set()
    measured = 0
    by_job: dict[str, list[datetime]] = defaultdict(list)
    for identifier, slot, _, created, started, message in sorted(rows, key=lambda r: r[1]):
        slot = as_datetime(slot)
        by_job[identifier].append(slot)
        start = t0 + timedelta(seconds=int(identifier.split("-")[1]) / jobs)
        if slot < start + timedelta(seconds=WARMUP_SLOTS) or message is None:
            continue
        stamp = json.loads(message)
        pids.add(stamp["pid"])
        measured += 1
        at, created, started = slot.timestamp(), as_datetime(created), as_datetime(started)
        lag.append(stamp["started"] - at)
        submit.append(created.timestamp() - at)
        claim.append(started.timestamp() - created.timestamp())
        dispatch.append(stamp["started"] - started.timestamp())
    gaps = sum(
        1
        for slot_list in by_job.values()
        for a, b in zip(sorted(slot_list), sorted(slot_list)[1:], strict=False)
        if b - a != timedelta(seconds=1)
    )
    duplicates = len(rows) - len({(r[0], r[1]) for r in rows})
    return {
        "nodes": count,
        "jobs": jobs,
        "settings": {**QUIET, **settings},
        "label": config.label(jobs),
        "slots": measured,
        "warmup_slots_per_job": WARMUP_SLOTS,
        "runs": len(rows),
        "runs_expected": jobs * per_job,
        "runs_not_succeeded": len(not_ok),
        "gaps": gaps,
        "duplicates": duplicates,
        "processes_that_ran_jobs": len(pids),
        "database_traffic": traffic,
        "load_average_after": load_average(),
        "lag": summary_ms(lag),
        "stages": {
            "submit (slot -> created_at)": summary_ms(submit),
            "claim (created_at -> started_at)": summary_ms(claim),
            "dispatch (started_at -> handler)": summary_ms(dispatch),
        },
        "lag_ms_in_slot_order": [round(v * 1000, 2) for v in lag],
    }


# --- submission rate ------------------------------------------------------------------------


def define_schedules(vendor: str, count: int, due: datetime, *, history: bool = True) -> None:
    """Empty the task and schedule tables, then define ``count`` jobs (every 60 s) due at ``due``.

    The first is made by ``scheduling.schedule_recurring``; the others are copies of its
    row with other ids (``bulk_create``, 1,000 a statement), so every row is exactly what
    the API stores. With ``history`` each job gets one finished run (its previous slot)
    in the task table: a system that has been running. Both tables are analyzed.
    """
    from django_tasks_coord import scheduling
    from django_tasks_coord.enums import TaskState
    from django_tasks_coord.models import PeriodicTask, Task

    clear_schedules(vendor)
    with on(vendor):
        first = scheduling.schedule_recurring(NOOP, 60, start_time=due, job_id="rate-00000")
        model = PeriodicTask.objects.using(vendor).get(pk=first)
        assert model.nextrun == due, (model.nextrun, due)
        fields = {
            f.attname: getattr(model, f.attname)
            for f in PeriodicTask._meta.concrete_fields
            if f.attname not in ("id", "created_at")
        }
        payload = {"task": model.task, "args": model.args, "kwargs": model.kwargs}
        previous = due - timedelta(seconds=60)
        for start in range(0, count, 1000):
            ids = [f"rate-{i:05d}" for i in range(start, min(count, start + 1000))]
            PeriodicTask.objects.using(vendor).bulk_create(
                PeriodicTask(id=job_id, **fields) for job_id in ids if job_id != first
            )
            if not history:
                continue
            Task.objects.using(vendor).bulk_create(
                Task(
                    topic_id=scheduling.JOBS_TOPIC,
                    identifier=job_id,
                    slot=previous,
                    payload=payload,
                    state=TaskState.SUCCEEDED,
                    attempts=1,
                    started_at=previous,
                    finished_at=previous,
                )
                for job_id in ids
            )
    tidy(vendor)


class SqlTimer:
    """A connection execute wrapper: time spent in each kind of SQL statement."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    @staticmethod
    def kind(sql: str) -> str:
        """``VERB table`` of a statement; the due-jobs query is :data:`SELECT_DUE`."""
        if "pg_notify" in sql:
            return "SELECT pg_notify"
        verb = sql.split(maxsplit=1)[0].upper() if sql.strip() else "?"
        tables = re.findall(r'\b(?:FROM|INTO|UPDATE)\s+[`"]?(\w+)', sql, re.IGNORECASE)
        if verb == "SELECT" and "periodic_task" in tables:
            return SELECT_DUE
        return f"{verb} {(tables or [''])[0]}".strip()

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        start = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            kind = self.kind(sql)
            self.seconds[kind] += time.perf_counter() - start
            self.calls[kind] += 1


def drain_due(vendor: str, now: datetime) -> dict[str, Any]:
    """Call ``submit_due`` until it submits nothing, timing each call and its SQL."""
    from django.db import connections

    from django_tasks_coord.scheduling import scheduler

    timer = SqlTimer()
    calls = []
    with on(vendor), connections[vendor].execute_wrapper(timer):
        begin = time.perf_counter()
        while True:
            sql_before, select_before = sum(timer.seconds.values()), timer.seconds[SELECT_DUE]
            start = time.perf_counter()
            created = scheduler.submit_due("bench", now=now)
            calls.append(
                {
                    "runs": len(created),
                    "s": round(time.perf_counter() - start, 4),
                    "sql_s": round(sum(timer.seconds.values()) - sql_before, 4),
                    "select_due_s": round(timer.seconds[SELECT_DUE] - select_before, 4),
                }
            )
            if not created:
                break
        total = time.perf_counter() - begin
    return {
        "total_s": round(total, 3),
        "sql_s": round(sum(timer.seconds.values()), 3),
        "by_statement": {
            kind: {"s": round(seconds, 3), "calls": timer.calls[kind]}
            for kind, seconds in sorted(timer.seconds.items(), key=lambda item: -item[1])
        },
        "calls": calls,
    }


def submitted(vendor: str, due: datetime) -> int:
    """How many runs of the submission-rate jobs exist for slot ``due``."""
    from django_tasks_coord import scheduling
    from django_tasks_coord.models import Task

    return (
        Task.objects.using(vendor)
        .filter(topic_id=scheduling.JOBS_TOPIC, slot=due, identifier__startswith="rate-")
        .count()
    )


def submission_in_process(vendor: str, schedules: int, repeat: int) -> dict[str, Any]:
    """``repeat`` timed drains with history, one with an empty task table, one under cProfile."""
    due = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
    now = due + timedelta(milliseconds=500)  # half a second into the due second

    def drain(
        what: str, *, history: bool = True, profiler: cProfile.Profile | None = None
    ) -> dict[str, Any]:
        define_schedules(vendor, schedules, due, history=history)
        if profiler is not None:
            profiler.enable()
        result = drain_due(vendor, now)
        if profiler is not None:
            profiler.disable()
        count = submitted(vendor, due)
        if count != schedules:
            raise RuntimeError(f"{LABELS[vendor]}: {count} of {schedules} runs submitted.")
        print(
            f"  {LABELS[vendor]}: {what}: {schedules} submitted in {result['total_s']:.2f}s "
            f"({result['sql_s']:.2f}s in SQL)",
            flush=True,
        )
        return result

    prepare(vendor)
    rounds = [drain(f"round {i + 1}") for i in range(repeat)]
    fresh = drain("empty task table", history=False)
    profiler = cProfile.Profile()
    profiled = drain("under cProfile", profiler=profiler)
    median = statistics.median(r["total_s"] for r in rounds)
    typical = min(rounds, key=lambda r: abs(r["total_s"] - median))
    return {
        "schedules": schedules,
        "total_s": round(median, 3),
        "schedules_per_s": round(schedules / median),
        "calls_per_round": len(typical["calls"]),
        "median_call_s": round(statistics.median(c["s"] for c in typical["calls"] if c["runs"]), 4),
        "typical_round": typical,
        "round_totals_s": [r["total_s"] for r in rounds],
        "rounds": rounds,
        "empty_task_table": fresh,
        "profile": profile_summary(profiler, profiled["total_s"]),
        "load_average_after": load_average(),
    }


def profile_summary(profiler: cProfile.Profile, total: float, top: int = 25) -> dict[str, Any]:
    """The functions with the most time of their own, and the package's heaviest calls."""
    stats = pstats.Stats(profiler, stream=io.StringIO())
    rows = []
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    for (filename, line, name), (_, calls, own, cumulative, _) in raw.items():
        where = filename.split("site-packages/")[-1].replace(str(ROOT) + "/", "")
        rows.append(
            {
                "function": f"{where}:{line}({name})",
                "calls": calls,
                "own_s": round(own, 3),
                "cumulative_s": round(cumulative, 3),
            }
        )
    own = sorted(rows, key=lambda r: -r["own_s"])[:top]
    package = sorted(
        (
            r
            for r in rows
            if r["function"].startswith(("django_tasks_coord/", "django/db/models/query.py"))
        ),
        key=lambda r: -r["cumulative_s"],
    )[:top]
    return {"total_s_under_profiler": round(total, 3), "by_own_time": own, "by_cumulative": package}


def submission_with_node(vendor: str, schedules: int) -> dict[str, Any]:
    """One real node submits ``schedules`` jobs due in the same second; timed until all are in.

    The node starts first; the schedules are defined an hour ahead, then moved with one
    ``UPDATE`` (``nextrun`` and ``start_time``) to the next whole second at least 2 s away:
    a schedule change wakes the node on PostgreSQL; elsewhere it looks at least every
    ``POLL_INTERVAL`` (1 s). It processes only an empty topic, so the runs stay queued and
    the scheduler works alone.
    """
    from django.db.models import Count, Max, Min

    from django_tasks_coord import db, scheduling
    from django_tasks_coord.models import PeriodicTask, Task

    prepare(vendor)
    tidy(vendor)
    with on(vendor), nodes(vendor, 1, IDLE_TOPIC, {}) as wait_for:
        define_schedules(vendor, schedules, datetime.now(UTC).replace(microsecond=0) + HOUR)
        due = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=3)
        PeriodicTask.objects.using(vendor).update(nextrun=due, start_time=due)
        db.notify(db.connection(), scheduling.SCHEDULE_CHANGED)  # as the API does (PostgreSQL)
        if time.time() > due.timestamp() - 1.1:
            raise RuntimeError(f"Moving {schedules} schedules took too long to measure.")
        runs = Task.objects.using(vendor).filter(topic_id=scheduling.JOBS_TOPIC, slot=due)
        wait_for(lambda: runs.count() >= schedules, f"{schedules} runs", 120)
        visible = time.time()
    stats = runs.aggregate(
        first=Min("created_at"), last=Max("created_at"), batches=Count("created_at", distinct=True)
    )
    first, last = as_datetime(stats["first"]), as_datetime(stats["last"])
    total = visible - due.timestamp()
    return {
        "schedules": schedules,
        "all_visible_s": round(total, 3),
        "schedules_per_s": round(schedules / total),
        "first_insert_s": round(first.timestamp() - due.timestamp(), 3),
        "last_insert_s": round(last.timestamp() - due.timestamp(), 3),
        "insert_statements": stats["batches"],
        "note": "all_visible_s: due second -> the benchmark's count (every 50 ms) saw every run; "
        "first/last_insert_s: due second -> created_at of the first and last run (DB clock, "
        "start of each batch's INSERT).",
    }


# --- results --------------------------------------------------------------------------------


def server_info(vendors: list[str]) -> dict[str, Any]:
    """Server versions and the durability settings that bound per-commit costs."""
    info: dict[str, Any] = {}
    if "postgres" in vendors:
        names = ["server_version", "fsync", "synchronous_commit", "shared_buffers"]
        info["postgres"] = postgres_settings("postgres", names)
    if "mysql" in vendors:
        info["mysql"] = mysql_variables("mysql")
    if "sqlite" in vendors:
        info["sqlite"] = {"version": sqlite3.sqlite_version}
    return info


def other_benchmarks() -> list[str]:
    """Other benchmark processes running now (the machine is shared): their command lines."""
    mine = {os.getpid()}
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if int(proc.name) in mine:
                continue
            args = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent in mine:
            continue
        if re.search(r"benchmarks[/.]|runscheduler|pgbench|procrastinate", args):
            found.append(args[:120])
    return sorted(found)


def load_average() -> str:
    """The 1/5/15-minute load averages."""
    return common.load_average(" / ")


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets on PostgreSQL, each with its figure and whether it is met."""
    rows = []
    lag = results["start_lag"].get("postgres")
    if lag:
        p99 = lag[0]["lag"]["p99_ms"]
        rows.append(
            {
                "target": f"start lag p99 < {LAG_TARGET_MS:.0f} ms (3 nodes)",
                "figure": f"{p99} ms",
                "met": p99 < LAG_TARGET_MS,
            }
        )
    rate = results["submission"].get("postgres", {})
    for key, what in (("in_process", "total_s"), ("node", "all_visible_s")):
        if key in rate:
            total = rate[key][what]
            rows.append(
                {
                    "target": f"{rate[key]['schedules']:,} due schedules submitted within "
                    f"{SUBMIT_TARGET_S:.0f} s ({key.replace('_', ' ')})",
                    "figure": f"{total} s",
                    "met": total <= SUBMIT_TARGET_S,
                }
            )
    return rows


def markdown(results: dict[str, Any], meta: dict[str, Any]) -> str:
    """The human-readable report."""
    lines = [
        "# Scheduling benchmark",
        "",
        f"{meta['date']}; {meta['machine']}; Python {meta['python']}, Django {meta['django']}; "
        f"commit {meta['commit']}. Servers: "
        + "; ".join(f"{LABELS[v]} {json.dumps(i)}" for v, i in meta["servers"].items())
        + ".",
        "",
        f"Load average (1/5/15 min) at start {meta['load_at_start']}, at end "
        f"{meta['load_at_end']}; other benchmark processes at start: "
        f"{len(meta['other_benchmarks_at_start'])}, at end: "
        f"{len(meta['other_benchmarks_at_end'])} (listed in the JSON).",
        "",
        "## Targets (PostgreSQL)",
        "",
        "| target | figure | met |",
        "| --- | ---: | --- |",
    ]
    for row in results["targets"]:
        lines.append(f"| {row['target']} | {row['figure']} | {'yes' if row['met'] else '**no**'} |")
    lines += [
        "",
        "## Start lag",
        "",
        f"Recurring jobs every second ({meta['jobs']}, slots spread evenly over the second, "
        "unless the row says 1 job) on real `runscheduler` nodes processing the jobs topic "
        "(3 nodes; SQLite 1). Lag = handler start (`time.time()` on the job's first line) - "
        f"slot; the first {WARMUP_SLOTS} slots of each job are left out. Stages from the run's "
        "task row: *submit* = slot -> `created_at` (the scheduler woke up, locked the due job "
        "and began the INSERT; DB clock), *claim* = `created_at` -> `started_at` (the rest of "
        "the submitting transaction, the wake-up of a dispatcher, its heartbeat and claim "
        "SELECT; `started_at` is taken before the claim's UPDATE), *dispatch* = `started_at` "
        "-> handler start (the claim's UPDATE and commit, the hand-over to a worker thread, "
        "which needs no query before calling the job: the run carries its attempt limit). "
        "Milliseconds.",
        "",
        "| database | node settings; jobs | slots | median | p95 | p99 | max | submit p50 / p99 | "
        "claim p50 / p99 | dispatch p50 / p99 | dropped slots / dup. | nodes that ran jobs | "
        "DB transactions per slot (idle: per s) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for vendor, runs in results["start_lag"].items():
        for r in runs:
            lag, st = r["lag"], list(r["stages"].values())
            lines.append(
                f"| {LABELS[vendor]} | {r['label']} | {r['slots']} | "
                f"{lag['median_ms']} | {lag['p95_ms']} | {lag['p99_ms']} | {lag['max_ms']} | "
                + " | ".join(f"{s['median_ms']} / {s['p99_ms']}" for s in st)
                + f" | {r['runs_expected'] - r['runs']} / {r['duplicates']} | "
                + f"{r['processes_that_ran_jobs']} | "
                + (
                    f"{t['transactions_per_slot']} ({t['idle_transactions_per_s']})"
                    if (t := r.get("database_traffic"))
                    else "-"
                )
                + " |"
            )
    lines += [
        "",
        "## Submission rate",
        "",
        f"{meta['schedules']:,} recurring jobs (every 60 s) due in the same second, each with "
        "one finished run (its previous slot) in the task table, both tables analyzed: a system "
        "that has been running. *In process*: `scheduler.submit_due(node, now=due + 0.5 s)` "
        f"called until nothing is due (500 jobs a call), median of {meta['repeat']} rounds; "
        "*empty task table*: one more round without the history. *Node*: one `runscheduler` "
        "(default settings, processing an empty topic so that only its scheduler works) submits "
        "them at their due second; timed from the due second until every run is visible.",
        "",
        "| database | in process: total s | schedules/s | of which SQL s | calls | "
        "empty task table: total s | node: all visible s | schedules/s | "
        "first / last INSERT at s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for vendor, r in results["submission"].items():
        ip, nd = r.get("in_process", {}), r.get("node", {})
        typical = ip.get("typical_round", {})
        fresh = ip.get("empty_task_table", {})
        lines.append(
            f"| {LABELS[vendor]} | {ip.get('total_s', '-')} | {ip.get('schedules_per_s', '-')} | "
            f"{typical.get('sql_s', '-')} | {ip.get('calls_per_round', '-')} | "
            f"{fresh.get('total_s', '-')} | "
            f"{nd.get('all_visible_s', '-')} | {nd.get('schedules_per_s', '-')} | "
            f"{nd.get('first_insert_s', '-')} / {nd.get('last_insert_s', '-')} |"
        )
    for vendor, r in results["submission"].items():
        ip = r.get("in_process")
        if not ip:
            continue
        typical = ip["typical_round"]
        selects = [c["select_due_s"] for c in typical["calls"]]
        lines += [
            "",
            f"### Where the time goes: {LABELS[vendor]}",
            "",
            f"The median round ({typical['total_s']} s): {typical['sql_s']} s inside "
            "`cursor.execute` (the database and the driver), the rest in Python.",
            "",
            "| statement | calls | s |",
            "| --- | ---: | ---: |",
        ]
        for kind, v in typical["by_statement"].items():
            lines.append(f"| `{kind}` | {v['calls']} | {v['s']} |")
        if vendor == "sqlite":
            lines += [
                "",
                "SQLite computes a SELECT's rows as they are fetched, after `cursor.execute` "
                "returns: its due-jobs query shows under `sqlite3.Cursor.fetchmany` in the "
                "profile below, not in this table.",
            ]
        lines += [
            "",
            "The due-jobs query (`SELECT ... FOR UPDATE SKIP LOCKED` on `periodic_task`), call by "
            "call (s): " + ", ".join(f"{v:.3f}" for v in selects) + ".",
        ]
        prof = ip["profile"]
        lines += [
            "",
            f"cProfile, one more round ({prof['total_s_under_profiler']} s under the profiler), "
            "heaviest package and queryset calls by cumulative time:",
            "",
            "| function | calls | cumulative s | own s |",
            "| --- | ---: | ---: | ---: |",
        ]
        for row in prof["by_cumulative"][:12]:
            lines.append(
                f"| `{row['function']}` | {row['calls']} | {row['cumulative_s']} | {row['own_s']} |"
            )
        lines += ["", "By own time:", ""]
        lines += ["| function | calls | own s | cumulative s |", "| --- | ---: | ---: | ---: |"]
        for row in prof["by_own_time"][:10]:
            lines.append(
                f"| `{row['function']}` | {row['calls']} | {row['own_s']} | {row['cumulative_s']} |"
            )
    if results.get("errors"):
        lines += ["", "## Failed measurements", ""]
        lines += [f"- {e.splitlines()[0]}" for e in results["errors"]]
    if results.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in results["notes"]]
    return "\n".join(lines) + "\n"


def write_results(results: dict[str, Any], meta: dict[str, Any]) -> None:
    """Write ``scheduling.json`` and ``scheduling.md`` and print the latter."""
    results["targets"] = targets(results)
    write_report("scheduling", {"meta": meta, **results}, lambda: markdown(results, meta))


# --- main -----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--databases", default="postgres,mysql,sqlite")
    parser.add_argument("--slots", type=int, default=200, help="start-lag slots per configuration")
    parser.add_argument("--jobs", type=int, default=4, help="start-lag jobs (each every second)")
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3, help="in-process submission rounds")
    parser.add_argument("--skip-lag", action="store_true")
    parser.add_argument("--skip-submission", action="store_true")
    args = parser.parse_args()
    vendors = [v for v in args.databases.split(",") if v]
    unknown = set(vendors) - set(SERVERS)
    if unknown:
        parser.error(f"unknown database(s): {', '.join(sorted(unknown))}")
    vendors = [v for v in vendors if reachable(v)]
    if not vendors:
        sys.exit("No database answers.")
    configure(vendors)
    import django

    contention = {"load_at_start": load_average(), "other_benchmarks_at_start": other_benchmarks()}

    results: dict[str, Any] = {"start_lag": {}, "submission": {}, "errors": []}

    def attempt(what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - one failed measurement must not end the run
            results["errors"].append(f"{what}: {str(exc)[-3000:]}")
            print(f"  FAILED {what}: {str(exc)[-3000:]}", flush=True)
            return None

    for vendor in vendors:
        if not args.skip_lag:
            for config in LAG_CONFIGS[vendor]:
                lag = attempt(
                    f"start lag {vendor} {config.label(config.jobs or args.jobs)}",
                    lambda v=vendor, c=config: start_lag(v, c, args.slots, args.jobs),
                )
                if lag:
                    results["start_lag"].setdefault(vendor, []).append(lag)
        if not args.skip_submission:
            entry: dict[str, Any] = {}
            ip = attempt(
                f"submission in process {vendor}",
                lambda v=vendor: submission_in_process(v, args.schedules, args.repeat),
            )
            if ip:
                entry["in_process"] = ip
            nd = attempt(
                f"submission with a node {vendor}",
                lambda v=vendor: submission_with_node(v, args.schedules),
            )
            if nd:
                entry["node"] = nd
            results["submission"][vendor] = entry
        attempt(f"clean-up {vendor}", lambda v=vendor: prepare(v))
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "python": platform.python_version(),
        "django": django.get_version(),
        "commit": git_revision(),
        "servers": server_info(vendors),
        "slots": args.slots,
        "jobs": args.jobs,
        "schedules": args.schedules,
        "repeat": args.repeat,
        **contention,
        "load_at_end": load_average(),
        "other_benchmarks_at_end": other_benchmarks(),
    }
    write_results(results, meta)


if __name__ == "__main__":
    main()
