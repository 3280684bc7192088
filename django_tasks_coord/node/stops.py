"""Stop requests: what a request does at once, and what it leaves for later.

A SIGTERM/SIGINT lands in the main thread between two bytecodes of whatever it interrupted,
a write of a log record to stdout included. Logging from there re-enters that stream
(``RuntimeError: reentrant call inside <_io.BufferedWriter name='<stdout>'>``, which
``logging`` reports as ``--- Logging error ---``, and the message is lost), and so may any
request that logs as it is made. So a request (:meth:`StopRequests.request`) sets the node's
stop events at once (every loop wakes; a second request forces the stop) and leaves its
message in a :class:`queue.SimpleQueue`. The node logs what waits there from its own code
(:meth:`StopRequests.log`): at the start of its shutdown and at its end (for a request that
came during it). ``runscheduler``'s signal handler makes no request itself: it hands the
signal to a thread that does.
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
        """Stop gracefully; a second request stops at once. It logs nothing (its message
        waits for :meth:`log`), but setting the events takes the loops' wake-up events'
        locks: from a signal handler, hand the request to another thread (``runscheduler``'s
        ``stop-signals``)."""
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
