"""A node's activity metrics: counted from signals and observers, served on --metrics-port."""

from __future__ import annotations

import signal
import socket
import urllib.request
from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client import generate_latest

from django_tasks_coord import observers, queue
from django_tasks_coord.enums import TaskState
from django_tasks_coord.metrics.node import NodeMetrics, serve
from django_tasks_coord.models import Task
from tests.metrics.conftest import documented, samples
from tests.node.conftest import run
from tests.processes import reap, runscheduler, wait_for
from tests.testapp.models import Run

NODE_METRICS = {
    "tasks_coord_tasks_processed_total",
    "tasks_coord_task_duration_seconds",
    "tasks_coord_task_start_delay_seconds",
    "tasks_coord_claim_duration_seconds",
    "tasks_coord_tasks_claimed_total",
    "tasks_coord_node_tasks_held",
    "tasks_coord_node_capacity",
    "tasks_coord_node_workers",
    "tasks_coord_node_workers_busy",
    "tasks_coord_node_info",
    "tasks_coord_node_cancels_delivered_total",
    "tasks_coord_node_progress_writes_total",
    "tasks_coord_node_checkpoints_written_total",
}
#: Suffixes prometheus_client adds to the samples of counters and histograms.
SUFFIXES = ("_bucket", "_count", "_sum", "_created")


def family(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def value(found: dict, name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


def test_every_documented_node_metric_after_a_known_workload(make_node, work_topic):
    queue.push("work", "ok")
    queue.push("work", "filtered", {"result": "FILTER"})
    queue.push("work", "flaky", {"fail_times": 1})  # retried later: after the burst
    queue.push("work", "late", execute_at=timezone.now() - timedelta(seconds=30))
    queue.push("work", "lost", handler="tests.testapp.consumers.does_not_exist")
    node = make_node(node_id="metrics-node", workers=2)
    metrics = NodeMetrics(node).install()
    try:
        assert run(node) == 0
        found = samples(generate_latest(metrics.registry).decode())
    finally:
        metrics.uninstall()
    assert not observers.active()

    reference = documented()
    assert set(reference) >= NODE_METRICS
    assert {family(name) for name, _ in found} >= NODE_METRICS
    for name, labels in found:
        if family(name) in NODE_METRICS:
            keys = [key for key, _ in labels if key != "le"]
            assert keys == sorted(reference[family(name)][1]), name

    # The retry of "flaky" (0.2 s later) may or may not run before the burst ends: compare
    # with what the database and the handler's own records say.
    tasks = Task.objects.filter(topic_id="work")
    runs = Run.objects.filter(topic="work").count()  # one per handler start
    succeeded = tasks.filter(state=TaskState.SUCCEEDED).count()
    assert succeeded in (2, 3)  # ok, late, and maybe flaky's second attempt
    processed = "tasks_coord_tasks_processed_total"
    assert value(found, processed, topic="work", outcome="succeeded") == succeeded
    assert value(found, processed, topic="work", outcome="filtered") == 1
    assert value(found, processed, topic="work", outcome="retried") == 1
    assert value(found, processed, topic="work", outcome="failed") == 1  # no handler
    claims = sum(tasks.values_list("attempts", flat=True))
    assert value(found, "tasks_coord_tasks_claimed_total", topic="work") == claims
    assert value(found, "tasks_coord_claim_duration_seconds_count", topic="work") >= 1
    # A handler run per start (the task without a handler never starts one).
    assert value(found, "tasks_coord_task_duration_seconds_count", topic="work") == runs
    assert value(found, "tasks_coord_task_start_delay_seconds_count", topic="work") == runs
    # "late" was due 30 s before it started: in a bucket of 30 s or more only.
    delay = "tasks_coord_task_start_delay_seconds_bucket"
    assert value(found, delay, topic="work", le="10.0") == runs - 1
    assert value(found, delay, topic="work", le="60.0") == runs
    assert value(found, "tasks_coord_node_workers") == 2
    assert value(found, "tasks_coord_node_capacity") >= 2
    assert value(found, "tasks_coord_node_tasks_held") == 0  # the burst is over
    assert value(found, "tasks_coord_node_workers_busy") == 0
    assert value(found, "tasks_coord_node_info", node="metrics-node") == 1
    assert value(found, "tasks_coord_node_cancels_delivered_total") == 0  # nothing canceled
    assert value(found, "tasks_coord_node_progress_writes_total") == 0
    assert value(found, "tasks_coord_node_checkpoints_written_total") == 0


def test_a_failing_observer_never_breaks_the_node(make_node, work_topic, caplog):
    class Broken(observers.Observer):
        def ran(self, task, seconds):
            raise RuntimeError("observer bug")

    broken = Broken()
    observers.add(broken)
    try:
        queue.push("work", "ok")
        assert run(make_node()) == 0
    finally:
        observers.remove(broken)
    assert Task.objects.get(topic_id="work").state == TaskState.SUCCEEDED
    assert "observer bug" in caplog.text


def test_serve_answers_on_its_port(make_node, work_topic):
    node = make_node(node_id="served")
    server = serve(node, 0, "127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as r:
            text = r.read().decode()
    finally:
        server.close()
    assert 'tasks_coord_node_info{node="served"} 1.0' in text
    assert not observers.active()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.django_db(transaction=True)
@pytest.mark.multiprocess
def test_runscheduler_metrics_port(work_topic):
    port = _free_port()
    proc = runscheduler(
        "--topic",
        "work",
        "--metrics-port",
        str(port),
        settings={"POLL_INTERVAL": 0.1, "STATUS_INTERVAL": 0, "METRICS_ADDRESS": "127.0.0.1"},
    )
    try:
        queue.push("work", "over-http")

        def processed() -> bool:
            """The node's metrics count the task."""
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read().decode()
            except OSError:
                return False
            return 'tasks_coord_tasks_processed_total{outcome="succeeded",topic="work"} 1.0' in text

        wait_for(processed, timeout=60)
    finally:
        out, err = reap(proc, signal.SIGTERM)
    assert proc.returncode == 0, err
    assert f"metrics on 127.0.0.1:{port}/metrics" in out + err
