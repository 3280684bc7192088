"""Bad declarations are check errors naming the declaration, never tracebacks.

``manage.py check`` and ``runscheduler`` run in a subprocess with settings that install the
broken apps of ``tests/operating/declaring`` next to valid declarations.
"""

from __future__ import annotations

import subprocess
import sys
from importlib.util import find_spec

import pytest
from django.apps import AppConfig

from django_tasks_coord import checks, handlers
from django_tasks_coord.scheduling import declared
from tests.processes import ROOT, subprocess_env

FIXTURES = "tests.operating.declaring"


def manage(*args: str, apps: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=subprocess_env(DJANGO_SETTINGS_MODULE=f"{FIXTURES}.settings", DECLARING_APPS=apps),
        capture_output=True,
        text=True,
        timeout=120,
    )


def app(name: str) -> AppConfig:
    return AppConfig.create(f"{FIXTURES}.{name}")


@pytest.fixture(autouse=True)
def _forget_fixture_declarations():
    before = handlers.registry.consumers()
    yield
    handlers.registry.restore(before)
    for name in list(declared.declarations()):
        if name.startswith((f"{FIXTURES}.", "checks-")):
            declared.forget(name)


@pytest.mark.parametrize("command", [("check",), ("runscheduler", "--burst")])
def test_a_timer_typo_next_to_a_valid_job_is_e004_not_a_traceback(command):
    done = manage(*command, apps="mixed_timer")
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "Traceback" not in output
    assert "(tasks_coord.E004) tests.operating.declaring.mixed_timer.jobs: a declared job's " in (
        output
    )
    # The job, where it is declared, and the position of the error in the timer.
    assert "Job 'tests.operating.declaring.mixed_timer.jobs.typo' (" in output
    assert "mixed_timer/jobs.py:11)" in output
    assert "unexpected character in the second at 'x' (character 17)" in output
    assert output.count("(tasks_coord.") == 1  # the valid job is no problem


@pytest.mark.django_db
def test_every_declaration_check_reports_and_none_raises():
    # A @task module needs Django's task framework (django.tasks, or the backport on 5.2).
    has_tasks = bool(find_spec("django.tasks") or find_spec("django_tasks"))
    messages = checks.check_declarations(
        app_configs=[
            app("mixed_timer"),
            *([app("mixed_tasks")] if has_tasks else []),
            app("mixed_options"),
            app("mixed_consumers"),
            app("dup_consumers"),
            app("fine"),
        ]
    )
    found = {(message.id, message.obj) for message in messages}
    assert found == {
        ("tasks_coord.E004", f"{FIXTURES}.mixed_timer.jobs"),
        *([("tasks_coord.E004", f"{FIXTURES}.mixed_tasks.tasks")] if has_tasks else []),
        ("tasks_coord.E006", f"{FIXTURES}.mixed_options.jobs"),
        ("tasks_coord.E006", f"{FIXTURES}.mixed_consumers.consumers"),
        ("tasks_coord.E007", "checks-dup"),
    }
    text = {message.obj: message.msg for message in messages}
    if has_tasks:
        assert (
            f"Task {FIXTURES}.mixed_tasks.tasks.typo_report: Invalid calendar event"
            in text[f"{FIXTURES}.mixed_tasks.tasks"]
        )
        assert "(character 13)" in text[f"{FIXTURES}.mixed_tasks.tasks"]
    assert (
        f"Job '{FIXTURES}.mixed_options.jobs.bad_option' ("
        in text[f"{FIXTURES}.mixed_options.jobs"]
    )
    assert (
        "max_count must be -1 (unlimited) or a positive int, not 0."
        in text[f"{FIXTURES}.mixed_options.jobs"]
    )
    assert text[f"{FIXTURES}.mixed_consumers.consumers"].endswith(
        f"InvalidArgumentError: Consumer {FIXTURES}.mixed_consumers.consumers.bad of topic "
        "'checks-bad-consumer': retry must be a RetryPolicy, not 3."
    )
    assert text["checks-dup"].startswith(
        f"Topic 'checks-dup' has two consumers: {FIXTURES}.dup_consumers.consumers.first and "
        f"{FIXTURES}.dup_consumers.consumers.second;"
    )


def test_two_consumers_for_one_topic_are_e007_in_manage_py_check():
    done = manage("check", apps="dup_consumers,fine")
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "Traceback" not in output
    assert "checks-dup: (tasks_coord.E007) Topic 'checks-dup' has two consumers: " in output


def test_one_consumer_declared_again_by_the_same_function_is_no_conflict():
    def declare():
        @handlers.consumer("checks-once")
        def once(task):
            return None

    declare()
    declare()
    assert [c for c in handlers.registry.conflicts() if c[0] == "checks-once"] == []
