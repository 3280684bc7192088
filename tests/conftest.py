"""Shared fixtures. The database comes from DATABASE_URL (see tests/settings.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection

from django_tasks_coord import queue
from django_tasks_coord.models import Topic


@pytest.fixture(autouse=True)
def _forget_known_topics() -> Iterator[None]:
    """Tests roll back topics; the per-process topic cache must not outlive them."""
    queue.known_topics.clear()
    yield
    queue.known_topics.clear()


@pytest.fixture
def topic(db: None) -> Topic:
    """A registered topic named ``jobs``."""
    return queue.register_topic("jobs")


@pytest.fixture
def vendor() -> str:
    """The database vendor under test: ``postgresql``, ``mysql`` or ``sqlite``."""
    return connection.vendor


def skip_unless_row_locks() -> pytest.MarkDecorator:
    """Skip on SQLite, which has no row locks (claims are serialized there instead)."""
    return pytest.mark.skipif(
        connection.vendor == "sqlite", reason="needs SELECT ... FOR UPDATE SKIP LOCKED"
    )
