"""Exit and stop times: how long a node takes to exit once it has nothing left to do.

Measured on each database asked for (``--databases``, all three by default), each a real
``runscheduler`` subprocess (``benchmarks.settings``, the ``noop`` consumer, default
``TASKS_COORD`` settings), ``--runs`` times; figures are medians (the runs are in the JSON):

- **idle burst**: ``--burst`` with nothing queued and no job due; from the moment its
  "Burst mode: nothing is due, exiting." line reaches this process to the process's exit.
- **busy burst**: ``--burst`` draining ``--tasks`` no-op tasks; from the last task's
  ``finished_at`` (the database's record of its completion) to the process's exit. Both
  processes share the machine's clock.
- **idle stop**: a node (not ``--burst``) idle for ``--idle`` seconds after it logged its
  start, then sent SIGINT (Ctrl-C); from the signal to the process's exit.

``--root`` runs the nodes from another checkout (e.g. ``git archive main`` unpacked in a
temporary directory) to measure the code before a change.

Usage::

    ./run bench burst_exit
    python -m benchmarks.burst_exit --databases sqlite,postgres,mysql --runs 5

Results: ``benchmarks/results/burst_exit.json`` and ``benchmarks/results/burst_exit.md``.
Targets: a burst exits within 0.5 s once nothing is left; an idle node stops within 1 s.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.cluster import Cluster, Node
from benchmarks.common import LABELS, ROOT, configure_django, git_revision, load_average, machine

DB_NAME = "bench_burst_exit"
TOPIC = "noop"


def prepare(vendor: str) -> None:
    """Migrate; empty the tables a node reads; register the topic."""
    from django.core.management import call_command

    from django_tasks_coord import topics
    from django_tasks_coord.models import HealthCheck, Owner, PeriodicTask, Task, TokenHolder

    call_command("migrate", database=vendor, verbosity=0)
    for model in (Task, PeriodicTask, Owner, HealthCheck, TokenHolder):
        model.objects.using(vendor).all().delete()
    with common.on(vendor):
        topics.register_topic(TOPIC)
    common.tidy(vendor)


@contextmanager
def node(vendor: str, root: Path, *flags: str) -> Iterator[Node]:
    """One ``runscheduler`` subprocess run from ``root`` (its output lines timestamped as
    they arrive); killed on the way out if still there."""
    env = common.bench_env(common.database(vendor, DB_NAME))
    with Cluster(env, source=root) as cluster:
        yield cluster.start("--topic", TOPIC, *flags)


def exit_time(node: Node, timeout: float = 120) -> tuple[float, float]:
    """Wait for the node's exit; (monotonic, wall-clock) time of the exit. Raise if it failed."""
    code = node.proc.wait(timeout)
    ended, wall = time.monotonic(), time.time()
    node.wait(10)
    if code != 0:
        raise RuntimeError(f"exit {code}:\n{node.output()}")
    return ended, wall


def idle_burst(vendor: str, root: Path) -> float:
    """Seconds from "nothing is due" to the exit of an idle burst."""
    prepare(vendor)
    with node(vendor, root, "--burst") as burst:
        said = burst.line_at("nothing is due")
        ended, _ = exit_time(burst)
    return ended - said


def busy_burst(vendor: str, root: Path, tasks: int) -> float:
    """Seconds from the last task's completion to the exit of a burst draining ``tasks``."""
    from django.db.models import Max

    from django_tasks_coord import queue
    from django_tasks_coord.models import Task

    prepare(vendor)
    with common.on(vendor):
        queue.push_many(TOPIC, [(f"t{i}", {}) for i in range(tasks)])
    common.tidy(vendor)
    with node(vendor, root, "--burst") as burst:
        _, exited = exit_time(burst)
    last = Task.objects.using(vendor).aggregate(m=Max("finished_at"))["m"]
    common.tidy(vendor)
    assert last is not None, "no task finished"
    return exited - common.as_datetime(last).astimezone(UTC).timestamp()


def idle_stop(vendor: str, root: Path, idle: float) -> float:
    """Seconds from SIGINT to the exit of a node idle for ``idle`` seconds."""
    prepare(vendor)
    with node(vendor, root) as idle_node:
        idle_node.line_at("started")
        time.sleep(idle)  # let the node settle into its idle waits (the point of the measurement)
        sent = time.monotonic()
        idle_node.signal(signal.SIGINT)
        ended, _ = exit_time(idle_node)
    return ended - sent


def markdown(results: dict[str, Any], meta: dict[str, Any]) -> str:
    """The results as Markdown."""
    lines = [
        "# Burst exit and idle stop times",
        "",
        f"{meta['date']}; {meta['machine']}; Python {meta['python']}; commit {meta['commit']}; "
        f"nodes run from {meta['root']}. Load average at start {meta['load_at_start']}, at end "
        f"{meta['load_at_end']} (shared machine).",
        "",
        f"Seconds, medians of {meta['runs']} runs (each run in the JSON). *Idle burst*: from its "
        "'nothing is due' line to its exit. *Busy burst*: from the last of "
        f"{meta['tasks']} no-op tasks' `finished_at` to its exit. *Idle stop*: a node idle "
        f"for {meta['idle']} s, from SIGINT to its exit. Targets: 0.5 s, 0.5 s, 1 s.",
        "",
        "| database | idle burst | busy burst | idle stop |",
        "| --- | ---: | ---: | ---: |",
    ]
    for vendor, r in results.items():
        lines.append(
            f"| {LABELS[vendor]} | {r['idle_burst']['median']} | {r['busy_burst']['median']} "
            f"| {r['idle_stop']['median']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--databases", default="sqlite,postgres,mysql")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--idle", type=float, default=3.0)
    parser.add_argument("--root", type=Path, default=ROOT, help="checkout to run the nodes from")
    parser.add_argument("--name", default="burst_exit", help="results/NAME.json and .md")
    args = parser.parse_args()
    vendors = [v for v in args.databases.split(",") if common.reachable(v, DB_NAME)]
    configure_django(
        {"default": common.database(vendors[0], DB_NAME)}
        | {v: common.database(v, DB_NAME) for v in vendors}
    )
    meta = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "python": sys.version.split()[0],
        "commit": git_revision(),
        "root": str(args.root),
        "runs": args.runs,
        "tasks": args.tasks,
        "idle": args.idle,
        "load_at_start": load_average(),
    }
    results: dict[str, Any] = {}
    for vendor in vendors:
        runs: dict[str, list[float]] = {"idle_burst": [], "busy_burst": [], "idle_stop": []}
        for i in range(args.runs):
            print(f"{LABELS[vendor]}: run {i + 1}/{args.runs}", flush=True)
            runs["idle_burst"].append(idle_burst(vendor, args.root))
            runs["busy_burst"].append(busy_burst(vendor, args.root, args.tasks))
            runs["idle_stop"].append(idle_stop(vendor, args.root, args.idle))
            print("  " + ", ".join(f"{k} {v[-1]:.3f}s" for k, v in runs.items()), flush=True)
        results[vendor] = {
            k: {"median": round(statistics.median(v), 3), "runs": [round(x, 3) for x in v]}
            for k, v in runs.items()
        }
    meta["load_at_end"] = load_average()
    common.write_report(
        args.name, {"meta": meta, "results": results}, lambda: markdown(results, meta)
    )


if __name__ == "__main__":
    main()
