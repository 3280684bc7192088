"""A pool of daemon worker threads whose queued (not yet started) jobs can be taken back.

Unlike ``concurrent.futures.ThreadPoolExecutor``, its threads are daemons, so a node
that must stop while a handler is stuck can exit; and :meth:`WorkerPool.take_queued`
returns the jobs that never started, so their tasks can be released untouched.

Each worker treats its database connections the way Django treats a request's, with
one difference: a run of jobs that follow each other without a pause counts as one
request. Between two such jobs a connection is dropped only if it is unusable (an error
broke it, autocommit was left off) or older than a positive ``CONN_MAX_AGE``; once the
worker has nothing queued, ``close_old_connections()`` runs as at the end of a request
(with the default ``CONN_MAX_AGE=0`` it closes them). So a busy worker does not connect
anew for each task, and an idle one holds no connection it does not keep on purpose.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import close_old_connections, connections

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class Job:
    """Work for one worker: ``run()`` is called in a worker thread; ``done`` once it returned."""

    run: Callable[[], None]
    payload: Any = None
    done: bool = False


def _keep_connections() -> None:
    """Between two jobs of a run: Django's end-of-request check, but a connection whose
    ``CONN_MAX_AGE`` is 0 (closed at the end of each request) is kept if usable."""
    for conn in connections.all(initialized_only=True):
        if conn.connection is None or conn.settings_dict.get("CONN_MAX_AGE") != 0:
            conn.close_if_unusable_or_obsolete()
            continue
        close_at, conn.close_at = conn.close_at, None  # the request goes on
        try:
            conn.close_if_unusable_or_obsolete()
        finally:
            if conn.connection is not None:
                conn.close_at = close_at


class WorkerPool:
    """``size`` daemon threads taking :class:`Job` objects from one queue."""

    def __init__(self, size: int, name: str = "worker") -> None:
        self._queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        #: Changed by the workers without a lock (a set's add and discard are atomic), and
        #: read as a copy: a lock taken twice per job by every worker made them queue
        #: behind one another on fast tasks.
        self._running: set[Job] = set()
        self._finished = threading.Condition()
        self._joining = 0  # threads in join_running: a job that ends wakes them
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
        return list(self._running.copy())

    def join_running(self, timeout: float, abort: threading.Event | None = None) -> list[Job]:
        """Wait up to ``timeout`` seconds for running jobs, or until ``abort`` is set;
        return the jobs still running."""
        deadline = time.monotonic() + max(timeout, 0)
        with self._finished:
            self._joining += 1
            try:
                while self._running and (abort is None or not abort.is_set()):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._finished.wait(min(left, 0.1))  # a wake-up missed: the next look
            finally:
                self._joining -= 1
        return self.running()

    def stop(self) -> None:
        """Let idle workers exit (running jobs are not interrupted)."""
        for _ in self._threads:
            self._queue.put(None)

    def _work(self) -> None:
        idle = True  # nothing ran since the last end-of-request check
        while (job := self._queue.get()) is not None:
            self._running.add(job)
            try:
                if idle:
                    close_old_connections()  # a new request begins
                job.run()
            except Exception:
                logger.exception(
                    "A worker job raised; the task's claim will be released or expire."
                )
            finally:
                idle = self._queue.empty()
                if idle:
                    close_old_connections()  # the request ends
                else:
                    _keep_connections()
                self._running.discard(job)
                job.done = True
                if self._joining:
                    with self._finished:
                        self._finished.notify_all()
        connections.close_all()
