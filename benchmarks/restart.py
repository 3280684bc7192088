"""Recovery after a database outage: how long until three busy nodes work at full speed again.

Three ``runscheduler`` nodes (default timings, 4 workers each) drain a backlog of
no-op tasks. After a warm-up the database goes away under them:

- ``restart`` (PostgreSQL): a PostgreSQL server of the benchmark's own
  (``tests.servers.PrivatePostgres``: ``initdb`` in a temporary directory, a free port) is
  stopped (``pg_ctl -m fast``), stays down ``--down`` seconds and is started again;
- ``restart`` (MariaDB): likewise a private ``mariadbd`` (``mariadb-install-db`` in a
  temporary directory, a free port), stopped with SIGTERM and started again;
- ``terminate``: every connection of the benchmark database on the shared server is ended
  (``pg_terminate_backend``, ``KILL CONNECTION``), nothing else.

"Back" is the moment the server accepts connections again (``restart``) or the moment the
connections were ended (``terminate``). From every task's ``finished_at`` (the nodes' clock,
the same machine's), completions are counted in 100 ms bins. The **baseline** is the mean
rate of the warm-up's last 5 s but its last second; **recovered** is the end of the first
0.5 s window after "back" in which tasks *claimed after "back"* complete at half the
baseline rate or more (completions of earlier claims, written again once the database is
back, do not count); **first claim** and **first completion** the first task claimed and finished after
"back". Reported per run and as medians. A node that exits during the run fails it.

Usage::

    python -m benchmarks.restart [--database postgres|mysql|both] [--mode restart|terminate]
                                 [--runs 3] [--down 1.0]

Results: ``benchmarks/results/restart.json`` (every run; entries of other databases and
modes are kept) and ``benchmarks/results/restart.md``. A run takes about 30 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.cluster import Cluster
from benchmarks.common import (
    LABELS,
    RESULTS,
    ROOT,
    bench_env,
    create_database,
    database,
    git_revision,
    load_average,
    machine,
)
from tests.servers import PrivateMariaDB, PrivatePostgres, terminate_connections

NODES = 3
WORKERS = 4
WARM_UP = 8.0
AFTER = 12.0
BIN = 0.1
#: Seconds over which the rate after the outage is compared with the baseline.
WINDOW = 0.5
NAME = "bench_restart"
#: Tasks finished before the warm-up starts (the nodes' start-up is not measured).
WARM_UP_TASKS = 300
FINISHED = (
    "SELECT count(*) FROM django_tasks_coord_task WHERE topic_id = 'noop' "
    "AND finished_at IS NOT NULL"
)


def django_env(config: dict[str, Any]) -> dict[str, str]:
    return bench_env(config)


def manage(config: dict[str, Any], *args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=ROOT,
        env=django_env(config),
        check=True,
        capture_output=True,
        timeout=600,
    )


@contextlib.contextmanager
def connect(config: dict[str, Any]) -> Iterator[Any]:
    """A DB-API connection of its own (autocommit) to ``config``'s database."""
    if config["ENGINE"].endswith("postgresql"):
        import psycopg

        with psycopg.connect(
            host=config["HOST"],
            port=int(config["PORT"]),
            user=config["USER"],
            dbname=config["NAME"],
            autocommit=True,
        ) as conn:
            yield conn
        return
    import MySQLdb

    conn = MySQLdb.connect(
        host=config["HOST"], port=int(config["PORT"]), user=config["USER"], db=config["NAME"]
    )
    try:
        conn.autocommit(True)
        yield conn
    finally:
        conn.close()


def sql(config: dict[str, Any], statement: str) -> list[Any]:
    """Run ``statement`` on a connection of its own (the outage ends every other one)."""
    with connect(config) as conn:
        cursor = conn.cursor()
        cursor.execute(statement)
        return list(cursor.fetchall()) if cursor.description else []


def end_connections(config: dict[str, Any]) -> int:
    """End every connection to the benchmark database but the one doing it."""
    vendor = "postgresql" if config["ENGINE"].endswith("postgresql") else "mysql"
    with connect(config) as conn:
        return terminate_connections(conn.cursor(), vendor)


