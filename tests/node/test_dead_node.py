"""A node killed (SIGKILL) while it holds ACTIVE tasks, in a cluster that is busy: its tasks
are freed within ``LIVENESS_INTERVAL + REAP_INTERVAL`` of its last heartbeat (the bound of
docs/guarantees.md) and claimed again, then the same for the next node killed. Real
runscheduler nodes on PostgreSQL and MariaDB (SQLite runs one node).

The delay is measured on the database's times: the dead owner's last heartbeat (written with
the database's ``NOW()``), the moment the test sees its owner row deleted (the sweep that
freed its tasks; the test's clock, the same machine's here) and the new claims'
``started_at`` (the claiming node's clock, likewise). The bound is checked on the first, with
a margin for a loaded machine (a sweep takes a moment, the test polls): the bound without the
margin is what the fault suite (``benchmarks/faults.py``) measures. The claims come after
the survivors' workers are free (they drain the queue meanwhile).
"""

from __future__ import annotations

import signal

import pytest
from django.db import connection
from django.db.models import Max
from django.utils import timezone

from django_tasks_coord import queue
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Owner, Task
from tests.processes import reap, runscheduler, wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.multiprocess,
    pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite runs one node"),
]

LIVENESS = 2.0
REAP = 1.0
SETTINGS = {
    "HEARTBEAT_FREQUENCY": 0.2,
    "LIVENESS_INTERVAL": LIVENESS,
    "REAP_INTERVAL": REAP,
    "POLL_INTERVAL": 0.1,
    "STATUS_INTERVAL": 0,
    "WORKERS": 2,
    "BUFFER": 4,
}
#: What a loaded 2-core machine may add to the bound: the sweep's and the claim's own time.
MARGIN = 1.5
TASKS = 120


def kill_holding(name: str, proc) -> tuple[float, float]:
    """SIGKILL node ``name`` once it holds ACTIVE tasks; return the seconds from its last
    heartbeat to its tasks being freed (its owner row deleted by a sweep), and to their
    being claimed again by the others."""
    wait_for(
        lambda: Task.objects.filter(owner__name=name, state=TaskState.ACTIVE).count() >= 2,
        timeout=60,
    )
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    owner = Owner.objects.get(name=name)  # still there: nobody declared it dead yet
    held = list(
        Task.objects.filter(owner=owner, state=TaskState.ACTIVE).values_list("pk", "exec_id")
    )
    assert held, f"{name} held no ACTIVE task when it died"
    exec_ids = {exec_id for _, exec_id in held}
    pks = [pk for pk, _ in held]
    wait_for(lambda: not Owner.objects.filter(pk=owner.pk).exists(), timeout=60, interval=0.02)
    freed_at = timezone.now()  # this machine's clock is the database's here

    def claimed_again() -> bool:
        rows = Task.objects.filter(pk__in=pks)
        return (
            not rows.filter(exec_id__in=exec_ids).exists()
            and not rows.filter(state=TaskState.PENDING).exists()
        )

    wait_for(claimed_again, timeout=60)
    last_claim = Task.objects.filter(pk__in=pks).aggregate(at=Max("started_at"))["at"]
    return (
        (freed_at - owner.heartbeat).total_seconds(),
        (last_claim - owner.heartbeat).total_seconds(),
    )


def test_a_dead_nodes_tasks_are_claimed_again_within_liveness_and_one_sweep(work_topic):
    queue.push_many("work", [(f"t{i}", {"sleep": 0.2}) for i in range(TASKS)])
    names = ["a", "b", "doomed1", "doomed2"]
    nodes = {name: runscheduler("--node-id", name, "--topic", "work", settings=SETTINGS)
             for name in names}  # fmt: skip
    delays = []
    try:
        for name in ("doomed1", "doomed2"):  # one after the other, the cluster still busy
            delays.append(kill_holding(name, nodes[name]))
        wait_for(
            lambda: (
                Task.objects.filter(topic_id="work", state=TaskState.SUCCEEDED).count() == TASKS
            ),
            timeout=120,
        )
    finally:
        outputs = {name: reap(proc, signal.SIGTERM) for name, proc in nodes.items()}
    print(
        "freed, claimed again after the last heartbeat: "
        + ", ".join(f"{freed:.2f}s, {claimed:.2f}s" for freed, claimed in delays)
    )
    for freed, claimed in delays:
        assert freed + 0.3 >= LIVENESS, delays  # never before it was dead (a beat's spread)
        assert freed <= LIVENESS + REAP + MARGIN, (delays, outputs["a"][1][-3000:])
        assert claimed >= freed - 0.1, delays
