"""The README's demo command, run as a new user would: ``./run demo``.

It runs against this test run's database (``DATABASE_URL``, so SQLite, PostgreSQL or
MariaDB as the tox environment says). The test waits until the demo has processed work of
every kind, checking the database, then presses Ctrl-C (SIGINT to the demo's process group,
as a terminal does) and checks that everything stopped cleanly: exit status 0, no process of
the demo left, nodes unregistered, the group's token released.

``./run demo`` installs the project into ``.venv`` first (as the README says), so the test
runs once per database: on Python 3.12 with Django 6.x (the tox environments
``py312-dj61-{sqlite,postgres,mysql}``, or pytest from ``.venv``).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from urllib.parse import quote

import django
import pytest
from django.db import connection

from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import HealthCheck, Owner, PeriodicTask, Task, TokenHolder
from django_tasks_coord.scheduling import JOBS_TOPIC
from tests.processes import ROOT, wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.multiprocess,
    pytest.mark.skipif(
        sys.version_info[:2] != (3, 12) or django.VERSION < (6, 0),
        reason="runs once per database: on Python 3.12 with Django 6 (./run demo uses .venv)",
    ),
]

NODES = {"demo-a", "demo-b"}
SUCCEEDED = TaskState.SUCCEEDED


def database_url() -> str:
    """This test run's database as a DATABASE_URL for the demo."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    scheme = {"postgresql": "postgres", "mysql": "mysql"}[connection.vendor]
    credentials = quote(db["USER"] or "", safe="")
    if db["PASSWORD"]:
        credentials += ":" + quote(db["PASSWORD"], safe="")
    at = f"{credentials}@" if credentials else ""
    port = f":{db['PORT']}" if db["PORT"] else ""
    return f"{scheme}://{at}{db['HOST'] or 'localhost'}{port}/{db['NAME']}"


class Demo:
    """``./run demo`` in a session of its own, its output collected by a thread."""

    def __init__(self) -> None:
        env = {**os.environ, "DATABASE_URL": database_url()}
        for name in ("DJANGO_SETTINGS_MODULE", "TASKS_COORD_JSON", "TASKS_COORD_TEST_DB"):
            env.pop(name, None)
        self.proc = subprocess.Popen(
            ["./run", "demo"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group, like a job in a terminal
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def find(self, pattern: str) -> re.Match[str] | None:
        return next((m for line in list(self.lines) if (m := re.search(pattern, line))), None)

    def ctrl_c(self) -> None:
        """What a terminal does on Ctrl-C: SIGINT to the foreground process group."""
        os.killpg(self.proc.pid, signal.SIGINT)

    def kill(self) -> None:
        """After a failure: kill the demo and the children it started (still ours then)."""
        if self.proc.poll() is not None:
            return
        children = self.pids().values()
        os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait()

    def pids(self) -> dict[str, int]:
        """The demo's children, as its banner lists them."""
        found = self.find(r"Processes: (.*)")
        if found is None:
            return {}
        return {
            name: int(pid) for name, pid in re.findall(r"([\w-]+) \(pid (\d+)\)", found.group(1))
        }


@pytest.fixture
def demo() -> Iterator[Demo]:
    running = Demo()
    try:
        yield running
    finally:
        running.kill()
        running.reader.join(timeout=10)
        running.proc.stdout.close()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status


def test_the_demo_processes_work_of_every_kind_and_stops_cleanly_on_ctrl_c(demo):
    def started():
        """the demo printed its banner (./run installs the project first)"""
        assert demo.proc.poll() is None, demo.output
        return demo.find(r"Admin: +(http://\S+)")

    admin = wait_for(started, timeout=300, interval=0.2).group(1)
    pids = demo.pids()
    assert set(pids) == {*NODES, "web", "executor"}, demo.output

    def done(check):
        def predicate():
            assert demo.proc.poll() is None, demo.output
            return check()

        predicate.__doc__ = check.__doc__
        wait_for(predicate, timeout=90, interval=0.5)

    def consumer():
        """a task of the 'emails' topic succeeded (the consumer ran)"""
        return Task.objects.filter(topic_id="emails", state=SUCCEEDED).exists()

    def calendar_job():
        """a run of the calendar job 'demo-feed' succeeded"""
        return Task.objects.filter(
            topic_id=JOBS_TOPIC, identifier="demo-feed", state=SUCCEEDED
        ).exists()

    def recurring_job():
        """the recurring job 'demo-countdown' ran its max_count of 5 runs and finished"""
        runs = Task.objects.filter(identifier="demo-countdown", state=SUCCEEDED).count()
        job = PeriodicTask.objects.get(id="demo-countdown")
        return runs == 5 and job.run_count == 5 and job.finished_at is not None

    def django_task():
        """a Django @task (demo.tasks.word_count) finished successfully"""
        return Task.objects.filter(
            topic_id="default", handler="demo.tasks.word_count", state=SUCCEEDED
        ).exists()

    def group():
        """group 'demo' has two members and a leader, whose leader-only job ran fenced"""
        holder = TokenHolder.objects.filter(group_id="demo").first()
        members = set(HealthCheck.objects.filter(group_id="demo").values_list("task_id", flat=True))
        ledger = Task.objects.filter(
            identifier="demo-ledger", state=SUCCEEDED, message__startswith="closed by demo-"
        )
        return holder is not None and holder.task_id in NODES and members == NODES and ledger

    def executor():
        """the external executor completed a 'demo/thumbnail' task over HTTP"""
        return Task.objects.filter(topic_id="demo/thumbnail", state=SUCCEEDED).exists()

    for check in (consumer, calendar_job, recurring_job, django_task, group, executor):
        done(check)
    thumbnail = Task.objects.filter(topic_id="demo/thumbnail", state=SUCCEEDED).first()
    assert thumbnail.result["thumbnail"].startswith(thumbnail.payload["image"])

    # The admin answers at the printed address, its CSS included (served under ASGI).
    base = admin.removesuffix("/admin/")
    assert get(f"{admin}login/") == 200
    assert get(f"{base}/static/admin/css/base.css") == 200

    demo.ctrl_c()
    try:
        demo.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the demo did not stop within 60 s of Ctrl-C:\n{demo.output}")
    demo.reader.join(timeout=10)
    assert demo.proc.returncode == 0, demo.output
    assert "every process exited cleanly" in demo.output, demo.output
    deadline = time.monotonic() + 5  # the pids were reaped by the demo; none may linger
    while any(alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [name for name, pid in pids.items() if alive(pid)], demo.output
    assert not Owner.objects.filter(name__in=NODES).exists()  # both nodes unregistered
    assert TokenHolder.objects.get(group_id="demo").task_id == ""  # the leader let go
