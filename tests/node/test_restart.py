"""A database outage under real nodes: every connection cut, or the server restarted.

Three ``manage.py runscheduler`` processes of one group work through queue tasks, Django
``@task`` functions, a job every second and a leader-only job every second. Then every
connection they hold is terminated (``pg_terminate_backend``, MariaDB ``KILL CONNECTION``),
or a server of the test's own (:class:`tests.servers.PrivatePostgres`,
:class:`tests.servers.PrivateMariaDB`) is restarted under them. Afterwards no node may have
exited, all work must be done, both jobs must go on, and each node must have logged the
outage once: one WARNING when it began, one INFO when the database answered again, no
ERROR. SQLite has no connection to lose.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from django_tasks_coord import queue, scheduling
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import HealthCheck, Owner, Task
from django_tasks_coord.scheduling import JOBS_TOPIC
from django_tasks_coord.topics import register_internal_topic
from tests.processes import ROOT, reap, subprocess_env, wait_for
from tests.servers import PrivateMariaDB, PrivatePostgres, migrated_on, terminate_connections
from tests.testapp.models import Run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.multiprocess,
    pytest.mark.skipif(
        connection.vendor == "sqlite", reason="SQLite has no database connection to lose"
    ),
]

NODES = 3
SETTINGS = {
    "HEARTBEAT_FREQUENCY": 0.2,
    "POLL_INTERVAL": 0.2,
    "STATUS_INTERVAL": 0,
    "REAP_INTERVAL": 0.5,
    "RETENTION_INTERVAL": 1,
}
RECORD = "tests.testapp.job_functions.record"
FENCED_RECORD = "tests.testapp.job_functions.fenced_record"


#: Seconds the private server stays down in the restart case (a longer outage by hand:
#: ``TASKS_COORD_TEST_OUTAGE=30``; the fault suite, benchmarks/faults.py, measures it).
OUTAGE = float(os.environ.get("TASKS_COORD_TEST_OUTAGE", "1.0"))


@pytest.fixture
def private_server(transactional_db):
    """Point this test's connection (and the nodes it starts) at a server of its own
    (PostgreSQL, or MariaDB on MySQL/MariaDB runs) that it may restart."""
    if connection.vendor == "mysql" and not os.environ.get("TASKS_COORD_TEST_MARIADB_RESTART"):
        # A private mariadbd costs ~20 s more than the PostgreSQL one (mariadb-install-db):
        # by hand (TASKS_COORD_TEST_MARIADB_RESTART=1) and in benchmarks/faults.py.
        pytest.skip("the MariaDB restart runs with TASKS_COORD_TEST_MARIADB_RESTART=1")
    kind = PrivatePostgres if connection.vendor == "postgresql" else PrivateMariaDB
    try:
        server = kind()
    except (FileNotFoundError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"no private {kind.__name__} server can be started here: {exc}")
    with migrated_on(server, "tasks_coord_restart"):
        yield server


def start_node(log: Path) -> subprocess.Popen[str]:
    """A node on the steady queue, Django tasks' default queue and the jobs topic, logging
    to ``log`` (a file: a pipe nobody reads could fill up and freeze the node)."""
    import json

    topics = ["--topic", "steady", "--topic", "default", "--topic", JOBS_TOPIC, "--group", "g"]
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "django", "runscheduler", *topics, "--workers", "4"],
            cwd=ROOT,
            env=subprocess_env(TASKS_COORD_JSON=json.dumps(SETTINGS)),
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )


def push_work(prefix: str, tasks: int, django_tasks: int, sleep: float = 0.01) -> None:
    from tests.backends import tasks as task_functions

    queue.push_many("steady", [(f"{prefix}{i}", {"sleep": sleep}) for i in range(tasks)])
    for i in range(django_tasks):
        task_functions.patient.enqueue(f"{prefix}{i}")


def unfinished() -> int:
    """Queue tasks and Django tasks not finished yet."""
    return Task.objects.filter(topic_id__in=["steady", "default"], state__lt=40).count()


def ticks_since(moment, job: str = "tick") -> int:
    return Run.objects.filter(identifier=job, slot__gte=moment).count()


def expected_lines() -> list[tuple[str, str]]:
    """What a node logs about the outage: one WARNING, one INFO; an outage longer than the
    liveness interval (30 s) also declares every node dead: a WARNING each, as it registers
    again."""
    if OUTAGE < 30.0:
        return [("WARNING", "lost"), ("INFO", "back")]
    return [("WARNING", "lost"), ("WARNING", "declared dead"), ("INFO", "back")]


def outage_lines(text: str) -> list[tuple[str, str]]:
    """The WARNING and INFO lines a node logged about the database's outage (logger
    ``django_tasks_coord.db``, and the retries of tasks that failed because of it)."""
    found = []
    for line in text.splitlines():
        match = re.match(r"\S+ \S+ (WARNING|INFO|ERROR) (\S+): (.*)", line)
        if match is None:
            continue
        level, logger, message = match.groups()
        if logger == "django_tasks_coord.db":
            found.append((level, "back" if "answers again," in message else "lost"))
        elif "may have been declared dead" in message:
            found.append((level, "declared dead"))
        elif "failed (attempt" in message and level != "INFO":
            found.append((level, message))  # a retry is part of the outage: INFO
    return found


@pytest.mark.parametrize("outage", ["terminate", "restart"])
def test_a_database_outage_stops_no_node_and_loses_no_work(outage, request, tmp_path):
    server = request.getfixturevalue("private_server") if outage == "restart" else None
    for topic in ("steady", "default"):
        queue.register_topic(topic)
    register_internal_topic(JOBS_TOPIC)
    push_work("before-", 300, 10)
    start = (timezone.now() + timedelta(seconds=1)).replace(microsecond=0)
    scheduling.schedule_recurring(RECORD, 1, start_time=start, job_id="tick")
    scheduling.schedule_recurring(
        FENCED_RECORD, 1, start_time=start, group="g", leader_only=True, job_id="lead"
    )
    logs = tmp_path
    nodes = [start_node(logs / f"node{i}.log") for i in range(NODES)]
    try:
        # Started for good (start-up itself is not retried): registered and in the group.
        wait_for(lambda: Owner.objects.count() == NODES, timeout=60)
        wait_for(lambda: HealthCheck.objects.filter(group_id="g").count() == NODES, timeout=60)
        wait_for(lambda: Run.objects.filter(topic="steady").count() >= 50, timeout=60)
        wait_for(lambda: ticks_since(start) >= 2 and ticks_since(start, "lead") >= 2, timeout=60)
        # The outage comes while work is in flight: a batch pushed now, some of it claimed
        # (the first batch may be drained by now on a fast machine).
        push_work("during-", 200, 0, sleep=0.05)
        wait_for(lambda: Run.objects.filter(identifier__startswith="during-").exists())
        assert unfinished() > 0, "the outage must come while work is in flight"

        if server is not None:
            connection.close()
            back = server.restart(down=OUTAGE)
        else:
            with connection.cursor() as cursor:
                assert terminate_connections(cursor, connection.vendor) >= NODES
            back = time.monotonic()
        back_at = timezone.now()

        push_work("after-", 100, 5)  # new work is picked up too
        wait_for(lambda: not unfinished(), timeout=120)
        recovered = time.monotonic() - back
        later = back_at + timedelta(seconds=1)
        wait_for(lambda: ticks_since(later) >= 3 and ticks_since(later, "lead") >= 3, timeout=60)
        assert [node.poll() for node in nodes] == [None] * NODES, "a node exited"
    finally:
        for node in nodes:
            reap(node, signal.SIGTERM)
    output = {path.name: path.read_text() for path in sorted(logs.iterdir())}
    assert [node.returncode for node in nodes] == [0] * NODES, output
    states = Task.objects.filter(topic_id__in=["steady", "default"]).values_list("state", flat=True)
    assert set(states) == {TaskState.SUCCEEDED}  # nothing failed, nothing left ACTIVE
    assert Task.objects.filter(topic_id="steady").count() == 600
    assert Task.objects.filter(topic_id="default").count() == 15
    for job in ("tick", "lead"):
        submitted = list(Task.objects.filter(identifier=job).values_list("slot", flat=True))
        assert len(submitted) == len(set(submitted)), job  # each slot submitted once
        if OUTAGE < 30.0:  # shorter than LIVENESS_INTERVAL: no node was declared dead...
            slots = list(Run.objects.filter(identifier=job).values_list("slot", flat=True))
            assert len(slots) == len(set(slots)), job  # ...so no slot ran twice
    errors = [line for text in output.values() for line in text.splitlines() if " ERROR " in line]
    assert not errors, "\n".join(errors)
    # The outage costs each node one WARNING and one INFO, not a line per loop and try.
    for name, text in output.items():
        assert sorted(outage_lines(text)) == sorted(expected_lines()), (name, text)
    print(f"{outage}: all work done {recovered:.1f}s after the database was back")
    print(f"{outage}: tasks finished per second around it: {per_second(back_at)}")


def per_second(back_at) -> dict[int, int]:
    """Queue tasks finished in each second from 3 s before ``back_at`` to 5 s after it."""
    counts: dict[int, int] = {}
    for finished in Task.objects.filter(topic_id="steady").values_list("finished_at", flat=True):
        second = int((finished - back_at).total_seconds() // 1)
        if -3 <= second <= 5:
            counts[second] = counts.get(second, 0) + 1
    return dict(sorted(counts.items()))
