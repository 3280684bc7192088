"""The metrics view: every documented queue-state metric, its labels, and values that match
the database after a known workload (exact counts: far below the estimate threshold)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_tasks_coord import coordination, db, owners, queue, scheduling, topics, workflows
from django_tasks_coord.enums import Result, TaskState
from django_tasks_coord.metrics import state
from django_tasks_coord.models import Owner, PeriodicTask, Task, Workflow, WorkflowState
from django_tasks_coord.scheduling import JOBS_TOPIC, scheduler
from tests.metrics.conftest import documented, samples

pytestmark = pytest.mark.django_db

URL = "/tasks/metrics"
RECORD = "tests.testapp.job_functions.record"
#: The queue-state metrics (the rest of the reference page is the node's).
VIEW_METRICS = {
    "tasks_coord_tasks",
    "tasks_coord_oldest_pending_seconds",
    "tasks_coord_topic_paused",
    "tasks_coord_nodes",
    "tasks_coord_leader_term",
    "tasks_coord_leader",
    "tasks_coord_job_last_success_timestamp_seconds",
    "tasks_coord_job_next_slot_timestamp_seconds",
    "tasks_coord_job_missed_slots_total",
    "tasks_coord_workflows",
}


def scrape(client: Client) -> dict:
    with override_settings(TASKS_COORD={"METRICS_PUBLIC": True}):
        response = client.get(URL)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return samples(response.content.decode())


def workload() -> dict:
    """Two topics with tasks in several states, nodes alive and dead, two groups, two jobs."""
    queue.register_topic("m-a")
    queue.register_topic("m-b")
    now = timezone.now()
    for i in range(3):
        queue.push("m-a", f"a{i}")
    queue.push("m-a", "later", execute_at=now + timedelta(hours=1))
    (active,) = queue.poll("m-a")
    done, failed = queue.poll("m-a", 2)
    queue.complete(done, Result.SUCCESS)
    queue.complete(failed, Result.FAILURE)
    Task.objects.filter(pk=active.pk).update(state=TaskState.ACTIVE)  # it stays claimed
    late = queue.push("m-b", "late", execute_at=now - timedelta(minutes=5))
    old = queue.push("m-b", "old")
    Task.objects.filter(pk=old.pk).update(created_at=now - timedelta(minutes=10))
    queue.push("m-a", "plain")  # due now: m-a's oldest pending is seconds old
    queue.pause_topic("m-b")

    owners.register_owner("node-1")
    owners.register_owner("node-2")
    owners.register_owner("node-dead")
    Owner.objects.filter(name="node-dead").update(heartbeat=now - timedelta(hours=1))
    coordination.join("g-led", "node-1")
    term = coordination.try_acquire("g-led", "node-1", timedelta(seconds=30))
    assert term is not None
    coordination.join("g-leaderless", "node-2")

    start = now - timedelta(minutes=10)
    missing = scheduling.schedule_recurring(
        RECORD, 10, start_time=start, job_id="every-10s", catch_up="skip"
    )
    (run,) = scheduler.submit_due(now=now)
    claimed = queue.poll(JOBS_TOPIC)
    assert [t.pk for t in claimed] == [run.pk]
    queue.complete(claimed[0], Result.SUCCESS)
    never = scheduling.schedule_periodic(RECORD, "yearly", job_id="yearly")
    return {"late": late, "old": old, "term": term, "jobs": (missing, never), "now": now}


def test_every_documented_view_metric_is_there_with_values_from_the_database(client):
    known = workload()
    found = scrape(client)
    names = {name for name, _ in found}
    reference = documented()
    assert set(reference) >= VIEW_METRICS, "the reference page lists every view metric"
    assert names >= VIEW_METRICS

    # Labels: exactly the documented ones, on every sample.
    for name, labels in found:
        if name in VIEW_METRICS:
            assert [key for key, _ in labels] == sorted(reference[name][1]), name

    # Tasks per topic and state: every state of every topic, equal to a count of the table.
    for topic in ("m-a", "m-b", JOBS_TOPIC):
        for task_state in TaskState:
            key = ("tasks_coord_tasks", (("state", task_state.name.lower()), ("topic", topic)))
            exact = Task.objects.filter(topic_id=topic, state=task_state).count()
            assert found[key] == exact, key
    assert found[("tasks_coord_tasks", (("state", "pending"), ("topic", "m-a")))] == 2
    assert found[("tasks_coord_tasks", (("state", "active"), ("topic", "m-a")))] == 1

    # Oldest due pending: m-b's oldest is the one created 10 minutes ago (the task due 5
    # minutes ago comes second); m-a's is seconds old (its future task does not count).
    oldest_b = found[("tasks_coord_oldest_pending_seconds", (("topic", "m-b"),))]
    assert 600 - 5 <= oldest_b <= 600 + 120
    assert 0 <= found[("tasks_coord_oldest_pending_seconds", (("topic", "m-a"),))] < 120
    assert found[("tasks_coord_topic_paused", (("topic", "m-b"),))] == 1
    assert found[("tasks_coord_topic_paused", (("topic", "m-a"),))] == 0

    assert found[("tasks_coord_nodes", ())] == 2  # node-dead is not counted

    assert found[("tasks_coord_leader_term", (("group", "g-led"),))] == known["term"]
    assert found[("tasks_coord_leader", (("group", "g-led"), ("node", "node-1")))] == 1
    assert found[("tasks_coord_leader_term", (("group", "g-leaderless"),))] == 0
    assert found[("tasks_coord_leader", (("group", "g-leaderless"), ("node", "")))] == 0

    missing, never = known["jobs"]
    job = PeriodicTask.objects.get(pk=missing)
    run = Task.objects.get(topic_id=JOBS_TOPIC, identifier=missing)
    assert job.missed_slots == 60  # 61 slots due, the on-time one ran, "skip" drops the rest
    assert found[("tasks_coord_job_missed_slots_total", (("job", missing),))] == 60
    assert found[("tasks_coord_job_missed_slots_total", (("job", never),))] == 0
    success = ("tasks_coord_job_last_success_timestamp_seconds", (("job", missing),))
    assert found[success] == pytest.approx(run.finished_at.timestamp(), abs=1e-3)
    assert ("tasks_coord_job_last_success_timestamp_seconds", (("job", never),)) not in found
    for job_id in (missing, never):
        nextrun = PeriodicTask.objects.get(pk=job_id).nextrun
        slot = found[("tasks_coord_job_next_slot_timestamp_seconds", (("job", job_id),))]
        assert slot == pytest.approx(nextrun.timestamp(), abs=1e-3)


def test_a_job_whose_last_run_failed_reports_its_last_success(client):
    """The job row only knows the last outcome; the last success is read from the runs."""
    job_id = scheduling.schedule_periodic(RECORD, "yearly", job_id="y")
    PeriodicTask.objects.filter(pk=job_id).update(
        last_outcome=TaskState.FAILED, last_finished_at=timezone.now()
    )
    topics.register_internal_topic(JOBS_TOPIC)
    ok = queue.push(JOBS_TOPIC, job_id)
    queue.push(JOBS_TOPIC, job_id)
    first, second = queue.poll(JOBS_TOPIC, 2)
    queue.complete(first, Result.SUCCESS)
    queue.complete(second, Result.FAILURE)
    finished = Task.objects.get(pk=ok.pk).finished_at
    (job,) = state.jobs("default")
    assert job.last_success == finished


def test_counts_past_the_threshold_are_the_planners_estimate(vendor):
    queue.register_topic("m-many")
    queue.push_many("m-many", [(f"t{i}", None) for i in range(30)])
    counts, estimated = state.task_counts(["m-many"], "default", exact_below=10)
    key = ("m-many", "pending")
    if vendor == "sqlite":  # no estimates: exact whatever the threshold
        assert (counts[key], estimated) == (30, set())
    else:
        assert estimated == {key}
        assert counts[key] > 10
    exact, none = state.task_counts(["m-many"], "default")
    assert (exact[key], none) == (30, set())


def test_missed_slots_add_up_per_job():
    """Dropped slots (missed-slot policy) and slots skipped while the previous run goes on
    (an ignore waiting policy) both count; jobs updated in one statement keep their own."""
    now = timezone.now()
    start = now - timedelta(seconds=95)
    skip = scheduling.schedule_recurring(
        RECORD, 10, start_time=start, job_id="skip", catch_up="skip"
    )
    some = scheduling.schedule_recurring(
        RECORD, 10, start_time=start, job_id="some", catch_up="all", catch_up_limit=3
    )
    scheduler.submit_due(now=now)  # 10 slots due: "skip" runs the last, "some" 3 more
    missed = dict(PeriodicTask.objects.values_list("id", "missed_slots"))
    assert missed == {skip: 9, some: 6}
    ignoring = scheduling.schedule_periodic(
        RECORD, "*:*:0/10", job_id="ignoring", waiting_policy="ignore"
    )
    slot = PeriodicTask.objects.get(pk=ignoring).nextrun
    PeriodicTask.objects.exclude(pk=ignoring).update(enabled=False)
    scheduler.submit_due(now=slot)
    queue.poll(JOBS_TOPIC, 10)  # every run in flight
    assert scheduler.submit_due(now=slot + timedelta(seconds=10)) == []  # skipped
    assert PeriodicTask.objects.get(pk=ignoring).missed_slots == 1


def test_workflows_are_counted_by_state(client):
    queue.register_topic("wf")
    ids = [workflows.start(f"w{n}", workflows.push("wf", f"w{n}", {})) for n in range(4)]
    workflows.cancel(ids[0])
    Workflow.objects.filter(pk=ids[1]).update(state=WorkflowState.FAILED)
    found = scrape(client)
    by_state = {
        labels[0][1]: value
        for (name, labels), value in found.items()
        if name == "tasks_coord_workflows"
    }
    assert by_state == {"running": 2, "succeeded": 0, "failed": 1, "canceled": 1}
    assert state.workflow_counts("default", exact_below=1)["running"] >= 2  # estimated above 1


def test_the_workflow_count_is_capped_where_the_planner_estimates(client):
    if not db.has_row_estimates(connection):
        pytest.skip("SQLite keeps no estimates: counts are exact")
    queue.register_topic("wf")
    for n in range(5):
        workflows.start(f"w{n}", workflows.push("wf", f"w{n}", {}))
    with CaptureQueriesContext(connection) as queries:
        counts = state.workflow_counts("default", exact_below=2)
    assert counts["running"] >= 3  # past the cap: the planner's guess, never less than seen
    assert any("LIMIT 3" in query["sql"] for query in queries.captured_queries)
