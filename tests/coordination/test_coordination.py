"""Leader election through token_holder and health_check, on the database clock."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from django_tasks_coord import coordination
from django_tasks_coord.exceptions import FencedError, InvalidArgumentError
from django_tasks_coord.models import HealthCheck, TokenHolder
from tests.processes import reap, start

LIVENESS = timedelta(seconds=30)


def age(node_id: str, seconds: float) -> None:
    """Move a node's last heartbeat back in time (instead of waiting for it to go stale)."""
    HealthCheck.objects.filter(task_id=node_id).update(
        last_heartbeat=timezone.now() - timedelta(seconds=seconds)
    )


@pytest.mark.django_db
class TestElection:
    def test_the_first_candidate_wins_term_one(self):
        coordination.join("g", "a")
        coordination.join("g", "b")
        assert coordination.try_acquire("g", "a", LIVENESS) == 1
        assert coordination.try_acquire("g", "b", LIVENESS) is None
        assert coordination.try_acquire("g", "a", LIVENESS) == 1  # keeps it
        leader = coordination.leader("g")
        assert (leader.node_id, leader.term) == ("a", 1)
        assert leader.last_heartbeat is not None

    def test_lease_says_who_holds_the_token_and_until_when(self):
        assert coordination.lease("g", LIVENESS) is None  # never taken
        coordination.join("g", "a")
        assert coordination.try_acquire("g", "a", LIVENESS) == 1
        held = coordination.lease("g", LIVENESS)
        assert (held.node_id, held.term) == ("a", 1)
        assert 25 < held.seconds_left <= 30
        age("a", 10)  # written with this process's clock; SQLite's reads it to the millisecond
        assert 15 < coordination.lease("g", LIVENESS).seconds_left <= 20.001
        age("a", 31)
        assert coordination.lease("g", LIVENESS).seconds_left == 0.0
        coordination.release("g", "a")
        released = coordination.lease("g", LIVENESS)
        assert (released.node_id, released.term, released.seconds_left) == ("", 1, 0.0)

    def test_forget_dead_clears_memberships_without_a_recent_heartbeat(self):
        for node in ("a", "b", "c"):
            coordination.join("g", node)
        age("a", 400)
        age("b", 200)
        assert coordination.forget_dead(timedelta(seconds=300)) == 1
        assert sorted(HealthCheck.objects.values_list("task_id", flat=True)) == ["b", "c"]
        assert coordination.heartbeat("g", "a") is False  # a frozen node finds out, rejoins

    def test_a_standby_takes_over_a_stale_holder_and_the_term_grows(self):
        for node in "abc":
            coordination.join("g", node)
        coordination.try_acquire("g", "a", LIVENESS)
        age("a", 29)
        assert coordination.try_acquire("g", "b", LIVENESS) is None  # not stale yet
        age("a", 31)
        assert coordination.try_acquire("g", "b", LIVENESS) == 2
        assert coordination.try_acquire("g", "c", LIVENESS) is None
        assert coordination.try_acquire("g", "a", LIVENESS) is None  # the old holder is out
        assert coordination.is_current("g", "b", 2)
        assert not coordination.is_current("g", "a", 1)

    def test_a_holder_that_left_is_replaced(self):
        coordination.join("g", "a")
        coordination.join("g", "b")
        coordination.try_acquire("g", "a", LIVENESS)
        coordination.leave("g", "a")
        assert coordination.leader("g") is None
        assert coordination.try_acquire("g", "b", LIVENESS) == 2
        assert not HealthCheck.objects.filter(task_id="a").exists()

    def test_release_keeps_the_term_counting(self):
        coordination.join("g", "a")
        coordination.try_acquire("g", "a", LIVENESS)
        assert coordination.release("g", "a") is True
        assert coordination.release("g", "a") is False
        assert TokenHolder.objects.get(group_id="g").term == 1
        assert coordination.try_acquire("g", "a", LIVENESS) == 2

    def test_groups_are_independent(self):
        coordination.join("g1", "a")
        coordination.join("g2", "b")
        assert coordination.try_acquire("g1", "a", LIVENESS) == 1
        assert coordination.try_acquire("g2", "b", LIVENESS) == 1
        assert coordination.leader("g1").node_id == "a"

    def test_heartbeat_reports_lost_membership(self):
        coordination.join("g", "a")
        assert coordination.heartbeat("g", "a") is True
        HealthCheck.objects.all().delete()
        assert coordination.heartbeat("g", "a") is False

    def test_bad_names(self):
        with pytest.raises(InvalidArgumentError):
            coordination.join("", "a")
        with pytest.raises(InvalidArgumentError):
            coordination.try_acquire("g", "x" * 201, LIVENESS)


