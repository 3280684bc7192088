"""Nodes SIGKILLed one after the other every 1.5 s (and replaced) while three of them drain a
queue and run two periodic jobs: one that may overlap itself, one leader-only whose side
effect is fenced. Real runscheduler nodes on PostgreSQL in CI (MariaDB by hand:
``TASKS_COORD_TEST_MARIADB_KILLS=1``, 45 s here; SQLite runs one node).

What must hold (docs/guarantees.md): every queue task succeeds, each slot of each job is
submitted exactly once and executed at least once, a slot runs twice only when the first run
was cut off by a kill (at least once), and a fenced side effect commits at most once per slot.
The long form, with SIGSTOP and many more kills, is the fault suite (``benchmarks/faults.py``).
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections import defaultdict
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_tasks_coord import queue, scheduling, topics
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Owner, Task
from django_tasks_coord.scheduling import JOBS_TOPIC
from tests.processes import reap, runscheduler, wait_for
from tests.testapp.models import Run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.multiprocess,
    pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite runs one node"),
    pytest.mark.skipif(
        connection.vendor == "mysql" and not os.environ.get("TASKS_COORD_TEST_MARIADB_KILLS"),
        reason="45 s on MariaDB: by hand (TASKS_COORD_TEST_MARIADB_KILLS=1) and in the fault suite",
    ),
]

SETTINGS = {
    "HEARTBEAT_FREQUENCY": 0.2,
    "LIVENESS_INTERVAL": 1.5,
    "REAP_INTERVAL": 0.5,
    "POLL_INTERVAL": 0.1,
    "STATUS_INTERVAL": 0,
    "SHUTDOWN_MAX_WAIT": 2,
    "WORKERS": 3,
}
RECORD = "tests.testapp.job_functions.record"
FENCED = "tests.testapp.job_functions.fenced_record"
TASKS = 150
KILLS = 4


def stopped(nodes: dict) -> dict:
    """Stop the ``nodes`` still running (SIGTERM); the output of each, by name."""
    return {name: reap(proc, signal.SIGTERM) for name, proc in nodes.items()}


def node(name: str):
    return runscheduler("--node-id", name, "--topic", "work", "--topic", JOBS_TOPIC,
                        "--group", "g", settings=SETTINGS)  # fmt: skip


def test_repeated_kills_lose_nothing_and_run_no_slot_twice_but_a_cut_off_one(work_topic):
    topics.register_internal_topic(JOBS_TOPIC)
    queue.push_many("work", [(f"t{i}", {"sleep": 0.05}) for i in range(TASKS)])
    start = (timezone.now() + timedelta(seconds=1)).replace(microsecond=0)
    # Slower than its interval and allowed to overlap: runs of several slots at once.
    scheduling.schedule_recurring(
        RECORD,
        1,
        start_time=start,
        job_id="ovl",
        allow_overlap=True,
        kwargs={"sleep": 1.2},
        waiting_time=30,  # a scheduler starved by the restarts is late, not missing slots
        catch_up="all",
    )
    scheduling.schedule_recurring(
        FENCED, 1, start_time=start, group="g", leader_only=True, job_id="lead"
    )
    nodes = {name: node(name) for name in ("n0", "n1", "n2")}
    killed: set[int] = set()
    try:
        wait_for(lambda: Owner.objects.count() == 3, timeout=60)
        wait_for(lambda: Run.objects.filter(identifier="ovl").exists(), timeout=60)
        rotation = list(nodes)
        for kill in range(KILLS):
            name = rotation[kill % 3]
            victim = nodes.pop(name)
            killed.add(victim.pid)
            reap(victim, signal.SIGKILL)
            rotation[kill % 3] = f"k{kill}"  # a replacement, as a supervisor would start
            nodes[f"k{kill}"] = node(f"k{kill}")
            time.sleep(1.5)  # the pace of the kills, not a wait for a condition
        calm = timezone.now()
        wait_for(
            lambda: (
                Task.objects.filter(topic_id="work", state=TaskState.SUCCEEDED).count() == TASKS
            ),
            timeout=120,
        )
        later = calm + timedelta(seconds=3)  # slots submitted while nodes were dying, and after
        try:
            wait_for(
                lambda: (
                    not Task.objects.filter(identifier="ovl", slot__lte=later)
                    .exclude(state=TaskState.SUCCEEDED)
                    .exists()
                    and Task.objects.filter(identifier="ovl", slot__gt=later).exists()
                ),
                timeout=60,
            )
        except AssertionError as timed_out:  # what the slots and the nodes were doing
            rows = Task.objects.filter(identifier="ovl").order_by("slot")
            states = rows.values_list("slot", "state", "attempts", "owner_id", "message")
            owners = list(Owner.objects.values_list("pk", "name", "heartbeat"))
            raise AssertionError(
                f"{timed_out}: later={later}; ovl slots {list(states)}; owners {owners}; "
                f"nodes {stopped(nodes)}"
            ) from timed_out
    finally:
        outputs = stopped(nodes)
    assert all(proc.returncode == 0 for proc in nodes.values()), outputs
    assert Run.objects.filter(topic="work").values("identifier").distinct().count() == TASKS
    for job in ("ovl", "lead"):  # each slot submitted exactly once
        slots = list(Task.objects.filter(identifier=job).values_list("slot", flat=True))
        assert len(slots) == len(set(slots)), job
    # Executed at least once: every slot up to `later` has a run that succeeded, no gap.
    done = sorted(
        Task.objects.filter(identifier="ovl", slot__lte=later).values_list("slot", flat=True)
    )
    assert done and all(b - a == timedelta(seconds=1) for a, b in itertools.pairwise(done)), done
    runs = defaultdict(list)
    for slot, pid in Run.objects.filter(identifier="ovl").values_list("slot", "pid"):
        runs[slot].append(pid)
    assert all(runs[slot] for slot in done)
    # Twice only when the first run was cut off: at most one run by a node never killed.
    twice = {
        slot: pids for slot, pids in runs.items() if len([p for p in pids if p not in killed]) > 1
    }
    assert not twice, twice
    # The fenced side effect committed at most once per slot, whatever happened to leaders.
    fenced = list(Run.objects.filter(topic="leader").values_list("slot", flat=True))
    assert fenced and len(fenced) == len(set(fenced))
