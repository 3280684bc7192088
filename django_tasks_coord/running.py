"""What a running handler asks and tells: whether its task was asked to stop, its progress,
and the checkpoints it resumes from after a crash.

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

**Checkpoints.** :func:`checkpoint` stores a JSON value under a name for the running task,
at once, in one statement, only while the task is still ACTIVE under this attempt's claim
(else :class:`~django_tasks_coord.exceptions.StaleClaimError`: stop, the task runs
elsewhere). :func:`checkpoints` returns what the task stored in this attempt and earlier
ones; :func:`step` runs a function at most once per completed step: a retried or recovered
task resumes after its last completed step (``running.step(f"email-{n}", send, address)``).
A step runs at least once (again if its attempt died between its side effect and its
checkpoint); its completion is recorded at most once per claim. Checkpoints stay with the
task across its attempts and resets and go with it; a new task starts without any.
Composite steps use them. See docs/howto/resume-after-a-crash.md.

Outside a node (a loop of your own over ``queue.poll``) pass the task: :func:`cancel_requested`
then reads its row, :func:`report_progress` writes it at once, and :func:`checkpoint` and
:func:`checkpoints` write and read under the claim it carries.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from django_tasks_coord import db, validation
from django_tasks_coord.conf import app_settings
from django_tasks_coord.exceptions import (
    InvalidArgumentError,
    ProgressError,
    StaleClaimError,
    TaskCanceledError,
)
from django_tasks_coord.models import Task
from django_tasks_coord.store import checkpoints as store_checkpoints
from django_tasks_coord.store import progress as store_progress

__all__ = [
    "CHECKPOINT_NAME_MAX_LENGTH",
    "RESERVED_PREFIX",
    "Run",
    "Runs",
    "cancel_requested",
    "check_checkpoint",
    "check_progress",
    "checkpoint",
    "checkpoints",
    "only",
    "raise_if_canceled",
    "report_progress",
    "step",
]

#: Checkpoint names starting with this are the package's own (composite steps).
RESERVED_PREFIX = "tasks_coord."
#: The longest checkpoint name.
CHECKPOINT_NAME_MAX_LENGTH = 200
#: The most checkpoints an executor's ``notify`` stores in one call (in one transaction).
CHECKPOINTS_PER_NOTIFY = 100


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
    #: Its checkpoints by name, once read (:func:`checkpoints`); kept current by its writes.
    saved: dict[str, Any] | None = None
    #: The node's runs it belongs to (counts its checkpoints), if a node runs it.
    runs: Runs | None = None


#: The runs of the handler call under way in this thread or coroutine (one, or a batch's).
_current: ContextVar[tuple[Run, ...]] = ContextVar("tasks_coord_running", default=())


class Runs:
    """The tasks a node is running, for its lifeline: whose cancel was requested, whose
    progress waits to be written. Thread-safe; a worker's calls for each task take no lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[int, Run] = {}
        #: Tasks whose cancel reached this node (running or not yet), until :meth:`forget`.
        self._requested: set[int] = set()
        #: Cancel requests delivered to running handlers, since the node started.
        self.delivered = 0
        #: Progress values written, since the node started.
        self.progress_writes = 0
        #: Checkpoints its handlers wrote (:func:`checkpoint`, :func:`step`, composite
        #: steps), since the node started.
        self.checkpoint_writes = 0

    @contextlib.contextmanager
    def running(self, tasks: list[Task]) -> Iterator[tuple[Run, ...]]:
        """Register ``tasks`` as running for the handler call made inside the block. No lock
        (atomic dict and set steps: a run registers before it reads the requests, :meth:`cancel`
        records one before it reads the runs) but for a run whose progress waits to be written."""
        registered = [(task.pk, Run(task, runs=self)) for task in tasks]
        runs = tuple(run for _, run in registered)
        for pk, run in registered:
            self._runs[pk] = run
            if pk in self._requested or run.task.cancel_requested_at is not None:
                self._requested.add(pk)  # until the node settled it (forget)
                run.canceled.set()
        token = _current.set(runs)
        try:
            yield runs
        finally:
            _current.reset(token)
            for run in runs:
                run.alive = False
            with self._lock if any(run.dirty for run in runs) else contextlib.nullcontext():
                self._drop([(pk, run) for pk, run in registered if not run.dirty])

    def _drop(self, runs: list[tuple[int, Run]]) -> None:
        """Forget the ``runs`` that ended (by pk): unless a later run of the task took its place."""
        for pk, run in runs:
            if self._runs.get(pk) is run:
                self._runs.pop(pk, None)

    def cancel(self, pks: Iterable[int]) -> int:
        """Flag ``pks`` as asked to stop (recorded first, see :meth:`running`); how many were new."""
        new = 0
        with self._lock:
            for pk in pks:
                self._requested.add(pk)
                run = self._runs.get(pk)
                if run is not None and not run.canceled.is_set():
                    run.canceled.set()
                    new += 1
            self.delivered += new
        return new

    def is_requested(self, task: Task) -> bool:
        """Whether a cancel of ``task`` (not started yet, or running) reached this node (no
        lock: one set read; a flagged run's task is among the requests until :meth:`forget`)."""
        return task.pk in self._requested

    def wrote_checkpoint(self) -> None:
        """A handler of this node wrote a checkpoint."""
        with self._lock:
            self.checkpoint_writes += 1

    def forget(self, task: Task) -> None:
        """``task`` is done with: drop what is known of it (no lock: see :meth:`is_requested`)."""
        self._requested.discard(task.pk)

    @property
    def count(self) -> int:
        """How many tasks run now."""
        return sum(1 for run in list(self._runs.values()) if run.alive)  # a copy: no lock

    @property
    def progress_pending(self) -> bool:
        """Whether some progress waits to be written."""
        return any(run.dirty for run in list(self._runs.values()))  # a copy: no lock

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
                    self._drop([(pk, run)])
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


