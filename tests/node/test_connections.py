"""A node's connection budget, as docs/howto/pgbouncer.md states it, counted on the server.

A real ``runscheduler`` process runs tasks that hold their worker's connection for a
while; the test samples the server's sessions on the test database meanwhile (PostgreSQL:
``pg_stat_activity``, told apart by the node's ``application_name``; MariaDB/MySQL: the
process list, the test's own session left out). At most ``WORKERS + 7`` with every duty on
(dispatcher, completer, lifeline, scheduler, retention, workflow advancer, and on PostgreSQL
the LISTEN connection), ``WORKERS + 3`` with the scheduler, retention, LISTEN and the
workflow advancer off.
"""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest
from django.db import connection

from django_tasks_coord import queue
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Task
from tests.processes import reap, start, wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.multiprocess,
    pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite has no sessions to count"),
]

NODE_APP = "tasks-coord-budget"
WORKERS = 3
FAST = {"HEARTBEAT_FREQUENCY": 0.2, "POLL_INTERVAL": 0.1, "STATUS_INTERVAL": 0}


def node_sessions() -> int:
    """The node's sessions on the test database now."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = %s",
                [NODE_APP],
            )
        else:
            cursor.execute(
                "SELECT count(*) FROM information_schema.PROCESSLIST "
                "WHERE DB = DATABASE() AND ID <> CONNECTION_ID()"
            )
        return int(cursor.fetchone()[0])


def peak(settings: dict[str, Any]) -> int:
    """The most sessions a node with ``settings`` held while running slow tasks."""
    db = {key: connection.settings_dict[key] for key in ("ENGINE", "USER", "PASSWORD", "HOST")}
    db.update(NAME=str(connection.settings_dict["NAME"]), PORT=connection.settings_dict["PORT"])
    db["OPTIONS"] = dict(connection.settings_dict["OPTIONS"])
    if connection.vendor == "postgresql":
        db["OPTIONS"]["application_name"] = NODE_APP
    queue.register_topic("work")
    identifiers = [f"s{i}" for i in range(WORKERS * 4)]
    queue.push_many("work", [(i, {"sleep": 0.5}) for i in identifiers])
    env = {
        "TASKS_COORD_TEST_DB": json.dumps(db),
        "TASKS_COORD_JSON": json.dumps({**FAST, **settings, "WORKERS": WORKERS}),
    }
    proc = start("django", "runscheduler", "--topic", "work", **env)
    seen = [0]

    def finished() -> bool:
        seen.append(node_sessions())
        done = Task.objects.filter(topic_id="work", state=TaskState.SUCCEEDED).count()
        return done == len(identifiers)

    try:
        wait_for(finished, timeout=120, interval=0.02)
    finally:
        out, err = reap(proc, signal.SIGTERM)
    assert proc.returncode == 0, err + out
    return max(seen)


def test_a_node_holds_at_most_workers_plus_seven_connections():
    listen = 1 if connection.vendor == "postgresql" else 0
    most = peak({})
    assert WORKERS + 1 <= most <= WORKERS + 6 + listen


def test_without_scheduler_retention_listen_and_advancer_it_holds_workers_plus_three():
    off = {"SCHEDULER": False, "RETENTION_INTERVAL": 0, "LISTEN_NOTIFY": False}
    most = peak({**off, "WORKFLOW_POLL_INTERVAL": 0})
    assert WORKERS + 1 <= most <= WORKERS + 3
