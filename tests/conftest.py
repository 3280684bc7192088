"""Shared fixtures. The database comes from DATABASE_URL (see tests/settings.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from django_tasks_coord import db, queue
from django_tasks_coord.models import Topic
from tests import store_rule

store_rule.install()


@pytest.fixture(autouse=True)
def _task_store_rule() -> Iterator[None]:
    """Fail a test during which a module outside the task store wrote task rows
    (``tests/store_rule.py``)."""
    store_rule.violations.clear()
    yield
    store_rule.check()


@pytest.fixture(autouse=True)
def _forget_known_topics() -> Iterator[None]:
    """Tests roll back topics; the per-process topic cache must not outlive them."""
    queue.known_topics.clear()
    yield
    queue.known_topics.clear()


@pytest.fixture(autouse=True)
def _no_outage() -> Iterator[None]:
    """An outage a test left open (``db.OUTAGE``) must not silence the next test's."""
    db.OUTAGE.reset()
    yield
    db.OUTAGE.reset()


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


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """Before the test database is dropped, wait for the sessions of other processes to end.

    PostgreSQL refuses to drop a database another session is connected to. Tests start
    and kill node processes; the server ends a killed client's session only once it
    notices. Waits up to 15 s, then names what is left on stderr (a leak to look into)
    and ends it, so that the run reports its tests rather than a failed clean-up.
    """
    yield
    if connection.vendor != "postgresql":
        return
    import sys

    from tests.processes import wait_for

    with django_db_blocker.unblock(), connection.cursor() as cursor:

        def others() -> list[tuple]:
            """Sessions of other processes on the test database."""
            cursor.execute(
                "SELECT pid, application_name, state, left(query, 200), backend_start "
                "FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()"
            )
            return list(cursor.fetchall())

        try:
            wait_for(lambda: not others(), timeout=15, interval=0.2)
        except AssertionError:
            for session in others():
                print(f"Session left on the test database, ended: {session}", file=sys.stderr)
                cursor.execute("SELECT pg_terminate_backend(%s)", [session[0]])
    connection.close()
