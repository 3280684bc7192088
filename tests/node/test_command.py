"""``manage.py runscheduler`` argument handling (the node itself is tested in test_node/test_e2e)."""

import pytest
from django.core.management import CommandError, call_command

from django_tasks_coord import queue
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Task

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workers", "0"], "must be at least 1"),
        (["--workers", "many"], "is not an integer"),
        (["--poll-interval", "-1"], "must be at least 0"),
    ],
)
def test_bad_flags_are_refused(args, message, capsys):
    with pytest.raises(CommandError, match=message):
        call_command("runscheduler", *args)


def test_a_live_node_id_cannot_be_reused():
    queue.register_owner("node-a")
    with pytest.raises(CommandError, match="node-a"):
        call_command("runscheduler", "--node-id", "node-a", "--burst")


def test_bad_settings_are_refused(settings):
    settings.TASKS_COORD = {"HEARTBEAT_FREQUENCY": 20, "LIVENESS_INTERVAL": 30}
    with pytest.raises(CommandError, match="at least twice"):
        call_command("runscheduler", "--burst")


def test_burst_through_call_command(settings):
    settings.TASKS_COORD = {"POLL_INTERVAL": 0.05, "STATUS_INTERVAL": 0}
    queue.register_topic("work")
    queue.push_many("work", [("a", {}), ("b", {})])
    call_command("runscheduler", "--burst", "--topic", "work", "-v", "0")
    assert set(Task.objects.values_list("state", flat=True)) == {TaskState.SUCCEEDED}
