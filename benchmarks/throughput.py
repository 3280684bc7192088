"""Node throughput and start latency, beside django-tasks-db, procrastinate and a pgbench ceiling.

Measured in one run, on each database asked for (``--databases``):

- **ours**: a real ``runscheduler --burst`` subprocess draining ``--tasks`` no-op
  tasks, once with settings tuned for a no-op drain (:data:`TUNED`) and once with the
  defaults. Tasks/s = tasks / (last ``finished_at`` - first ``started_at``), read from the
  task table, so process start-up is excluded; the wall time of the process, start-up
  included, is reported beside it.
- **django-tasks-db**: its ``db_worker --batch`` (one worker), timed the same way from its
  results table (``started_at``/``finished_at``).
- **procrastinate** (PostgreSQL only): its worker, ``--concurrency 8 --one-shot``, timed from
  its ``procrastinate_events`` table (first ``started`` to last ``succeeded``).
- **the ceiling** (PostgreSQL only): ``pgbench`` with 4 clients running
  ``pgbench_claim.sql`` (claim one task with ``SKIP LOCKED`` and finish it, one transaction
  per task) on our own task table; ``pgbench_claim_two_step.sql`` (claim, then finish: two
  transactions per task) is reported beside it.
- **start latency** of a due task on an idle node (a long-running ``runscheduler`` with the
  default settings): push one task and read when its handler started (the ``latency``
  consumer stores ``time.time()``), against the push's commit; and for a task pushed with
  ``execute_at`` a little ahead, against ``execute_at``.

The peers live in their own virtualenv, ``benchmarks/.venv-peers`` (created on first use,
pinned versions: :data:`PEER_PACKAGES`); they are never dependencies of the package.

Usage::

    ./run bench throughput
    python -m benchmarks.throughput --databases postgres,mysql,sqlite --tasks 10000 --repeat 3
    python -m benchmarks.throughput --databases postgres --skip-peers --latency-samples 0

Results: ``benchmarks/results/throughput.json`` and ``benchmarks/results/throughput.md``.
The machine is shared and noisy: figures are medians of ``--repeat`` rounds, each round runs
every system once, and ratios are taken within a round. ``benchmarks.paired`` measures our
node alone, two versions of the package against each other (before and after a change).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import math
import platform
import random
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks.cluster import Cluster, run_node
from benchmarks.common import (
    HERE,
    LABELS,
    RESULTS,  # noqa: F401 - read as throughput.RESULTS
    ROOT,
    SERVERS,
    as_datetime,
    bench_env,
    configure_django,
    create_database,
    database,
    git_revision,
    load_average,
    machine,
    mysql_variables,
    on,
    percentile,
    postgres_settings,
    query,
    subprocess_env,
    terminate,
    tidy,
    write_report,
)
from benchmarks.common import reachable as server_reachable

PEERS_VENV = HERE / ".venv-peers"

#: The peers, pinned. Django, psycopg and mysqlclient are pinned to this environment's versions.
PEER_PACKAGES = {"django-tasks-db": "0.13.0", "procrastinate": "3.10.0"}

#: Node settings for a no-op drain: claim and complete in batches of 500 and keep up to
#: 1,000 claimed tasks ready. With no-op tasks a claimed task is done in microseconds, so a
#: node's throughput is (tasks it may hold) / (claim + completion round trip): the defaults
#: (5 workers + a buffer of 10) hold 15.
TUNED = {"WORKERS": 4, "BUFFER": 1000, "BATCH_SIZE": 500}

TOPIC = "noop"
LATENCY_TOPIC = "latency"
#: How far ahead ``execute_at`` is set in the delayed latency samples, in seconds.
LATENCY_AHEAD = 0.3
PROCRASTINATE_CONCURRENCY = 8
PGBENCH = shutil.which("pgbench") or "/usr/bin/pgbench"
PGBENCH_CLIENTS = 4
#: Seconds a peer's worker may run before it is stopped (SIGTERM, graceful) and timed on the
#: tasks it finished. django-tasks-db drains about 100 tasks/s here: 10,000 tasks would take
#: minutes per round, and a one-task-at-a-time worker's rate does not depend on how far
#: into the queue it is. Off PostgreSQL, django-tasks-db runs in the first round only.
PEER_TIME_BOX = 45.0

OURS_DB = "bench_throughput"
TASKS_DB_DB = "bench_peers_tasks_db"
PROCRASTINATE_DB = "bench_peers_procrastinate"
TASKS_DB_TABLE = "django_tasks_database_dbtaskresult"

OURS_TUNED = "ours (tuned)"
OURS_DEFAULT = "ours (defaults)"
TASKS_DB = "django-tasks-db (defaults: 1 worker)"
TASKS_DB_BEST_2 = "django-tasks-db (2 workers, CONN_MAX_AGE=None)"
TASKS_DB_BEST_4 = "django-tasks-db (4 workers, CONN_MAX_AGE=None)"
PROCRASTINATE_DEFAULT = "procrastinate (defaults: concurrency 1)"
PROCRASTINATE = f"procrastinate (concurrency {PROCRASTINATE_CONCURRENCY})"
CEILING = "ceiling: pgbench, 1 txn/task"
TWO_STEP = "pgbench, 2 txns/task"


# --- databases ------------------------------------------------------------------------------


def alias_of(vendor: str, name: str) -> str:
    """The orchestrator's Django alias for a benchmark database."""
    return f"{name}_{vendor}"


def configure(vendors: list[str]) -> None:
    """Set up Django in this process with every database the run touches."""
    databases = {}
    for vendor in vendors:
        for name in (OURS_DB, TASKS_DB_DB) + ((PROCRASTINATE_DB,) if vendor == "postgres" else ()):
            databases[alias_of(vendor, name)] = database(vendor, name)
    databases["default"] = databases[alias_of(vendors[0], OURS_DB)]
    configure_django(databases)


