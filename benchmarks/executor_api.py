"""The executor HTTP API over a live uvicorn server, driven by executors in another process.

**Throughput.** ``--executors`` (4) executors drain a backlog of one definition's no-op tasks
through one uvicorn process. They are the Node.js loops of ``executor_client.mjs``, all in
one process of their own, each on one keep-alive HTTP connection; a run is timed by that
process from its first request to its last answer. What is measured:

| row | package | deployment | calls per task |
| --- | --- | --- | --- |
| ``base: poll, start, success`` | ``--base`` (the commit before the batch calls) | its documented one: ``serve_long_polls``, Django's default ``CONN_MAX_AGE`` (0) | poll (limit 1), start, success |
| ``poll, start, success`` | this tree | the documented one: ``serve_api``, ``CONN_MAX_AGE`` 600 | the same three |
| ``claim 1, complete 1`` | this tree | the same | claim (limit 1), complete (one report) |
| ``claim N, complete N`` | this tree | the same | claim (limit ``--batch``), complete (all of them) |
| ``claim 1, complete 1, plain uvicorn`` | this tree | the same on plain ``uvicorn`` (h11, asyncio) | claim (limit 1), complete (one report) |

Every server runs on ``uvicorn[standard]``'s httptools parser and uvloop event loop (the
documented deployment) where they are installed; the last row, served beside it in the same
rounds, shows what they are worth (it is left out without them, and then every row runs on
plain uvicorn).

Both servers run a project's usual middleware (Django's ``startproject`` list). Each round
runs every row once, in an order rotated from round to round; figures are medians of
``--rounds`` (at least 3) and ratios are taken within each round. Each row starts from a
table holding just its backlog (``--tasks-single`` or ``--tasks-batch`` tasks, filled and
analyzed untimed).

**Statements per call**, counted with ``CaptureQueriesContext`` through Django's test client
in the helper process of each version (``BEGIN`` and ``COMMIT`` are not statements there).

**Long-poll wake-up latency** (this tree): one executor long-polls; a task is created; the
time from the create's commit to the long-poll's answer. PostgreSQL wakes long-polls by
``NOTIFY``; the other databases check every ``LONG_POLL_INTERVAL`` (0.5 s).

Usage::

    ./run bench executor_api                                # PostgreSQL
    python -m benchmarks.executor_api --databases postgres,sqlite --rounds 3
    python -m benchmarks.executor_api --render              # the .md again from the .json

Needs ``node`` (18 or later) on ``PATH``. Results: ``benchmarks/results/executor_api.json``
and ``.md``. The same module is the servers' ASGI application (``application``) and the
helper processes' entry point.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.paired import WORKTREE, checkout

DEFINITION = "bench/work"
NAME = "bench_executor_api"
CLIENT = common.HERE / "executor_client.mjs"
#: The documented deployment's connection settings (docs/executors.md).
PERSISTENT = {"CONN_MAX_AGE": 600}
#: Django's startproject middleware: what a project's requests go through.
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]


def configure(spec: dict[str, Any]) -> None:
    """Django settings of a helper or server process of one version (``spec``: vendor,
    database name, ``head`` or ``base``)."""
    import django
    from django.conf import settings
    from django.urls import include, path

    config = common.database(spec["vendor"], spec["name"])
    if spec["label"] == "head":
        config.update(PERSISTENT)
    urls = types.ModuleType("bench_executor_api_urls")
    settings.configure(
        DATABASES={"default": config},
        INSTALLED_APPS=[*common.BASE_APPS, "django.contrib.sessions", "django.contrib.messages"],
        MIDDLEWARE=MIDDLEWARE,
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        ROOT_URLCONF=urls,
        ALLOWED_HOSTS=["127.0.0.1", "testserver"],
        SECRET_KEY="benchmark",
        LOGGING_CONFIG=None,
    )
    django.setup()
    urls.urlpatterns = [path("tasks/", include("django_tasks_coord.api.urls"))]  # type: ignore[attr-defined]
    from django_tasks_coord import definitions

    definitions.define(DEFINITION)


if os.environ.get("EXECUTOR_API_SERVE"):  # a server process (uvicorn imports this module)
    configure(json.loads(os.environ["EXECUTOR_API_SERVE"]))
    from django.core.handlers.asgi import ASGIHandler

    from django_tasks_coord.api import asgi

    if hasattr(asgi, "serve_api"):
        application = asgi.serve_api(ASGIHandler(), prefix="/tasks/")
    else:  # the base version's documented deployment
        application = asgi.serve_long_polls(ASGIHandler(), path="/tasks/long-poll")


# --- the helper processes (Django set up on one version's package and database) ---------------


def setup() -> dict[str, Any]:
    """Create and migrate the database, empty it, and issue an executor's token."""
    from django.contrib.auth.models import Permission, User
    from django.core.management import call_command
    from django.db import connection

    import django_tasks_coord
    from django_tasks_coord.api.auth import issue_token

    common.create_database(connection.settings_dict)
    call_command("migrate", verbosity=0)
    call_command("flush", interactive=False, verbosity=0)
    user = User.objects.create_user("executor")
    user.user_permissions.add(Permission.objects.get(codename="execute_tasks"))
    return {"token": issue_token(user, "benchmark")[1], "package": django_tasks_coord.__file__}


