"""Batched writes of the worker side: attempt logs and completions, many tasks per statement.

Every attempt of a Django task writes its row twice (its log entry when it starts, its
outcome when it ends). One statement per write would bound a node by the database's
commit rate; instead the workers hand their writes to one writer thread per process,
which turns everything handed over meanwhile into one ``UPDATE`` per kind of write
(per-row values through ``CASE``), each row fenced by its claim (``exec_id``, still
ACTIVE). A failed attempt's log is waited for by its worker (the node retries or fails the task
right after, and must find it written); a success is waited for by the node's completer
before the task counts as done (``DjangoTaskType.outcome_committed``), so the worker goes on at
once and the node never stops with an outcome unwritten. The start of an attempt is
not waited for, and is written only if the attempt still runs :data:`START_DELAY`
seconds later: a shorter attempt's outcome carries its whole log anyway, so most
tasks cost one batched write. An attempt whose node dies before its start was written
shows as lost with an unknown worker.

A batch that fails because the database connection broke is written again once the
database answers (:func:`~django_tasks_coord.db.retry_while_lost`), so outcomes finished
during an outage are stored, not left to expire. Every write is fenced by its claim, so
a batch whose commit went through just before the connection broke changes nothing the
second time, and its completions are recognized by the ``finished_at`` they wrote.
"""

from __future__ import annotations

import contextlib
import logging
import queue as stdlib_queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from django.db import connections, models
from django.db.models import Case, Q, Value, When
from django.utils import timezone

from django_tasks_coord import db
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Task as TaskRow

logger = logging.getLogger(__name__)

MAX_BATCH = 500
#: Seconds after which the start of a still running attempt is written.
START_DELAY = 0.2


@dataclass(eq=False)
class Write:
    """One row's changes, fenced by its claim. ``ok``: whether it was written (None: unknown)."""

    pk: int
    exec_id: Any
    changes: dict[str, Any]
    done: threading.Event | None = None
    ok: bool | None = None
    completes: bool = field(default=False)
    due: float = 0.0  # time.monotonic() from which it may be written (a delayed start)
    superseded: list[Write] = field(default_factory=list)  # earlier delayed writes it replaces

    def wait(self) -> bool | None:
        """Wait until it was handled: True if written, False if the claim was lost, None if
        the batch failed (write it yourself)."""
        assert self.done is not None
        self.done.wait()
        return self.ok


class Writer:
    """The writer thread of this process (started on first use)."""

    def __init__(self) -> None:
        self._items: stdlib_queue.SimpleQueue[Write | None] = stdlib_queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, row: TaskRow, changes: dict[str, Any], *, delay: float = 0.0) -> Write:
        """Hand over ``changes`` for ``row``, written while it is ACTIVE under its claim.

        With ``delay``, it is written only if no other write for the row's claim came
        within ``delay`` seconds. A change of ``state`` completes the row: its
        ``finished_at`` is set by the writer (one time for the whole batch) and put into
        ``changes``. :meth:`Write.wait` tells whether it was written.
        """
        completes = "state" in changes
        if completes:
            changes["finished_at"] = None
        item = Write(row.pk, row.exec_id, changes, threading.Event(), None, completes)
        item.due = time.monotonic() + delay if delay else 0.0
        self._ensure_started()
        self._items.put(item)
        return item

    def stop(self, timeout: float = 30.0) -> None:
        """Write what was handed over (delayed starts too), close the thread's database
        connection and end the thread; the next :meth:`submit` starts it again."""
        with self._lock:
            thread = self._thread
            if thread is None or not thread.is_alive():
                return
            self._items.put(None)
        thread.join(timeout)

    def _ensure_started(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="django-tasks-writer", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        delayed: dict[int, Write] = {}
        stopping = False
        while not stopping:
            timeout = None
            if delayed:
                timeout = max(min(item.due for item in delayed.values()) - time.monotonic(), 0)
            received: list[Write | None] = []
            with contextlib.suppress(stdlib_queue.Empty):
                received.append(self._items.get(timeout=timeout))
            while len(received) < MAX_BATCH:
                try:
                    received.append(self._items.get_nowait())
                except stdlib_queue.Empty:
                    break
            stopping = None in received
            now = time.monotonic()
            ready = []
            for item in received:
                if item is None:
                    continue
                waiting = delayed.get(item.pk)
                if waiting is not None and waiting.exec_id == item.exec_id:
                    del delayed[item.pk]  # superseded by a later write of the same attempt
                    item.superseded.append(waiting)
                if item.due > now and not stopping:
                    delayed[item.pk] = item
                else:
                    ready.append(item)
            for pk in [pk for pk, item in delayed.items() if item.due <= now or stopping]:
                ready.insert(0, delayed.pop(pk))
            if ready:
                self._write(ready)
        connections[db.alias()].close()

    def _write(self, batch: list[Write]) -> None:
        try:  # a lost connection: reconnect and write the same batch again (fenced, see _update)
            db.retry_while_lost(lambda: self._flush(batch), what="Writing task outcomes")
        except Exception:
            logger.exception("Writing %s attempt log(s) or outcome(s) failed.", len(batch))
            connections[db.alias()].close()
            for item in batch:
                item.ok = None
        finally:
            for item in batch:
                for earlier in item.superseded:
                    earlier.ok = item.ok
                    if earlier.done is not None:
                        earlier.done.set()
                if item.done is not None:
                    item.done.set()

    def _flush(self, batch: list[Write]) -> None:
        groups: dict[tuple[str, ...], dict[int, list[Write]]] = {}
        for item in batch:
            # Within a kind of write, a row's later write supersedes its earlier ones.
            rows = groups.setdefault(tuple(sorted(item.changes)), {})
            rows.setdefault(item.pk, []).append(item)
        for fields, rows in groups.items():
            self._update(fields, [writes[-1] for writes in rows.values()])
            for writes in rows.values():
                for earlier in writes[:-1]:
                    earlier.ok = writes[-1].ok

    def _update(self, fields: tuple[str, ...], items: list[Write]) -> None:
        finished = timezone.now()
        for item in items:  # once: a retried write must find the time its first try wrote
            if item.completes and item.changes["finished_at"] is None:
                item.changes["finished_at"] = finished
        values: dict[str, Any] = {}
        for name in fields:
            column = [item.changes[name] for item in items]
            if all(value == column[0] for value in column) and name != "attempt_log":
                values[name] = column[0]
                continue
            output = TaskRow._meta.get_field(name)
            assert isinstance(output, models.Field)
            values[name] = Case(
                *(
                    When(pk=item.pk, then=Value(item.changes[name], output_field=output))
                    for item in items
                ),
                output_field=output,
            )
        held = Q()
        for item in items:
            held |= Q(pk=item.pk, exec_id=item.exec_id)
        rows = TaskRow.objects.using(db.alias()).filter(held, state=TaskState.ACTIVE)
        if rows.update(**values) == len(items):
            for item in items:
                item.ok = True
            return
        # Some rows were no longer held: find out which were written.
        current = {
            row["pk"]: row
            for row in TaskRow.objects.using(db.alias())
            .filter(pk__in=[item.pk for item in items])
            .values("pk", "exec_id", "state", "finished_at")
        }
        for item in items:
            row = current.get(item.pk)
            if row is None or row["exec_id"] != item.exec_id:
                item.ok = False
            elif item.completes:
                item.ok = (
                    row["state"] == item.changes["state"]
                    and row["finished_at"] == item.changes["finished_at"]
                )
            else:
                item.ok = row["state"] == TaskState.ACTIVE


#: The writer of this process.
writer = Writer()