@pytest.mark.django_db
class TestFencing:
    def test_fenced_writes_run_under_the_current_term(self):
        coordination.join("g", "a")
        term = coordination.try_acquire("g", "a", LIVENESS)
        with coordination.fenced("g", "a", term):
            HealthCheck.objects.create(task_id="marker", group_id="x")
        assert HealthCheck.objects.filter(task_id="marker").exists()

    def test_a_deposed_leader_is_refused(self):
        coordination.join("g", "a")
        coordination.join("g", "b")
        old = coordination.try_acquire("g", "a", LIVENESS)
        age("a", 60)
        coordination.try_acquire("g", "b", LIVENESS)
        with pytest.raises(FencedError, match="b holds term 2"), coordination.fenced("g", "a", old):
            HealthCheck.objects.create(task_id="never", group_id="x")
        assert not HealthCheck.objects.filter(task_id="never").exists()

    def test_a_released_token_fences_too(self):
        coordination.join("g", "a")
        term = coordination.try_acquire("g", "a", LIVENESS)
        coordination.release("g", "a")
        with pytest.raises(FencedError, match="token is free"), coordination.fenced("g", "a", term):
            pass


@pytest.mark.django_db(transaction=True)
@pytest.mark.multiprocess
def test_racing_candidates_produce_exactly_one_winner():
    for round_ in range(3):
        group = f"race-{round_}"
        procs = [start("tests.workers.elect", group, f"node-{i}") for i in range(4)]
        try:
            for proc in procs:
                assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
            for proc in procs:
                proc.stdin.write("go\n")
                proc.stdin.flush()
            terms = [int(reap(proc)[0].strip()) for proc in procs]
        finally:
            for proc in procs:
                reap(proc, 9)
        assert sorted(terms) == [0, 0, 0, 1], terms
        assert TokenHolder.objects.get(group_id=group).term == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor == "sqlite", reason="row locks")
class TestLiveness:
    """A frozen process holding locks must not stop the others from electing a leader."""

    def test_a_locked_token_row_gives_token_busy_at_once(self):
        from django_tasks_coord.exceptions import TokenBusyError

        coordination.join("g", "a")
        coordination.join("g", "b")
        coordination.try_acquire("g", "a", LIVENESS)
        locked, release = threading.Event(), threading.Event()

        def hold_the_lock():
            with transaction.atomic():
                list(TokenHolder.objects.select_for_update().filter(group_id="g"))
                locked.set()
                release.wait(30)
            connections.close_all()

        holder = threading.Thread(target=hold_the_lock)
        holder.start()
        try:
            assert locked.wait(30)
            started = time.monotonic()
            with pytest.raises(TokenBusyError, match="locked by another process"):
                coordination.try_acquire("g", "b", LIVENESS)
            assert time.monotonic() - started < 2  # NOWAIT: no waiting on the lock
        finally:
            release.set()
            holder.join(30)

    def test_no_lock_is_held_while_fenced_code_runs(self):
        coordination.join("g", "a")
        coordination.join("g", "b")
        term = coordination.try_acquire("g", "a", LIVENESS)
        result = {}

        def elect():
            result["term"] = coordination.try_acquire("g", "b", LIVENESS)
            connections.close_all()

        age("a", 60)  # a froze: its heartbeat is stale, yet the token is still a's
        with pytest.raises(FencedError), coordination.fenced("g", "a", term):
            HealthCheck.objects.create(task_id="written-by-a", group_id="x")
            thread = threading.Thread(target=elect)
            thread.start()
            thread.join(30)
            assert result["term"] == term + 1  # the election went ahead, unblocked
        # ...and a's write, made while b took over, did not commit
        assert not HealthCheck.objects.filter(task_id="written-by-a").exists()