def reachable(vendor: str) -> bool:
    """Whether ``vendor``'s server answers (creating the benchmark database on the way)."""
    return server_reachable(vendor, OURS_DB)


# --- processes ------------------------------------------------------------------------------


def django_env(
    config: dict[str, Any], *, system: str = "coord", tasks_coord: dict[str, Any] | None = None
) -> dict[str, str]:
    """Environment for a ``manage.py`` subprocess using ``benchmarks/settings.py``."""
    return bench_env(config, tasks_coord=tasks_coord, BENCH_SYSTEM=system)


def run(
    cmd: list[Any], env: dict[str, str] | None = None, *, time_box: float | None = None
) -> tuple[float, str]:
    """Run ``cmd`` in the project root; return its wall time and output. Raise if it fails.

    With ``time_box``, the process gets SIGTERM (a graceful stop) after that many seconds.
    """
    with tempfile.TemporaryFile(mode="w+") as out:
        start = time.perf_counter()
        args = [str(part) for part in cmd]
        process = subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        stopped = False
        try:
            process.wait(timeout=time_box)
        except subprocess.TimeoutExpired:
            stopped = True
            terminate([process], 30)
        elapsed = time.perf_counter() - start
        out.seek(0)
        output = out.read()
    if process.returncode and not stopped:
        raise RuntimeError(f"{' '.join(args)} exited with {process.returncode}:\n{output[-4000:]}")
    return elapsed, output


@dataclasses.dataclass
class Drain:
    """One drain: how many tasks finished and how long it took."""

    tasks: int
    drain_s: float  # first start to last finish, from the system's own table
    wall_s: float  # the worker process, start-up and shutdown included
    round: int = 0  # which round of the run measured it

    @property
    def rate(self) -> float:
        return self.tasks / self.drain_s

    @property
    def wall_rate(self) -> float:
        return self.tasks / self.wall_s if self.wall_s else 0.0


def drain_from(
    rows: list[tuple[Any, ...]], wall: float, queued: int, what: str, *, partial: bool = False
) -> Drain:
    """A :class:`Drain` from one ``(finished count, first start, last finish)`` row.

    Every queued task must have finished, unless ``partial`` (a time-boxed peer).
    """
    done, first, last = int(rows[0][0] or 0), rows[0][1], rows[0][2]
    if done < 2 or (done != queued and not partial):
        raise RuntimeError(f"{what}: {done} of {queued} tasks finished.")
    return Drain(done, (as_datetime(last) - as_datetime(first)).total_seconds(), wall)


# --- our node -------------------------------------------------------------------------------


def fill_ours(vendor: str, count: int) -> None:
    """Empty our task table and push ``count`` no-op tasks (``push_many``, 1,000 at a time)."""
    from django_tasks_coord import queue
    from django_tasks_coord.models import Owner, Task

    alias = alias_of(vendor, OURS_DB)
    with on(alias):
        queue.register_topic(TOPIC)
        queue.register_topic(LATENCY_TOPIC)
        Task.objects.using(alias).all().delete()
        Owner.objects.using(alias).all().delete()
        for start in range(0, count, 1000):
            queue.push_many(
                TOPIC, [(f"task-{i}", None) for i in range(start, min(count, start + 1000))]
            )
    tidy(alias, Task._meta.db_table)


def drain_ours(vendor: str, count: int, settings: dict[str, Any]) -> Drain:
    """Fill the queue, then drain it with one ``runscheduler --burst`` process."""
    from django.db.models import Count, Max, Min, Q

    from django_tasks_coord.enums import TaskState
    from django_tasks_coord.models import Task

    fill_ours(vendor, count)
    env = django_env(database(vendor, OURS_DB), tasks_coord=settings)
    code, wall, output = run_node(env, "--burst", "--topic", TOPIC, "-v", "0")
    if code:
        raise RuntimeError(f"runscheduler --burst exited with {code}:\n{output}")
    alias = alias_of(vendor, OURS_DB)
    row = (
        Task.objects.using(alias)
        .filter(topic_id=TOPIC)
        .aggregate(
            done=Count("pk", filter=Q(state=TaskState.SUCCEEDED)),
            first=Min("started_at"),
            last=Max("finished_at"),
        )
    )
    what = f"runscheduler (output: {output[-1500:]!r})"
    return drain_from([(row["done"], row["first"], row["last"])], wall, count, what)


def node_settings(overrides: dict[str, Any]) -> dict[str, Any]:
    """Every setting a node started with ``TASKS_COORD=overrides`` runs with."""
    from django.test.utils import override_settings

    from django_tasks_coord.node import NodeConfig

    with override_settings(TASKS_COORD=overrides):
        config = dataclasses.asdict(NodeConfig.from_settings())
    config.pop("node_id", None)
    config.pop("burst", None)
    return config


# --- the peers ------------------------------------------------------------------------------


def peer_pins() -> list[str]:
    """The packages of the peers' virtualenv, every one pinned."""
    pins = [f"{name}=={version}" for name, version in PEER_PACKAGES.items()]
    pins.append(f"Django=={importlib.metadata.version('Django')}")
    pins.append(f"psycopg[binary]=={importlib.metadata.version('psycopg')}")
    with suppress(importlib.metadata.PackageNotFoundError):
        pins.append(f"mysqlclient=={importlib.metadata.version('mysqlclient')}")
    return pins


