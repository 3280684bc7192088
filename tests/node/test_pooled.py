"""Nodes behind PgBouncer in transaction mode, and the LISTEN connection's own alias.

Real ``runscheduler`` processes whose ``default`` alias goes through a real PgBouncer
(:mod:`tests.pgbouncer`, 3 server connections for every client) process tasks, periodic
and leader-only jobs. Woken by NOTIFY through a LISTEN connection of their own
(``LISTEN_DATABASE``, a direct alias), or in poll-only mode (``LISTEN_NOTIFY`` off) with
no LISTEN at all. PostgreSQL only: PgBouncer pools PostgreSQL connections.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from django_tasks_coord import queue, scheduling
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Task
from tests import pgbouncer
from tests.processes import ROOT, reap, start, subprocess_env, wait_for
from tests.testapp.models import Run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.multiprocess,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PgBouncer pools PostgreSQL"),
]

RECORD = "tests.testapp.job_functions.record"
FENCED = "tests.testapp.job_functions.fenced_record"
#: The LISTEN connection's alias, told apart in pg_stat_activity by its application_name.
LISTEN_APP = "tasks-coord-listen"
#: Slow polls: a task that starts within a few seconds was woken by NOTIFY, not by a poll.
SLOW_POLLS = {"POLL_INTERVAL": 30.0, "MAX_POLL_INTERVAL": 30.0, "NOTIFIED_POLL_INTERVAL": 60.0}
BASE = {"HEARTBEAT_FREQUENCY": 0.5, "STATUS_INTERVAL": 0, "REAP_INTERVAL": 1.0}


def _settings() -> dict[str, Any]:
    keys = ("ENGINE", "NAME", "USER", "PASSWORD", "HOST", "PORT", "OPTIONS")
    settings = {key: connection.settings_dict[key] for key in keys}
    settings["NAME"] = str(settings["NAME"])
    return settings


def _direct(application_name: str) -> dict[str, Any]:
    direct = _settings()
    direct["OPTIONS"] = {**direct["OPTIONS"], "application_name": application_name}
    return direct


def node_env(
    bouncer: pgbouncer.PgBouncer,
    settings: dict[str, Any],
    extra_databases: dict[str, Any] | None = None,
) -> dict[str, str]:
    """Environment of a subprocess whose ``default`` alias goes through ``bouncer``."""
    return {
        "TASKS_COORD_TEST_DB": json.dumps(bouncer.database(_settings())),
        "TASKS_COORD_EXTRA_DATABASES": json.dumps(extra_databases or {}),
        "TASKS_COORD_JSON": json.dumps(settings),
    }


def listening(application_name: str | None = None) -> list[str]:
    """The application names of the sessions LISTENing on the test database."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT application_name FROM pg_stat_activity "
            "WHERE datname = current_database() AND query LIKE 'LISTEN %%'"
        )
        names = [row[0] for row in cursor.fetchall()]
    return [n for n in names if application_name is None or n == application_name]


def push_through(bouncer: pgbouncer.PgBouncer, identifiers: list[str]) -> None:
    """Push ``work`` tasks from another process, through PgBouncer (as a web process would)."""
    code = (
        "import sys, django; django.setup()\n"
        "from django_tasks_coord import queue\n"
        "queue.push_many('work', [(i, {}) for i in sys.argv[1:]])\n"
    )
    env = subprocess_env(**node_env(bouncer, {}))
    subprocess.run(
        [sys.executable, "-c", code, *identifiers], cwd=ROOT, env=env, check=True, timeout=120
    )


def done(identifiers: list[str]) -> bool:
    """Whether every task of ``identifiers`` succeeded."""
    succeeded = Task.objects.filter(
        topic_id="work", identifier__in=identifiers, state=TaskState.SUCCEEDED
    ).count()
    return succeeded == len(identifiers)


def assert_each_ran_once(identifiers: list[str]) -> None:
    runs = Counter(
        Run.objects.filter(topic="work", identifier__in=identifiers).values_list(
            "identifier", flat=True
        )
    )
    assert runs == Counter(identifiers)


def stop(proc: subprocess.Popen[str]) -> str:
    """SIGTERM the node; it must exit cleanly, having logged no error.

    Called in a ``finally``: while a failure is raised already, the node is killed and
    its output printed instead, so that the first failure is the one reported.
    """
    if sys.exc_info()[0] is not None:
        out, err = reap(proc, signal.SIGKILL)
        print(err + out)
        return err + out
    out, err = reap(proc, signal.SIGTERM)
    assert proc.returncode == 0, err + out
    assert "ERROR" not in err + out and "Traceback" not in err + out, err + out
    return err + out


@pytest.fixture
def jobs(transactional_db: None) -> None:
    queue.register_topic("work")
    now = timezone.now()
    scheduling.schedule_recurring(RECORD, 1, start_time=now, job_id="tick")
    scheduling.schedule_recurring(
        FENCED, 1, start_time=now, group="g", leader_only=True, job_id="lead"
    )


def ran(job_id: str, count: int) -> bool:
    return Run.objects.filter(identifier=job_id).count() >= count


