"""Chaos run for zombie nodes: SIGSTOP a node with work in flight past its liveness interval,
let the others take over, SIGCONT it, and count what ran twice.

Each round: a clean database, 120 queue tasks of 0.25 s (topic ``work``) and six jobs each
firing every second that sleep 0.3 s (``tests.testapp.job_functions.record``), three
``runscheduler`` nodes (``zombie``, ``a``, ``b``; 2 workers and a buffer of 8 each; heartbeat
0.2 s, liveness 3 s). Once ``zombie`` holds more tasks than it has workers (running and
buffered), it gets SIGSTOP; once the others declared it dead (its owner row is gone) and
ran work for a second, SIGCONT. The round ends when every task succeeded and two more
slots ran; the nodes get SIGTERM.

Every run (task or job slot) is recorded by its handler (``tests.testapp`` ``Run`` rows:
identifier or slot, node pid, start time). A run is a **duplicate** when its task or slot
ran more than once, not counting a run ``zombie`` had already *started* before it froze
(another node must run that one again: execution is at least once). The report also says
whether ``zombie`` went on working (registered again and ran something after SIGCONT) and
its exit code.

``--source`` runs the nodes from another checkout (e.g. ``/work/main``, to measure before a
fix); the script, its database and the report stay here.

Usage::

    python -m benchmarks.zombie [--database postgres|mysql] [--rounds 5] [--source PATH]
        [--label NAME] [--name bench_zombie]

Results: ``benchmarks/results/zombie.json`` (one entry per database and label; the others
are kept) and ``benchmarks/results/zombie.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.cluster import Cluster
from benchmarks.common import RESULTS, ROOT, create_database, git, load_average

LIVENESS = 3.0
SETTINGS = {
    "HEARTBEAT_FREQUENCY": 0.2,
    "LIVENESS_INTERVAL": LIVENESS,
    "POLL_INTERVAL": 0.1,
    "REAP_INTERVAL": 0.3,
    "STATUS_INTERVAL": 0,
    "SHUTDOWN_MAX_WAIT": 2,
    "WORKERS": 2,
    "BUFFER": 8,
}
TASKS = 120
JOBS = 6


def wait_until(predicate: Callable[[], object], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)  # polling a condition with a deadline
    return False


def env(database: dict[str, Any]) -> dict[str, str]:
    """The nodes' environment: the test settings (their app has the job that records runs)."""
    return common.subprocess_env(
        "tests.settings",
        TASKS_COORD_TEST_DB=json.dumps(database),
        TASKS_COORD_JSON=json.dumps(SETTINGS),
    )


