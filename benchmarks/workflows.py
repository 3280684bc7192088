"""Workflows: what a step costs over a plain task, how soon a fan-in starts, and the chaos run.

Three parts, on one database per call (PostgreSQL or MariaDB), with the test app's ``work``
consumer (``tests/testapp/consumers.py``: each run writes one ``Run`` row) on the topic
``work``, nodes started like the test suite's (``tests.settings``):

1. **Overhead per step**, paired: in each round, in a rotated order, ``--steps`` N plain
   tasks (``queue.push_many``), the same N as a workflow *chain* (each step after the
   previous one) and as a *group* (N steps side by side), each drained by one
   ``runscheduler --burst`` node with **one worker**, so that the plain tasks run one after
   the other too. Timed on the task table, from the first task's ``started_at`` to the last
   one's ``finished_at`` (the node's start-up left out). The overhead per step of a
   workflow is ``(its time - the plain tasks' time) / N``, per round; the report gives the
   median of ``--rounds`` rounds (3).
2. **Fan-in latency**: ``--fan-ins`` workflows (50) of a root, 8 steps after it and a fan-in
   after the 8, on three ``runscheduler`` nodes with the default settings. Per workflow, from
   the last parent's ``finished_at`` to the fan-in's ``enqueued_at`` (the advance) and to
   its task's ``started_at`` (the fan-in's start): p50, p95 and max.
3. **Chaos**: ``--chaos`` workflows (200) of 10 steps each (fan-out 8, fan-in 1, each step
   0.3 s of work and a fenced side effect; the ``chaos`` consumer, 1,000 attempts) on three nodes, one SIGKILLed every 1-3 s and
   replaced (``tests/workflows/chaos.py``, whose short form is ``tests/workflows/test_chaos.py``):
   its duration, kills, reruns, and the violations, which must all be empty.

Usage::

    python -m benchmarks.workflows --database postgres|mysql [--steps 200] [--rounds 3]
        [--fan-ins 50] [--chaos 200] [--parts overhead,fan_in,chaos] [--name bench_workflows]

Results: ``benchmarks/results/workflows.json`` (one entry per database; the others are kept)
and ``benchmarks/results/workflows.md``. About 5 minutes per database. The exit status is 1
when the chaos run broke an invariant.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from datetime import datetime
from typing import Any

from benchmarks import common
from benchmarks.common import RESULTS, create_database, load_average

KINDS = ("plain", "chain", "group")
BURST = {"WORKERS": 1, "STATUS_INTERVAL": 0}


def clean() -> None:
    """Empty the tables a part fills."""
    from django_tasks_coord.models import Owner, Task, Workflow, WorkflowStep
    from tests.testapp.models import Run

    for model in (Run, WorkflowStep, Workflow, Task, Owner):
        model.objects.all().delete()


def span() -> float:
    """Seconds from the first task's start to the last one's end."""
    from django.db.models import Max, Min

    from django_tasks_coord.models import Task

    times = Task.objects.filter(topic_id="work").aggregate(
        a=Min("started_at"), b=Max("finished_at")
    )
    return (times["b"] - times["a"]).total_seconds()


def drain_once(kind: str, steps: int) -> float:
    """Push ``steps`` tasks as ``kind``, drain them with one burst node; its span."""
    from django_tasks_coord import queue, workflows
    from django_tasks_coord.enums import TaskState
    from django_tasks_coord.models import Task
    from tests.processes import reap, runscheduler

    clean()
    queue.register_topic("work")
    if kind == "plain":
        queue.push_many("work", [(f"p{i}", {}) for i in range(steps)])
    else:
        made = [workflows.push("work", f"s{i}", {}, name=f"s{i}") for i in range(steps)]
        workflows.start(kind, workflows.chain(*made) if kind == "chain" else workflows.group(made))
    node = runscheduler("--burst", "--topic", "work", "-v", "0", settings=BURST)
    _, err = reap(node)
    if node.returncode != 0:
        raise RuntimeError(f"the burst node failed: {err[-2000:]}")
    done = Task.objects.filter(topic_id="work", state=TaskState.SUCCEEDED).count()
    if done != steps:
        raise RuntimeError(f"{kind}: {done} of {steps} tasks succeeded")
    return span()


def overhead(args: argparse.Namespace) -> dict[str, Any]:
    """Part 1 (see the module)."""
    rounds = []
    for number in range(args.rounds):
        order = KINDS[number % 3 :] + KINDS[: number % 3]
        times = {kind: drain_once(kind, args.steps) for kind in order}
        rounds.append(
            {
                "order": list(order),
                "seconds": times,
                "overhead_ms_per_step": {
                    kind: (times[kind] - times["plain"]) / args.steps * 1000
                    for kind in ("chain", "group")
                },
            }
        )
        print(f"round {number + 1}: {times}", flush=True)

    def median(kind: str, key: str = "seconds") -> float:
        return statistics.median(r[key][kind] for r in rounds)

    return {
        "steps": args.steps,
        "rounds": rounds,
        "median_seconds": {kind: median(kind) for kind in KINDS},
        "median_ms_per_task": {kind: median(kind) / args.steps * 1000 for kind in KINDS},
        "median_overhead_ms_per_step": {
            kind: median(kind, "overhead_ms_per_step") for kind in ("chain", "group")
        },
    }


def fan_in(args: argparse.Namespace) -> dict[str, Any]:
    """Part 2 (see the module)."""
    from django.db.models import Max

    from django_tasks_coord import queue, workflows
    from django_tasks_coord.models import Owner, Task, Workflow, WorkflowState, WorkflowStep
    from tests.processes import reap, runscheduler, wait_for

    clean()
    queue.register_topic("work")
    nodes = [
        runscheduler(
            "--node-id", f"f{i}", "--topic", "work", "-v", "0", settings={"STATUS_INTERVAL": 0}
        )
        for i in range(3)
    ]
    try:
        wait_for(lambda: Owner.objects.count() == 3, timeout=60)
        ids = []
        for n in range(args.fan_ins):
            root = workflows.push("work", f"f{n}-root", {}, name="root")
            fan = [workflows.push("work", f"f{n}-{i}", {}, name=f"fan{i}") for i in range(8)]
            join = workflows.push("work", f"f{n}-join", {}, name="join", results=True)
            ids.append(
                workflows.start(f"fan-in {n}", workflows.chain(root, workflows.group(fan), join))
            )
            time.sleep(0.05)  # the pace of the starts: one workflow every 50 ms, not a burst
        running = Workflow.objects.filter(pk__in=ids, state=WorkflowState.RUNNING)
        wait_for(lambda: not running.exists(), timeout=300)
    finally:
        codes = []
        for node in nodes:
            reap(node, signal.SIGTERM)
            codes.append(node.returncode)
    advance, start = [], []
    for workflow_id in ids:
        steps = WorkflowStep.objects.filter(workflow_id=workflow_id)
        join = steps.get(name="join")
        parents = steps.filter(name__startswith="fan").values_list("task_sequence", flat=True)
        last = Task.objects.filter(sequence__in=list(parents)).aggregate(t=Max("finished_at"))["t"]
        started = Task.objects.get(sequence=join.task_sequence).started_at
        advance.append((join.enqueued_at - last).total_seconds() * 1000)
        start.append((started - last).total_seconds() * 1000)
    return {
        "workflows": args.fan_ins,
        "exit_codes": codes,
        "to_enqueued_ms": summarize(advance),
        "to_started_ms": summarize(start),
    }


def summarize(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(common.percentile(values, 50), 1),
        "p95": round(common.percentile(values, 95), 1),
        "max": round(max(values), 1),
    }


def chaos_run(args: argparse.Namespace) -> dict[str, Any]:
    """Part 3 (see the module)."""
    from tests.workflows import chaos

    clean()
    ids = chaos.start_workflows(args.chaos)
    run = chaos.run(ids, seed=args.seed, timeout=900)
    figures = chaos.verify(run)
    figures["finished"] = run.finished
    return figures


def markdown(entries: list[dict[str, Any]]) -> str:
    lines = [
        "# Workflows: overhead per step, fan-in latency, SIGKILL chaos",
        "",
        "Generated by `benchmarks/workflows.py` (see its docstring for the method). Shared, noisy "
        "two-core machine; comparisons are within one run.",
        "",
        "## Overhead per step (one burst node, one worker; medians of the rounds)",
        "",
        "| database | steps | plain tasks | chain | group | chain overhead / step | group overhead / step |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for e in entries:
        o = e.get("overhead")
        if not o:
            continue
        s, per = o["median_seconds"], o["median_overhead_ms_per_step"]
        lines.append(
            f"| {e['database']} | {o['steps']} | {s['plain']:.2f} s | {s['chain']:.2f} s | "
            f"{s['group']:.2f} s | {per['chain']:.1f} ms | {per['group']:.1f} ms |"
        )
    lines += [
        "",
        "## Fan-in latency (three nodes, default settings; 8 parents per fan-in)",
        "",
        "| database | workflows | last parent's end → fan-in enqueued (p50 / p95 / max) | → fan-in started (p50 / p95 / max) |",
        "| --- | --- | --- | --- |",
    ]
    for e in entries:
        f = e.get("fan_in")
        if not f:
            continue
        a, b = f["to_enqueued_ms"], f["to_started_ms"]
        lines.append(
            f"| {e['database']} | {f['workflows']} | {a['p50']} / {a['p95']} / {a['max']} ms | "
            f"{b['p50']} / {b['p95']} / {b['max']} ms |"
        )
    lines += [
        "",
        "## Chaos: three nodes, one SIGKILLed every 1-3 s and replaced",
        "",
        "| database | workflows | steps | seconds | kills | executions | reruns (of runs cut off by a kill) | fan-in reruns | most attempts of a task | violations |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for e in entries:
        c = e.get("chaos")
        if not c:
            continue
        broken = sum(len(v) for v in c["violations"].values())
        lines.append(
            f"| {e['database']} | {c['workflows']} | {c['steps']} | {c['seconds']} | {c['kills']} | "
            f"{c['executions']} | {c['reruns_after_kills']} | {c['fan_in_reruns']} | "
            f"{c['most_attempts']} | {broken} |"
        )
    lines += [
        "",
        "Violations (all must be 0): a workflow not SUCCEEDED, a fan-in not enqueued exactly once "
        "or without its 8 parents' results, a step whose fenced side effect did not commit exactly "
        "once, a step run twice by nodes never killed, a node that did not exit 0 on SIGTERM. "
        "Every figure and round: `benchmarks/results/workflows.json`.",
        "",
    ]
    for e in entries:
        lines.append(
            f"- {e['database']}: {e['when']}, revision {e['revision']}, load {e['load_average']}."
        )
    lines.append("")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database", choices=["postgres", "mysql"], default="postgres")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fan-ins", type=int, default=50)
    parser.add_argument("--chaos", type=int, default=200)
    parser.add_argument("--seed", type=int, default=24)
    parser.add_argument("--parts", default="overhead,fan_in,chaos")
    parser.add_argument("--name", default="bench_workflows")
    args = parser.parse_args()
    database = common.database(args.database, args.name)
    create_database(database)
    os.environ.update(
        DJANGO_SETTINGS_MODULE="tests.settings", TASKS_COORD_TEST_DB=json.dumps(database)
    )
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", run_syncdb=True, verbosity=0)  # testapp has no migrations
    parts = args.parts.split(",")
    entry: dict[str, Any] = {
        "database": common.LABELS[args.database],
        "when": datetime.now().isoformat(timespec="seconds"),
        "revision": common.git_revision(),
        "machine": common.machine(),
    }
    if "overhead" in parts:
        entry["overhead"] = overhead(args)
    if "fan_in" in parts:
        entry["fan_in"] = fan_in(args)
    if "chaos" in parts:
        entry["chaos"] = chaos_run(args)
    entry["load_average"] = load_average()  # the rows stay: the chaos run's can be looked at
    path = RESULTS / "workflows.json"
    entries = json.loads(path.read_text())["entries"] if path.exists() else []
    entries = [e for e in entries if e["database"] != entry["database"]] + [entry]
    common.write_report("workflows", {"entries": entries}, lambda: markdown(entries))
    chaos = entry.get("chaos")
    return 1 if chaos and any(chaos["violations"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