def test_a_node_through_pgbouncer_listens_directly_and_runs_tasks_and_jobs(jobs: None) -> None:
    with pgbouncer.start(_settings(), pool_mode="transaction", pool_size=3) as bouncer:
        settings = {**BASE, **SLOW_POLLS, "LISTEN_DATABASE": "direct"}
        env = node_env(bouncer, settings, {"direct": _direct(LISTEN_APP)})
        proc = start("django", "runscheduler", "--group", "g", **env)
        try:
            wait_for(lambda: listening(LISTEN_APP), timeout=60)
            first = [f"a{i}" for i in range(200)]
            queue.push_many("work", [(i, {}) for i in first])  # NOTIFY from a direct session
            wait_for(lambda: done(first), timeout=20)  # woken, not polled (30 s)
            second = [f"b{i}" for i in range(50)]
            push_through(bouncer, second)  # NOTIFY sent through the pooler wakes it too
            wait_for(lambda: done(second), timeout=20)
            wait_for(lambda: ran("tick", 3) and ran("lead", 3), timeout=60)
            clients = [c for c in bouncer.show("CLIENTS") if c["database"] == _settings()["NAME"]]
            pools = [p for p in bouncer.show("POOLS") if p["database"] == _settings()["NAME"]]
            # only the LISTEN connection is direct: nothing LISTENs through the pooler
            assert listening() == [LISTEN_APP]
        finally:
            log = stop(proc)
    assert_each_ran_once(first + second)
    assert len(clients) >= 4  # the node's threads each hold a client connection...
    servers = sum(p["sv_active"] + p["sv_idle"] + p["sv_used"] for p in pools)
    assert servers <= 3  # ...served by at most the pool's 3 server connections
    leader_runs = Run.objects.filter(topic="leader", identifier="lead")
    assert leader_runs.exclude(term=None).count() == leader_runs.count() >= 3
    print(  # the figures of the closing note (pytest -s)
        f"\npgbouncer transaction mode: {len(clients)} client connections of the node on "
        f"{servers} server connections; {len(first) + len(second)} tasks, "
        f"{Run.objects.filter(identifier='tick').count()} periodic and "
        f"{leader_runs.count()} leader-only runs; log lines: {len(log.splitlines())}"
    )


def test_poll_only_mode_through_pgbouncer_needs_no_listen_at_all(jobs: None) -> None:
    with pgbouncer.start(_settings(), pool_mode="transaction", pool_size=3) as bouncer:
        settings = {**BASE, "LISTEN_NOTIFY": False, "POLL_INTERVAL": 0.2, "MAX_POLL_INTERVAL": 1}
        proc = start("django", "runscheduler", "--group", "g", **node_env(bouncer, settings))
        try:
            identifiers = [f"p{i}" for i in range(100)]
            push_through(bouncer, identifiers)
            listens: set[str] = set()

            def finished() -> bool:
                listens.update(listening())
                return done(identifiers) and ran("tick", 3) and ran("lead", 3)

            wait_for(finished, timeout=60)
        finally:
            stop(proc)
    assert listens == set()
    assert_each_ran_once(identifiers)


def test_without_listen_database_the_node_listens_on_its_own_alias(jobs: None) -> None:
    """Without PgBouncer: ``LISTEN_DATABASE`` unset, the LISTEN session is the app alias's
    (its application_name), so the setting above is what moved it."""
    settings = {**BASE, **SLOW_POLLS}
    env = {
        "TASKS_COORD_TEST_DB": json.dumps(_direct("tasks-coord-app")),
        "TASKS_COORD_JSON": json.dumps(settings),
    }
    proc = start("django", "runscheduler", "--topic", "work", **env)
    try:
        wait_for(lambda: listening("tasks-coord-app"), timeout=60)
        assert listening() == ["tasks-coord-app"]
        queue.push("work", identifier="x")
        wait_for(lambda: done(["x"]), timeout=20)
    finally:
        stop(proc)


def test_an_unreachable_listen_database_leaves_the_node_polling(jobs: None) -> None:
    """A LISTEN alias that does not answer costs latency, never work: one WARNING, polls."""
    unreachable = {**_settings(), "PORT": "1"}
    settings = {**BASE, "POLL_INTERVAL": 0.2, "MAX_POLL_INTERVAL": 1, "LISTEN_DATABASE": "off"}
    env = {
        "TASKS_COORD_EXTRA_DATABASES": json.dumps({"off": unreachable}),
        "TASKS_COORD_JSON": json.dumps(settings),
    }
    proc = start("django", "runscheduler", "--topic", "work", **env)
    identifiers = [f"u{i}" for i in range(20)]
    queue.push_many("work", [(i, {}) for i in identifiers])
    try:
        wait_for(lambda: done(identifiers), timeout=60)
        time.sleep(2)  # let the listener's back-off fail a few more times: still one WARNING
    finally:
        out, err = reap(proc, signal.SIGTERM)
    assert proc.returncode == 0, err + out
    warnings = [line for line in (err + out).splitlines() if "LISTEN" in line and "WARNING" in line]
    assert len(warnings) == 1, err + out
    assert_each_ran_once(identifiers)


def check_output(extra_databases: dict[str, Any], settings: dict[str, Any]) -> str:
    env = {
        "TASKS_COORD_EXTRA_DATABASES": json.dumps(extra_databases),
        "TASKS_COORD_JSON": json.dumps(settings),
    }
    proc = start("django", "check", "--database", "default", "--fail-level", "CRITICAL", **env)
    out, err = proc.communicate(timeout=120)
    return out + err


def test_the_listen_database_is_checked(transactional_db: None) -> None:
    other = {**_settings(), "NAME": "postgres"}  # the same server, another database
    lite = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
    databases = {"direct": _direct(LISTEN_APP), "other": other, "lite": lite}

    assert "tasks_coord." not in check_output(databases, {"LISTEN_DATABASE": "direct"})
    wrong = check_output(databases, {"LISTEN_DATABASE": "other"})
    assert "tasks_coord.W005" in wrong and "'postgres'" in wrong, wrong
    not_postgres = check_output(databases, {"LISTEN_DATABASE": "lite"})
    assert "tasks_coord.E003" in not_postgres and "must be a PostgreSQL alias" in not_postgres
    missing = check_output(databases, {"LISTEN_DATABASE": "nope"})
    assert "tasks_coord.E003" in missing and "'nope' must be None or an alias" in missing
