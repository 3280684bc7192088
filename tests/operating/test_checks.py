"""System checks: each id, its message, and when it stays quiet."""

from __future__ import annotations

import pytest
from django.apps import AppConfig
from django.core import checks as django_checks
from django.db import connections
from django.test import override_settings

from django_tasks_coord import checks, owners
from django_tasks_coord.models import JobKind, PeriodicTask

pytestmark = pytest.mark.django_db


def ids(messages) -> list[str]:
    return [message.id for message in messages]


def settings_errors(**values) -> list[str]:
    with override_settings(TASKS_COORD=values):
        messages = checks.check_settings()
    assert set(ids(messages)) <= {"tasks_coord.E003"}
    return [message.msg for message in messages]


def test_default_settings_pass():
    assert checks.check_settings() == []
    found = [m for m in django_checks.run_checks() if m.id.startswith("tasks_coord.")]
    # E002 reports jobs that other tests declare on nested functions on purpose.
    assert [m for m in found if m.id != "tasks_coord.E002"] == []


def test_unknown_keys_are_e001():
    with override_settings(TASKS_COORD={"WORKER": 3}):
        (error,) = checks.check_settings()
    assert error.id == "tasks_coord.E001"
    assert error.msg.startswith("Unknown TASKS_COORD key(s): WORKER.")


def test_values_out_of_range_are_e003():
    assert settings_errors(WORKERS=0) == [
        "TASKS_COORD: WORKERS must be an int of at least 1, not 0."
    ]
    assert settings_errors(HEARTBEAT_FREQUENCY=20, LIVENESS_INTERVAL=30) == [
        "TASKS_COORD: LIVENESS_INTERVAL (30s) must be at least twice HEARTBEAT_FREQUENCY "
        "(20s), or live nodes would be declared dead."
    ]
    assert settings_errors(DATABASE="nope") == [
        "TASKS_COORD: DATABASE 'nope' is not an alias in DATABASES (default)."
    ]
    assert settings_errors(
        TOPICS="emails", LISTEN_NOTIFY="yes", LONG_POLL_INTERVAL=0, NODE_ID=""
    ) == [
        "TASKS_COORD: NODE_ID must be None or a str of 1 to 200 characters, not ''.",
        "TASKS_COORD: TOPICS must be None or a list of topic names, not 'emails'.",
        "TASKS_COORD: LISTEN_NOTIFY must be True or False, not 'yes'.",
        "TASKS_COORD: LONG_POLL_INTERVAL must be a positive number of seconds, not 0.",
    ]
    assert settings_errors(POLL_INTERVAL="1") == [
        "TASKS_COORD: POLL_INTERVAL must be a positive number of seconds, not '1'."
    ]
    assert settings_errors(WORKERS=2, BUFFER=0, TOPICS=["a"], GROUP="g") == []


def app(name: str) -> AppConfig:
    return AppConfig.create(f"tests.operating.declaring.{name}")


def test_a_declared_timer_that_does_not_parse_is_e004():
    (error,) = checks.check_declarations(app_configs=[app("bad_timer")])
    assert error.id == "tasks_coord.E004"
    assert error.msg.startswith(
        "tests.operating.declaring.bad_timer.jobs: a declared job's timer does not parse: "
    )
    assert "every other tuesday" in error.msg


def test_an_invalid_json_schema_is_e005():
    (error,) = checks.check_declarations(app_configs=[app("bad_schema")])
    assert error.id == "tasks_coord.E005"
    assert error.msg.startswith(
        "tests.operating.declaring.bad_schema.tasks: Definition 'checks/bad-schema': "
        "params_schema is not a valid JSON Schema: "
    )


def test_a_module_that_fails_to_import_is_e006_and_hides_no_other_problem():
    messages = checks.check_declarations(
        app_configs=[app("bad_import"), app("fine"), app("bad_timer")]
    )
    assert ids(messages) == ["tasks_coord.E006", "tasks_coord.E004"]
    assert messages[0].msg == (
        "tests.operating.declaring.bad_import.jobs cannot be imported: ModuleNotFoundError: "
        "No module named 'tests.operating.declaring.no_such_module'"
    )
    assert messages[0].obj == "tests.operating.declaring.bad_import.jobs"
    assert messages[0].hint.endswith(
        "run `python manage.py shell -c 'import tests.operating.declaring.bad_import.jobs'` "
        "to see the traceback."
    )


