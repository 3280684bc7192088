"""The app's management commands by their names: ``tasks_coord_`` ones, deprecated aliases."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command, get_commands

from django_tasks_coord.models import ApiToken

pytestmark = pytest.mark.django_db


def test_every_command_but_runscheduler_has_the_prefix_or_is_a_deprecated_alias():
    ours = {name for name, app in get_commands().items() if app == "django_tasks_coord"}
    assert {name for name in ours if not name.startswith("tasks_coord_")} == {
        "runscheduler",
        "prune",
        "createapitoken",
    }
    assert {"tasks_coord_prune", "tasks_coord_createapitoken"} <= ours


def test_createapitoken_issues_a_token():
    get_user_model().objects.create_user("bot")
    out = StringIO()
    call_command("tasks_coord_createapitoken", "bot", "--name", "ci", stdout=out)
    token = out.getvalue().strip()
    assert ApiToken.objects.get(name="ci").prefix == token[: len(ApiToken.objects.get().prefix)]


@pytest.mark.parametrize(
    ("old", "new", "args"),
    [
        ("prune", "tasks_coord_prune", ["--older-than", "0", "--dry-run"]),
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