def fill(tasks: int) -> dict[str, Any]:
    """A table holding ``tasks`` ready tasks and nothing else, analyzed."""
    from django.db import transaction

    from django_tasks_coord import executions
    from django_tasks_coord.models import Task

    Task.objects.all().delete()
    with transaction.atomic():
        for _ in range(tasks):
            executions.create(DEFINITION)
    common.tidy("default", Task._meta.db_table)
    return {"tasks": tasks}


def _count(client: Any, token: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    """The statements of one call: in this process's thread, and in the API's database
    threads where it has them (where claims run)."""
    import importlib

    from django.db import connection, connections
    from django.test.utils import CaptureQueriesContext

    captured: list[Any] = []
    try:
        threads: Any = importlib.import_module("django_tasks_coord.api.threads")
    except ImportError:  # the base version: no database threads but the long-polls'
        threads = None
    if threads is not None:
        call = threads._call

        def counting(func: Any, args: Any) -> Any:
            with CaptureQueriesContext(connections["default"]) as queries:
                try:
                    return call(func, args)
                finally:
                    captured.extend(queries.captured_queries)

        threads._call = counting
    try:
        with CaptureQueriesContext(connection) as queries:
            response = client.post(
                f"/tasks/{path}",
                body,
                "application/json",
                headers={"Authorization": f"Bearer {token}"},
            )
    finally:
        if threads is not None:
            threads._call = call
    assert response.status_code == 200, response.content
    return len(queries.captured_queries) + len(captured), response.json()


def count(token: str) -> dict[str, Any]:
    """Statements per call: poll, start and success; claim and complete where they exist."""
    from django.test import Client

    from django_tasks_coord.api import openapi

    fill(60)
    client, counts = Client(), {}
    for _ in range(2):  # the second time is counted: definitions synced, token touched
        counts["poll"], polled = _count(client, token, "poll", {"definitions": [DEFINITION]})
        (task,) = polled["tasks"]
        execution = {"exec_id": task["exec_id"]}
        counts["start"], _ = _count(client, token, f"{task['id']}/start", execution)
        success = {**execution, "result": {"ok": True}}
        counts["success"], _ = _count(client, token, f"{task['id']}/success", success)
    for limit in (1, 50) if "claim" in openapi.BY_ID else ():
        claim = {"definitions": [DEFINITION], "limit": limit}
        counts[f"claim {limit}"], claimed = _count(client, token, "claim", claim)
        reports = [
            {"id": t["id"], "exec_id": t["exec_id"], "outcome": "succeeded", "result": {"ok": 1}}
            for t in claimed["tasks"]
        ]
        counts[f"complete {limit}"], _ = _count(client, token, "complete", {"tasks": reports})
    return counts


class Client:
    """One keep-alive HTTP connection speaking JSON with a bearer token (wake-ups only)."""

    def __init__(self, port: int, token: str) -> None:
        import http.client

        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.conn.request("POST", f"/tasks/{path}", json.dumps(body), self.headers)
        response = self.conn.getresponse()
        data: dict[str, Any] = json.loads(response.read())
        if response.status >= 300:
            raise RuntimeError(f"{path}: {response.status} {data}")
        return data


def wakeups(port: int, token: str, samples: int) -> dict[str, Any]:
    """Long-poll wake-up latencies: median and p99 in milliseconds."""
    from django_tasks_coord import executions

    fill(0)
    arrivals: dict[int, float] = {}
    got, stop = threading.Event(), threading.Event()

    def executor() -> None:
        client = Client(port, token)
        while not stop.is_set():
            body = client.post("long-poll", {"definitions": [DEFINITION], "timeout": 5})
            for task in body["tasks"]:
                arrivals[task["id"]] = time.perf_counter()
                got.set()

    threading.Thread(target=executor, daemon=True).start()
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
    latencies = sorted(latencies[2:])  # the first ones open the LISTEN connection
    return {
        "wakeup_median_ms": round(statistics.median(latencies) * 1000, 1),
        "wakeup_p99_ms": round(common.percentile(latencies, 99) * 1000, 1),
        "wakeup_samples": len(latencies),
    }


def helper(action: str, *args: str) -> None:
    """A helper process's work; prints its JSON answer as the last line."""
    configure(json.loads(os.environ["EXECUTOR_API_HELPER"]))
    if action == "setup":
        answer = setup()
    elif action == "fill":
        answer = fill(int(args[0]))
    elif action == "count":
        answer = count(args[0])
    else:
        answer = wakeups(int(args[0]), args[1], int(args[2]))
    print(json.dumps(answer))


# --- the orchestrating process (no Django) --------------------------------------------------


@dataclass
class Version:
    """One version of the package, its database and its server."""

    label: str
    revision: str
    source: Path
    spec: dict[str, Any]
    workdir: Path
    token: str = ""
    server: subprocess.Popen[bytes] | None = None
    port: int = 0
    #: uvicorn's HTTP parser and event loop (``--http``, ``--loop``): :data:`FAST_SERVER`
    #: where ``uvicorn[standard]`` is installed, else the pure-Python pair.
    server_args: tuple[str, ...] = ()

    def env(self, **values: str) -> dict[str, str]:
        path = os.pathsep.join(dict.fromkeys([str(self.source), str(common.ROOT)]))
        return {**os.environ, "PYTHONPATH": path, **values}

    def helper(self, *args: str) -> dict[str, Any]:
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.executor_api", "--helper", *args],
            cwd=self.workdir,  # not the repository: its package would come first
            env=self.env(EXECUTOR_API_HELPER=json.dumps(self.spec)),
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            raise RuntimeError(f"{self.label} {args[0]}: {out.stderr[-3000:]}")
        answer: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        return answer

    def serve(self) -> None:
        self.port = _free_port()
        self.server = subprocess.Popen(
            [
                *(sys.executable, "-m", "uvicorn", "benchmarks.executor_api:application"),
                *("--port", str(self.port), "--lifespan=off", "--no-access-log"),
                "--log-level=warning",
                *self.server_args,
            ],
            cwd=self.workdir,  # not the repository: its package would come first
            env=self.env(EXECUTOR_API_SERVE=json.dumps(self.spec)),
        )
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"the {self.label} server did not start")


