"""Workflows on real runscheduler nodes through a frozen node and a lost database connection.

- A node frozen (SIGSTOP) past LIVENESS_INTERVAL with workflows in progress, then resumed
  (SIGCONT), while another node runs: every workflow succeeds, every fan-in becomes one task
  that gets its parents' results, every step's fenced side effect commits once, and no step
  runs twice except a run the frozen node had started before it froze (at least once).
- The database lost for a few seconds while the nodes' advancers advance: the nodes reach it
  through a proxy (:class:`tests.servers.Proxy`) that closes every connection and refuses
  new ones meanwhile (the shared server is not touched): no node exits or loses a thread,
  no workflow is left behind, and each node logs the outage as one WARNING and one INFO,
  nothing else at WARNING or above.

The workflows are those of the SIGKILL run (``tests/workflows/chaos.py``: a root, 8 steps,
a fan-in). PostgreSQL and MariaDB (SQLite runs one node and has no connection to lose).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection
from django.db.models import Count
from django.utils import timezone

from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Owner, Task, Workflow, WorkflowState, WorkflowStep
from tests.processes import ROOT, reap, stopped, subprocess_env, wait_for
from tests.servers import Proxy
from tests.testapp.models import Run
from tests.workflows import chaos

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.multiprocess,
    pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite runs one node"),
]

WORKFLOWS = 12
#: Seconds the database is lost for.
OUTAGE = 3.0
DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306}


def start_node(
    name: str, log: Path, proxy: Proxy | None = None, **settings: float
) -> subprocess.Popen[str]:
    """A node on the chaos topic (``chaos.SETTINGS``, updated with ``settings``) logging to
    ``log`` (a pipe nobody reads could fill up), reaching the database through ``proxy`` if
    given."""
    env = {"TASKS_COORD_JSON": json.dumps({**chaos.SETTINGS, **settings})}
    if proxy is not None:
        through = {**json.loads(subprocess_env()["TASKS_COORD_TEST_DB"])}
        env["TASKS_COORD_TEST_DB"] = json.dumps(
            {**through, "HOST": "127.0.0.1", "PORT": str(proxy.port)}
        )
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "django", "runscheduler", "--node-id", name,
             "--topic", chaos.TOPIC],
            cwd=ROOT,
            env=subprocess_env(**env),
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip


def all_ended() -> bool:
    """Every workflow of the test ended."""
    return not Workflow.objects.filter(state=WorkflowState.RUNNING).exists()


def some_steps_done() -> bool:
    """The workflows are under way: roots done, fan-outs running."""
    return WorkflowStep.objects.filter(state="succeeded").count() >= WORKFLOWS


def check_workflows(ids: list[int]) -> None:
    """Every workflow succeeded; every fan-in one task with its 8 parents' results; every
    fenced side effect once."""
    assert set(Workflow.objects.filter(pk__in=ids).values_list("state", flat=True)) == {
        WorkflowState.SUCCEEDED
    }, list(WorkflowStep.objects.exclude(state="succeeded").values("name", "state", "message"))
    joins = Task.objects.filter(topic_id=chaos.TOPIC, identifier__endswith="-join")
    assert joins.count() == WORKFLOWS
    assert {len(payload["results"]) for payload in joins.values_list("payload", flat=True)} == {
        chaos.FAN_OUT
    }
    fenced = Run.objects.filter(topic="fenced").values("identifier").annotate(n=Count("id"))
    assert len(fenced) == WORKFLOWS * (chaos.FAN_OUT + 2)
    assert {row["n"] for row in fenced} == {1}


def test_a_frozen_node_resumed_loses_no_workflow_and_repeats_no_step(tmp_path):
    ids = chaos.start_workflows(WORKFLOWS, sleep=0.2)
    nodes = {name: start_node(name, tmp_path / f"{name}.log") for name in ("zombie", "a")}
    zombie = nodes["zombie"]
    try:
        wait_for(lambda: Owner.objects.count() == 2, timeout=60)
        wait_for(
            lambda: Task.objects.filter(owner__name="zombie", state=TaskState.ACTIVE).count() >= 2,
            timeout=60,
        )
        old_owner = Owner.objects.get(name="zombie").pk
        os.kill(zombie.pid, signal.SIGSTOP)
        wait_for(lambda: stopped(zombie.pid))
        frozen_at = timezone.now()
        try:  # declared dead by the other node, which goes on with the workflows
            # Its owner row goes, or, where the frozen node holds a task row locked in a
            # fenced handler's transaction, stays (with that task) while the others return.
            swept = "returned to the queue: its owner died"
            wait_for(
                lambda: (
                    not Owner.objects.filter(pk=old_owner).exists()
                    or swept in (tmp_path / "a.log").read_text()
                ),
                timeout=30,
            )
            wait_for(lambda: Run.objects.filter(started_at__gt=frozen_at).exists(), timeout=30)
        finally:
            os.kill(zombie.pid, signal.SIGCONT)
        wait_for(all_ended, timeout=60)
        wait_for(lambda: Owner.objects.filter(name="zombie").exists(), timeout=30)
    finally:
        for proc in nodes.values():
            reap(proc, signal.SIGTERM)
    logs = {name: (tmp_path / f"{name}.log").read_text() for name in nodes}
    assert [proc.returncode for proc in nodes.values()] == [0, 0], logs
    assert "registered again" in logs["zombie"]
    check_workflows(ids)
    # A step ran once, or twice when the zombie had started it before it froze.
    for identifier in (
        Run.objects.filter(topic=chaos.TOPIC)
        .values("identifier")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
        .values_list("identifier", flat=True)
    ):
        runs = Run.objects.filter(topic=chaos.TOPIC, identifier=identifier)
        cut_off = runs.filter(pid=zombie.pid, started_at__lt=frozen_at).count()
        assert runs.count() - min(cut_off, 1) == 1, list(runs.values("pid", "started_at"))


def outage_lines(log: str) -> list[tuple[str, str]]:
    """What a node logged at WARNING and above, and the database's return (INFO), with the
    lines of the outage (logger ``django_tasks_coord.db``) as "lost" and "back". A fenced
    handler whose transaction the outage rolled back is expected (its task is retried); one
    whose completion committed as the connection was cut is logged at INFO (the task is
    reported completed)."""
    found = []
    for line in log.splitlines():
        match = re.match(r"\S+ \S+ (INFO|WARNING|ERROR|CRITICAL) (\S+): (.*)", line)
        if match is None:
            continue
        level, logger, message = match.groups()
        if logger == "django_tasks_coord.db":
            found.append((level, "back" if "answers again," in message else "lost"))
        elif "that completion was rolled back with the handler's transaction" in message:
            continue  # a fenced handler's COMMIT lost with the connection: retried, as it says
        elif level != "INFO":
            found.append((level, message))
    return found


def test_a_database_lost_for_seconds_while_advancing_loses_no_workflow(tmp_path):
    ids = chaos.start_workflows(WORKFLOWS, sleep=0.2)
    settings = connection.settings_dict
    proxy = Proxy(
        settings["HOST"] or "127.0.0.1", int(settings["PORT"] or DEFAULT_PORTS[connection.vendor])
    )
    names = ("a", "b")
    nodes = {  # an outage shorter than the liveness interval: no node is declared dead
        name: start_node(name, tmp_path / f"{name}.log", proxy, LIVENESS_INTERVAL=OUTAGE + 5)
        for name in names
    }
    try:
        wait_for(lambda: Owner.objects.count() == 2, timeout=60)
        wait_for(some_steps_done, timeout=60)
        assert proxy.cut() >= 2 * 3  # each node's claims, heartbeat, advancer...
        try:
            assert not all_ended()  # nothing moves without the database
            time.sleep(OUTAGE)  # the outage: the nodes find no database for that long
        finally:
            proxy.restore()
        wait_for(all_ended, timeout=60)
        assert all(proc.poll() is None for proc in nodes.values())
    finally:
        for proc in nodes.values():
            reap(proc, signal.SIGTERM)
        proxy.close()
    logs = {name: (tmp_path / f"{name}.log").read_text() for name in names}
    assert [proc.returncode for proc in nodes.values()] == [0, 0], logs
    check_workflows(ids)
    for log in logs.values():
        assert "Traceback" not in log, log
        assert outage_lines(log) == [("WARNING", "lost"), ("INFO", "back")], log
