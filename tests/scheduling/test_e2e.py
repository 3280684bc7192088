"""Scheduling end to end: real runscheduler nodes (3 on PostgreSQL/MariaDB, 1 on SQLite)."""

from __future__ import annotations

import itertools
import signal
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Count
from django.utils import timezone

from django_tasks_coord import scheduling
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Owner, PeriodicTask, Task
from django_tasks_coord.scheduling import JOBS_TOPIC
from django_tasks_coord.topics import register_internal_topic
from tests.processes import reap, runscheduler, wait_for
from tests.testapp.models import Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multiprocess]

RECORD = "tests.testapp.job_functions.record"
FAST = {
    "HEARTBEAT_FREQUENCY": 0.2,
    "POLL_INTERVAL": 0.2,
    "STATUS_INTERVAL": 0,
    "REAP_INTERVAL": 0.5,
}
NODES = 1 if connection.vendor == "sqlite" else 3


def start_nodes(n: int = NODES, workers: int = 4):
    register_internal_topic(JOBS_TOPIC)
    nodes = [
        runscheduler("--topic", JOBS_TOPIC, "--workers", str(workers), settings=FAST)
        for _ in range(n)
    ]
    wait_for(lambda: Owner.objects.count() == n, timeout=60)
    return nodes


def stop(nodes):
    for node in nodes:
        reap(node, signal.SIGTERM)
    assert [node.returncode for node in nodes] == [0] * len(nodes)


def test_every_second_for_twenty_seconds_runs_once_per_slot():
    # Each run takes 1.5 s, and each node runs one at a time: no node keeps up alone, so the
    # nodes compete for the slots. (With time to spare, the scheduler's own node may take
    # every run: on MariaDB/MySQL only it is woken when a run is submitted.)
    nodes = start_nodes(workers=1)
    try:
        start = (timezone.now() + timedelta(seconds=2)).replace(microsecond=0)
        job_id = scheduling.schedule_recurring(
            RECORD,
            1,
            start_time=start,
            end_time=start + timedelta(seconds=19),
            job_id="tick",
            kwargs={"sleep": 1.5 if NODES > 1 else 0},
            allow_overlap=True,
        )
        wait_for(lambda: Run.objects.filter(identifier=job_id).count() >= 20, timeout=60)
        wait_for(
            lambda: (
                not Task.objects.filter(identifier=job_id)
                .exclude(state=TaskState.SUCCEEDED)
                .exists()
            )
        )
    finally:
        stop(nodes)
    slots = sorted(Run.objects.filter(identifier=job_id).values_list("slot", flat=True))
    assert slots == [start + timedelta(seconds=i) for i in range(20)]  # no duplicate, no gap
    assert not PeriodicTask.objects.get(pk=job_id).enabled  # finished at end_time
    if NODES > 1:  # the work was shared
        assert Run.objects.values("pid").distinct().count() >= 2


def test_the_same_function_scheduled_twice_runs_twice():
    # A reminder per user: two one-time jobs of one function, due now, with no job_id.
    nodes = start_nodes()
    try:
        due = timezone.now()
        ids = [scheduling.schedule_one_time(RECORD, due, args=[user]) for user in (1, 2)]
        wait_for(lambda: Run.objects.filter(identifier__in=ids).count() >= 2, timeout=60)
    finally:
        stop(nodes)
    assert len(set(ids)) == 2
    assert sorted(Run.objects.values_list("identifier", flat=True)) == sorted(ids)
    assert sorted(job.args for job in PeriodicTask.objects.all()) == [[1], [2]]


