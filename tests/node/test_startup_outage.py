"""A node started while its database is down waits for it, then starts as usual.

A server of the test's own (:class:`tests.servers.PrivatePostgres` or
:class:`~tests.servers.PrivateMariaDB`, the shared servers are never stopped) is migrated,
then stopped; ``runscheduler`` starts against it, logs one WARNING while it waits, and once
the server is back it registers and runs a task. A signal while it waits ends it cleanly.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from django_tasks_coord import queue
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Owner, Task
from tests.processes import ROOT, subprocess_env, wait_for
from tests.servers import PrivateMariaDB, PrivatePostgres, PrivateServer, migrated_on

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.multiprocess,
    pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite has no server to be down"),
]

WAITING = "Start-up: waiting for the database"


@pytest.fixture
def private_server(transactional_db: None) -> Iterator[PrivateServer]:
    """This test's connection (and the nodes it starts) on a server of its own, migrated."""
    kind = PrivatePostgres if connection.vendor == "postgresql" else PrivateMariaDB
    try:
        server = kind()
    except (FileNotFoundError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"no private server can be started here: {exc}")
    with migrated_on(server, "tasks_coord_startup"):
        queue.register_topic("work")
        connection.close()
        yield server


def start_node(log: Path) -> subprocess.Popen[str]:
    settings = {"HEARTBEAT_FREQUENCY": 0.2, "POLL_INTERVAL": 0.2, "STATUS_INTERVAL": 0}
    with log.open("w") as out:  # a file: a pipe nobody reads could fill up and freeze it
        return subprocess.Popen(
            [sys.executable, "-m", "django", "runscheduler", "--topic", "work"],
            cwd=ROOT,
            env=subprocess_env(TASKS_COORD_JSON=json.dumps(settings)),
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )


def lines(log: Path, text: str) -> list[str]:
    return [line for line in log.read_text().splitlines() if text in line]


def test_a_node_started_during_an_outage_waits_then_works(private_server, tmp_path):
    private_server.stop()
    log = tmp_path / "node.log"
    node = start_node(log)
    try:
        wait_for(lambda: lines(log, WAITING), timeout=60)
        wait_for(lambda: "retrying" in log.read_text(), timeout=10)
        assert node.poll() is None  # still waiting, not dead
        private_server.start()
        wait_for(lambda: lines(log, "started:"), timeout=60)
        queue.push("work", identifier="after")
        wait_for(
            lambda: Task.objects.filter(identifier="after", state=TaskState.SUCCEEDED).exists(),
            timeout=60,
        )
    finally:
        node.send_signal(signal.SIGTERM)
        node.wait(60)
    text = log.read_text()
    assert node.returncode == 0, text
    assert "Traceback" not in text and "ERROR" not in text, text
    assert [line for line in lines(log, "WARNING") if WAITING in line] == lines(log, "WARNING")
    assert len(lines(log, WAITING)) == 2, text  # one WARNING, one INFO when it answers
    assert "the database answers again" in lines(log, WAITING)[1]
    assert not Owner.objects.exists()  # unregistered at the stop


def test_a_signal_while_it_waits_ends_it_cleanly(private_server, tmp_path):
    private_server.stop()
    log = tmp_path / "node.log"
    node = start_node(log)
    try:
        wait_for(lambda: lines(log, WAITING), timeout=60)
    finally:
        node.send_signal(signal.SIGTERM)
        node.wait(30)
    text = log.read_text()
    assert node.returncode == 0, text
    assert "SIGTERM received during start-up: exiting before the node registered." in text
    assert "Traceback" not in text, text