def peers_python() -> Path:
    """Create ``benchmarks/.venv-peers`` on first use (or when the pins change); its Python."""
    python = PEERS_VENV / "bin" / "python"
    marker = PEERS_VENV / "pins.txt"
    pins = peer_pins()
    if python.exists() and marker.exists() and marker.read_text().split() == pins:
        return python
    print(f"Creating {PEERS_VENV.relative_to(ROOT)} with {' '.join(pins)}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(PEERS_VENV)], check=True)
    subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *pins],
        check=True,
    )
    marker.write_text("\n".join(pins) + "\n")
    return python


def peer_versions(python: Path) -> dict[str, str]:
    """Installed versions of the peers' packages, as their virtualenv reports them."""
    script = (
        "import importlib.metadata as m, json, sys; "
        "print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))"
    )
    names = [*PEER_PACKAGES, "Django", "psycopg"]
    out = subprocess.run([python, "-c", script, *names], capture_output=True, text=True, check=True)
    versions: dict[str, str] = json.loads(out.stdout)
    return versions


@dataclasses.dataclass(frozen=True)
class PeerSetup:
    """One way of running a peer: its label and settings.

    django-tasks-db: ``workers`` ``db_worker`` processes at once, persistent connections
    (``CONN_MAX_AGE=None``) or not. procrastinate: one worker with ``concurrency``.
    """

    label: str
    system: str  # "tasks_db" or "procrastinate"
    workers: int = 1
    persistent: bool = False
    concurrency: int = 1
    best: bool = False  # the peer's best documented settings (a default otherwise)


#: Each peer at its defaults and at its best documented settings: django-tasks-db with
#: persistent connections and several workers (2 and 4: the better one is "best"),
#: procrastinate with concurrency. Ours are compared with each, in the same round.
PEER_SETUPS = (
    PeerSetup(TASKS_DB, "tasks_db"),
    PeerSetup(TASKS_DB_BEST_2, "tasks_db", workers=2, persistent=True, best=True),
    PeerSetup(TASKS_DB_BEST_4, "tasks_db", workers=4, persistent=True, best=True),
    PeerSetup(PROCRASTINATE_DEFAULT, "procrastinate"),
    PeerSetup(PROCRASTINATE, "procrastinate", concurrency=PROCRASTINATE_CONCURRENCY, best=True),
)


def run_together(
    cmds: list[list[Any]], env: dict[str, str], *, time_box: float | None = None
) -> float:
    """Run ``cmds`` at once in the project root; the wall time until the last one exited.

    With ``time_box``, those still running then get SIGTERM (a graceful stop). Raise if one
    failed otherwise.
    """
    start = time.perf_counter()
    with tempfile.TemporaryFile(mode="w+") as out:
        procs = [
            subprocess.Popen(
                [str(part) for part in cmd], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
            )
            for cmd in cmds
        ]
        deadline = None if time_box is None else start + time_box
        stopped = False
        for proc in procs:
            try:
                left = None if deadline is None else max(deadline - time.perf_counter(), 0.01)
                proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                stopped = True
                terminate(procs, 30)
                break
        elapsed = time.perf_counter() - start
        out.seek(0)
        output = out.read()
    if not stopped and any(proc.returncode for proc in procs):
        raise RuntimeError(
            f"{cmds[0]} exited with {[p.returncode for p in procs]}:\n{output[-4000:]}"
        )
    return elapsed


class Peers:
    """Runs django-tasks-db and procrastinate from their virtualenv.

    ``tasks_db_name`` and ``procrastinate_name`` are the peers' databases (each benchmark has
    its own, so two may run at once); a peer still busy after ``time_box`` seconds is stopped and timed on the
    tasks it finished.
    """

    def __init__(
        self,
        tasks_db_name: str = TASKS_DB_DB,
        time_box: float = PEER_TIME_BOX,
        procrastinate_name: str = PROCRASTINATE_DB,
    ) -> None:
        self.python = peers_python()
        self.versions = peer_versions(self.python)
        self.tasks_db_name = tasks_db_name
        self.procrastinate_name = procrastinate_name
        self.time_box = time_box
        self._ready: set[str] = set()

    def drain(self, vendor: str, setup: PeerSetup, count: int) -> Drain:
        """Fill the peer's queue with ``count`` no-op tasks and drain it as ``setup`` says."""
        if setup.system == "procrastinate":
            return self.procrastinate(count, setup.concurrency)
        return self.tasks_db(vendor, count, workers=setup.workers, persistent=setup.persistent)

    def tasks_db(
        self, vendor: str, count: int, *, workers: int = 1, persistent: bool = False
    ) -> Drain:
        """Enqueue ``count`` no-op tasks, then drain them with ``workers`` ``db_worker
        --batch`` processes at once (``persistent``: ``CONN_MAX_AGE=None``)."""
        config = database(vendor, self.tasks_db_name)
        env = django_env(config, system="tasks_db")
        if f"tasks_db-{vendor}" not in self._ready:
            create_database(config)
            run([self.python, "-m", "benchmarks.benchapp.peers", "tasks_db", "migrate"], env)
            self._ready.add(f"tasks_db-{vendor}")
        run([self.python, "-m", "benchmarks.benchapp.peers", "tasks_db", "enqueue", count], env)
        alias = alias_of(vendor, self.tasks_db_name)
        tidy(alias, TASKS_DB_TABLE)
        if persistent:
            env = django_env({**config, "CONN_MAX_AGE": None}, system="tasks_db")
        cmd = [self.python, "manage.py", "db_worker", "--batch", "--no-startup-delay"]
        cmd += ["--interval", "0", "-v", "0"]
        wall = run_together([cmd] * workers, env, time_box=self.time_box)
        rows = query(
            alias,
            "SELECT SUM(CASE WHEN status = 'SUCCESSFUL' THEN 1 ELSE 0 END), "
            f"MIN(started_at), MAX(finished_at) FROM {TASKS_DB_TABLE}",
        )
        return drain_from(rows, wall, count, "db_worker", partial=True)

    def _procrastinate_env(self) -> dict[str, str]:
        """The environment of procrastinate's processes: its database's libpq DSN."""
        config = database("postgres", self.procrastinate_name)
        return subprocess_env(
            None,
            BENCH_PROCRASTINATE_DSN=(
                f"host={config['HOST']} port={config['PORT']} user={config['USER']} "
                f"dbname={config['NAME']}"
            ),
        )

    def procrastinate_defer(self, count: int) -> float:
        """Empty procrastinate's queue and defer ``count`` no-op jobs (``batch_defer``, 1,000
        at a time; its database and schema made on first use); the seconds the defers took,
        as the helper timed them (its start-up excluded)."""
        env = self._procrastinate_env()
        helper = [self.python, "-m", "benchmarks.benchapp.peers", "procrastinate"]
        if "procrastinate" not in self._ready:
            create_database(database("postgres", self.procrastinate_name))
            run([*helper, "schema"], env)
            self._ready.add("procrastinate")
        _, output = run([*helper, "enqueue", count], env)
        seconds: float = json.loads(output.strip().splitlines()[-1])["seconds"]
        return seconds

    def procrastinate(self, count: int, concurrency: int = PROCRASTINATE_CONCURRENCY) -> Drain:
        """Defer ``count`` no-op jobs, then run one worker (``concurrency``) until none is left."""
        self.procrastinate_defer(count)
        env = self._procrastinate_env()
        alias = alias_of("postgres", self.procrastinate_name)
        tidy(alias, "procrastinate_jobs")
        worker = [
            PEERS_VENV / "bin" / "procrastinate",
            "--app=benchmarks.benchapp.procrastinate_app.app",
            "worker",
            "--concurrency",
            concurrency,
            "--one-shot",
            "--queues",
            "bench",
        ]
        wall = run_together([worker], env, time_box=self.time_box)
        rows = query(
            alias,
            "SELECT count(*) FILTER (WHERE type = 'succeeded'), "
            "min(at) FILTER (WHERE type = 'started'), max(at) FILTER (WHERE type = 'succeeded') "
            "FROM procrastinate_events",
        )
        return drain_from(rows, wall, count, "procrastinate worker", partial=True)