@pytest.mark.parametrize(
    ("catch_up", "expected"), [("once", [-30]), ("all", [-150, -90, -30]), ("skip", [])]
)
def test_slots_missed_while_every_node_was_down(catch_up, expected):
    # A job every minute whose last six slots (330s ago ... 30s ago) passed with no node up.
    now = timezone.now().replace(microsecond=0)
    start = now - timedelta(seconds=330)
    job_id = scheduling.schedule_recurring(
        RECORD,
        60,
        start_time=start,
        job_id="missed",
        waiting_time=1,
        catch_up=catch_up,
        catch_up_limit=3,
    )
    nodes = start_nodes()
    try:
        wait_for(
            lambda: PeriodicTask.objects.filter(pk=job_id, marked__isnull=False).exists(),
            timeout=60,
        )
        wait_for(lambda: not Task.objects.filter(identifier=job_id, state__lt=40).exists())
    finally:
        stop(nodes)
    slots = sorted(Run.objects.filter(identifier=job_id).values_list("slot", flat=True))
    assert slots == [now + timedelta(seconds=s) for s in expected]  # the policy, in the run records
    assert PeriodicTask.objects.get(pk=job_id).nextrun == now + timedelta(seconds=30)  # no replay


def test_a_job_slower_than_its_interval_never_overlaps():
    nodes = start_nodes()
    try:
        start = (timezone.now() + timedelta(seconds=1)).replace(microsecond=0)
        job_id = scheduling.schedule_recurring(
            RECORD, 1, start_time=start, job_id="slow", kwargs={"sleep": 1.5}
        )
        wait_for(
            lambda: Task.objects.filter(identifier=job_id, state=TaskState.SUCCEEDED).count() >= 4,
            timeout=60,
        )
        scheduling.pause(job_id)
        wait_for(
            lambda: not Task.objects.filter(identifier=job_id, state__lt=40).exists(), timeout=30
        )
    finally:
        stop(nodes)
    runs = list(
        Task.objects.filter(identifier=job_id)
        .order_by("started_at")
        .values_list("started_at", "finished_at")
    )
    for (_, first_end), (second_start, _) in itertools.pairwise(runs):
        assert second_start >= first_end  # no run started before the previous one finished
    slots = list(Run.objects.filter(identifier=job_id).values_list("slot", flat=True))
    assert len(slots) == len(set(slots))


def test_every_node_killed_for_several_slots_then_restarted():
    settings = {**FAST, "LIVENESS_INTERVAL": 2.0}
    register_internal_topic(JOBS_TOPIC)
    start = (timezone.now() + timedelta(seconds=1)).replace(microsecond=0)
    job_id = scheduling.schedule_recurring(
        RECORD, 1, start_time=start, job_id="outage", waiting_time=0.5, catch_up="skip"
    )
    nodes = [runscheduler("--topic", JOBS_TOPIC, settings=settings) for _ in range(NODES)]
    wait_for(lambda: Run.objects.filter(identifier=job_id).count() >= 2, timeout=60)
    for node in nodes:
        reap(node, signal.SIGKILL)
    killed = timezone.now()
    # A real outage: no node runs while at least four slots pass.
    wait_for(lambda: timezone.now() >= killed + timedelta(seconds=4.5), timeout=10)
    restarted = timezone.now()
    nodes = [runscheduler("--topic", JOBS_TOPIC, settings=settings) for _ in range(NODES)]
    try:
        pids = [node.pid for node in nodes]
        wait_for(lambda: Owner.objects.filter(pid__in=pids).count() == NODES, timeout=60)
        wait_for(
            lambda: Run.objects.filter(identifier=job_id, slot__gt=restarted).count() >= 2,
            timeout=60,
        )
    finally:
        stop(nodes)
    slots = sorted(Run.objects.filter(identifier=job_id).values_list("slot", flat=True))
    during = [
        s for s in slots if killed + timedelta(seconds=1) <= s <= restarted - timedelta(seconds=1)
    ]
    assert during == [], slots  # skip: the slots missed during the outage never ran
    # Each slot was submitted once; a run killed mid-way ran again as its next attempt.
    per_slot = Task.objects.filter(identifier=job_id).values("slot").annotate(n=Count("sequence"))
    assert not per_slot.filter(n__gt=1).exists()
    for slot in set(slots):
        attempts = sorted(
            Run.objects.filter(identifier=job_id, slot=slot).values_list("attempt", flat=True)
        )
        assert attempts == list(range(1, len(attempts) + 1)), (slot, attempts)
    runs = Task.objects.filter(identifier=job_id)
    assert not runs.filter(state__lt=40).exclude(slot__gt=restarted).exists()  # nothing left behind
