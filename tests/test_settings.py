import pytest
from django.core import checks
from django.test import override_settings

from django_tasks_coord.conf import app_settings
from django_tasks_coord.exceptions import ConfigurationError


def test_defaults():
    assert app_settings.DATABASE == "default"
    assert app_settings.LIVENESS_INTERVAL == 30.0
    assert app_settings.liveness_interval.total_seconds() == 30


def test_settings_are_read_lazily_and_follow_overrides():
    with override_settings(TASKS_COORD={"LIVENESS_INTERVAL": 5}):
        assert app_settings.LIVENESS_INTERVAL == 5
    assert app_settings.LIVENESS_INTERVAL == 30.0


def test_unknown_keys_are_refused_by_name():
    with (
        override_settings(TASKS_COORD={"LIVENES_INTERVAL": 5}),
        pytest.raises(ConfigurationError) as info,
    ):
        _ = app_settings.DATABASE
    assert "LIVENES_INTERVAL" in str(info.value)
    assert "LIVENESS_INTERVAL" in str(info.value)


@pytest.mark.django_db  # model checks ask the database about JSON support
def test_system_check_reports_a_bad_setting():
    with override_settings(TASKS_COORD=["not", "a", "dict"]):
        errors = [m for m in checks.run_checks() if m.id == "tasks_coord.E001"]
    assert len(errors) == 1
    assert "must be a dict" in errors[0].msg


@pytest.mark.django_db
def test_system_check_is_quiet_when_settings_are_fine():
    assert not [m for m in checks.run_checks() if m.id.startswith("tasks_coord.")]
