"""``manage.py tasks_coord_health``: exit codes from the heartbeat's age and the database,
in-process and as a probe next to a real ``runscheduler``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings

from django_tasks_coord import db, health, owners
from django_tasks_coord.exceptions import InvalidArgumentError
from django_tasks_coord.health import Status
from django_tasks_coord.models import Owner
from tests.processes import ROOT, reap, runscheduler, subprocess_env, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

HOST = socket.gethostname()


def probe(*args: str) -> tuple[int, str]:
    """Run the command in-process: (exit status, the line it printed)."""
    out = StringIO()
    try:
        call_command("tasks_coord_health", *args, stdout=out)
    except CommandError as exc:
        return exc.returncode, str(exc)
    return 0, out.getvalue().strip()


def age_heartbeat(name: str, seconds: float) -> None:
    Owner.objects.filter(name=name).update(heartbeat=db.ago(timedelta(seconds=seconds)))


def dead_pid() -> int:
    """The id of a process that has exited (and was reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_fresh_heartbeat_is_healthy():
    owners.register_owner("n1")
    code, line = probe("--node-id", "n1")
    assert code == 0
    assert line.startswith("healthy: node 'n1': last heartbeat ")


def test_quiet_when_healthy_with_verbosity_0():
    owners.register_owner("n1")
    out = StringIO()
    call_command("tasks_coord_health", "--node-id", "n1", verbosity=0, stdout=out)
    assert out.getvalue() == ""


def test_a_heartbeat_older_than_the_liveness_interval_is_stale():
    owners.register_owner("n1")
    with override_settings(TASKS_COORD={"LIVENESS_INTERVAL": 30}):
        age_heartbeat("n1", 40)
        code, line = probe("--node-id", "n1")
        assert code == Status.STALE_HEARTBEAT == 5
        assert "unhealthy: node 'n1': last heartbeat 4" in line
        assert "more than 30s" in line
        age_heartbeat("n1", 20)
        assert probe("--node-id", "n1")[0] == 0


def test_max_age_overrides_the_liveness_interval():
    owners.register_owner("n1")
    age_heartbeat("n1", 10)
    assert probe("--node-id", "n1", "--max-age", "5")[0] == Status.STALE_HEARTBEAT
    assert probe("--node-id", "n1", "--max-age", "20")[0] == 0


def test_an_unknown_node_is_not_registered():
    code, line = probe("--node-id", "nobody")
    assert code == Status.NOT_REGISTERED == 4
    assert (
        line
        == "unhealthy: node 'nobody' is not registered (not started, stopped, or declared dead)"
    )


def test_the_node_id_setting_names_the_node():
    owners.register_owner("from-settings")
    with override_settings(TASKS_COORD={"NODE_ID": "from-settings"}):
        assert probe()[0] == 0
    with override_settings(TASKS_COORD={"NODE_ID": "other"}):
        assert probe()[0] == Status.NOT_REGISTERED


def test_without_a_node_id_the_live_process_of_this_host_is_found():
    owners.register_owner("old", host=HOST, pid=dead_pid())  # left by an exited process
    owners.register_owner("elsewhere", host="another-host", pid=os.getpid())
    owners.register_owner("me", host=HOST, pid=os.getpid())
    code, line = probe()
    assert code == 0
    assert "node 'me'" in line


def test_only_owners_of_exited_processes_mean_not_registered():
    owners.register_owner("old", host=HOST, pid=dead_pid())
    code, line = probe()
    assert code == Status.NOT_REGISTERED
    assert "owners of exited processes: old" in line


def test_two_live_nodes_on_this_host_are_ambiguous_unless_one_is_named():
    owners.register_owner("a", host=HOST, pid=os.getpid())
    owners.register_owner("b", host=HOST, pid=os.getppid())
    code, line = probe()
    assert code == Status.AMBIGUOUS == 6
    assert "--node-id" in line
    assert probe("--pid", str(os.getppid()))[1].startswith("healthy: node 'b'")
    assert probe("--node-id", "a")[0] == 0


def test_bad_flags_are_refused():
    with pytest.raises(CommandError, match="must be more than 0"):
        call_command("tasks_coord_health", "--max-age", "0")
    with pytest.raises(CommandError, match="is not a process id"):
        call_command("tasks_coord_health", "--pid", "x")
    with pytest.raises(InvalidArgumentError):
        health.check("n1", max_age=-1)


def test_bad_settings_exit_1():
    with override_settings(TASKS_COORD={"LIVENES_INTERVAL": 3}):
        code, line = probe("--node-id", "n1")
    assert code == 1
    assert "Unknown TASKS_COORD key(s): LIVENES_INTERVAL" in line


def test_the_service_reports_without_raising():
    owners.register_owner("n1")
    report = health.check("n1", max_age=timedelta(minutes=1))
    assert report.healthy
    assert report.node_id == "n1"
    assert report.age is not None and report.age >= 0


def run_probe(*args: str, database: dict | None = None, **settings: object) -> tuple[int, str]:
    """Run the command as a separate process, as a container probe does."""
    env = subprocess_env(TASKS_COORD_JSON=json.dumps(settings))
    if database is not None:
        env["TASKS_COORD_TEST_DB"] = json.dumps(database)
    proc = subprocess.run(
        [sys.executable, "-m", "django", "tasks_coord_health", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def test_an_unreachable_database_exits_3():
    database = json.loads(subprocess_env()["TASKS_COORD_TEST_DB"])
    if connection.vendor == "sqlite":
        database["NAME"] = str(ROOT / "no-such-directory" / "db.sqlite3")
    else:
        database.update(HOST="127.0.0.1", PORT="1")  # nothing listens there
        database.setdefault("OPTIONS", {})["connect_timeout"] = 5
    code, output = run_probe("--node-id", "n1", database=database)
    assert code == Status.DATABASE_UNAVAILABLE == 3, output
    assert output.startswith("CommandError: unhealthy: database unavailable: ")
    assert len(output.splitlines()) == 1


SETTINGS = {
    "HEARTBEAT_FREQUENCY": 0.2,
    "LIVENESS_INTERVAL": 3.0,
    "POLL_INTERVAL": 0.1,
    "STATUS_INTERVAL": 0,
    "SHUTDOWN_MAX_WAIT": 2,
}


@pytest.mark.multiprocess
def test_a_probe_next_to_a_real_runscheduler():
    node = runscheduler("--node-id", "probed", "--topic", "none", settings=SETTINGS)
    try:
        wait_for(lambda: Owner.objects.filter(name="probed").exists(), timeout=60)
        assert run_probe("--node-id", "probed")[0] == 0
        code, output = run_probe()  # found by this host's name and the node's process id
        assert code == 0, output
        assert output == f"healthy: node 'probed': last heartbeat {output.split()[-2]} ago"
        assert run_probe(**{"NODE_ID": "probed"})[0] == 0
        assert Owner.objects.get(name="probed").pid == node.pid

        node.send_signal(signal.SIGKILL)  # no graceful stop: the row stays, the heartbeat ages
        reap(node)

        def stale() -> bool:
            """the dead node's heartbeat is older than 0.5s"""
            return run_probe("--node-id", "probed", "--max-age", "0.5")[0] == 5

        wait_for(stale, timeout=60)
        code, output = run_probe()  # its process is gone: nothing runs on this host
        assert code == Status.NOT_REGISTERED, output
        assert "owners of exited processes: probed" in output
    finally:
        reap(node, signal.SIGKILL)


@pytest.mark.multiprocess
def test_a_gracefully_stopped_node_is_not_registered():
    node = runscheduler("--node-id", "stopping", "--topic", "none", settings=SETTINGS)
    try:
        wait_for(lambda: Owner.objects.filter(name="stopping").exists(), timeout=60)
        reap(node, signal.SIGTERM)
        assert node.returncode == 0
        code, output = run_probe("--node-id", "stopping")
        assert code == Status.NOT_REGISTERED, output
    finally:
        reap(node, signal.SIGKILL)


def test_with_a_pid_other_live_nodes_are_not_called_exited():
    owners.register_owner("live", host=HOST, pid=os.getpid())
    owners.register_owner("old", host=HOST, pid=dead_pid())
    code, line = probe("--pid", str(dead_pid()))
    assert code == Status.NOT_REGISTERED
    assert line.endswith(
        "registered (nodes of other running processes: live; owners of exited processes: old)"
    )
