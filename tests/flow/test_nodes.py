"""Flow control across real nodes: three ``runscheduler`` processes share one topic's limits.

Short versions of issue 23's proofs (the full sizes are ``benchmarks/flow_control.py``),
run one after the other on the same three nodes, the limits changed while they run (a
change needs no restart), because starting nodes costs more than the proofs:

- a rate limit never exceeded in any 1-second window of the database clock, the starts
  paced by it (the 90% throughput is measured by the benchmark);
- concurrency 3 per key over 10 keys, never exceeded in samples of the table every 10 ms,
  with 25 or more active at once;
- fair claims start the tasks of nine small keys before the backlog of a big one (at most
  one turn of the big key per turn of theirs).
"""

from __future__ import annotations

import bisect
import signal
import threading
from collections import Counter

import pytest
from django.db import connection, connections, transaction
from django.db.models import Count

from django_tasks_coord import flow, queue
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Owner, Task
from tests.processes import reap, runscheduler, wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.multiprocess,
    pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite runs one node"),
]

FAST = {"HEARTBEAT_FREQUENCY": 0.2, "POLL_INTERVAL": 0.1, "STATUS_INTERVAL": 0}
#: Each node: 10 workers, 2 tasks buffered: 36 places in all, more than any limit here.
WORKERS, BUFFER = 10, 2


@pytest.fixture
def three_nodes(transactional_db):
    flow._cache.clear()
    queue.register_topic("work")
    settings = {**FAST, "BUFFER": BUFFER}
    procs = [
        runscheduler("--topic", "work", "--workers", str(WORKERS), settings=settings)
        for _ in range(3)
    ]
    try:
        wait_for(lambda: Owner.objects.count() == 3, timeout=60)
        yield procs
    finally:
        for proc in procs:
            reap(proc, signal.SIGTERM)
        flow._cache.clear()
    assert all(proc.returncode == 0 for proc in procs)


def push(items: list[tuple[str, dict]]) -> list[int]:
    return [task.pk for task in queue.push_many("work", items)]


def all_done(pks: list[int]) -> bool:
    return Task.objects.filter(pk__in=pks, state=TaskState.SUCCEEDED).count() == len(pks)


def busiest_window(times: list[float], width: float = 1.0) -> int:
    """The most of the sorted ``times`` in any half-open window ``[t, t + width)``."""
    return max(bisect.bisect_left(times, t + width) - i for i, t in enumerate(times))


def check_rate(rate: int = 40, total: int = 240) -> None:
    flow.set_limits("work", rate=f"{rate}/s")
    pks = push([(f"r{i}", {}) for i in range(total)])
    wait_for(lambda: all_done(pks), timeout=60)
    stamps = Task.objects.filter(pk__in=pks).values_list("started_at", flat=True)
    times = sorted(stamp.timestamp() for stamp in stamps)  # the claims, on the database clock
    assert busiest_window(times) <= rate  # the tolerance is 0: one clock, the database's
    # The first window starts a burst of `rate`; after it, the limit paces the starts. On a
    # loaded CI machine the bound is generous: nodes held back by the rate claim again when
    # the window frees, not after their idle back-off. benchmarks/flow_control.py measures
    # the 90% of issue 23 at the full size.
    paced = (total - rate) / (times[-1] - times[0])
    assert paced >= 0.5 * rate, paced


def check_concurrency_per_key() -> None:
    flow.set_limits("work", concurrency=3, key="payload.tenant")
    peaks: Counter[str] = Counter()
    most = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal most
        try:
            active = Task.objects.filter(topic_id="work", state=TaskState.ACTIVE)
            per_key = active.values("concurrency_key").annotate(n=Count("pk"))
            while not done.is_set():
                seen = dict(per_key.values_list("concurrency_key", "n"))
                for key, n in seen.items():
                    peaks[key] = max(peaks[key], n)
                most = max(most, sum(seen.values()))
                done.wait(0.01)
        finally:
            connections.close_all()

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        pks = push([(f"c{i}", {"tenant": f"k{i % 10}", "sleep": 0.3}) for i in range(150)])
        wait_for(lambda: all_done(pks), timeout=60)
    finally:
        done.set()
        sampler.join()
    assert set(peaks) == {f"k{k}" for k in range(10)}
    assert max(peaks.values()) <= 3, peaks
    assert most >= 25, most


def check_fairness() -> None:
    flow.set_limits("work", key="identifier", fair=True)
    with transaction.atomic():  # all pending at once, the big key's the oldest
        big = push([("big", {}) for _ in range(500)])
        small = push([(f"small{k}", {}) for k in range(9) for _ in range(10)])
    wait_for(lambda: all_done(small), timeout=60)
    # A claim's tasks share their start (the claim's time); a claim takes each key's first
    # task, then each key's second... Ten turns serve the small keys: ten of the big key's
    # tasks at most start in claims before the last small one (FIFO: all 500).
    last_small = max(Task.objects.filter(pk__in=small).values_list("started_at", flat=True))
    big_before = Task.objects.filter(pk__in=big, started_at__lt=last_small).count()
    assert big_before <= 10 + 5, big_before
    queue.pause_topic("work")  # the rest of the big key's backlog is not needed


def test_limits_hold_across_three_nodes(three_nodes):
    check_rate()
    check_concurrency_per_key()
    check_fairness()