def _one_run(task: Task | None, what: str) -> tuple[Task, Run | None]:
    """The task a checkpoint call is about, and its run in this handler call (if any)."""
    runs = _runs_of(task)
    if task is not None:
        return task, (runs[0] if runs else None)
    if not runs:
        raise InvalidArgumentError(
            f"{what} outside a handler the node runs needs the task: {what}(..., task=task)."
        )
    if len(runs) > 1:
        raise InvalidArgumentError(f"{what} in a batch handler: pass task=, or `running.only`.")
    return runs[0].task, runs[0]


def check_checkpoint(name: object, value: object = None) -> Any:
    """Refuse a checkpoint name that is not a non-empty str of at most
    :data:`CHECKPOINT_NAME_MAX_LENGTH` characters or starts with :data:`RESERVED_PREFIX`,
    or a value that is not JSON, and what no database stores (NUL, a lone surrogate, too deep:
    :mod:`.validation`) (:class:`~django_tasks_coord.exceptions.InvalidArgumentError`);
    return the value as it reads back (a tuple becomes a list)."""
    limit, reserved = CHECKPOINT_NAME_MAX_LENGTH, RESERVED_PREFIX
    if not (isinstance(name, str) and 0 < len(name) <= limit and not name.startswith(reserved)):
        raise InvalidArgumentError(
            f"A checkpoint name is a non-empty str of at most {limit} characters, not starting "
            f"with {reserved!r} (reserved): not {name!r}."
        )
    validation.check_text(name, f"The checkpoint name {name!r}")
    return _as_json(value, name)


def _as_json(value: object, name: str) -> Any:
    """``value`` as it reads back from the database (a tuple becomes a list...)."""
    validation.check_json(value, f"checkpoint {name!r}")
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(
            f"The value of checkpoint {name!r} must be JSON (dict, list, str, int, float, "
            f"bool or None): {exc}."
        ) from exc


def _saved(task: Task, run: Run | None) -> dict[str, Any]:
    if run is not None and run.saved is not None:
        return run.saved
    saved = store_checkpoints.read([task]).get(task.pk, {})
    if run is not None:
        run.saved = saved
    return saved


def save(task: Task, name: str, value: Any) -> Any:
    """Write checkpoint ``name`` of ``task`` under its claim (names unchecked: the package's
    own use); return the value as stored. :class:`StaleClaimError` if the claim is lost."""
    value = _as_json(value, name)
    if task.exec_id is None:
        raise StaleClaimError(
            f"Task #{task.pk} carries no claim: a checkpoint is written under the claim of "
            "the attempt that records it."
        )
    if not store_checkpoints.write(task, name, value):
        raise StaleClaimError(
            f"Checkpoint {name!r} of task #{task.pk} refused: the task is no longer ACTIVE "
            "under this attempt's claim (its node was declared dead and the task handed out "
            "again, or it was completed). Stop: the attempt's work is being redone elsewhere."
        )
    for run in _runs_of(task):
        if run.saved is not None:
            run.saved[name] = value
        if run.runs is not None:
            run.runs.wrote_checkpoint()
    return value


def checkpoint(name: str, value: Any, task: Task | None = None) -> None:
    """Store ``value`` (JSON) under ``name`` for the running task (or ``task``), durably.

    Written at once, in one statement, and only while the task is ACTIVE under the claim
    of this attempt: else :class:`~django_tasks_coord.exceptions.StaleClaimError` (let it
    propagate: the task is being run elsewhere). Writing a name again replaces its value.
    ``name``: a non-empty str of at most :data:`CHECKPOINT_NAME_MAX_LENGTH` characters, not
    starting with :data:`RESERVED_PREFIX`. In a batch handler pass ``task``.
    """
    value = check_checkpoint(name, value)
    task, _ = _one_run(_check_task(task), "checkpoint")
    save(task, name, value)


def checkpoints(task: Task | None = None) -> dict[str, Any]:
    """The checkpoints of the running task (or ``task``): name to value, in the order they
    were first written; those of earlier attempts, and this attempt's own.

    Inside a handler the node runs, read once per attempt and then kept in memory.
    """
    task = _check_task(task)
    task, run = _one_run(task, "checkpoints")
    return {
        name: value
        for name, value in _saved(task, run).items()
        if not name.startswith(RESERVED_PREFIX)
    }


def step[T](name: str, func: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Run ``func(*args, **kwargs)`` once for the running task: durable step ``name``.

    If an earlier attempt (or this one) completed the step, return the value it stored
    without calling ``func``; else call it, store its result (JSON) as checkpoint ``name``
    (:func:`checkpoint`) and return the result as stored (a tuple comes back as a list,
    as a resumed attempt would get it). If ``func`` raises, nothing is stored and the
    exception propagates. At least once: an attempt killed after ``func``'s side effect
    and before its checkpoint runs the step again when the task resumes.
    """
    check_checkpoint(name)
    task, run = _one_run(None, "step")
    saved = _saved(task, run)
    if name in saved:
        return saved[name]  # type: ignore[no-any-return]
    return save(task, name, func(*args, **kwargs))  # type: ignore[no-any-return]