#: uvicorn with ``uvicorn[standard]``'s C parser and event loop (what docs/executors.md
#: documents), and with its pure-Python defaults (what plain ``uvicorn`` runs).
FAST_SERVER = ("--http", "httptools", "--loop", "uvloop")
PLAIN_SERVER = ("--http", "h11", "--loop", "asyncio")


def fast_server() -> bool:
    """Whether this Python has ``uvicorn[standard]``'s httptools and uvloop."""
    import importlib.util

    return all(importlib.util.find_spec(name) for name in ("httptools", "uvloop"))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass(frozen=True)
class Row:
    """One throughput measurement: a version, the client's mode and the claim's size."""

    label: str
    version: str
    mode: str
    batch: int


def drain(version: Version, row: Row, tasks: int, executors: int) -> dict[str, Any]:
    """Fill the backlog, drain it with the Node.js executors; their figures."""
    version.helper("fill", str(tasks))
    base = f"http://127.0.0.1:{version.port}/tasks"
    assert version.server is not None
    cpu = _cpu_seconds(version.server.pid)
    out = subprocess.run(
        [
            *("node", str(CLIENT), base, version.token, DEFINITION),
            *(row.mode, str(executors), str(row.batch)),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{row.label}: {out.stderr[-3000:]}")
    figures: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if figures["done"] != tasks:
        raise RuntimeError(f"{row.label}: {figures['done']} of {tasks} tasks done")
    figures["tasks_per_s"] = round(tasks / figures["seconds"], 1)
    figures["server_cpu_ms_per_task"] = round(
        (_cpu_seconds(version.server.pid) - cpu) / tasks * 1000, 3
    )
    return figures


def _cpu_seconds(pid: int) -> float:
    """The CPU time process ``pid`` used so far (Linux: /proc; elsewhere NaN)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(vendor: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Every row on ``vendor``'s database, ``args.rounds`` interleaved rounds."""
    versions: dict[str, Version] = {}
    for label, ref in (("base", args.base), ("head", WORKTREE)):
        source, revision = checkout(ref, label, tmp)
        spec = {"vendor": vendor, "name": f"{NAME}_{label}", "label": label}
        version = versions[label] = Version(label, revision, source, spec, tmp)
        answer = version.helper("setup")
        if not Path(answer["package"]).is_relative_to(source):
            raise RuntimeError(f"{label} imported {answer['package']}, not its own package")
        version.token = answer["token"]
        version.server_args = FAST_SERVER if fast_server() else PLAIN_SERVER
    rows = [
        Row("base: poll, start, success", "base", "single", 1),
        Row("poll, start, success", "head", "single", 1),
        Row("claim 1, complete 1", "head", "batch", 1),
        Row(f"claim {args.batch}, complete {args.batch}", "head", "batch", args.batch),
    ]
    if fast_server():  # the same head served by plain uvicorn, in the same rounds
        head = versions["head"]
        versions["head, plain uvicorn"] = dataclasses.replace(
            head, label="head, plain uvicorn", server_args=PLAIN_SERVER
        )
        rows.append(Row("claim 1, complete 1, plain uvicorn", "head, plain uvicorn", "batch", 1))
    result: dict[str, Any] = {
        "database": vendor,
        "versions": {label: v.revision for label, v in versions.items()},
        "servers": {label: " ".join(v.server_args) for label, v in versions.items()},
        "statements": {
            label: versions[label].helper("count", versions[label].token)
            for label in ("base", "head")
        },
        "rounds": [],
    }
    try:
        for version in versions.values():
            version.serve()
        for number in range(args.rounds):
            shift = number % len(rows)
            figures = {}
            for row in rows[shift:] + rows[:shift]:
                tasks = args.tasks_batch if row.batch > 1 else args.tasks_single
                figures[row.label] = drain(versions[row.version], row, tasks, args.executors)
                print(f"{vendor} round {number + 1}: {row.label}: {figures[row.label]}")
            result["rounds"].append(figures)
        if args.wakeups:
            head = versions["head"]
            result.update(head.helper("wakeups", str(head.port), head.token, str(args.wakeups)))
    finally:
        common.terminate([v.server for v in versions.values() if v.server], timeout=30)
    result["rows"] = _summary(rows, result["rounds"])
    if "head, plain uvicorn" in versions:
        fast, plain = "claim 1, complete 1", "claim 1, complete 1, plain uvicorn"
        ratios = [r[fast]["tasks_per_s"] / r[plain]["tasks_per_s"] for r in result["rounds"]]
        result["standard_over_plain"] = round(statistics.median(ratios), 2)
    return result


def _summary(rows: list[Row], rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per row: the median rate, its range, and the median of its per-round ratio to the base."""
    summary = []
    for row in rows:
        rates = [r[row.label]["tasks_per_s"] for r in rounds]
        ratios = [r[row.label]["tasks_per_s"] / r[rows[0].label]["tasks_per_s"] for r in rounds]
        requests = rounds[0][row.label]["requests"] / rounds[0][row.label]["done"]
        cpu = statistics.median(r[row.label]["server_cpu_ms_per_task"] for r in rounds)
        summary.append(
            {
                "row": row.label,
                "tasks_per_s": round(statistics.median(rates), 1),
                "min": min(rates),
                "max": max(rates),
                "vs_base": round(statistics.median(ratios), 2),
                "requests_per_task": round(requests, 2),
                "server_cpu_ms_per_task": round(cpu, 2),
            }
        )
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--databases", default="postgres")
    parser.add_argument("--base", default="173a994", help="the git ref measured as 'base'")
    parser.add_argument("--executors", type=int, default=4)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--tasks-single", type=int, default=1000)
    parser.add_argument("--tasks-batch", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--wakeups", type=int, default=50)
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error("--rounds must be at least 3 (figures are medians of interleaved rounds)")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for vendor in args.databases.split(","):
            if common.reachable(vendor, f"{NAME}_head"):
                results.append(measure(vendor, args, Path(tmp)))
    report = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": common.machine(),
        "load_average_after": common.load_average(),
        "executors": args.executors,
        "batch": args.batch,
        "tasks_single": args.tasks_single,
        "tasks_batch": args.tasks_batch,
        "results": results,
    }
    common.write_report("executor_api", report, lambda: markdown(report))


def markdown(report: dict[str, Any]) -> str:
    """``results/executor_api.md`` from a report (``--render`` redoes it from the JSON)."""
    lines = [
        "# Executor API benchmark",
        "",
        f"{report['when']}, {report['machine']}. One uvicorn process; {report['executors']} "
        "executors (Node.js, one process, a keep-alive connection each) drain "
        f"{report['tasks_single']} tasks one per call, {report['tasks_batch']} with the "
        f"claims of {report['batch']}. Load average after the run: "
        f"{report['load_average_after']}.",
    ]
    for result in report["results"]:
        rounds = len(result["rounds"])
        lines += [
            "",
            f"## {common.LABELS.get(result['database'], result['database'])}",
            "",
            f"base = {result['versions']['base']}, head = {result['versions']['head']}; "
            f"medians of {rounds} interleaved rounds. uvicorn "
            + "; ".join(f"{label}: `{args}`" for label, args in result.get("servers", {}).items())
            + ".",
            "",
            "| calls | requests per task | tasks/s (median) | range | x base (median of rounds) "
            "| server CPU per task |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for row in result["rows"]:
            lines.append(
                f"| {row['row']} | {row['requests_per_task']} | {row['tasks_per_s']} | "
                f"{row['min']}-{row['max']} | {row['vs_base']} | "
                f"{row['server_cpu_ms_per_task']} ms |"
            )
        if "standard_over_plain" in result:
            lines += [
                "",
                "Claim 1 and complete 1 on `uvicorn[standard]` (httptools, uvloop) over plain "
                f"uvicorn (h11, asyncio): {result['standard_over_plain']}x (median of the "
                "per-round ratios).",
            ]
        lines += ["", "Statements per call (`CaptureQueriesContext`):", ""]
        names = list(result["statements"]["head"])
        lines += ["| version | " + " | ".join(names) + " |", "| --- |" + " ---: |" * len(names)]
        for label, counts in result["statements"].items():
            cells = [str(counts.get(name, "-")) for name in names]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        if "wakeup_median_ms" in result:
            lines += [
                "",
                f"Long-poll wake-up (head): median {result['wakeup_median_ms']} ms, p99 "
                f"{result['wakeup_p99_ms']} ms ({result['wakeup_samples']} samples).",
            ]
    lines += [
        "",
        "Rows: see the module docstring of `benchmarks/executor_api.py`. The base runs the",
        "deployment its documentation gave (`serve_long_polls`, Django's request handling for",
        "every other call, a new database connection per request); the head runs",
        "`serve_api` with `CONN_MAX_AGE` 600. The two cores are shared",
        "by the server, the client, the database and whatever else ran on the machine.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--helper"]:
        helper(*sys.argv[2:])
    elif sys.argv[1:] == ["--render"]:
        stored = json.loads((common.RESULTS / "executor_api.json").read_text())
        common.write_report("executor_api", stored, lambda: markdown(stored))
    else:
        main()
