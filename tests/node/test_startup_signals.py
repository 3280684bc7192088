"""SIGTERM/SIGINT while ``runscheduler`` starts up: a clean exit (code 0, a log line, no
traceback) and nothing left registered, wherever the signal lands."""

from __future__ import annotations

import json
import signal
import time

import pytest

from django_tasks_coord.models import HealthCheck, Owner
from tests.processes import Output, start, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.multiprocess]

SETTINGS = {"STATUS_INTERVAL": 0, "HEARTBEAT_FREQUENCY": 0.2, "POLL_INTERVAL": 0.2}


def node(*args: str, **env: str) -> Output:
    return Output(
        start("django", "runscheduler", *args, TASKS_COORD_JSON=json.dumps(SETTINGS), **env)
    )


def assert_clean_exit(output: Output) -> str:
    _, out, err = output.finish()
    assert output.proc.returncode == 0, err + out
    assert "Traceback" not in err + out
    assert not Owner.objects.exists()
    assert not HealthCheck.objects.exists()  # no group membership left either
    return out


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_loading_consumers_exits_before_registering(signum):
    output = node(TESTAPP_IMPORT_PAUSE="3")  # the consumers module takes 3 s to import
    output.line_at("testapp.consumers: importing")
    output.proc.send_signal(signum)
    out = assert_clean_exit(output)
    assert f"{signum.name} received during start-up: exiting before the node registered." in out
    assert " started:" not in out  # it never registered


def test_sigterm_right_after_the_first_log_line_exits_cleanly():
    output = node("--group", "g")
    output.line_at("Starting: loading consumers")
    output.proc.send_signal(signal.SIGTERM)
    assert_clean_exit(output)


def test_sigterm_right_after_the_node_registered_exits_cleanly():
    output = node("--group", "g")  # joining the group is part of its start-up
    output.line_at(" started:")
    output.proc.send_signal(signal.SIGTERM)
    out = assert_clean_exit(output)
    assert " stopped: " in out  # the node unregistered itself
    # The signal handler logs nothing; the node logs the request as its shutdown starts.
    assert out.index("Stopping: no new claims") < out.index(" stopped: ")


@pytest.mark.parametrize("delay", [0.0, 0.5, 1.0, 1.5])
def test_sigterm_at_any_moment_of_start_up_leaves_nothing_behind(delay):
    """Once the command runs (it imports the consumers: the marker line), the exit is clean.
    Before that (the interpreter, Django's set-up) no code of this package runs yet: the
    signal's default action may end the process, with nothing registered either."""
    output = node("--group", "g", TESTAPP_IMPORT_PAUSE="0.5")
    time.sleep(delay)  # the moment of start-up the signal lands in
    output.proc.send_signal(signal.SIGTERM)
    _, out, err = output.finish()
    if "testapp.consumers: importing" in out:
        assert output.proc.returncode == 0, err + out
    else:
        assert output.proc.returncode in (0, -signal.SIGTERM), err + out
    assert "Traceback" not in err + out
    wait_for(lambda: not Owner.objects.exists() and not HealthCheck.objects.exists())