# --- the ceiling ----------------------------------------------------------------------------


def pgbench(script: str, count: int) -> tuple[Drain, float]:
    """Drain ``count`` tasks from our table with ``pgbench``, 4 clients; the drain and pgbench's tps.

    Each client runs a few more transactions than its share, so the drain always
    completes; the extra ones find nothing. The rate is timed from the table like the
    node's (the scripts stamp ``clock_timestamp()``).
    """
    fill_ours("postgres", count)
    config = database("postgres", OURS_DB)
    per_client = math.ceil(count / PGBENCH_CLIENTS) + 50
    cmd = [PGBENCH, "-h", config["HOST"], "-p", config["PORT"], "-U", config["USER"], "-n"]
    cmd += ["-f", HERE / script, "-c", PGBENCH_CLIENTS, "-j", 2, "-t", per_client, config["NAME"]]
    wall, output = run(cmd)
    match = re.search(r"tps = ([\d.]+)", output)
    rows = query(
        alias_of("postgres", OURS_DB),
        "SELECT count(*) FILTER (WHERE state = 40), min(started_at), max(finished_at) "
        "FROM django_tasks_coord_task WHERE topic_id = %s",
        [TOPIC],
    )
    return drain_from(rows, wall, count, f"pgbench {script}"), float(match[1]) if match else 0.0


# --- start latency --------------------------------------------------------------------------


def p99(values: list[float]) -> float:
    """The 99th percentile, nearest rank: with fewer than 100 samples, the maximum."""
    return percentile(values, 99)


def summary_ms(values: list[float]) -> dict[str, Any]:
    """Median, p99, min and max of latencies given in seconds, in milliseconds."""
    ms = [v * 1000 for v in values]
    return {
        "samples": len(ms),
        "median_ms": round(statistics.median(ms), 2),
        "p99_ms": round(p99(ms), 2),
        "min_ms": round(min(ms), 2),
        "max_ms": round(max(ms), 2),
        "samples_ms": [round(v, 2) for v in ms],
    }


@contextmanager
def idle_node(vendor: str) -> Iterator[Callable[[Callable[[], bool], str], None]]:
    """Run a long-lived node (default settings) on the latency topic; yield a ``wait_for``.

    ``wait_for(condition, what)`` polls ``condition`` every 10 ms and fails with the node's
    output if the node died or 30 s passed. The node gets SIGTERM on the way out.
    """
    alias = alias_of(vendor, OURS_DB)
    with Cluster(django_env(database(vendor, OURS_DB))) as cluster:
        cluster.start("--topic", LATENCY_TOPIC, "-v", "0")
        cluster.wait_ready(alias, timeout=30)
        yield lambda condition, what: cluster.wait_for(condition, what, 30, every=0.01)


