"""The attempt logs of running tasks, as the completer writes them: ends and delayed starts.

A worker hands an attempt log to the completer (:mod:`~django_tasks_coord.node.completer`)
as a :class:`LogWrite`: the end of a failed attempt through the completer's queue (its
worker waits for it), the start of an attempt of a task type that logs every attempt into
:class:`DelayedStarts`, where it waits ``START_DELAY`` seconds and is written only if its
attempt is still running then. Most attempts end sooner: their outcome, which carries the
whole entry, replaces the start unwritten.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from django_tasks_coord import store
from django_tasks_coord.node.follow_ups import Item


class Tick:
    """Handed to the completer to wake it: a delayed start now waits, its sleep must end."""


#: The one :class:`Tick`.
TICK = Tick()


@dataclass(eq=False)
class LogWrite:
    """An attempt log handed to the completer thread; :meth:`wait` for it to be handled."""

    change: store.Change
    due: float = 0.0  # time.monotonic() from which it may be written (a delayed start)
    done: threading.Event = field(default_factory=threading.Event)
    superseded: list[LogWrite] = field(default_factory=list)  # delayed starts it replaces

    def wait(self) -> bool | None:
        """True: written; False: the claim was lost; None: failed (write it yourself)."""
        self.done.wait()
        return self.change.ok

    def settle(self, ok: bool | None) -> None:
        """Record the outcome of the write (and of the starts it replaced) and wake waiters."""
        self.change.ok = ok
        for earlier in self.superseded:
            earlier.settle(ok)
        self.done.set()


#: What the completer's queue carries: a finished task, a log write, a tick, None (stop).
Received = Item | LogWrite | Tick | None


class DelayedStarts:
    """The starts waiting to be written, by task pk, the earliest due first.

    ``lock`` is the completer's: adding a start and closing the completer exclude each
    other, so that a start added before the close is written by the last batch.
    """

    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock
        self.closed = False
        self._writes: dict[int, LogWrite] = {}

    def add(self, writes: list[LogWrite]) -> bool | None:
        """Keep ``writes`` until due; None if closed (nothing kept), else whether none waited
        before (the completer may sleep without a timeout: wake it)."""
        with self.lock:
            if self.closed:
                return None
            first = not self._writes
            for write in writes:
                self._writes[write.change.task.pk] = write
        return first

    def next_due(self) -> float | None:
        """When the first waiting start is due (``time.monotonic()``), or None."""
        with self.lock:
            for write in self._writes.values():  # in the order added: the first is due first
                return write.due
        return None

    def sort(
        self, received: list[Received], now: float, stop: bool
    ) -> tuple[list[Item], list[LogWrite], list[LogWrite]]:
        """The completions among ``received``, the log writes due now (received, or starts
        due), and the waiting starts that a later write of the same attempt replaces (its
        end or its completion carries the start)."""
        items: list[Item] = []
        ready: list[LogWrite] = []
        replaced: list[LogWrite] = []
        with self.lock:
            writes = self._writes
            for thing in received:
                if thing is None or isinstance(thing, Tick):
                    continue
                task = thing.change.task if isinstance(thing, LogWrite) else thing[1]
                waiting = writes.get(task.pk)
                if waiting is not None and waiting.change.task.exec_id == task.exec_id:
                    del writes[task.pk]
                    (thing.superseded if isinstance(thing, LogWrite) else replaced).append(waiting)
                if isinstance(thing, LogWrite):
                    ready.append(thing)
                else:
                    items.append(thing)
            due = []
            for pk, write in writes.items():  # the earliest due first
                if write.due > now and not stop:
                    break
                due.append(pk)
            ready[:0] = [writes.pop(pk) for pk in due]
        return items, ready, replaced
