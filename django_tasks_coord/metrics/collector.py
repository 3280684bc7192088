"""The queue-state metrics: a ``prometheus_client`` collector that reads the database.

Each scrape calls :func:`django_tasks_coord.metrics.state.read` once and reports what it
read; nothing is cached between scrapes. Names, labels and meaning:
``docs/reference/metrics.md``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django_tasks_coord.metrics import PREFIX, require, state

require()

from prometheus_client.core import (  # noqa: E402 - after the check that it is installed
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector  # noqa: E402


class QueueStateCollector(Collector):
    """Reads the queue's state at every scrape (database ``using``, default the app's)."""

    def __init__(self, using: str | None = None) -> None:
        self.using = using

    def describe(self) -> list[Metric]:
        """Nothing: registering the collector must not query the database."""
        return []

    def collect(self) -> Iterator[Metric]:
        """One read of the database, as metric families."""
        read = state.read(self.using)
        yield _tasks(read.tasks)
        yield _per_topic(
            "oldest_pending_seconds",
            "Seconds since the longest-waiting due pending task of the topic became due "
            "(0: none is due).",
            read.oldest_pending,
        )
        yield _per_topic("topic_paused", "1 while the topic is paused, else 0.", read.paused, float)
        yield _per_topic(
            "topic_rate_limit",
            "The topic's rate limit in task starts per second (per key with a limit key).",
            read.rate_limits,
        )
        yield _per_topic(
            "topic_concurrency_limit",
            "The topic's concurrency limit (per key with a limit key).",
            read.concurrency_limits,
        )
        yield _per_topic(
            "topic_total_rate_limit",
            "The topic's topic-wide rate limit in task starts per second (all keys together).",
            read.total_rate_limits,
        )
        yield _per_topic(
            "topic_total_concurrency_limit",
            "The topic's topic-wide concurrency limit (all keys together).",
            read.total_concurrency_limits,
        )
        yield GaugeMetricFamily(
            PREFIX + "nodes",
            "Nodes (owners) whose heartbeat is younger than LIVENESS_INTERVAL.",
            value=read.nodes,
        )
        yield from _leaders(read.leaders)
        yield from _jobs(read.jobs)
        yield _workflows(read.workflows)


def _workflows(counts: dict[str, int]) -> GaugeMetricFamily:
    workflows = GaugeMetricFamily(
        PREFIX + "workflows",
        "Workflows per state (exact up to 10,000 per state, then the planner's estimate).",
        labels=["state"],
    )
    for name, n in sorted(counts.items()):
        workflows.add_metric([name], n)
    return workflows


def _tasks(counts: dict[tuple[str, str], int]) -> GaugeMetricFamily:
    tasks = GaugeMetricFamily(
        PREFIX + "tasks",
        "Tasks per topic and state (exact up to 10,000 per topic and state, then the "
        "planner's estimate).",
        labels=["topic", "state"],
    )
    for (topic, name), n in sorted(counts.items()):
        tasks.add_metric([topic, name], n)
    return tasks


def _leaders(leaders: list[state.Leader]) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
    term = GaugeMetricFamily(
        PREFIX + "leader_term",
        "The term of the coordination group's token (0: never held).",
        labels=["group"],
    )
    leader = GaugeMetricFamily(
        PREFIX + "leader",
        "1 if the group's token holder (label node; empty: nobody) is alive, else 0.",
        labels=["group", "node"],
    )
    for row in leaders:
        term.add_metric([row.group], row.term)
        leader.add_metric([row.group, row.holder], 1.0 if row.alive else 0.0)
    return term, leader


def _jobs(jobs: list[state.Job]) -> tuple[Metric, Metric, Metric]:
    success = GaugeMetricFamily(
        PREFIX + "job_last_success_timestamp_seconds",
        "When the job's last successful run finished (Unix time; absent: never).",
        labels=["job"],
    )
    next_slot = GaugeMetricFamily(
        PREFIX + "job_next_slot_timestamp_seconds",
        "The job's next slot (Unix time; absent: none scheduled).",
        labels=["job"],
    )
    missed = CounterMetricFamily(
        PREFIX + "job_missed_slots",
        "Due slots of the job that never ran (missed and not caught up, or skipped "
        "while its previous run was still going).",
        labels=["job"],
    )
    for job in jobs:
        if job.last_success is not None:
            success.add_metric([job.id], job.last_success.timestamp())
        if job.next_slot is not None:
            next_slot.add_metric([job.id], job.next_slot.timestamp())
        missed.add_metric([job.id], job.missed_slots)
    return success, next_slot, missed


def _per_topic(
    name: str, documentation: str, values: dict[str, Any], convert: Any = float
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(PREFIX + name, documentation, labels=["topic"])
    for topic, value in sorted(values.items()):
        family.add_metric([topic], convert(value))
    return family