def latency(
    vendor: str, samples: int, poll_interval: float, idle_samples: int = 0, idle_s: float = 0.0
) -> dict[str, Any]:
    """Time ``samples`` single tasks on an idle node, pushed due and pushed ahead.

    ``push``: handler start minus the moment the push's commit returned. ``execute_at``:
    handler start minus ``execute_at``, for tasks pushed :data:`LATENCY_AHEAD` s ahead.
    Before each push the node idles 50-150 ms; on databases without LISTEN/NOTIFY, where
    the node finds work by watching or polling, a random part of a poll interval is added
    so that pushes land at every phase of the node's cycle, not just after a look.
    ``after_idle``: ``idle_samples`` tasks each pushed after the node idled ``idle_s``
    seconds (its idle back-off at its cap).
    """
    from django.utils import timezone

    from django_tasks_coord import queue
    from django_tasks_coord.enums import TaskState
    from django_tasks_coord.models import Task

    alias = alias_of(vendor, OURS_DB)
    jitter = 0.0 if vendor == "postgres" else poll_interval
    fill_ours(vendor, 0)
    with on(alias), idle_node(vendor) as wait_for:

        def sample(i: int, ahead: float, idle: float = 0.0) -> float:
            time.sleep(idle + random.uniform(0.05, 0.15) + random.uniform(0, jitter))
            execute_at = timezone.now() + timedelta(seconds=ahead) if ahead else None
            task = queue.push(LATENCY_TOPIC, f"sample-{i}", execute_at=execute_at)
            committed = time.time()
            done = Task.objects.using(alias).filter(pk=task.pk, state=TaskState.SUCCEEDED)
            wait_for(done.exists, f"completion of task #{task.pk}")
            started = float(done.values_list("message", flat=True)[0])
            return started - (execute_at.timestamp() if execute_at else committed)

        for i in range(3):  # warm-up: connections, imports, first queries
            sample(-1 - i, 0)
        push = [sample(i, 0) for i in range(samples)]
        delayed = [sample(samples + i, LATENCY_AHEAD) for i in range(samples)]
        idle = [sample(2 * samples + i, 0, idle_s) for i in range(idle_samples)]
    result = {"push": summary_ms(push), "execute_at": summary_ms(delayed)}
    if idle:
        result["after_idle"] = summary_ms(idle)
    return result


# --- one run --------------------------------------------------------------------------------


def median_of(drains: list[Drain]) -> dict[str, Any]:
    """Median rates of several drains, with every sample."""
    return {
        "rate": round(statistics.median(d.rate for d in drains)),
        "wall_rate": round(statistics.median(d.wall_rate for d in drains)),
        "samples": [
            {
                "tasks": d.tasks,
                "rate": round(d.rate),
                "drain_s": round(d.drain_s, 3),
                "wall_s": round(d.wall_s, 3),
                "wall_rate": round(d.wall_rate),
            }
            for d in drains
        ],
    }


def migrate_ours(vendor: str) -> None:
    """Bring our benchmark database up to the migrations on disk.

    A subprocess, so it sees the code as it is now: other work may add migrations while a
    long run goes on, and every round starts from the current schema.
    """
    env = django_env(database(vendor, OURS_DB))
    run([sys.executable, "manage.py", "migrate", "-v", "0"], env)