def push_backlog(config: dict[str, Any], count: int) -> None:
    script = (
        "from django_tasks_coord import queue\n"
        "queue.register_topic('noop')\n"
        f"for start in range(0, {count}, 5000):\n"
        f"    queue.push_many('noop', [(f't{{i}}', None) for i in range(start, min(start + 5000, {count}))])\n"
    )
    subprocess.run(
        [sys.executable, "-c", f"import django; django.setup()\n{script}"],
        cwd=ROOT,
        env=django_env(config),
        check=True,
        capture_output=True,
        timeout=600,
    )


def task_times(config: dict[str, Any]) -> list[tuple[datetime, datetime]]:
    """(claimed, finished) of every finished task."""
    rows = sql(
        config,
        "SELECT started_at, finished_at FROM django_tasks_coord_task WHERE topic_id = 'noop' "
        "AND finished_at IS NOT NULL",
    )
    return [(common.as_datetime(row[0]), common.as_datetime(row[1])) for row in rows]


def rates(finished: list[datetime], origin: datetime) -> list[float]:
    """Completions per second in :data:`BIN` bins from ``origin`` (warm-up and after)."""
    bins = [0] * int((WARM_UP + AFTER) / BIN)
    for moment in finished:
        index = int((moment - origin).total_seconds() / BIN)
        if 0 <= index < len(bins):
            bins[index] += 1
    return [count / BIN for count in bins]


def analyse(times: list[tuple[datetime, datetime]], back: datetime) -> dict[str, Any]:
    """The baseline before the outage, and how soon after ``back`` the nodes claimed and
    completed new work at half of it (completions of work claimed before, written again
    once the database was back, do not count as recovery)."""
    origin = back - timedelta(seconds=WARM_UP)
    back_bin = int(WARM_UP / BIN)
    every = rates([finished for _, finished in times], origin)
    before = every[back_bin - int(5 / BIN) : back_bin - int(1 / BIN)]
    baseline = sum(before) / len(before)  # a mean: completions are written in batches
    new = rates([finished for claimed, finished in times if claimed >= back], origin)
    window = int(WINDOW / BIN)
    recovered = None
    for index in range(back_bin, len(new) - window):
        if sum(new[index : index + window]) / window >= baseline / 2:
            recovered = (index - back_bin + window) * BIN  # the end of that window
            break
    claims = sorted(claimed for claimed, _ in times if claimed >= back)
    finished = sorted(finished for _, finished in times if finished >= back)
    return {
        "baseline_per_s": baseline,
        "recovered_s": recovered,
        "first_claim_s": (claims[0] - back).total_seconds() if claims else None,
        "first_completion_s": (finished[0] - back).total_seconds() if finished else None,
        "rates_per_s": every,
    }


