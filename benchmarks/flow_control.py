"""Flow control at issue 23's full sizes, with three ``runscheduler`` nodes per database.

Per database (``--databases postgres,mysql``; a database ``bench_flow`` on each server):

- **rate**: ``--rate`` (20/s) on the ``noop`` topic, ``--rate-tasks`` (2,000) pushed at once,
  three nodes: the most starts in any 1-second window of ``started_at`` (the claims'
  times, on the database clock; the limit, tolerance 0), and the paced throughput: starts
  after the first window's burst / (last start - first start).
- **concurrency**: 3 per key (``payload.tenant``), 10 keys, ``--concurrency-tasks`` (600)
  tasks of the ``sleepy`` consumer sleeping 0.3 s, three nodes of 10 workers: the table
  sampled every 10 ms, the most ACTIVE per key and overall.
- **fairness**: ``--big`` (50,000) pending tasks of one key and 10 of each of nine small
  keys, pushed in one transaction, the topic fair by identifier: how many of the big key's
  tasks started in claims before the last small task's (round-robin: at most 10 plus a
  claim's share; FIFO: all of them), and how long the small tasks took.
- **drain**: ``--drain-tasks`` (10,000) ``noop`` tasks drained by one ``runscheduler
  --burst`` (throughput.py's tuned settings), once without limits and once with limits
  that never bind (rate 1,000,000/s, concurrency 100,000), alternating which goes first,
  ``--rounds`` (3) rounds: the median of the per-round ratios limited / unlimited.

Usage: ``python -m benchmarks.flow_control`` (every size is an option; ``--help``).
Results: ``benchmarks/results/flow_control.json`` and ``.md``. About 10 minutes.
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from benchmarks import common
from benchmarks.cluster import Cluster, run_node
from benchmarks.throughput import TUNED

NAME = "bench_flow"
NODE = {"HEARTBEAT_FREQUENCY": 0.5, "POLL_INTERVAL": 0.2, "STATUS_INTERVAL": 0}


def _setup(config: dict[str, Any]) -> None:
    common.configure_django({"default": config})
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _empty() -> None:
    from django_tasks_coord import flow
    from django_tasks_coord.models import FlowStart, Owner, Task

    Task.objects.all().delete()
    FlowStart.objects.all().delete()
    Owner.objects.all().delete()
    for topic in ("noop", "sleepy"):
        flow.set_limits(topic)


def _wait(condition: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError("timed out")
        time.sleep(0.1)  # polling the table for the end of a phase


def _nodes(config: dict[str, Any], topic: str, workers: int, **settings: Any) -> Cluster:
    cluster = Cluster(common.bench_env(config, tasks_coord={**NODE, **settings}))
    for _ in range(3):
        cluster.start("--topic", topic, "--workers", str(workers), "-v", "0")
    return cluster


def _done(topic: str, count: int) -> bool:
    from django_tasks_coord.enums import TaskState
    from django_tasks_coord.models import Task

    return Task.objects.filter(topic_id=topic, state=TaskState.SUCCEEDED).count() >= count


def rate_phase(config: dict[str, Any], rate: int, tasks: int) -> dict[str, Any]:
    from django_tasks_coord import flow, queue
    from django_tasks_coord.models import Task

    _empty()
    flow.set_limits("noop", rate=f"{rate}/s")
    with _nodes(config, "noop", 5):
        queue.push_many("noop", [(f"r{i}", None) for i in range(tasks)])
        _wait(lambda: _done("noop", tasks), timeout=tasks / rate * 3 + 60)
    stamps = Task.objects.filter(topic_id="noop").values_list("started_at", flat=True)
    times = sorted(stamp.timestamp() for stamp in stamps)
    busiest = max(bisect.bisect_left(times, t + 1.0) - i for i, t in enumerate(times))
    paced = (len(times) - rate) / (times[-1] - times[0])
    return {
        "rate": rate,
        "tasks": tasks,
        "busiest_1s_window": busiest,
        "paced_per_s": round(paced, 2),
        "paced_share": round(paced / rate, 3),
    }


def concurrency_phase(config: dict[str, Any], tasks: int) -> dict[str, Any]:
    from django.db import connections
    from django.db.models import Count

    from django_tasks_coord import flow, queue
    from django_tasks_coord.enums import TaskState
    from django_tasks_coord.models import Task

    _empty()
    flow.set_limits("sleepy", concurrency=3, key="payload.tenant")
    peaks: Counter[str] = Counter()
    most, samples = 0, 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal most, samples
        active = Task.objects.filter(topic_id="sleepy", state=TaskState.ACTIVE)
        per_key = active.values("concurrency_key").annotate(n=Count("pk"))
        while not stop.is_set():
            seen = dict(per_key.values_list("concurrency_key", "n"))
            samples += 1
            for key, n in seen.items():
                peaks[key] = max(peaks[key], n)
            most = max(most, sum(seen.values()))
            stop.wait(0.01)
        connections.close_all()

    with _nodes(config, "sleepy", 10, BUFFER=2):
        sampler = threading.Thread(target=sample)
        sampler.start()
        items = [(f"c{i}", {"tenant": f"k{i % 10}", "sleep": 0.3}) for i in range(tasks)]
        started = time.monotonic()
        queue.push_many("sleepy", items)
        _wait(lambda: _done("sleepy", tasks), timeout=tasks * 0.3 / 3 + 120)
        took = time.monotonic() - started
        stop.set()
        sampler.join()
    return {
        "tasks": tasks,
        "samples": samples,
        "most_active_per_key": max(peaks.values()),
        "most_active_overall": most,
        "seconds": round(took, 2),
        "ideal_seconds": round(tasks * 0.3 / 30, 2),
    }


def fairness_phase(config: dict[str, Any], big: int) -> dict[str, Any]:
    from django.db import transaction

    from django_tasks_coord import flow, queue
    from django_tasks_coord.enums import TaskState
    from django_tasks_coord.models import Owner, Task

    _empty()
    flow.set_limits("noop", key="identifier", fair=True)
    with _nodes(config, "noop", 5):
        _wait(lambda: Owner.objects.count() == 3, timeout=120)  # their start is not measured
        with transaction.atomic():
            for start in range(0, big, 5000):
                queue.push_many("noop", [("big", None) for _ in range(min(5000, big - start))])
            small = queue.push_many("noop", [(f"s{k}", None) for k in range(9) for _ in range(10)])
        pushed = time.monotonic()
        pks = [t.pk for t in small]
        _wait(
            lambda: Task.objects.filter(pk__in=pks, state=TaskState.SUCCEEDED).count() == 90,
            timeout=600,
        )
        took = time.monotonic() - pushed
        queue.pause_topic("noop")
    last = max(Task.objects.filter(pk__in=pks).values_list("started_at", flat=True))
    before = Task.objects.filter(topic_id="noop", identifier="big", started_at__lt=last).count()
    queue.resume_topic("noop")
    return {
        "big": big,
        "small": 90,
        "big_started_before_last_small": before,
        "small_done_seconds": round(took, 2),
    }


def drain_phase(config: dict[str, Any], tasks: int, rounds: int) -> dict[str, Any]:
    from django_tasks_coord import flow, queue
    from django_tasks_coord.models import Task

    def drain(limited: bool) -> float:
        _empty()
        if limited:
            flow.set_limits("noop", rate="1000000/s", concurrency=100000)
        for start in range(0, tasks, 5000):
            queue.push_many(
                "noop", [(f"d{i}", None) for i in range(start, min(start + 5000, tasks))]
            )
        env = common.bench_env(config, tasks_coord=TUNED)
        code, _, output = run_node(env, "--burst", "--topic", "noop", "-v", "0")
        if code:
            raise RuntimeError(output)
        rows = Task.objects.filter(topic_id="noop")
        first = min(rows.values_list("started_at", flat=True))
        last = max(rows.values_list("finished_at", flat=True))
        return tasks / (last - first).total_seconds()

    samples = []
    for round_ in range(rounds):
        order = (False, True) if round_ % 2 == 0 else (True, False)
        rates = {limited: drain(limited) for limited in order}
        samples.append({"unlimited": rates[False], "limited": rates[True]})
    ratios = [s["limited"] / s["unlimited"] for s in samples]
    return {
        "tasks": tasks,
        "rounds": samples,
        "median_unlimited_per_s": round(statistics.median(s["unlimited"] for s in samples), 1),
        "median_limited_per_s": round(statistics.median(s["limited"] for s in samples), 1),
        "median_ratio": round(statistics.median(ratios), 3),
        "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
    }


def one(args: argparse.Namespace) -> None:
    """Every phase on the database of ``args.one`` (a vendor); its figures as JSON."""
    config = common.database(args.one, NAME)
    common.create_database(config)
    _setup(config)
    figures = {
        "rate": rate_phase(config, args.rate, args.rate_tasks),
        "concurrency": concurrency_phase(config, args.concurrency_tasks),
        "fairness": fairness_phase(config, args.big),
        "drain": drain_phase(config, args.drain_tasks, args.rounds),
    }
    print(json.dumps(figures))


def markdown(document: dict[str, Any]) -> str:
    lines = [
        "# Flow control: issue 23's proofs at full size",
        "",
        f"{document['when']}, {document['machine']}, load {document['load']}, "
        f"revision {document['revision']}. `python -m benchmarks.flow_control "
        f"{document['argv']}`. Three `runscheduler` nodes per database.",
        "",
    ]
    for vendor, f in document["databases"].items():
        r, c, fa, d = f["rate"], f["concurrency"], f["fairness"], f["drain"]
        lines += [
            f"## {vendor}",
            "",
            "| proof | measured | required |",
            "| --- | --- | --- |",
            f"| rate {r['rate']}/s, {r['tasks']} tasks: most starts in any 1-second window "
            f"| {r['busiest_1s_window']} | <= {r['rate']} |",
            f"| rate: paced throughput after the first window | {r['paced_per_s']}/s "
            f"({r['paced_share']:.0%}) | >= 90% |",
            f"| concurrency 3 per key, 10 keys, {c['tasks']} tasks of 0.3 s: most ACTIVE per "
            f"key ({c['samples']} samples, every 10 ms) | {c['most_active_per_key']} | <= 3 |",
            f"| concurrency: most ACTIVE overall | {c['most_active_overall']} | >= 25 |",
            f"| concurrency: drain time (ideal {c['ideal_seconds']} s) | {c['seconds']} s | |",
            f"| fairness, {fa['big']} pending of one key, 9 x 10 small: big-key tasks started "
            f"before the last small one | {fa['big_started_before_last_small']} | one turn "
            f"each (FIFO: {fa['big']}) |",
            f"| fairness: all small tasks done after | {fa['small_done_seconds']} s | |",
            f"| drain, {d['tasks']} tasks, limits not binding / no limits (median of "
            f"{len(d['rounds'])} paired rounds) | {d['median_ratio']:.3f} (range "
            f"{d['ratio_range'][0]:.3f}-{d['ratio_range'][1]:.3f}; "
            f"{d['median_limited_per_s']}/s vs {d['median_unlimited_per_s']}/s) | >= 0.9 |",
            "",
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--databases", default="postgres,mysql")
    parser.add_argument("--rate", type=int, default=20)
    parser.add_argument("--rate-tasks", type=int, default=2000)
    parser.add_argument("--concurrency-tasks", type=int, default=600)
    parser.add_argument("--big", type=int, default=50000)
    parser.add_argument("--drain-tasks", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", default="flow_control")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one(args)
        return
    results = {}
    for vendor in args.databases.split(","):
        if not common.reachable(vendor, NAME):
            continue
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.flow_control", *sys.argv[1:], "--one", vendor],
            cwd=common.ROOT,
            env=common.subprocess_env(None),
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode:
            raise SystemExit(f"{vendor} failed:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
        results[vendor] = json.loads(out.stdout.strip().splitlines()[-1])
    document = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": common.machine(),
        "load": common.load_average(),
        "revision": common.git_revision(),
        "argv": " ".join(sys.argv[1:]),
        "databases": results,
    }
    common.write_report(args.output, document, lambda: markdown(document))


if __name__ == "__main__":
    main()
