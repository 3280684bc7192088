"""A pool of daemon worker threads whose queued (not yet started) jobs can be taken back.

Unlike ``concurrent.futures.ThreadPoolExecutor``, its threads are daemons, so a node
that must stop while a handler is stuck can exit; and :meth:`WorkerPool.take_queued`
returns the jobs that never started, so their tasks can be released untouched.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import close_old_connections, connections

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class Job:
    """Work for one worker: ``run()`` is called in a worker thread."""

    run: Callable[[], None]
    payload: Any = None
    started: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)


class WorkerPool:
    """``size`` daemon threads taking :class:`Job` objects from one queue."""

    def __init__(self, size: int, name: str = "worker") -> None:
        self._queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._running: set[Job] = set()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i + 1}", daemon=True)
            for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, job: Job) -> Job:
        """Queue ``job`` for the next free worker."""
        self._queue.put(job)
        return job

    def take_queued(self, which: Callable[[Job], bool] | None = None) -> list[Job]:
        """Remove and return the jobs that have not started yet (those ``which`` accepts).

        The others go back in their order (behind any job submitted meanwhile).
        """
        taken: list[Job] = []
        kept: list[Job] = []
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                (taken if which is None or which(job) else kept).append(job)
        for job in kept:
            self._queue.put(job)
        return taken

    def running(self) -> list[Job]:
        """Jobs a worker is executing right now."""
        with self._lock:
            return list(self._running)

    def join_running(self, timeout: float, abort: threading.Event | None = None) -> list[Job]:
        """Wait up to ``timeout`` seconds for running jobs, or until ``abort`` is set;
        return the jobs still running."""
        deadline = time.monotonic() + max(timeout, 0)
        while (running := [job for job in self.running() if not job.done.is_set()]) and (
            abort is None or not abort.is_set()
        ):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            running[0].done.wait(min(left, 0.1))
        return [job for job in self.running() if not job.done.is_set()]

    def stop(self) -> None:
        """Let idle workers exit (running jobs are not interrupted)."""
        for _ in self._threads:
            self._queue.put(None)

    def _work(self) -> None:
        while (job := self._queue.get()) is not None:
            with self._lock:
                self._running.add(job)
            job.started.set()
            try:
                close_old_connections()
                job.run()
            except Exception:
                logger.exception(
                    "A worker job raised; the task's claim will be released or expire."
                )
            finally:
                close_old_connections()
                with self._lock:
                    self._running.discard(job)
                job.done.set()
        connections.close_all()
