"""A node frozen (SIGSTOP) past its liveness interval is declared dead; once it resumes
(SIGCONT) it starts nothing it had claimed or buffered before, registers again and goes on
working. Real runscheduler nodes on PostgreSQL and MariaDB (SQLite runs one node)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from django.db import connection
from django.db.models import Count, Max
from django.utils import timezone

from django_tasks_coord import queue, scheduling, topics
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Owner, Task
from django_tasks_coord.scheduling import JOBS_TOPIC
from tests.processes import ROOT, reap, runscheduler, stopped, subprocess_env, wait_for
from tests.testapp.models import Run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.multiprocess,
    pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite runs one node"),
]

LIVENESS = 3.0
SETTINGS = {
    "HEARTBEAT_FREQUENCY": 0.2,
    "LIVENESS_INTERVAL": LIVENESS,
    "POLL_INTERVAL": 0.1,
    "REAP_INTERVAL": 0.3,
    "STATUS_INTERVAL": 0,
    "SHUTDOWN_MAX_WAIT": 2,
    "WORKERS": 2,
    "BUFFER": 8,
}
TICK = "tests.testapp.job_functions.record"


def duplicates(since: datetime, zombie_pid: int) -> list[tuple[str, str]]:
    """Runs started twice, except a run the zombie had started before it froze at ``since``
    (at least once: another node runs it again, unavoidably)."""
    found = []
    for topic, keys in (("work", ("identifier",)), ("jobs", ("identifier", "slot"))):
        twice = (
            Run.objects.filter(topic=topic)
            .values(*keys)
            .annotate(n=Count("id"))
            .filter(n__gt=1)
            .values(*keys)
        )
        for values in twice:
            runs = Run.objects.filter(topic=topic, **values)
            interrupted = runs.filter(pid=zombie_pid, started_at__lt=since).count()
            if runs.count() - min(interrupted, 1) > 1:
                found.append((topic, values))
    return found


def test_a_resumed_zombie_starts_nothing_it_held_and_registers_again(work_topic):
    topics.register_internal_topic(JOBS_TOPIC)
    queue.push_many("work", [(f"t{i}", {"sleep": 0.25}) for i in range(160)])
    for job in range(4):  # runs of several jobs wait in the nodes' buffers at once
        scheduling.schedule_recurring(TICK, 1, job_id=f"tick{job}", kwargs={"sleep": 0.3})
    nodes = {
        name: runscheduler("--node-id", name, "--topic", "work", "--topic", JOBS_TOPIC,
                           settings=SETTINGS)
        for name in ("zombie", "a", "b")
    }  # fmt: skip
    zombie = nodes["zombie"]
    try:
        # Frozen with work in flight: running, and buffered beyond its two workers.
        wait_for(
            lambda: Task.objects.filter(owner__name="zombie", state=TaskState.ACTIVE).count() > 3,
            timeout=60,
        )
        old_owner = Owner.objects.get(name="zombie").pk
        os.kill(zombie.pid, signal.SIGSTOP)
        wait_for(lambda: stopped(zombie.pid))
        frozen_at = timezone.now()
        try:
            # Declared dead: its row is gone and its tasks went to the others.
            wait_for(lambda: not Owner.objects.filter(pk=old_owner).exists(), timeout=60)
            wait_for(lambda: Run.objects.filter(started_at__gt=frozen_at).count() >= 6, timeout=60)
        finally:
            os.kill(zombie.pid, signal.SIGCONT)
        resumed_at = timezone.now()
        # It registers again (a new owner row) instead of exiting...
        wait_for(lambda: Owner.objects.filter(name="zombie").exists(), timeout=60)
        assert zombie.poll() is None, reap(zombie)
        assert Owner.objects.get(name="zombie").pk != old_owner
        wait_for(
            lambda: Task.objects.filter(topic_id="work", state=TaskState.SUCCEEDED).count() == 160,
            timeout=120,
        )
        # ...and goes on working: alone now, it runs new tasks and the job's next slots.
        for name in ("a", "b"):
            reap(nodes.pop(name), signal.SIGTERM)
        queue.push_many("work", [(f"after{i}", {}) for i in range(5)])
        wait_for(
            lambda: Run.objects.filter(pid=zombie.pid, identifier__startswith="after").count() == 5,
            timeout=60,
        )
        wait_for(
            lambda: Run.objects.filter(pid=zombie.pid, topic="jobs", started_at__gt=resumed_at)
            .exists(),
            timeout=60,
        )  # fmt: skip
    finally:
        outputs = {name: reap(proc, signal.SIGTERM) for name, proc in nodes.items()}
    assert zombie.returncode == 0, outputs["zombie"]
    assert "registered again" in outputs["zombie"][0] + outputs["zombie"][1]
    assert duplicates(frozen_at, zombie.pid) == []
    # Every task completed exactly once, none left behind.
    assert Run.objects.filter(topic="work").values("identifier").distinct().count() == 165
    assert not Task.objects.filter(topic_id="work").exclude(state=TaskState.SUCCEEDED).exists()


FENCED = "tests.testapp.job_functions.fenced_record"


def logged_node(name: str, log: Path, settings: dict[str, object]) -> subprocess.Popen[str]:
    """A node of group ``g`` only, logging to the file ``log``."""
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "django", "runscheduler", "--node-id", name, "--group", "g"],
            cwd=ROOT,
            env=subprocess_env(TASKS_COORD_JSON=json.dumps(settings)),
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )


@pytest.mark.skipif(
    connection.vendor == "mysql" and not os.environ.get("TASKS_COORD_TEST_MARIADB_KILLS"),
    reason="27 s on MariaDB: by hand (TASKS_COORD_TEST_MARIADB_KILLS=1), over the CI budget",
)
def test_a_leader_frozen_in_a_run_commits_nothing_once_declared_dead(transactional_db, tmp_path):
    """The leader freezes inside a leader-only run, before its fenced commit; it is declared
    dead and a standby takes over. Once it resumes, the run's fenced commit is refused: no
    effect under its old term after it was declared dead, each slot's effect at most once."""
    scheduling.schedule_recurring(
        FENCED, 2, job_id="lead", group="g", leader_only=True, kwargs={"sleep": 1.5}
    )
    settings = {**SETTINGS, "WORKERS": 1, "BUFFER": 1}
    log = tmp_path / "zombie.log"
    leader = logged_node("zombie", log, settings)
    nodes = {"zombie": leader}
    try:
        wait_for(lambda: Run.objects.filter(topic="leader", node="zombie").exists(), timeout=60)
        nodes["standby"] = logged_node("standby", tmp_path / "standby.log", settings)
        wait_for(lambda: Owner.objects.filter(name="standby").exists(), timeout=60)
        old_term = Run.objects.filter(topic="leader", node="zombie").aggregate(t=Max("term"))["t"]
        done = Run.objects.filter(topic="leader").count()
        # Frozen inside the next run (claimed at once: its only worker is free), before the
        # fenced block at its end.
        wait_for(lambda: Run.objects.filter(topic="leader").count() > done, timeout=60)
        wait_for(
            lambda: Task.objects.filter(
                owner__name="zombie", state=TaskState.ACTIVE, identifier="lead"
            ).exists(),
            timeout=60,
            interval=0.01,
        )
        time.sleep(0.4)  # into the run's 1.5 s (claimed is not started yet), not a condition
        old_owner = Owner.objects.get(name="zombie").pk
        os.kill(leader.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: not Owner.objects.filter(pk=old_owner).exists(), timeout=60)
            declared_dead_at = timezone.now()
            wait_for(lambda: Run.objects.filter(topic="leader", node="standby").exists(), 60)
        finally:
            os.kill(leader.pid, signal.SIGCONT)
        # Its run goes on to its fenced block, which must be refused (the run not completed).
        late = Run.objects.filter(
            topic="leader", node="zombie", term=old_term, started_at__gt=declared_dead_at
        )
        wait_for(lambda: "Not completing" in log.read_text() or late.exists(), timeout=60)
    finally:
        for proc in nodes.values():
            reap(proc, signal.SIGTERM)
    assert not late.exists(), log.read_text()
    fenced = list(Run.objects.filter(topic="leader").values_list("slot", flat=True))
    assert len(fenced) == len(set(fenced))
