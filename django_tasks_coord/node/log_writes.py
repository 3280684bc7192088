"""The attempt logs of running tasks, as the completer writes them: ends and delayed starts.

A worker hands an attempt log to the completer (:mod:`~django_tasks_coord.node.completer`)
as a :class:`LogWrite`: the end of a failed attempt through the completer's queue (its
worker waits for it), the start of an attempt of a task type that logs every attempt into
:class:`DelayedStarts`, where it waits ``START_DELAY`` seconds and is written only if its
attempt is still running then. Most attempts end sooner: their outcome, which carries the
whole entry, replaces the start unwritten.
"""

from __future__ import annotations

import queue as stdlib_queue
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

    Workers add starts (:meth:`add`) without taking a lock: they go through a queue that
    only the completer drains, and only the completer reads and changes the starts kept.
    A lock shared by every worker and the completer made them queue behind one another
    (and behind the completer sorting a batch) for each task started.

    Added before :attr:`closed` is set, a start is written by the completer's last batch
    (it drains the queue when it receives the stop); added while it closes, it is not
    written, as if added after.
    """

    def __init__(self) -> None:
        self.closed = False
        #: Set by the completer while it sleeps without a timeout: an added start wakes it.
        self.sleeping = False
        self._added: stdlib_queue.SimpleQueue[list[LogWrite]] = stdlib_queue.SimpleQueue()
        self._writes: dict[int, LogWrite] = {}

    def add(self, writes: list[LogWrite]) -> bool | None:
        """Keep ``writes`` until due (any thread); None if closed (nothing kept), else
        whether the completer sleeps without a timeout (wake it)."""
        if self.closed:
            return None
        self._added.put(writes)
        return self.sleeping

    def _take_added(self) -> None:
        """Keep what workers added since the last look (the completer's thread)."""
        while True:
            try:
                writes = self._added.get_nowait()
            except stdlib_queue.Empty:
                return
            for write in writes:
                self._writes[write.change.task.pk] = write

    def next_due(self) -> float | None:
        """When the first waiting start is due (``time.monotonic()``), or None: then
        :attr:`sleeping` is set (the completer's thread; it clears it once woken)."""
        self._take_added()
        if not self._writes:
            self.sleeping = True  # then look again: a start added meanwhile saw it, or is seen
            self._take_added()
        for write in self._writes.values():  # in the order added: the first is due first
            self.sleeping = False
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
        self._take_added()  # a worker adds a start before it hands over anything of its attempt
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
