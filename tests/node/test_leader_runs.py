"""Warm backup never drops a leader-only run: a run this node claimed as the group's leader,
but cannot stamp with its current term (it lost the lead between its poll and the stamp),
goes back to the queue unstarted, its attempt refunded, and the new leader runs it.
In-process nodes on the real database (each of the three)."""

from __future__ import annotations

import pytest
from django.db import OperationalError
from django.db.models import F, QuerySet
from django.utils import timezone

from django_tasks_coord import coordination, queue, scheduling
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Task, TokenHolder
from django_tasks_coord.node import Node
from django_tasks_coord.scheduling import scheduler
from django_tasks_coord.scheduling.runner import group_topic
from tests.node.conftest import ShiftedClock, run
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

RECORD = "tests.testapp.job_functions.record"


def lose_the_lead_after_claiming(monkeypatch, nodes: list[Node], how: str) -> list[int]:
    """Make the first node lose the lead right after its poll claimed the run: another node
    takes over (``deposed``), or its own lease runs out (``lapsed``: it knows no term)."""
    original = queue.poll
    claimed: list[int] = []

    def poll(topic, *args, **kwargs):
        tasks = original(topic, *args, **kwargs)
        if tasks and topic == group_topic("g") and not claimed:
            claimed.extend(task.pk for task in tasks)
            if how == "deposed":
                coordination.join("g", "other")  # alive, so the token stays with it
                holders = TokenHolder.objects.filter(group_id="g")
                holders.update(task_id="other", term=F("term") + 1)
            else:
                leadership = nodes[0].leadership
                assert leadership is not None
                # No successful beat for a whole lease: its clock (only its) jumps an hour.
                leadership.clock = ShiftedClock(leadership.clock, 3600)
        return tasks

    monkeypatch.setattr(queue, "poll", poll)
    return claimed


@pytest.mark.parametrize("how", ["deposed", "lapsed"])
def test_a_run_claimed_as_the_lead_was_lost_goes_back_to_the_new_leader(
    make_node, monkeypatch, how
):
    scheduling.schedule_one_time(RECORD, timezone.now(), group="g", leader_only=True, job_id="j")
    (submitted,) = scheduler.submit_due()
    nodes: list[Node] = []
    claimed = lose_the_lead_after_claiming(monkeypatch, nodes, how)
    nodes.append(make_node(node_id="first", group="g", topics=["work"], scheduler=False))
    assert run(nodes[0]) == 0
    assert claimed == [submitted.pk]
    # The deposed node started nothing and failed nothing: the run waits for the leader,
    # with the attempt it used refunded and no term.
    assert not Run.objects.exists()
    task = Task.objects.get(pk=submitted.pk)
    assert (task.state, task.attempts, task.term) == (TaskState.PENDING, 0, None)

    monkeypatch.undo()
    new = make_node(node_id="other", group="g", topics=["work"], scheduler=False)
    assert run(new) == 0
    task.refresh_from_db()
    term = TokenHolder.objects.get(group_id="g").term
    assert (task.state, task.attempts, task.term) == (TaskState.SUCCEEDED, 1, term)
    assert term > 1
    assert list(Run.objects.values_list("identifier", "node", "attempt")) == [("j", "other", 1)]


def test_a_run_whose_stamp_failed_goes_back_and_runs_once(make_node, monkeypatch):
    """The stamp's UPDATE fails (a lock timeout, not a lost connection): the run is not left
    ACTIVE under the node, unknown to it; it goes back and the leader runs it, once."""
    scheduling.schedule_one_time(RECORD, timezone.now(), group="g", leader_only=True, job_id="j")
    (submitted,) = scheduler.submit_due()
    real_update = QuerySet.update
    failed: list[dict] = []

    def update(self, **fields):
        if "term" in fields and not failed:
            failed.append(fields)
            raise OperationalError("database is locked")
        return real_update(self, **fields)

    monkeypatch.setattr(QuerySet, "update", update)
    node = make_node(node_id="leader", group="g", topics=["work"], scheduler=False)
    assert run(node) == 0
    assert len(failed) == 1
    task = Task.objects.get(pk=submitted.pk)
    term = TokenHolder.objects.get(group_id="g").term
    assert (task.state, task.attempts, task.term) == (TaskState.SUCCEEDED, 1, term)
    assert list(Run.objects.values_list("identifier", "node")) == [("j", "leader")]
