"""A node's activity metrics, served by the ``runscheduler`` process on its own port.

``manage.py runscheduler --metrics-port 9310`` (or ``TASKS_COORD["METRICS_PORT"]``)
starts :func:`serve`: an HTTP server in a daemon thread of the node
(``prometheus_client.start_http_server``) answering ``GET /metrics`` with this node's
counters only, so every node is a scrape target of its own (one port per node on a
host; Prometheus adds the ``instance`` label). ``docs/reference/metrics.md`` lists them.

Where the numbers come from, without touching the node's loops: the task signals
(``task_completed``, ``task_retried``: tasks processed by outcome), the observer
interface (:mod:`django_tasks_coord.observers`: claim round trips, handler durations,
start delays) and, read at each scrape, the node object itself (tasks held, capacity,
busy workers).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from django_tasks_coord import observers, signals
from django_tasks_coord.enums import Decision, TaskState
from django_tasks_coord.metrics import PREFIX, require
from django_tasks_coord.models import Task

require()

from prometheus_client import (  # noqa: E402 - after the check that it is installed
    CollectorRegistry,
    Counter,
    Histogram,
    start_http_server,
)
from prometheus_client.core import (  # noqa: E402
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector  # noqa: E402

if TYPE_CHECKING:
    from django_tasks_coord.node import Node

#: Buckets of the task duration and start delay histograms (seconds).
TASK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
#: Buckets of the claim latency histogram (seconds).
CLAIM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class NodeMetrics(observers.Observer):
    """The activity metrics of one process, in a registry of their own.

    :meth:`install` connects the signal receivers and the observer; :meth:`uninstall`
    undoes it. ``node`` (optional) is read at each scrape for the gauges.
    """

    def __init__(self, node: Node | None = None) -> None:
        self.node = node
        self.registry = CollectorRegistry(auto_describe=True)
        self.processed = Counter(
            PREFIX + "tasks_processed",
            "Tasks this node ran to an outcome: succeeded, failed, filtered, suspended "
            "(final) or retried (a failed attempt that runs again).",
            ["topic", "outcome"],
            registry=self.registry,
        )
        self.duration = Histogram(
            PREFIX + "task_duration_seconds",
            "How long the handler ran, per task (a batch's time shared out).",
            ["topic"],
            buckets=TASK_BUCKETS,
            registry=self.registry,
        )
        self.start_delay = Histogram(
            PREFIX + "task_start_delay_seconds",
            "From when the task was due (execute_at, else its creation) to its handler's start.",
            ["topic"],
            buckets=TASK_BUCKETS,
            registry=self.registry,
        )
        self.claim_duration = Histogram(
            PREFIX + "claim_duration_seconds",
            "Claim round trips to the database (the count is the number of claims).",
            ["topic"],
            buckets=CLAIM_BUCKETS,
            registry=self.registry,
        )
        self.claimed_tasks = Counter(
            PREFIX + "tasks_claimed",
            "Tasks this node claimed.",
            ["topic"],
            registry=self.registry,
        )
        if node is not None:
            self.registry.register(_NodeGauges(node))
        self._uid = f"tasks_coord_metrics_{id(self)}"

    # --- wiring --------------------------------------------------------------------------

    def install(self) -> NodeMetrics:
        """Start counting: connect the signals and register the observer."""
        signals.task_completed.connect(
            self._completed, sender=Task, weak=False, dispatch_uid=self._uid
        )
        signals.task_retried.connect(self._retried, sender=Task, weak=False, dispatch_uid=self._uid)
        observers.add(self)
        return self

    def uninstall(self) -> None:
        """Stop counting."""
        signals.task_completed.disconnect(sender=Task, dispatch_uid=self._uid)
        signals.task_retried.disconnect(sender=Task, dispatch_uid=self._uid)
        observers.remove(self)

    # --- signals -------------------------------------------------------------------------

    def _completed(self, sender: Any, task: Task, decision: Decision, **kwargs: Any) -> None:
        outcome = TaskState(decision.result.state).name.lower()
        self.processed.labels(task.topic_id, outcome).inc()

    def _retried(self, sender: Any, task: Task, **kwargs: Any) -> None:
        self.processed.labels(task.topic_id, "retried").inc()

    # --- observer ------------------------------------------------------------------------

    def claimed(self, topic: str, tasks: list[Task], seconds: float) -> None:
        """A claim round trip."""
        self.claim_duration.labels(topic).observe(seconds)
        if tasks:
            self.claimed_tasks.labels(topic).inc(len(tasks))

    def started(self, task: Task, delay: float) -> None:
        """A handler starts ``task``."""
        self.start_delay.labels(task.topic_id).observe(delay)

    def ran(self, task: Task, seconds: float) -> None:
        """A handler ran ``task``."""
        self.duration.labels(task.topic_id).observe(seconds)


class _NodeGauges(Collector):
    """Read from the node at each scrape: held tasks, capacity, workers."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def collect(self) -> Iterator[Metric]:
        node = self.node
        busy = node.workers_busy
        yield GaugeMetricFamily(
            PREFIX + "node_tasks_held",
            "Tasks this node claimed and has not completed or released yet (running, "
            "waiting for a worker, or waiting for their completion to be written).",
            value=node.in_flight,
        )
        yield GaugeMetricFamily(
            PREFIX + "node_capacity",
            "The most tasks this node holds at once: its workers plus its claim-ahead buffer.",
            value=node.capacity,
        )
        yield GaugeMetricFamily(
            PREFIX + "node_workers", "This node's worker threads.", value=node.config.workers
        )
        yield GaugeMetricFamily(
            PREFIX + "node_workers_busy", "Worker threads running a task now.", value=busy
        )
        runs = node.state.runs
        yield CounterMetricFamily(
            PREFIX + "node_cancels_delivered",
            "Cancel requests this node delivered to running handlers.",
            value=runs.delivered,
        )
        yield CounterMetricFamily(
            PREFIX + "node_progress_writes",
            "Progress values of running tasks this node wrote (coalesced reports).",
            value=runs.progress_writes,
        )
        yield CounterMetricFamily(
            PREFIX + "node_checkpoints_written",
            "Checkpoints this node's handlers wrote (durable steps, composite steps).",
            value=runs.checkpoint_writes,
        )
        info = GaugeMetricFamily(
            PREFIX + "node_info", "Always 1; the node's id as a label.", labels=["node"]
        )
        info.add_metric([node.node_id or node.config.node_id or ""], 1.0)
        yield info


class Server:
    """A running metrics server (:func:`serve`); :meth:`close` stops it."""

    def __init__(self, metrics: NodeMetrics, httpd: Any, thread: threading.Thread) -> None:
        self.metrics = metrics
        self.httpd = httpd
        self.thread = thread

    @property
    def port(self) -> int:
        """The port it listens on (the one chosen by the system, if asked for port 0)."""
        return int(self.httpd.server_address[1])

    def close(self) -> None:
        """Stop serving and counting."""
        self.metrics.uninstall()
        self.httpd.shutdown()
        self.httpd.server_close()


def serve(node: Node, port: int, address: str = "0.0.0.0") -> Server:
    """Count ``node``'s activity and serve it on ``address``:``port`` until :meth:`Server.close`."""
    metrics = NodeMetrics(node).install()
    try:
        httpd, thread = start_http_server(port, addr=address, registry=metrics.registry)
    except BaseException:
        metrics.uninstall()
        raise
    return Server(metrics, httpd, thread)