def run_all(args: argparse.Namespace, vendors: list[str]) -> dict[str, Any]:
    """Every measurement, interleaved: each round runs each system once on each database.

    A measurement that fails is reported and left out; the run goes on.
    """
    peers = None if args.skip_peers else Peers()
    drains: dict[str, dict[str, list[Drain]]] = {v: {} for v in vendors}
    tps: dict[str, list[float]] = {CEILING: [], TWO_STEP: []}
    errors: list[str] = []
    round_ = 0

    def attempt(what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - one failed measurement must not end the run
            errors.append(f"{what}: {str(exc)[-2000:]}")
            print(f"  FAILED {what}: {str(exc)[-2000:]}", flush=True)
            return None

    def measure(vendor: str, name: str, fn: Callable[[], Drain]) -> None:
        drain = attempt(f"{vendor} {name}", fn)
        if drain is None:
            return
        drain.round = round_
        drains[vendor].setdefault(name, []).append(drain)
        print(
            f"  {vendor:8} {name:30} {drain.rate:8.0f} tasks/s  "
            f"(drain {drain.drain_s:6.2f}s, wall {drain.wall_s:6.2f}s, {drain.tasks} tasks)",
            flush=True,
        )

    def ceiling(name: str, script: str) -> Drain:
        drain, rate = pgbench(script, args.tasks)
        tps[name].append(rate)
        return drain

    for round_ in range(args.repeat):
        print(f"round {round_ + 1} of {args.repeat}", flush=True)
        for vendor in vendors:
            attempt(f"{vendor} migrate", lambda v=vendor: migrate_ours(v))
            measure(vendor, OURS_TUNED, lambda v=vendor: drain_ours(v, args.tasks, TUNED))
            measure(vendor, OURS_DEFAULT, lambda v=vendor: drain_ours(v, args.tasks, {}))
            for setup in PEER_SETUPS if peers is not None else ():
                if setup.system == "procrastinate" and vendor != "postgres":
                    continue  # PostgreSQL only
                if vendor == "postgres" or round_ == 0:
                    measure(
                        vendor,
                        setup.label,
                        lambda v=vendor, s=setup: peers.drain(v, s, args.tasks),  # type: ignore[union-attr]
                    )
            if vendor == "postgres" and Path(PGBENCH).exists():
                measure(vendor, CEILING, lambda: ceiling(CEILING, "pgbench_claim.sql"))
                measure(vendor, TWO_STEP, lambda: ceiling(TWO_STEP, "pgbench_claim_two_step.sql"))
    latencies = {}
    if args.latency_samples:
        poll_interval = args.node_settings["defaults"]["poll_interval"]
        for vendor in vendors:
            print(f"  {vendor:8} start latency, {args.latency_samples} samples x 2", flush=True)
            measured = attempt(
                f"{vendor} latency",
                lambda v=vendor: latency(
                    v, args.latency_samples, poll_interval, args.idle_samples, args.idle_seconds
                ),
            )
            if measured is not None:
                latencies[vendor] = measured
    return {
        "throughput": {
            vendor: {name: median_of(values) for name, values in by_name.items()}
            for vendor, by_name in drains.items()
        },
        "ratios": ratios(drains),
        "ratio_matrix": {
            vendor: ratio_matrix(by_name, [OURS_DEFAULT, OURS_TUNED])
            for vendor, by_name in drains.items()
        },
        "best": {
            vendor: {system: best_of(by_name, system) for system in ("tasks_db", "procrastinate")}
            for vendor, by_name in drains.items()
        },
        "pgbench_tps": {name: [round(v) for v in values] for name, values in tps.items() if values},
        "latency": latencies,
        "peer_versions": peers.versions if peers else {},
        "errors": errors,
    }


def ratios(drains: dict[str, dict[str, list[Drain]]]) -> dict[str, dict[str, float]]:
    """Ours (tuned) over each other system, per round, then the median over rounds."""
    return {
        vendor: {
            other: matrix[f"{OURS_TUNED} / {other}"]["drain"]
            for other in by_name
            if f"{OURS_TUNED} / {other}" in (matrix := ratio_matrix(by_name, [OURS_TUNED]))
        }
        for vendor, by_name in drains.items()
    }


def ratio_matrix(by_name: dict[str, list[Drain]], ours: list[str]) -> dict[str, dict[str, float]]:
    """Each of ``ours`` over each other system measured in the same rounds: the median of
    the per-round ratios of the drain rates (first start to last finish), and of the
    whole-process rates (tasks / wall time of the worker processes), as
    ``{"OURS / OTHER": {"drain": x, "wall": y, "rounds": n}}``."""
    result: dict[str, dict[str, float]] = {}
    for mine in ours:
        for other, theirs in by_name.items():
            if other in ours or other == mine:
                continue
            by_round = {d.round: d for d in theirs}
            pairs = [(d, by_round[d.round]) for d in by_name.get(mine, []) if d.round in by_round]
            if not pairs:
                continue
            result[f"{mine} / {other}"] = {
                "drain": round(statistics.median(a.rate / b.rate for a, b in pairs), 2),
                "wall": round(statistics.median(a.wall_rate / b.wall_rate for a, b in pairs), 2),
                "rounds": len(pairs),
            }
    return result


def best_of(by_name: dict[str, list[Drain]], system: str) -> str | None:
    """The label of ``system``'s best documented settings that drained fastest (median)."""
    measured = [
        setup.label
        for setup in PEER_SETUPS
        if setup.system == system and setup.best and by_name.get(setup.label)
    ]
    return max(
        measured, key=lambda label: statistics.median(d.rate for d in by_name[label]), default=None
    )


# --- results --------------------------------------------------------------------------------


def server_info(vendors: list[str]) -> dict[str, Any]:
    """Database server versions and the durability settings that bound per-commit costs."""
    info: dict[str, Any] = {}
    if "postgres" in vendors:
        alias = alias_of("postgres", OURS_DB)
        names = (
            "server_version",
            "fsync",
            "synchronous_commit",
            "wal_sync_method",
            "shared_buffers",
        )
        info["postgres"] = postgres_settings(alias, names)
        if Path(PGBENCH).exists():
            info["pgbench"] = subprocess.run(
                [PGBENCH, "--version"], capture_output=True, text=True
            ).stdout.strip()
    if "mysql" in vendors:
        info["mysql"] = mysql_variables(alias_of("mysql", OURS_DB))
    if "sqlite" in vendors:
        info["sqlite"] = {"version": sqlite3.sqlite_version, "journal_mode": "delete (default)"}
    return info


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets on PostgreSQL (issue 20), each with its figure and whether it is met."""
    pg = results["throughput"].get("postgres")
    if not pg:
        return []
    rows: list[dict[str, Any]] = []

    def add(target: str, figure: float | None, met: bool | None, unit: str) -> None:
        rows.append({"target": target, "figure": figure, "unit": unit, "met": met})

    for name, need in ((OURS_DEFAULT, 5000), (OURS_TUNED, 10000)):
        if name in pg:
            rate = pg[name]["rate"]
            add(f"{name}: >= {need:,} tasks/s", rate, rate >= need, "tasks/s")
    ratio = results["ratios"].get("postgres", {})
    if CEILING in ratio:
        add("ours (tuned) beats the 1-txn/task ceiling", ratio[CEILING], ratio[CEILING] > 1, "x")
    lat = results["latency"].get("postgres")
    if lat:
        p = lat["push"]["p99_ms"]
        add("start latency on an idle node: p99 < 50 ms", p, p < 50, "ms")
    for vendor in ("mysql", "sqlite"):
        lat = results["latency"].get(vendor)
        if lat:
            worst = max(lat["push"]["p99_ms"], lat.get("after_idle", lat["push"])["p99_ms"])
            add(f"{LABELS[vendor]} start latency, p99 < 300 ms", worst, worst < 300, "ms")
    return rows


def write_results(results: dict[str, Any], meta: dict[str, Any]) -> None:
    """Write ``throughput.json`` and ``throughput.md`` and print the latter."""
    results["targets"] = targets(results)
    write_report("throughput", {"meta": meta, **results}, lambda: markdown(results, meta))


def peers_method(meta: dict[str, Any], time_box: float) -> list[str]:
    """How the peers ran (the "Settings and method" bullets both reports share)."""
    return [
        "- django-tasks-db "
        f"{meta['peers'].get('django-tasks-db', '-')}: `manage.py db_worker --batch "
        "--no-startup-delay --interval 0`, each process one task at a time (a claim "
        "transaction, then a finish). Defaults: one process, Django's `CONN_MAX_AGE=0` (it "
        "calls `close_old_connections()` around each task, so each task connects anew). Best "
        "documented settings: `CONN_MAX_AGE=None` (persistent connections) and 2 or 4 processes "
        "at once. Tasks enqueued with `bulk_create` of the rows `enqueue` writes (not timed). "
        "Off PostgreSQL it runs in the first round only.",
        f"- Every peer gets the same {meta['tasks']:,}-task queue and at most {time_box:.0f} s: "
        "a worker still busy then is stopped with SIGTERM (both stop gracefully) and timed on "
        "the tasks it finished (`N s box: done` in the table): a one-task-at-a-time worker's "
        "rate does not depend on how far into the queue it is.",
        f"- procrastinate {meta['peers'].get('procrastinate', '-')}: `procrastinate worker "
        "--one-shot`, an `async def` no-op (its fastest path: coroutines run on its event "
        "loop, plain functions in threads), a connection pool of 10; defaults: concurrency 1; "
        f"best: `--concurrency {PROCRASTINATE_CONCURRENCY}`. Jobs deferred with `batch_defer` "
        "(not timed); timed from `procrastinate_events` (first `started`, last `succeeded`). "
        "PostgreSQL only.",
        "- Whole process: tasks / the wall time from spawning the worker process(es) to the "
        "last one's exit (start-up, the drain and the exit).",
        "- Logging: the Django settings of every process (ours and the peers') print warnings "
        "only; Django's own `django.tasks` INFO lines (two per task, a `@task`'s start and "
        "finish) are not written out.",
    ]


def ratio_lines(results: dict[str, Any], vendors: list[str]) -> list[str]:
    """The ratios of ours (defaults, tuned) over each peer setting, by drain rate and by
    whole-process rate, per database, and which setting of each peer was its best."""
    lines = [
        "Ours divided by each other system, per round, median. *drain*: first start to last "
        "finish; *whole process*: tasks / wall time of the worker process(es), start-up and "
        "exit included.",
        "",
    ]
    for vendor in vendors:
        matrix = results["ratio_matrix"].get(vendor, {})
        if not matrix:
            continue
        best = {k: v for k, v in results.get("best", {}).get(vendor, {}).items() if v}
        lines += [
            f"**{LABELS[vendor]}**"
            + (f" (best measured: {', '.join(best.values())})" if best else ""),
            "",
            "| ratio | drain | whole process | rounds |",
            "| --- | ---: | ---: | ---: |",
        ]
        for key, figures in matrix.items():
            lines.append(
                f"| {key} | {figures['drain']:.2f}x | {figures['wall']:.2f}x | {figures['rounds']} |"
            )
        lines.append("")
    return lines


def markdown(results: dict[str, Any], meta: dict[str, Any]) -> str:
    """The human-readable report."""
    vendors = list(results["throughput"])
    tput = results["throughput"]
    lines = [
        "# Throughput and start latency",
        "",
        f"{meta['date']}; {meta['machine']}; Python {meta['python']}, Django {meta['django']}, "
        f"psycopg {meta['psycopg']}, mysqlclient {meta['mysqlclient']}; django-tasks-coord "
        f"{meta['revision']}. {meta['tasks']} no-op tasks per drain, median of {meta['repeat']} "
        f"rounds (every system runs once per round). Load average at start / end: "
        f"{meta['load_start']} / {meta['load_end']}; total run time {meta['duration_min']} min.",
        "",
        "## Drain rate (tasks/s)",
        "",
        "Rate = tasks / (last finish - first start), from each system's own table: process "
        "start-up excluded. In brackets: tasks / wall time of the worker process, start-up and "
        "shutdown included.",
        "",
        "| system | " + " | ".join(LABELS[v] for v in vendors) + " |",
        "| --- | " + " | ".join("---:" for _ in vendors) + " |",
    ]
    names: list[str] = []
    for by_name in tput.values():
        names += [n for n in by_name if n not in names]
    for name in names:
        cells = []
        for vendor in vendors:
            r = tput[vendor].get(name)
            if r is None:
                cells.append("-")
                continue
            notes = []
            runs = len(r["samples"])
            if runs != meta["repeat"]:
                notes.append(f"{runs} run{'s' if runs > 1 else ''}")
            done = sorted(sample["tasks"] for sample in r["samples"])
            if done[0] < meta["tasks"]:
                spread = f"{done[0]:,}" + (f"-{done[-1]:,}" if done[-1] != done[0] else "")
                notes.append(f"{PEER_TIME_BOX:.0f} s box: {spread} done")
            note = "".join(f"; {n}" for n in notes)
            cells.append(f"{r['rate']:,} ({r['wall_rate']:,}{note})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", *ratio_lines(results, vendors)]
    if results["latency"]:
        lines += [
            "",
            "## Start latency of a due task on an idle node (ms)",
            "",
            f"{meta['latency_samples']} samples each; with fewer than 100 samples the p99 "
            "(nearest rank) is the maximum. `push`: handler start - the push's commit. "
            f"`execute_at`: handler start - `execute_at`, pushed {LATENCY_AHEAD} s ahead. "
            "Node with the default settings.",
            "",
            "`after idle`: pushed after the node idled "
            f"{meta.get('idle_seconds', '-')} s (its back-off at its cap), "
            f"{meta.get('idle_samples', 0)} samples.",
            "",
            "| database | push median | push p99 | execute_at median | execute_at p99 "
            "| after idle median | after idle max |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for vendor, lat in results["latency"].items():
            push, delayed = lat["push"], lat["execute_at"]
            idle = lat.get("after_idle", {})
            lines.append(
                f"| {LABELS[vendor]} | {push['median_ms']} | {push['p99_ms']} | "
                f"{delayed['median_ms']} | {delayed['p99_ms']} | "
                f"{idle.get('median_ms', '-')} | {idle.get('max_ms', '-')} |"
            )
    if results["errors"]:
        lines += ["", "## Failed measurements (left out above)", ""]
        lines += [f"- {(error.splitlines() or [error])[0]} ..." for error in results["errors"]]
    if results["targets"]:
        lines += [
            "",
            "## Targets (PostgreSQL)",
            "",
            "| target | figure | met |",
            "| --- | ---: | --- |",
        ]
        for t in results["targets"]:
            figure = f"{t['figure']:,} {t['unit']}" if t["unit"] != "x" else f"{t['figure']:.2f}x"
            lines.append(f"| {t['target']} | {figure} | {'yes' if t['met'] else '**no**'} |")
    tuned, default = meta["node_settings"]["tuned"], meta["node_settings"]["defaults"]
    changed = {k: v for k, v in tuned.items() if default.get(k) != v}
    held = default["workers"] + default["buffer"]
    lines += [
        "",
        "## Reading the figures",
        "",
        f"- With the defaults a node holds at most WORKERS + BUFFER = {held} tasks, each from its "
        "claim until its completion is written. A no-op task spends all that time waiting for "
        "two committed transactions (its claim, then its completion), so the node does at most "
        f"{held} tasks per claim-plus-completion round trip, however fast the handler (Little's "
        f"law): claims of {held} tasks or fewer, each paying a flushed commit. The tuned settings "
        f"let one claim take {tuned['batch_size']} tasks and keep {tuned['buffer']} ready.",
        "- The pgbench ceiling pays one flushed commit per task (4 clients share flushes); "
        "django-tasks-db pays two per task, one task at a time; a batching node pays two per "
        "batch.",
        "- MariaDB and SQLite have no LISTEN/NOTIFY: an idle node there finds new work at its next "
        f"look of the work watch (`WATCH_INTERVAL={default.get('watch_interval', '-')}` s, one "
        "statement), so its start latency is about half that on average and up to a whole one.",
    ]
    lines += [
        "",
        "## Settings and method",
        "",
        f"- Our node: `runscheduler --burst --topic {TOPIC}`, one process. Tuned: "
        + ", ".join(f"`{k.upper()}={v}`" for k, v in changed.items())
        + "; defaults: "
        + ", ".join(f"`{k.upper()}={default[k]}`" for k in changed)
        + ". Every other setting is the default: "
        + ", ".join(f"`{k.upper()}={v}`" for k, v in default.items() if k not in changed)
        + ". The queue is filled with `queue.push_many` (not timed).",
        *peers_method(meta, PEER_TIME_BOX),
        f"- Ceiling: `pgbench -c {PGBENCH_CLIENTS} -j 2 -t N` with `benchmarks/pgbench_claim.sql` "
        "on our own task table and claim index: one statement per task that claims the next "
        "due task with `FOR UPDATE SKIP LOCKED` and marks it finished. `pgbench_claim_two_step"
        ".sql` claims in one transaction and finishes in a second, as a one-task-at-a-time "
        f"worker must. pgbench's own tps: {results.get('pgbench_tps', {})}.",
        "- Each system has its own database on the same server (`bench_throughput`, "
        "`bench_peers_tasks_db`, `bench_peers_procrastinate`; SQLite files in the temp "
        "directory), emptied and `VACUUM ANALYZE`d (MariaDB: `ANALYZE TABLE`) before each drain.",
        f"- Servers: {json.dumps(meta['servers'])}. Every commit is flushed to disk "
        "(PostgreSQL `synchronous_commit=on`, InnoDB `innodb_flush_log_at_trx_commit=1`): "
        "per-transaction systems pay one flush per commit, batching systems one per batch.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--databases", default="postgres,mysql,sqlite")
    parser.add_argument("--tasks", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--skip-peers", action="store_true", help="Leave out django-tasks-db and procrastinate."
    )
    parser.add_argument(
        "--latency-samples", type=int, default=50, help="Per database and mode; 0: skip."
    )
    parser.add_argument(
        "--idle-samples", type=int, default=5, help="Tasks pushed after a long idle, per database."
    )
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=35.0,
        help="How long the node idles before each of those (its back-off at its 30 s cap).",
    )
    args = parser.parse_args()
    wanted = [v.strip() for v in args.databases.split(",") if v.strip()]
    unknown = sorted(set(wanted) - set(SERVERS))
    if unknown:
        parser.error(f"unknown database(s) {', '.join(unknown)}; choose from {', '.join(SERVERS)}")
    vendors = [v for v in wanted if reachable(v)]
    if not vendors:
        sys.exit("No database reachable.")
    started = time.monotonic()
    load_start = load_average()
    configure(vendors)
    # Read the node's settings (and import the node) before the long part: the tree may be
    # edited while the benchmark runs.
    args.node_settings = {"tuned": node_settings(TUNED), "defaults": node_settings({})}
    results = run_all(args, vendors)

    import django

    def version(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "-"

    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "python": platform.python_version(),
        "django": django.get_version(),
        "psycopg": version("psycopg"),
        "mysqlclient": version("mysqlclient"),
        "revision": git_revision(),
        "tasks": args.tasks,
        "repeat": args.repeat,
        "latency_samples": args.latency_samples,
        "idle_samples": args.idle_samples,
        "idle_seconds": args.idle_seconds,
        "peers": results.pop("peer_versions"),
        "servers": server_info(vendors),
        "node_settings": args.node_settings,
        "load_start": load_start,
        "load_end": load_average(),
        "duration_min": round((time.monotonic() - started) / 60, 1),
    }
    write_results(results, meta)


if __name__ == "__main__":
    main()
