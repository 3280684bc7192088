"""Shared by the flow-control tests (here and tests/api/test_flow_limits.py): each test
starts with no cached limits, and the rate windows move by back-dating the start log."""

from datetime import timedelta

import pytest

from django_tasks_coord import flow, queue, topics
from django_tasks_coord.models import FlowStart, Topic
from django_tasks_coord.store import flow as flow_claims


@pytest.fixture(autouse=True)
def fresh_limits():
    """No limits cached, no claim remembered as held back, before and after the test."""
    flow._cache.clear()
    topics.known_topics.clear()
    yield
    flow._cache.clear()
    topics.known_topics.clear()
    flow_claims._held_back.clear()


def age_starts(topic: Topic | str, seconds: float) -> None:
    """Let ``seconds`` pass for the rate windows of ``topic`` (a Topic or its name): the
    logged starts move back in time."""
    name = topic if isinstance(topic, str) else topic.name
    for start in FlowStart.objects.filter(topic=name):
        start.at -= timedelta(seconds=seconds)
        start.save(update_fields=["at"])


def finish(tasks) -> None:
    """Complete ``tasks`` successfully (their places in flight are freed)."""
    for task in tasks:
        queue.complete(task, queue.Result.SUCCESS)
