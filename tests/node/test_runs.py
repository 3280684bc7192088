"""The node's running tasks (``running.Runs``): a worker registers each task it runs without
a lock, so a cancel that races the start of its run must still reach the run."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

import pytest

from django_tasks_coord.running import Runs


@dataclass(eq=False)
class FakeTask:
    """What ``Runs`` reads of a task."""

    pk: int
    cancel_requested_at: datetime | None = None


@pytest.fixture
def often_switching() -> Iterator[None]:
    """Threads switch as often as the interpreter allows: races show within a few rounds."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


def test_a_cancel_racing_the_start_of_its_run_always_reaches_the_run(often_switching):
    runs = Runs()
    missed: list[int] = []
    for pk in range(3000):
        task = FakeTask(pk)
        both = threading.Barrier(2)
        canceled = threading.Event()

        def start(
            task: FakeTask = task,
            both: threading.Barrier = both,
            canceled: threading.Event = canceled,
        ) -> None:
            both.wait()
            with runs.running([task]) as (run,):  # type: ignore[list-item]
                canceled.wait(10)  # the cancel returned: now the run must know it
                if not (run.canceled.is_set() and runs.is_requested(task)):  # type: ignore[arg-type]
                    missed.append(task.pk)
            runs.forget(task)  # type: ignore[arg-type]

        worker = threading.Thread(target=start)
        worker.start()
        both.wait()
        runs.cancel([pk])
        canceled.set()
        worker.join()
        canceled.clear()
    assert missed == []
    assert runs.count == 0


def test_a_run_leaves_without_the_lock_and_one_with_progress_waits_for_its_write():
    runs = Runs()
    quiet, reporting = FakeTask(1), FakeTask(2)
    with runs.running([quiet, reporting]) as (_, run):  # type: ignore[list-item]
        run.progress, run.dirty = {"done": 1}, True
        assert runs.count == 2
    assert runs.count == 0
    assert runs.progress_pending  # the ended run's progress is still to be written
    assert runs.due_progress(now=100.0) == [(reporting, {"done": 1})]
    assert not runs.progress_pending
    assert runs.due_progress(now=200.0) == []


def test_a_cancel_before_the_start_flags_the_run_and_lasts_until_forgotten():
    runs = Runs()
    task = FakeTask(7)
    assert runs.cancel([7]) == 0  # not running here yet: nothing delivered
    with runs.running([task]) as (run,):  # type: ignore[list-item]
        assert run.canceled.is_set()
        assert runs.cancel([7]) == 0  # flagged already
    assert runs.is_requested(task)  # type: ignore[arg-type]
    runs.forget(task)  # type: ignore[arg-type]
    assert not runs.is_requested(task)  # type: ignore[arg-type]
    with runs.running([FakeTask(8)]) as (run,):  # type: ignore[list-item]
        assert runs.cancel([8]) == 1  # delivered to a running handler
        assert run.canceled.is_set()
    assert runs.delivered == 1