def one_round(database: dict[str, Any], source: Path, logs: Path, number: int) -> dict[str, Any]:
    from django.db.models import Count
    from django.utils import timezone

    from django_tasks_coord import queue, scheduling, topics
    from django_tasks_coord.enums import TaskState
    from django_tasks_coord.models import HealthCheck, Owner, PeriodicTask, Task, TokenHolder
    from django_tasks_coord.scheduling import JOBS_TOPIC
    from tests.processes import stopped
    from tests.testapp.models import Run

    for model in (Run, Task, PeriodicTask, Owner, HealthCheck, TokenHolder):
        model.objects.all().delete()
    queue.register_topic("work")
    topics.register_internal_topic(JOBS_TOPIC)
    queue.push_many("work", [(f"t{i}", {"sleep": 0.25}) for i in range(TASKS)])
    for job in range(JOBS):
        scheduling.schedule_recurring(
            "tests.testapp.job_functions.record", 1, job_id=f"tick{job}", kwargs={"sleep": 0.3}
        )
    cluster = Cluster(env(database), source=source, logs=logs)
    for name in ("zombie", "a", "b"):
        args = ("--node-id", name, "--topic", "work", "--topic", JOBS_TOPIC)
        cluster.start(*args, name=f"round{number}-{name}")
    zombie = cluster.nodes[f"round{number}-zombie"].proc
    result: dict[str, Any] = {"round": number}
    try:
        held = Task.objects.filter(owner__name="zombie", state=TaskState.ACTIVE)
        if not wait_until(lambda: held.count() > SETTINGS["WORKERS"] + 1, 60):
            return {**result, "error": "zombie never buffered tasks"}
        result["held_when_stopped"] = held.count()
        old = Owner.objects.get(name="zombie").pk
        os.kill(zombie.pid, signal.SIGSTOP)
        wait_until(lambda: stopped(zombie.pid), 10)
        frozen_at, stopped_at = timezone.now(), time.monotonic()
        try:
            wait_until(lambda: not Owner.objects.filter(pk=old).exists(), 60)
            time.sleep(1.0)  # the others work on meanwhile (what the chaos is about)
        finally:
            os.kill(zombie.pid, signal.SIGCONT)
        resumed_at = timezone.now()
        result["frozen_s"] = round(time.monotonic() - stopped_at, 2)
        done = Task.objects.filter(topic_id="work", state=TaskState.SUCCEEDED)
        result["all_done"] = wait_until(lambda: done.count() == TASKS, 180)
        slots = Run.objects.filter(topic="jobs", started_at__gt=timezone.now())
        wait_until(lambda: slots.count() >= 2 * JOBS, 30)
        result["zombie_alive"] = zombie.poll() is None
        result["zombie_registered_again"] = Owner.objects.filter(name="zombie").exists()
        result["zombie_ran_after_resume"] = Run.objects.filter(
            pid=zombie.pid, started_at__gt=resumed_at
        ).count()
    finally:
        codes = cluster.stop(timeout=30)
        cluster.destroy()
    result["zombie_exit_code"] = codes[0]
    duplicates = {"work": 0, "jobs": 0}
    late_starts = 0  # zombie runs, started after it froze, of a task/slot another node ran
    for topic, keys in (("work", ("identifier",)), ("jobs", ("identifier", "slot"))):
        twice = (
            Run.objects.filter(topic=topic)
            .values(*keys)
            .annotate(n=Count("id"))
            .filter(n__gt=1)
            .values(*keys)
        )
        for values in twice:
            runs = Run.objects.filter(topic=topic, **values)
            interrupted = min(runs.filter(pid=zombie.pid, started_at__lt=frozen_at).count(), 1)
            extra = runs.count() - 1 - interrupted
            duplicates[topic] += max(extra, 0)
            late_starts += runs.filter(pid=zombie.pid, started_at__gt=frozen_at).count() * (
                extra > 0
            )
    result["duplicate_task_runs"] = duplicates["work"]
    result["duplicate_slot_runs"] = duplicates["jobs"]
    result["zombie_late_starts"] = late_starts
    result["interrupted_reruns"] = sum(
        1
        for value in Run.objects.filter(topic="work", pid=zombie.pid, started_at__lt=frozen_at)
        .values_list("identifier", flat=True)
        .distinct()
        if Run.objects.filter(topic="work", identifier=value).count() > 1
    )
    print(json.dumps(result), flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", choices=["postgres", "mysql"], default="postgres")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--source", type=Path, default=ROOT)
    parser.add_argument("--label", default=None)
    parser.add_argument("--name", default="bench_zombie")
    args = parser.parse_args()
    source = args.source.resolve()
    label = args.label or git("-C", str(source), "rev-parse", "--abbrev-ref", "HEAD")
    database = common.database(args.database, args.name)
    create_database(database)
    os.environ.update(
        DJANGO_SETTINGS_MODULE="tests.settings", TASKS_COORD_TEST_DB=json.dumps(database)
    )
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", run_syncdb=True, verbosity=0)  # testapp has no migrations
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"zombie-{args.database}-{label}"
    logs.mkdir(parents=True, exist_ok=True)
    rounds = [one_round(database, source, logs, i + 1) for i in range(args.rounds)]
    entry = {
        "database": common.LABELS[args.database],
        "label": label,
        "source_revision": git("-C", str(source), "rev-parse", "--short", "HEAD"),
        "when": datetime.now().isoformat(timespec="seconds"),
        "load_average": load_average(),
        "logs": str(logs),
        "rounds": rounds,
        "totals": {
            key: sum(r.get(key, 0) for r in rounds)
            for key in (
                "duplicate_task_runs",
                "duplicate_slot_runs",
                "zombie_late_starts",
                "interrupted_reruns",
            )
        },
        "zombie_went_on": sum(
            1 for r in rounds if r.get("zombie_registered_again") and r.get("zombie_alive")
        ),
    }
    path = RESULTS / "zombie.json"
    entries = json.loads(path.read_text())["entries"] if path.exists() else []
    entries = [e for e in entries if (e["database"], e["label"]) != (entry["database"], label)]
    entries.append(entry)
    common.write_report(
        "zombie", {"machine": common.machine(), "entries": entries}, lambda: report(entries)
    )
    return 0


def report(entries: list[dict[str, Any]]) -> str:
    lines = [
        "# Zombie nodes: SIGSTOP past the liveness interval, then SIGCONT",
        "",
        "Generated by `benchmarks/zombie.py` (see its docstring). Each round: three nodes, "
        f"{TASKS} tasks of 0.25 s and {JOBS} jobs firing every second, one node frozen with work running and "
        f"buffered until the others declared it dead (liveness {LIVENESS} s), then resumed. "
        "A duplicate is a task or slot that started more than once, not counting the rerun of a "
        "run the frozen node had already started before it froze (at least once).",
        "",
        "| database | code | rounds | duplicate task runs | duplicate slot runs | of them started "
        "by the frozen node once resumed | reruns of interrupted runs | resumed node went on working |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for e in entries:
        t = e["totals"]
        lines.append(
            f"| {e['database']} | {e['label']} ({e['source_revision']}) | {len(e['rounds'])} | "
            f"{t['duplicate_task_runs']} | {t['duplicate_slot_runs']} | {t['zombie_late_starts']} "
            f"| {t['interrupted_reruns']} | {e['zombie_went_on']} of {len(e['rounds'])} |"
        )
    lines += [
        "",
        "Per round: `benchmarks/results/zombie.json` (exit code of the resumed node, tasks it "
        "held when stopped, how long it was frozen).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