def test_the_e006_hint_shows_the_traceback():
    """The hint's command works as written (a plain ``python -c`` fails: no settings)."""
    import subprocess
    import sys

    from tests.processes import ROOT, subprocess_env

    module = "tests.operating.declaring.bad_import.jobs"
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", f"import {module}"],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "Traceback" in done.stderr
    assert "No module named 'tests.operating.declaring.no_such_module'" in done.stderr


def test_installed_apps_declare_nothing_broken():
    assert [m for m in checks.check_declarations() if m.id != "tasks_coord.E002"] == []


def test_a_group_on_sqlite_is_w001(monkeypatch):
    monkeypatch.setattr(connections["default"], "vendor", "sqlite")
    with override_settings(TASKS_COORD={"GROUP": "g"}):
        (warning,) = checks.check_sqlite_group()
    assert warning.id == "tasks_coord.W001"
    assert warning.level == django_checks.WARNING
    assert warning.msg.startswith("TASKS_COORD['GROUP'] is 'g' on SQLite: ")
    assert checks.check_sqlite_group() == []  # no group


def test_a_group_elsewhere_passes(monkeypatch):
    monkeypatch.setattr(connections["default"], "vendor", "postgresql")
    with override_settings(TASKS_COORD={"GROUP": "g"}):
        assert checks.check_sqlite_group() == []


def test_database_checks_only_run_when_asked_for_the_apps_database():
    assert checks.check_database() == []
    assert checks.check_database(databases=["other"]) == []
    assert checks.check_stored_jobs() == []
    registered = django_checks.registry.registry.get_checks()
    tagged = {check.__name__ for check in registered if "database" in check.tags}
    assert {"check_database", "check_stored_jobs"} <= tagged


def test_no_skip_locked_is_e010(monkeypatch):
    conn = connections["default"]
    monkeypatch.setattr(conn, "vendor", "mysql")
    monkeypatch.setattr(conn.features, "has_select_for_update_skip_locked", False)
    (error,) = checks.check_database(databases=["default"])
    assert error.id == "tasks_coord.E010"
    assert "does not support SELECT ... FOR UPDATE SKIP LOCKED" in error.msg


def test_the_database_under_test_passes():
    assert checks.check_database(databases=["default"]) == []


def test_nodes_of_several_hosts_on_sqlite_are_w002(monkeypatch):
    monkeypatch.setattr(connections["default"], "vendor", "sqlite")
    owners.register_owner("a", host="host-a")
    owners.register_owner("a2", host="host-a")
    assert checks.check_database(databases=["default"]) == []
    owners.register_owner("b", host="host-b")
    (warning,) = checks.check_database(databases=["default"])
    assert warning.id == "tasks_coord.W002"
    assert warning.msg.startswith("Nodes of 2 hosts (host-a, host-b) are registered on the SQLite")


def stored_job(job_id: str, task: str, timer: str) -> None:
    PeriodicTask.objects.create(id=job_id, kind=JobKind.PERIODIC, task=task, timer=timer)


def test_stored_jobs_that_cannot_run_are_w003():
    stored_job("fine", "tests.testapp.job_functions.noop", "hourly")
    stored_job("ghost", "tests.testapp.job_functions.no_such_job", "hourly")
    stored_job("garbled", "tests.testapp.job_functions.noop", "every other tuesday")
    PeriodicTask.objects.create(
        id="off", kind=JobKind.PERIODIC, task="nowhere.job", timer="hourly", enabled=False
    )
    messages = sorted(checks.check_stored_jobs(databases=["default"]), key=lambda m: m.obj)
    assert ids(messages) == ["tasks_coord.W003", "tasks_coord.W003"]
    assert messages[0].obj == "garbled"
    assert messages[0].msg.startswith(
        "Job 'garbled': its timer 'every other tuesday' does not parse: "
    )
    assert messages[1].msg.startswith(
        "Job 'ghost': its callable tests.testapp.job_functions.no_such_job cannot be imported: "
    )