def one_run(vendor: str, mode: str, down: float, backlog: int) -> dict[str, Any]:
    server: PrivatePostgres | PrivateMariaDB | None = None
    if mode == "restart":
        server = PrivatePostgres() if vendor == "postgres" else PrivateMariaDB()
    logs = Path(tempfile.mkdtemp(prefix="tasks_coord_bench_restart_"))
    cluster: Cluster | None = None
    try:
        if server is not None:
            server.start()
            server.create_database(NAME)
            config = server.settings(NAME)
        else:
            config = database(vendor, NAME)
            if vendor == "postgres":
                with contextlib.suppress(Exception):
                    sql({**config, "NAME": "postgres"}, f'DROP DATABASE IF EXISTS "{NAME}"')
            else:
                with contextlib.suppress(Exception):
                    sql({**config, "NAME": "mysql"}, f"DROP DATABASE IF EXISTS `{NAME}`")
            create_database(config)
        manage(config, "migrate", "--verbosity", "0")
        push_backlog(config, backlog)
        cluster = Cluster(django_env(config), logs=logs)
        cluster.start_many(NODES, "--topic", "noop", "--workers", str(WORKERS))
        started = time.monotonic()
        while sql(config, FINISHED)[0][0] < WARM_UP_TASKS:  # every node up and working
            if time.monotonic() - started > 120:
                raise RuntimeError("the nodes did not start working within 120 s")
            time.sleep(0.2)  # polling the task table until work is done
        time.sleep(WARM_UP)  # the baseline: nodes at full speed
        if server is not None:
            server.restart(down=down)
            killed = None
        else:
            killed = end_connections(config)
        back = datetime.now(UTC)
        time.sleep(AFTER)  # the recovery being measured
        alive = [node.alive for node in cluster.nodes.values()]
        codes = cluster.stop(timeout=60)
        times = task_times(config)
        errors = sum(
            line.count(" ERROR ") for path in logs.iterdir() for line in path.open(errors="replace")
        )
        result = analyse(times, back)
        if len(times) >= backlog:
            raise RuntimeError(f"the backlog of {backlog} tasks drained: push more (--backlog)")
        result.update(
            alive=alive, exit_codes=codes, errors=errors, connections_ended=killed, logs=str(logs)
        )
        return result
    finally:
        if cluster is not None:
            cluster.destroy()
        if server is not None:
            server.destroy()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", choices=["postgres", "mysql", "both"], default="both")
    parser.add_argument("--mode", choices=["restart", "terminate"], default="restart")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--down", type=float, default=1.0, help="seconds the server stays down")
    parser.add_argument("--backlog", type=int, default=60000)
    args = parser.parse_args()
    vendors = ["postgres", "mysql"] if args.database == "both" else [args.database]
    path = RESULTS / "restart.json"
    document = json.loads(path.read_text()) if path.exists() else {"entries": {}}
    failed = False
    for vendor in vendors:
        runs = []
        for number in range(args.runs):
            run = one_run(vendor, args.mode, args.down, args.backlog)
            runs.append(run)
            print(
                f"{LABELS[vendor]} {args.mode} run {number + 1}: baseline "
                f"{run['baseline_per_s']:.0f}/s, first claim {run['first_claim_s']}s, "
                f"first completion {run['first_completion_s']}s, "
                f"recovered {run['recovered_s']}s, alive {run['alive']}, errors {run['errors']}"
            )
            failed |= not all(run["alive"]) or run["recovered_s"] is None
        recovered = [r["recovered_s"] for r in runs if r["recovered_s"] is not None]
        first = [r["first_completion_s"] for r in runs if r["first_completion_s"] is not None]
        claims = [r["first_claim_s"] for r in runs if r["first_claim_s"] is not None]
        document["entries"][f"{vendor}-{args.mode}"] = {
            "database": LABELS[vendor],
            "mode": args.mode,
            "down_s": args.down if args.mode == "restart" else 0,
            "runs": [{k: v for k, v in r.items() if k != "rates_per_s"} for r in runs],
            "median_recovered_s": statistics.median(recovered) if recovered else None,
            "median_first_completion_s": statistics.median(first) if first else None,
            "median_first_claim_s": statistics.median(claims) if claims else None,
            "median_baseline_per_s": statistics.median(r["baseline_per_s"] for r in runs),
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "revision": git_revision(),
            "machine": machine(),
            "load": load_average(),
            "pid": os.getpid(),
        }

    def markdown() -> str:
        lines = [
            "# Recovery after a database outage",
            "",
            "Three `runscheduler` nodes (default timings, 4 workers each) drain no-op tasks; the",
            "database goes away under them (`benchmarks/restart.py`). *Back*: the server accepts",
            "connections again (restart) or every connection was ended (terminate). *First claim*,",
            "*first completion*: the first task claimed, finished after *back*. *Recovered*: end of",
            "the first 0.5 s window after *back* in which tasks claimed after *back* complete at half",
            "the baseline rate or more. Medians of the runs (each run's in brackets); the machine",
            "is shared with other work, so rates are noisy.",
            "",
            "| database | outage | runs | baseline | first claim | first completion | recovered |"
            " nodes alive | ERROR lines |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for entry in document["entries"].values():
            runs = entry["runs"]
            outage = (
                f"restart, down {entry['down_s']} s"
                if entry["mode"] == "restart"
                else "connections ended"
            )
            lines.append(
                f"| {entry['database']} | {outage} | {len(runs)} | "
                f"{entry['median_baseline_per_s']:.0f}/s | "
                f"{_seconds(entry.get('median_first_claim_s'))} | "
                f"{_seconds(entry['median_first_completion_s'])} | "
                f"{_seconds(entry['median_recovered_s'])} "
                f"({', '.join(_seconds(r['recovered_s']) for r in runs)}) | "
                f"{sum(all(r['alive']) for r in runs)}/{len(runs)} | "
                f"{sum(r['errors'] for r in runs)} |"
            )
        lines += ["", f"Machine: {machine()}. Revision: {git_revision()}.", ""]
        return "\n".join(lines)

    common.write_report("restart", document, markdown)
    return 1 if failed else 0


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


if __name__ == "__main__":
    sys.exit(main())
