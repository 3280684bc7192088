"""The executor HTTP API over a live ASGI server (uvicorn, one process), on each database.

1. Throughput: 8 executor threads (one keep-alive HTTP connection each) run
   poll → start → success until a backlog of tasks is done; tasks/s, with polls of 1
   and of 10 tasks.
2. Long-poll wake-up latency: one executor long-polls; a task is created; the time from
   the commit of the create to the long-poll's answer arriving. Median and p99 of
   ``--wakeups`` samples. PostgreSQL wakes long-polls by NOTIFY; the others check every
   ``LONG_POLL_INTERVAL`` (0.5 s by default), so their latency is about half of that.

Usage::

    ./run bench executor_api                     # every database that answers
    # postgres-pool: PostgreSQL with Django's connection pool (pip install "psycopg[pool]")
    python -m benchmarks.executor_api --databases sqlite --tasks 500 --wakeups 20

Results: ``benchmarks/results/executor_api.json`` and ``.md``. The same file is the
server's ASGI module (``benchmarks.executor_api:application``) when
``EXECUTOR_API_SERVE`` is set.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from typing import Any

from benchmarks.common import BASE_APPS, RESULTS, ROOT, create_database, database

DEFINITION = "bench/work"
EXECUTORS = 8

NAME = "bench_executor_api"


def configure(vendor: str) -> None:
    """Django settings for the benchmark process and the server alike."""
    import django
    from django.conf import settings

    config = database(vendor, NAME)
    if vendor == "postgres" and os.environ.get("BENCH_PG_POOL"):
        # Django's connection pool (psycopg_pool): a request's connection is borrowed, not opened.
        config["OPTIONS"] = {"pool": {"min_size": 4, "max_size": 16}}
    settings.configure(
        DATABASES={"default": config},
        INSTALLED_APPS=list(BASE_APPS),
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        ROOT_URLCONF=__name__,
        ALLOWED_HOSTS=["127.0.0.1"],
        SECRET_KEY="benchmark",
        MIDDLEWARE=[],
    )
    django.setup()
    from django_tasks_coord import definitions

    definitions.define(DEFINITION)


if os.environ.get("EXECUTOR_API_SERVE"):  # the server process
    configure(os.environ["EXECUTOR_API_SERVE"])
    from django.core.handlers.asgi import ASGIHandler
    from django.urls import include, path

    urlpatterns = [path("tasks/", include("django_tasks_coord.api.urls"))]
    application = ASGIHandler()


def prepare_database() -> None:
    """Create the benchmark database on its server if needed; start from empty tables."""
    from django.core.management import call_command
    from django.db import connection

    create_database(connection.settings_dict)
    call_command("migrate", verbosity=0)
    call_command("flush", interactive=False, verbosity=0)


class Client:
    """One keep-alive HTTP connection speaking JSON with a bearer token."""

    def __init__(self, port: int, token: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.conn.request("POST", f"/tasks/{path}", json.dumps(body), self.headers)
        response = self.conn.getresponse()
        data = json.loads(response.read())
        if response.status >= 300:
            raise RuntimeError(f"{path}: {response.status} {data}")
        return data


def serve(vendor: str) -> tuple[subprocess.Popen[bytes], int]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "benchmarks.executor_api:application",
            "--port",
            str(port),
            "--lifespan=off",
            "--no-access-log",
            "--log-level=warning",
        ],
        cwd=ROOT,
        env={**os.environ, "EXECUTOR_API_SERVE": vendor, "PYTHONPATH": str(ROOT)},
    )
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the server did not start")


def throughput(port: int, token: str, tasks: int, batch: int) -> float:
    from django_tasks_coord import executions

    for _ in range(tasks):
        executions.create(DEFINITION)
    done = [0] * EXECUTORS
    begin = threading.Barrier(EXECUTORS + 1)

    def executor(index: int) -> None:
        client = Client(port, token)
        begin.wait()
        while True:
            polled = client.post("poll", {"definitions": [DEFINITION], "limit": batch})["tasks"]
            if not polled:
                return
            for task in polled:
                body = {"exec_id": task["exec_id"]}
                client.post(f"{task['id']}/start", body)
                client.post(f"{task['id']}/success", {**body, "result": {"ok": True}})
                done[index] += 1

    threads = [threading.Thread(target=executor, args=(i,)) for i in range(EXECUTORS)]
    for thread in threads:
        thread.start()
    begin.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    assert sum(done) == tasks, done
    return tasks / elapsed


def wakeups(port: int, token: str, samples: int) -> list[float]:
    from django_tasks_coord import executions

    arrivals: dict[int, float] = {}
    got = threading.Event()
    stop = threading.Event()

    def executor() -> None:
        client = Client(port, token)
        while not stop.is_set():
            body = client.post("long-poll", {"definitions": [DEFINITION], "timeout": 5})
            for task in body["tasks"]:
                arrivals[task["id"]] = time.perf_counter()
                got.set()

    thread = threading.Thread(target=executor, daemon=True)
    thread.start()
    latencies = []
    for _ in range(samples + 2):
        # The executor is waiting again by then; a random gap samples every phase of its
        # LONG_POLL_INTERVAL checks (where no NOTIFY wakes it) evenly.
        time.sleep(random.uniform(0.1, 0.6))
        got.clear()
        task = executions.create(DEFINITION)
        committed = time.perf_counter()
        if not got.wait(10):
            raise RuntimeError("the long-poll was not woken")
        latencies.append(arrivals[task.pk] - committed)
    stop.set()
    return latencies[2:]  # the first ones open the LISTEN connection


def run(alias: str, tasks: int, samples: int) -> dict[str, Any]:
    from django.contrib.auth.models import User
    from django.db import connection

    from django_tasks_coord.api.auth import issue_token

    prepare_database()
    _, token = issue_token(User.objects.create_superuser("bench"))
    proc, port = serve(alias)
    try:
        result: dict[str, Any] = {"database": alias, "server": f"{connection.vendor}"}
        for batch in (1, 10):
            result[f"tasks_per_s_poll_{batch}"] = round(throughput(port, token, tasks, batch), 1)
        lat = sorted(wakeups(port, token, samples))
        result["wakeup_median_ms"] = round(statistics.median(lat) * 1000, 1)
        result["wakeup_p99_ms"] = round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 1)
        result["wakeup_samples"] = len(lat)
        return result
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--databases", default="sqlite,postgres,postgres-pool,mysql")
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--wakeups", type=int, default=100)
    args = parser.parse_args()
    results = []
    for alias in args.databases.split(","):
        # Each database in a fresh interpreter: Django is configured once per process.
        # "postgres-pool": PostgreSQL with Django's connection pool (needs psycopg[pool]).
        env = {**os.environ, "BENCH_PG_POOL": "1"} if alias == "postgres-pool" else None
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.executor_api",
                "--one",
                alias.removesuffix("-pool"),
                str(args.tasks),
                str(args.wakeups),
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
            env=env,
        )
        if out.returncode != 0:
            print(f"{alias}: skipped ({out.stderr.strip().splitlines()[-1:]})")
            continue
        results.append({**json.loads(out.stdout.strip().splitlines()[-1]), "database": alias})
        print(json.dumps(results[-1]))
    report = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "executors": EXECUTORS,
        "tasks": args.tasks,
        "results": results,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "executor_api.json").write_text(json.dumps(report, indent=2) + "\n")
    render(report)


def render(report: dict[str, Any]) -> None:
    """Write ``results/executor_api.md`` from a report (``--render`` redoes it from the JSON)."""
    lines = [
        "# Executor API benchmark",
        "",
        f"{report['when']}, {report['machine']}; one uvicorn process, {report['executors']} "
        f"executor threads (keep-alive connections) in another, {report['tasks']} tasks per run.",
        "",
        "| database | poll→start→success, poll 1 (tasks/s) | poll 10 (tasks/s) | long-poll wake-up median | p99 |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for r in report["results"]:
        lines.append(
            f"| {r['database']} | {r['tasks_per_s_poll_1']} | {r['tasks_per_s_poll_10']} | "
            f"{r['wakeup_median_ms']} ms | {r['wakeup_p99_ms']} ms |"
        )
    lines += [
        "",
        "Each task costs three HTTP requests with polls of 1 (poll, start, success) and a little",
        "over two with polls of 10; on two cores shared by the server, the eight client threads and",
        "the database, a request's Django and HTTP handling dominates, and so does opening a",
        "database connection per request where nothing pools them: `postgres-pool` is PostgreSQL",
        'with Django\'s connection pool (`OPTIONS: {"pool": ...}`, `psycopg[pool]`).',
        "Wake-ups: PostgreSQL's long-polls are woken by `NOTIFY`; SQLite's and MariaDB's check every",
        "`LONG_POLL_INTERVAL` (0.5 s), so their latency is spread over 0 to 0.5 s (median about",
        "half of it). The machine was shared with other work during the run (load average about 3).",
    ]
    (RESULTS / "executor_api.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] == ["--render"]:
        render(json.loads((RESULTS / "executor_api.json").read_text()))
    elif len(sys.argv) == 5 and sys.argv[1] == "--one":
        configure(sys.argv[2])
        print(json.dumps(run(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
    else:
        main()
