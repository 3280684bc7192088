"""A stop request from a signal handler logs nothing: the signal may land while the main
thread writes a log record to the very stream the request would log to.

``runscheduler``'s SIGTERM once landed while the main thread flushed a record to stdout;
its handler's ``request_stop`` logged "Stopping: ..." into the same ``BufferedWriter``,
which refused the reentrant call (``--- Logging error --- RuntimeError: reentrant call
inside <_io.BufferedWriter name='<stdout>'>``). Here a real SIGTERM is raised, with the
command's handler installed, from inside the raw write under a ``BufferedWriter``'s flush.
The request must set the stop events at once, and its message must come out when the node
logs its stop requests (:mod:`django_tasks_coord.node.stops`). No database involved.
"""

from __future__ import annotations

import io
import logging
import os
import signal
import subprocess
import sys
import threading

import pytest

from django_tasks_coord.management.commands.runscheduler import StopSignals
from django_tasks_coord.node import Node, NodeConfig
from django_tasks_coord.node.stops import StopRequests
from django_tasks_coord.node.wakeup import StopEvent
from tests.processes import ROOT


class SignaledRaw(io.RawIOBase):
    """A raw stream that keeps what is written, and raises SIGTERM from inside the write of
    the record that contains ``trigger`` (the signal lands while its ``BufferedWriter``
    flushes, holding its lock)."""

    def __init__(self, trigger: bytes) -> None:
        self.trigger = trigger
        self.written = bytearray()
        self.signals_raised = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        data = bytes(data)
        self.written += data
        if self.trigger in data:
            self.signals_raised += 1
            signal.raise_signal(signal.SIGTERM)  # its handler runs before this returns
        return len(data)


class RecordingHandler(logging.StreamHandler):
    """A stream handler that keeps the errors ``logging`` would print as ``--- Logging
    error ---``."""

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self.errors: list[BaseException] = []

    def handleError(self, record: logging.LogRecord) -> None:
        self.errors.append(sys.exc_info()[1])


@pytest.fixture
def node_log():
    """The node's logger writing, at INFO, through a ``TextIOWrapper`` over a
    ``BufferedWriter`` over :class:`SignaledRaw` (the layers of ``sys.stdout``)."""
    raw = SignaledRaw(b"on its way out")
    handler = RecordingHandler(io.TextIOWrapper(io.BufferedWriter(raw), encoding="utf-8"))
    node_logger = logging.getLogger("django_tasks_coord.node")
    level = node_logger.level
    node_logger.addHandler(handler)
    node_logger.setLevel(logging.INFO)
    yield node_logger, handler, raw
    node_logger.removeHandler(handler)
    node_logger.setLevel(level)


@pytest.fixture
def stop_signals():
    """``runscheduler``'s SIGTERM/SIGINT handlers, installed on the main thread."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers can only be installed on the main thread")
    signals = StopSignals()
    signals.install()
    assert signal.getsignal(signal.SIGTERM) == signals._handle  # a SIGTERM must not kill us
    yield signals
    signals.restore()


def test_a_sigterm_during_a_log_flush_stops_the_node_and_its_message_comes_later(
    node_log, stop_signals
):
    node_logger, handler, raw = node_log
    node = Node(NodeConfig.from_settings(burst=True, topics=["work"], shutdown_max_wait=7))
    stop_signals.attach(node)

    node_logger.info("a record on its way out")  # SIGTERM, inside its flush
    node_logger.info("a second record on its way out")  # SIGTERM again: forced
    assert raw.signals_raised == 2
    assert handler.errors == []  # the handler did not write into the stream it interrupted
    assert node.state.stopping.wait(5)  # set by the stop-signals thread
    assert node.state.force.wait(5)
    stop_signals.restore()  # its thread is done with both signals

    node.stops.log()  # as the node's shutdown does
    handler.flush()
    lines = raw.written.decode().splitlines()
    assert lines == [
        "a record on its way out",
        "a second record on its way out",
        "Stopping: no new claims; running tasks get 7s.",
        "Second stop request: stopping now, releasing running tasks.",
    ]


def test_stop_requests_set_the_events_at_once_and_log_later_in_order(caplog):
    stopping, force = StopEvent(), threading.Event()
    stops = StopRequests(stopping, force, shutdown_max_wait=5)
    with caplog.at_level(logging.INFO, logger="django_tasks_coord.node"):
        stops.request()
        assert (stopping.is_set(), force.is_set()) == (True, False)
        stops.request()
        assert force.is_set()
        assert caplog.records == []  # nothing logged from the request itself
        stops.log()
        stops.log()  # each message once
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "Stopping: no new claims; running tasks get 5s."),
        (logging.WARNING, "Second stop request: stopping now, releasing running tasks."),
    ]


#: Run in a process of its own: made by the handler itself, the request would leave the
#: process waiting for itself for good.
_SIGNAL_UNDER_A_HELD_LOCK = """
import signal
import django
django.setup()
from django_tasks_coord.management.commands.runscheduler import StopSignals
from django_tasks_coord.node import Node, NodeConfig

signals = StopSignals()
signals.install()
node = Node(NodeConfig.from_settings(burst=True, topics=["work"]))
signals.attach(node)
wake = node.dispatcher.wake
with wake._cond:  # the main thread, inside WakeEvent.clear()
    signal.raise_signal(signal.SIGTERM)  # the handler runs before this returns
    print("handler returned", flush=True)
assert node.state.stopping.wait(5) and wake.wait(5)
signals.restore()
print("stopped", flush=True)
"""


def test_a_sigterm_while_the_main_thread_holds_a_wake_up_events_lock_stops_the_node():
    """The dispatcher clears its wake-up event every round, under the event's lock; a stop
    request sets that event. Made by the handler itself, in the main thread that holds the
    lock, the request would wait for that thread forever (a ``Lock`` is not reentrant)."""
    done = subprocess.run(
        [sys.executable, "-c", _SIGNAL_UNDER_A_HELD_LOCK],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["handler returned", "stopped"]
