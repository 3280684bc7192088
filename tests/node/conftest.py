from __future__ import annotations

import threading
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from django_tasks_coord import handlers, queue, scheduling
from django_tasks_coord.models import PeriodicTask
from django_tasks_coord.node import Node, NodeConfig
from django_tasks_coord.node.clock import Clock
from tests.testapp import consumers as _test_consumers  # noqa: F401  (registers the test consumers)


@pytest.fixture
def make_node(transactional_db):
    """Build a burst-mode node with fast, test-friendly timings; ``overrides`` win."""

    def make(**overrides) -> Node:
        options = {
            "burst": True,
            "poll_interval": 0.05,
            "status_interval": 0,
            "heartbeat_frequency": 0.1,
            "liveness_interval": 5.0,
            "shutdown_max_wait": 5.0,
            "topics": ["work"],
            **overrides,
        }
        return Node(NodeConfig.from_settings(**options))

    return make


class ShiftedClock:
    """``clock`` moved ``seconds`` ahead: a node (or one duty) that was frozen that long."""

    def __init__(self, clock: Clock, seconds: float) -> None:
        self.clock, self.seconds = clock, seconds

    def monotonic(self) -> float:
        return self.clock.monotonic() + self.seconds

    def now(self) -> datetime:
        return self.clock.now() + timedelta(seconds=self.seconds)


def run(node: Node, timeout: float = 60) -> int:
    """Run ``node`` in a thread; fail the test if it does not finish within ``timeout``."""
    result: dict[str, int] = {}
    thread = threading.Thread(target=lambda: result.setdefault("code", node.run()))
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        node.request_stop()
        node.request_stop()
        thread.join(30)
        pytest.fail(f"the node did not finish within {timeout}s")
    return result["code"]


@pytest.fixture
def work_topic(transactional_db):
    return queue.register_topic("work")


@pytest.fixture(autouse=True)
def _restore_registry():
    before = handlers.registry.consumers()
    yield
    handlers.registry.restore(before)


def due_daily_job(job: str, job_id: str) -> tuple[str, datetime]:
    """Schedule ``job`` daily at the hour twelve hours ahead, with its last occurrence due;
    its id and that slot. No other slot of it can fall due while a test runs (an hourly job
    set a moment back has its next slot due too at the turn of an hour, and the missed-slot
    policy "once" runs that one instead)."""
    upcoming = timezone.now().replace(minute=0, second=0, microsecond=0) + timedelta(hours=12)
    daily = scheduling.schedule_periodic(job, f"*-*-* {upcoming:%H}:00:00", tz="UTC", job_id=job_id)
    slot = upcoming - timedelta(days=1)
    PeriodicTask.objects.filter(pk=daily).update(nextrun=slot)
    return daily, slot
