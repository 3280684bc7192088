"""How many tasks a node holds, and how many it may hold (its capacity)."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

from django_tasks_coord.node.config import NodeConfig


class RunningMean:
    """An exponentially weighted mean of durations (thread-safe enough: one float store)."""

    def __init__(self, weight: float = 0.2) -> None:
        self.weight = weight
        self.value: float | None = None

    def add(self, sample: float) -> None:
        """Fold in one sample."""
        value = self.value
        self.value = sample if value is None else value + self.weight * (sample - value)


#: The weight of each task's time in :attr:`Load.task_seconds` (about the last 50 tasks count).
TASK_WEIGHT = 0.02


class Load:
    """The tasks a node claimed and has not completed or released yet, against its capacity.

    ``on_busy`` is called when the node, holding nothing, claims (the lifeline beats at
    once, then at the busy rate); ``on_room`` when a node the dispatcher found full
    (:meth:`room`), or a burst, lets go of tasks (the dispatcher looks for more).
    """

    def __init__(
        self,
        config: NodeConfig,
        *,
        on_busy: Callable[[], None] = lambda: None,
        on_room: Callable[[], None] = lambda: None,
    ) -> None:
        self.config = config
        self.on_busy = on_busy
        self.on_room = on_room
        #: Seconds a claim query takes, and a task runs (per task of a batch). A task's is
        #: averaged over many more: the wall time of a fast task paused by the GIL (another
        #: thread's turn, 5 ms) is many times its usual one, and swung the buffer between
        #: BUFFER and its cap from one claim to the next.
        self.claim_seconds = RunningMean()
        self.task_seconds = RunningMean(TASK_WEIGHT)
        self._count = 0
        self._full = False  # the dispatcher found no room: the next task to leave wakes it
        self._lock = threading.Lock()

    @property
    def count(self) -> int:
        """Tasks claimed by this node and not yet completed or released."""
        with self._lock:
            return self._count

    @property
    def capacity(self) -> int:
        """How many tasks the node holds at most: one per worker plus an adaptive buffer.

        The buffer is ``BUFFER`` for slow tasks; when tasks are fast compared with a
        claim, it grows so that the workers never wait for the next claim (enough for
        two claims' worth of work), up to ``10 * BATCH_SIZE``. Claimed tasks are not
        available to other nodes, so slow tasks are never hoarded. ``BUFFER=0`` means
        never claim ahead.
        """
        config = self.config
        buffer = config.buffer
        task_s, claim_s = self.task_seconds.value, self.claim_seconds.value
        if buffer and task_s is not None and claim_s is not None:  # BUFFER=0: never claim ahead
            wanted = math.ceil(2 * config.workers * claim_s / max(task_s, 1e-6))
            buffer = min(max(buffer, wanted), max(buffer, 10 * config.batch_size))
        return config.workers + buffer

    def room(self) -> int:
        """How many more tasks the node may claim now.

        When there is none, the dispatcher sleeps until a task leaves: the next
        :meth:`left` that makes room calls ``on_room``. Decided under one lock with
        :meth:`left`, so a task leaving meanwhile is never missed, and against the
        capacity at each moment, which grows and shrinks with the tasks' speed.
        """
        with self._lock:
            free = self.capacity - self._count
            if free <= 0:
                self._full = True
            return free

    def claimed(self, n: int) -> None:
        """``n`` more tasks are held."""
        with self._lock:
            was_idle = self._count == 0
            self._count += n
        if was_idle:
            self.on_busy()

    def left(self, n: int) -> None:
        """``n`` tasks left this node (completed or released)."""
        with self._lock:
            self._count -= n
            room = self._full and self._count < self.capacity
            if room:
                self._full = False
        if room or self.config.burst:
            self.on_room()
