"""Workflows while nodes are SIGKILLed every 1-3 s (and replaced): 40 workflows of 10 steps
(fan-out 8, fan-in 1) on three real runscheduler nodes. Every workflow succeeds, every fan-in
is enqueued once and gets its parents' results, every step's fenced side effect commits
exactly once, and only runs cut off by a kill run again (``tests/workflows/chaos.py``; the
200-workflow run is ``benchmarks/workflows.py``). PostgreSQL and MariaDB (SQLite runs one
node, as the other kill tests)."""

from __future__ import annotations

import pytest
from django.db import connection

from tests.workflows import chaos

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.multiprocess,
    pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite runs one node"),
]

WORKFLOWS = 40


def test_sigkilled_nodes_lose_no_workflow_and_run_no_fan_in_or_fenced_effect_twice():
    ids = chaos.start_workflows(WORKFLOWS)
    run = chaos.run(ids, seed=24, timeout=180)
    figures = chaos.verify(run)
    assert run.finished, figures
    assert run.kills >= 5, figures  # the chaos happened
    assert figures["states"] == {"succeeded": WORKFLOWS}, figures
    assert figures["violations"] == {
        "not_succeeded": [],
        "fan_in_not_enqueued_once": [],
        "fan_in_without_all_results": [],
        "fenced_not_once": [],
        "run_twice_by_surviving_nodes": [],
        "unclean_exits": [],
    }, figures
