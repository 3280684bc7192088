"""The app's management commands by their names: ``tasks_coord_`` ones, deprecated aliases."""

from __future__ import annotations

from importlib.util import find_spec
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command, get_commands, load_command_class
from django.test import override_settings

from django_tasks_coord.models import ApiToken

pytestmark = pytest.mark.django_db


def test_every_command_but_runscheduler_has_the_prefix_or_is_a_deprecated_alias():
    ours = {name for name, app in get_commands().items() if app == "django_tasks_coord"}
    prefixed = {name for name in ours if name == "tasks_coord" or name.startswith("tasks_coord_")}
    assert ours - prefixed == {"runscheduler", "prune", "createapitoken"}
    assert {"tasks_coord", "tasks_coord_prune", "tasks_coord_createapitoken"} <= ours


def test_createapitoken_issues_a_token():
    get_user_model().objects.create_user("bot")
    out = StringIO()
    call_command("tasks_coord_createapitoken", "bot", "--name", "ci", stdout=out)
    token = out.getvalue().strip()
    assert ApiToken.objects.get(name="ci").prefix == token[: len(ApiToken.objects.get().prefix)]


@pytest.mark.parametrize(
    ("old", "new", "args"),
    [
        pytest.param(
            "prune",
            "tasks_coord_prune",
            ["--older-than", "0", "--dry-run"],
            marks=pytest.mark.skipif(
                not (find_spec("django.tasks") or find_spec("django_tasks")),
                reason="pruning Django task results needs Django's task framework",
            ),
        ),
        ("createapitoken", "tasks_coord_createapitoken", ["bot"]),
    ],
)
def test_old_names_still_work_and_say_they_are_deprecated(old, new, args):
    get_user_model().objects.create_user("bot")
    out, err = StringIO(), StringIO()
    call_command(old, *args, stdout=out, stderr=err)
    assert err.getvalue() == (
        f"manage.py {old} is deprecated and will be removed in 1.0; use manage.py {new}.\n"
    )
    assert out.getvalue()  # it did its work: a count, or a token


def runscheduler_help() -> str:
    command = load_command_class("django_tasks_coord", "runscheduler")
    return " ".join(command.create_parser("manage.py", "runscheduler").format_help().split())


def test_runscheduler_help_shows_the_defaults_in_force():
    text = runscheduler_help()
    assert "Worker threads. Default: 5 (TASKS_COORD['WORKERS'])." in text
    assert "Default: every topic with a consumer (TASKS_COORD['TOPICS'])." in text
    assert "Seconds running tasks get to finish after SIGTERM. Default: 30.0" in text
    with override_settings(TASKS_COORD={"WORKERS": 7, "TOPICS": ["a", "b"]}):
        text = runscheduler_help()
    assert "Worker threads. Default: 7 (TASKS_COORD['WORKERS'])." in text
    assert "Process this topic (repeatable). Default: a b (TASKS_COORD['TOPICS'])." in text


def test_runscheduler_help_works_with_bad_settings():
    with override_settings(TASKS_COORD={"WORKRES": 7}):
        assert "Worker threads. Default: 5 (TASKS_COORD['WORKERS'])." in runscheduler_help()
