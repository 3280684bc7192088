"""Warm backup with real runscheduler nodes: takeover after SIGKILL, demotion after SIGSTOP,
hand-over on SIGTERM. Three nodes on PostgreSQL and MariaDB; one node on SQLite."""

from __future__ import annotations

import os
import signal

import pytest
from django.db import connection
from django.db.models import Count

from django_tasks_coord import coordination, scheduling
from django_tasks_coord.models import HealthCheck, Owner, TokenHolder
from django_tasks_coord.scheduling import JOBS_TOPIC
from django_tasks_coord.topics import register_internal_topic
from tests.processes import reap, runscheduler, wait_for
from tests.testapp.models import Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multiprocess]

HEARTBEAT, LIVENESS = 0.2, 3.0
SETTINGS = {
    "HEARTBEAT_FREQUENCY": HEARTBEAT,
    "LIVENESS_INTERVAL": LIVENESS,
    "POLL_INTERVAL": 0.1,
    "REAP_INTERVAL": 0.3,
    "STATUS_INTERVAL": 0,
    "SHUTDOWN_MAX_WAIT": 2,
}
FENCED_RECORD = "tests.testapp.job_functions.fenced_record"
multi_node = pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite runs one node")


def start_group(n: int) -> dict[str, object]:
    register_internal_topic(JOBS_TOPIC)
    nodes = {
        f"n{i}": runscheduler("--group", "g", "--node-id", f"n{i}", settings=SETTINGS)
        for i in range(n)
    }
    wait_for(lambda: HealthCheck.objects.filter(group_id="g").count() == n, timeout=60)
    wait_for(lambda: coordination.leader("g") is not None)
    return nodes


def leader_job(**kwargs) -> str:
    return scheduling.schedule_recurring(
        FENCED_RECORD, 1, group="g", leader_only=True, job_id="lead", **kwargs
    )


def assert_each_slot_ran_once() -> None:
    twice = Run.objects.values("slot").annotate(n=Count("id")).filter(n__gt=1)
    assert not twice.exists(), list(twice)


def test_one_node_leads_and_runs_the_leader_only_job():
    nodes = start_group(1)
    try:
        leader_job()
        wait_for(lambda: Run.objects.count() >= 2, timeout=30)
    finally:
        for proc in nodes.values():
            reap(proc, signal.SIGTERM)
    assert set(Run.objects.values_list("node", "term")) == {("n0", 1)}
    assert_each_slot_ran_once()


@multi_node
def test_sigkill_of_the_holder_elects_exactly_one_new_holder_in_time():
    nodes = start_group(3)
    try:
        leader_job()
        wait_for(lambda: Run.objects.count() >= 2, timeout=30)
        old = coordination.leader("g")
        reap(nodes.pop(old.node_id), signal.SIGKILL)
        wait_for(lambda: coordination.leader("g").node_id != old.node_id, timeout=30)
        new, holder = coordination.leader("g"), TokenHolder.objects.get(group_id="g")
        dead_beat = HealthCheck.objects.get(task_id=old.node_id).last_heartbeat
        wait_for(lambda: Run.objects.filter(node=new.node_id).exists(), timeout=30)
        terms_before_shutdown = set(Run.objects.values_list("term", flat=True))
    finally:
        for proc in nodes.values():
            reap(proc, signal.SIGTERM)
    assert new.term == old.term + 1  # exactly one new holder: the term moved by one
    gap = (holder.acquired_at - dead_beat).total_seconds()
    assert LIVENESS <= gap <= LIVENESS + HEARTBEAT + 0.3, gap  # database clock on both sides
    assert terms_before_shutdown <= {old.term, new.term}
    assert_each_slot_ran_once()


@multi_node
def test_a_stopped_holder_wakes_up_demoted_and_runs_nothing_twice():
    nodes = start_group(3)
    try:
        leader_job(kwargs={"sleep": 0.3})
        wait_for(lambda: Run.objects.count() >= 2, timeout=30)
        old = coordination.leader("g")
        old_owner = Owner.objects.get(name=old.node_id).pk
        frozen = nodes[old.node_id]
        os.kill(frozen.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: coordination.leader("g").node_id != old.node_id, timeout=30)
            new = coordination.leader("g")
            new_since = TokenHolder.objects.get(group_id="g").acquired_at
            wait_for(lambda: Run.objects.filter(term=new.term).count() >= 2, timeout=30)
        finally:
            os.kill(frozen.pid, signal.SIGCONT)
        # The woken node finds it may have been declared dead: it acts on nothing it held
        # and registers again, a fresh owner and a standby of the group.
        wait_for(
            lambda: Owner.objects.filter(name=old.node_id).exclude(pk=old_owner).exists(),
            timeout=30,
        )
        wait_for(
            lambda: HealthCheck.objects.filter(group_id="g", task_id=old.node_id).exists(),
            timeout=30,
        )
        assert frozen.poll() is None, reap(frozen)
        runs_after = Run.objects.count()
        wait_for(lambda: Run.objects.count() >= runs_after + 2, timeout=30)
        assert coordination.leader("g").node_id == new.node_id
    finally:
        outputs = {name: reap(proc, signal.SIGTERM) for name, proc in nodes.items()}
    assert frozen.returncode == 0, outputs[old.node_id]
    assert_each_slot_ran_once()
    late = Run.objects.filter(node=old.node_id, started_at__gt=new_since)
    assert not late.exists()  # nothing recorded by the old leader after it lost the token


@multi_node
def test_graceful_stop_hands_over_within_two_heartbeats():
    nodes = start_group(3)
    try:
        leader_job()
        wait_for(lambda: Run.objects.count() >= 1, timeout=30)
        old = coordination.leader("g")
        nodes[old.node_id].send_signal(signal.SIGTERM)
        wait_for(
            lambda: (lead := coordination.leader("g")) is not None and lead.node_id != old.node_id,
            timeout=30,
        )
        holder = TokenHolder.objects.get(group_id="g")
        reap(nodes.pop(old.node_id))
    finally:
        for proc in nodes.values():
            reap(proc, signal.SIGTERM)
    handover = (holder.acquired_at - holder.released_at).total_seconds()
    assert 0 <= handover < 2 * HEARTBEAT, handover
    assert holder.term == old.term + 1
