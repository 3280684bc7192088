"""What a running handler asks and tells: whether its task was asked to stop, and its progress.

::

    from django_tasks_coord import running

    @consumer("exports")
    def export(task):
        for i, chunk in enumerate(chunks(task.payload)):
            running.raise_if_canceled()         # a checkpoint: stops here once canceled
            write(chunk)
            running.report_progress({"done": i + 1, "of": len(chunks)})

The same calls work in a topic's consumer, a ``@task`` function (whose context, with
``takes_context=True``, also offers them: :class:`~django_tasks_coord.backends.CoordTaskContext`)
and a scheduled job's function, whichever thread or coroutine the node runs them in.

**Cancelling a running task.** ``queue.cancel`` (the admin, ``manage.py tasks_coord
cancel``, the executor API's cancel) of an ACTIVE task does not end it: it stamps its
``cancel_requested_at`` and counts the request on the owner row of the node that runs it.
That node reads the count in the answer to its next heartbeat (no statement of its own
while nothing was canceled) and flags the task, so :func:`cancel_requested` turns True
within one ``HEARTBEAT_FREQUENCY``. The handler stops where it sees fit: at a
:func:`raise_if_canceled` checkpoint (raising :class:`~django_tasks_coord.exceptions.TaskCanceledError`,
which it may let propagate), or by returning. Whatever it does then (returns a success,
raises, asks for a retry), the task ends CANCELED, never SUCCEEDED: every write that
finishes a task turns into CANCELED in the database itself when a cancel was requested,
and a task whose cancel was requested is never retried.

**Progress.** :func:`report_progress` stores a small JSON value (at most
``PROGRESS_MAX_BYTES`` bytes once serialized) in memory; the node writes the latest
value of every running task with its heartbeat, in one statement for all of them, at
most once per ``PROGRESS_INTERVAL`` seconds per task (reports in between are coalesced).
It is ``Task.progress``: shown in the admin, the executor API's task read, and the
``tasks_coord_task_progress_reports_total`` counter of the node's metrics.

Outside a node (a loop of your own over ``queue.poll``) pass the task: :func:`cancel_requested`
then reads its row, and :func:`report_progress` writes it at once.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from django_tasks_coord import db
from django_tasks_coord.conf import app_settings
from django_tasks_coord.exceptions import InvalidArgumentError, ProgressError, TaskCanceledError
from django_tasks_coord.models import Task
from django_tasks_coord.store import progress as store_progress

__all__ = [
    "Run",
    "Runs",
    "cancel_requested",
    "check_progress",
    "only",
    "raise_if_canceled",
    "report_progress",
]


@dataclass(eq=False)
class Run:
    """One task a node is running: its cancel flag and its progress not written yet."""

    task: Task
    canceled: threading.Event = field(default_factory=threading.Event)
    #: The latest progress reported and not written yet (see :attr:`dirty`).
    progress: Any = None
    dirty: bool = False
    #: ``time.monotonic()`` of the last write of its progress (0: never).
    written_at: float = 0.0
    #: False once the handler returned (its last progress may still wait to be written).
    alive: bool = True


#: The runs of the handler call under way in this thread or coroutine (one, or a batch's).
_current: ContextVar[tuple[Run, ...]] = ContextVar("tasks_coord_running", default=())


class Runs:
    """The tasks a node is running, for its lifeline: whose cancel was requested, whose
    progress waits to be written. Thread-safe (workers and the lifeline share it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[int, Run] = {}
        #: Tasks whose cancel was requested before they started (claimed, buffered).
        self._requested: set[int] = set()
        #: Cancel requests delivered to running handlers, since the node started.
        self.delivered = 0
        #: Progress values written, since the node started.
        self.progress_writes = 0

    @contextlib.contextmanager
    def running(self, tasks: list[Task]) -> Iterator[tuple[Run, ...]]:
        """Register ``tasks`` as running for the handler call made inside the block."""
        runs = tuple(Run(task) for task in tasks)
        with self._lock:
            for run in runs:
                self._runs[run.task.pk] = run
                if run.task.pk in self._requested or run.task.cancel_requested_at is not None:
                    self._requested.discard(run.task.pk)
                    run.canceled.set()
        token = _current.set(runs)
        try:
            yield runs
        finally:
            _current.reset(token)
            with self._lock:
                for run in runs:
                    run.alive = False
                    if run.canceled.is_set():  # until the node settled it (forget)
                        self._requested.add(run.task.pk)
                    if not run.dirty and self._runs.get(run.task.pk) is run:
                        del self._runs[run.task.pk]

    def cancel(self, pks: Iterable[int]) -> int:
        """Flag the tasks ``pks`` as asked to stop; return how many were not flagged yet."""
        new = 0
        with self._lock:
            for pk in pks:
                run = self._runs.get(pk)
                if run is None:
                    self._requested.add(pk)
                elif not run.canceled.is_set():
                    run.canceled.set()
                    new += 1
            self.delivered += new
        return new

    def is_requested(self, task: Task) -> bool:
        """Whether a cancel of ``task`` (not started yet, or running) reached this node."""
        with self._lock:
            run = self._runs.get(task.pk)
            return task.pk in self._requested or (run is not None and run.canceled.is_set())

    def forget(self, task: Task) -> None:
        """``task`` is done with: drop what is known of it."""
        with self._lock:
            self._requested.discard(task.pk)

    @property
    def count(self) -> int:
        """How many tasks run now."""
        with self._lock:
            return sum(1 for run in self._runs.values() if run.alive)

    @property
    def progress_pending(self) -> bool:
        """Whether some progress waits to be written."""
        with self._lock:
            return any(run.dirty for run in self._runs.values())

    def due_progress(self, now: float | None = None) -> list[tuple[Task, Any]]:
        """The progress to write now: of each task with a new value, unless its last write
        is younger than ``PROGRESS_INTERVAL`` (its value waits, and is coalesced)."""
        now = time.monotonic() if now is None else now
        interval = float(app_settings.PROGRESS_INTERVAL)
        due: list[tuple[Task, Any]] = []
        with self._lock:
            for pk, run in list(self._runs.items()):
                if not run.dirty or (now - run.written_at < interval and run.written_at):
                    continue
                due.append((run.task, run.progress))
                run.dirty, run.written_at = False, now
                if not run.alive:
                    del self._runs[pk]
            self.progress_writes += len(due)
        return due

    def unwritten(self, values: list[tuple[Task, Any]]) -> None:
        """A write of ``values`` (from :meth:`due_progress`) failed: keep them for the next."""
        with self._lock:
            for task, value in values:
                run = self._runs.get(task.pk)
                if run is None:
                    run = self._runs[task.pk] = Run(task, alive=False)
                if not run.dirty:
                    run.progress, run.dirty = value, True
            self.progress_writes -= len(values)


@contextlib.contextmanager
def only(tasks: list[Task]) -> Iterator[None]:
    """Narrow the runs of the block to ``tasks`` (one handler call among the node's batch)."""
    runs = _current.get()
    if not runs:
        yield
        return
    pks = {task.pk for task in tasks}
    token = _current.set(tuple(run for run in runs if run.task.pk in pks))
    try:
        yield
    finally:
        _current.reset(token)


def _runs_of(task: Task | None) -> tuple[Run, ...]:
    runs = _current.get()
    if task is None:
        return runs
    return tuple(run for run in runs if run.task.pk == task.pk)


def _check_task(task: object) -> Task | None:
    if task is not None and not isinstance(task, Task):
        raise InvalidArgumentError(f"task must be a Task or None, not {type(task).__name__}.")
    return task


def cancel_requested(task: Task | None = None) -> bool:
    """Whether a cancel of the running task was requested.

    Inside a handler the node runs, without ``task``: its task (a batch consumer: any
    task of its batch), from memory; the node learns of a request within one
    heartbeat. With ``task`` outside a node's handler: reads the task's row.
    """
    task = _check_task(task)
    runs = _runs_of(task)
    if runs:
        return any(run.canceled.is_set() for run in runs)
    if task is None:
        return False  # not in a handler the node runs: nothing could ask it to stop
    return (
        Task.objects.using(db.alias())
        .filter(pk=task.pk, cancel_requested_at__isnull=False)
        .exists()
    )


def raise_if_canceled(task: Task | None = None) -> None:
    """A checkpoint: raise :class:`~django_tasks_coord.exceptions.TaskCanceledError` if
    :func:`cancel_requested` (same arguments); else return at once."""
    if cancel_requested(task):
        name = f"#{task.pk}" if task is not None else "running"
        raise TaskCanceledError(f"The {name} task was asked to stop (cancel requested).")


def check_progress(value: object) -> Any:
    """Refuse a progress value that is not JSON or larger than ``PROGRESS_MAX_BYTES``
    (:class:`~django_tasks_coord.exceptions.ProgressError`); return it."""
    limit = int(app_settings.PROGRESS_MAX_BYTES)
    try:
        size = len(json.dumps(value, allow_nan=False, separators=(",", ":")).encode())
    except (TypeError, ValueError) as exc:
        raise ProgressError(
            f"progress must be JSON (dict, list, str, int, float, bool or None): {exc}."
        ) from exc
    if size > limit:
        raise ProgressError(
            f"progress is {size} bytes as JSON, more than PROGRESS_MAX_BYTES ({limit}): "
            "report a summary (a percentage, counts, a stage)."
        )
    return value


def report_progress(value: Any, task: Task | None = None) -> None:
    """Report the progress of the running task (of each task of a batch, or of ``task``).

    ``value`` is a small JSON value (:func:`check_progress`). Inside a handler the node
    runs it is kept in memory and written by the node (see the module); with ``task``
    outside a node's handler it is written at once, while ``task`` is held under the
    claim it carries.
    """
    task = _check_task(task)
    value = check_progress(value)
    runs = _runs_of(task)
    if runs:
        for run in runs:
            run.progress, run.dirty = value, True
        return
    if task is None:
        raise InvalidArgumentError(
            "report_progress outside a handler the node runs needs the task: "
            "report_progress(value, task)."
        )
    store_progress.write([(task, value)])
