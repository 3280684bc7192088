"""Stop requests: what a SIGTERM/SIGINT handler does at once, and what it leaves for later.

A signal handler runs in the main thread between two bytecodes of whatever it interrupted,
a write of a log record to stdout included. Logging from the handler then re-enters that
stream (``RuntimeError: reentrant call inside <_io.BufferedWriter name='<stdout>'>``, which
``logging`` reports as ``--- Logging error ---``, and the message is lost). So a request
(:meth:`StopRequests.request`) sets the node's stop events at once (every loop wakes; a
second request forces the stop) and leaves its message in a :class:`queue.SimpleQueue`,
whose ``put`` may be called from a signal handler. The node logs what waits there from its
own code (:meth:`StopRequests.log`): at the start of its shutdown and at its end (for a
request that came during it).
"""

from __future__ import annotations

import logging
import queue
import threading

from django_tasks_coord.node.wakeup import StopEvent

logger = logging.getLogger("django_tasks_coord.node")


class StopRequests:
    """A node's stop requests (see the module): ``stopping`` is set by the first, ``force``
    by the second; ``shutdown_max_wait`` is what the first request's message announces."""

    def __init__(
        self, stopping: StopEvent, force: threading.Event, *, shutdown_max_wait: float
    ) -> None:
        self.stopping = stopping
        self.force = force
        self.shutdown_max_wait = shutdown_max_wait
        self._messages: queue.SimpleQueue[tuple[int, str]] = queue.SimpleQueue()

    def request(self) -> None:
        """Stop gracefully; a second request stops at once. Safe in a signal handler: it
        logs nothing (its message waits for :meth:`log`)."""
        if self.stopping.is_set():
            self._messages.put(
                (logging.WARNING, "Second stop request: stopping now, releasing running tasks.")
            )
            self.force.set()
        else:
            self._messages.put(
                (
                    logging.INFO,
                    f"Stopping: no new claims; running tasks get {self.shutdown_max_wait}s.",
                )
            )
        self.stopping.set()  # wakes every loop

    def log(self) -> None:
        """Log the messages of the requests so far, in their order (never call it from a
        signal handler)."""
        while True:
            try:
                level, message = self._messages.get_nowait()
            except queue.Empty:
                return
            logger.log(level, message)
