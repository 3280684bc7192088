"""Several OS processes against one database: exactly-once claims, and recovery after SIGKILL."""

from __future__ import annotations

import json
import signal
from collections import Counter
from datetime import timedelta

import pytest
from django.utils import timezone

from django_tasks_coord import queue
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Owner, Task
from tests.processes import reap, run_together, start

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multiprocess]

WORKERS = 4


@pytest.mark.parametrize("batch", [1, 25])
def test_concurrent_drain_completes_every_task_exactly_once(vendor, batch):
    total = 3000 if vendor != "sqlite" else 600
    queue.register_topic("drain")
    for start_at in range(0, total, 1000):
        queue.push_many(
            "drain", [(f"id-{i % 50}", i) for i in range(start_at, min(total, start_at + 1000))]
        )
    # Every worker holds its first claim (possibly empty) until all have made one, so the work
    # is shared by construction; then they all race for the rest.
    results = run_together(
        "tests.workers.drain", "drain", str(batch), count=WORKERS, rendezvous=("claimed",)
    )
    claimed = Counter(seq for done in results for seq in done)
    assert sum(claimed.values()) == total
    assert set(claimed.values()) == {1}  # nobody completed a task twice
    assert Task.objects.count() == total
    assert Task.objects.filter(state=TaskState.SUCCEEDED).count() == total
    assert set(Task.objects.values_list("attempts", flat=True)) == {1}  # nobody claimed one twice
    # The work was really shared between the processes.
    assert sum(1 for done in results if done) >= 2
    assert Task.objects.values("message").distinct().count() >= 2


def test_tasks_of_a_killed_owner_are_handed_to_another(vendor):
    queue.register_topic("held")
    queue.push_many("held", [(f"t{i}", i) for i in range(5)])
    proc = start("tests.workers.hold", "doomed-node", "held", "3")
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        held = json.loads(line)
    finally:
        reap(proc, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    assert len(held) == 3
    dead = Owner.objects.get(name="doomed-node")
    assert set(
        Task.objects.filter(owner=dead, state=TaskState.ACTIVE).values_list("pk", flat=True)
    ) == set(held)

    # The dead process heartbeats no more. Instead of sleeping through the liveness
    # interval, move its last heartbeat back in time.
    Owner.objects.filter(pk=dead.pk).update(heartbeat=timezone.now() - timedelta(seconds=60))
    survivor = queue.register_owner("survivor")
    freed = queue.expire(older_than=timedelta(seconds=30))
    assert sorted(t.pk for t in freed) == sorted(held)
    assert not Owner.objects.filter(name="doomed-node").exists()

    taken = queue.poll("held", 10, owner=survivor)
    assert sorted(t.pk for t in taken) == sorted(Task.objects.values_list("pk", flat=True))
    attempts = {t.pk: t.attempts for t in taken}
    assert all(attempts[pk] == 2 for pk in held)  # the killed attempt is counted
    assert all(n == 1 for pk, n in attempts.items() if pk not in held)
    for task in taken:
        queue.complete(task, queue.Result.SUCCESS)
    assert Task.objects.filter(state=TaskState.SUCCEEDED).count() == 5
