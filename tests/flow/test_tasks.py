"""``@task(rate=..., concurrency=...)``: a function's limits across all nodes, as an entry of
its queue topic's ``key_limits`` (the topic keyed by ``payload.task``), on every database."""

from __future__ import annotations

import pytest

compat = pytest.importorskip("django_tasks_coord.backends.compat", exc_type=ImportError)

from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from django_tasks_coord import flow, queue, topics  # noqa: E402
from django_tasks_coord.backends import limits as task_limits  # noqa: E402
from django_tasks_coord.exceptions import LimitKeyConflictError  # noqa: E402
from django_tasks_coord.models import Task as TaskRow  # noqa: E402
from django_tasks_coord.models import Topic  # noqa: E402
from django_tasks_coord.store import flow as flow_claims  # noqa: E402

task, InvalidTask = compat.task, compat.InvalidTask


@task(queue_name="other", concurrency=2)
def two_at_once(n):
    return n


@task(queue_name="other", rate="3/h")
def three_an_hour(n):
    return n


@task(queue_name="other")
def unlimited(n):
    return n


@task(queue_name="high", concurrency=1)
def on_a_tenant_queue(tenant):
    return tenant


def plain(n):
    return n


@pytest.fixture(autouse=True)
def _fresh():
    flow._cache.clear()
    topics.known_topics.clear()
    task_limits.forget()
    yield
    flow._cache.clear()
    topics.known_topics.clear()
    task_limits.forget()
    flow_claims._held_back.clear()


def claimed(name, size=100):
    return [t.payload["task"].rsplit(".", 1)[1] for t in queue.poll(name, size)]


@pytest.mark.django_db
def test_a_functions_concurrency_holds_and_other_functions_of_its_queue_run_free():
    for n in range(5):
        two_at_once.enqueue(n)
        unlimited.enqueue(n)
    first = claimed("other")
    assert first.count("two_at_once") == 2 and first.count("unlimited") == 5
    assert claimed("other") == []
    row = Topic.objects.get(name="other")
    assert row.limit_key == "payload.task"
    assert row.key_limits == {two_at_once.module_path: {"concurrency": 2}}
    keys = set(TaskRow.objects.filter(topic_id="other").values_list("concurrency_key", flat=True))
    assert keys == {two_at_once.module_path, unlimited.module_path}


@pytest.mark.django_db
def test_a_functions_rate_holds_and_enqueue_many_is_keyed_too():
    three_an_hour.enqueue_many([((n,), {}) for n in range(5)])
    first = queue.poll("other", 100)
    assert len(first) == 3
    for run in first:
        queue.complete(run, queue.Result.SUCCESS)
    assert queue.poll("other", 100) == []  # done, but started within the hour
    assert Topic.objects.get(name="other").key_limits == {
        three_an_hour.module_path: {"rate": "3/h"}
    }


def test_bad_limits_are_refused_when_the_task_is_made():
    with pytest.raises(InvalidTask, match="N/unit"):
        task(rate="fast")(plain)
    with pytest.raises(InvalidTask, match="concurrency"):
        task(concurrency=0)(plain)


@pytest.mark.django_db
def test_a_queue_keyed_otherwise_says_to_give_the_function_its_own_queue():
    flow.set_limits("high", concurrency=5, key="payload.kwargs.tenant")
    with pytest.raises(LimitKeyConflictError, match="queue_name of its own"):
        on_a_tenant_queue.enqueue(tenant="acme")
    assert not TaskRow.objects.filter(topic_id="high").exists()


@pytest.mark.django_db
def test_a_queue_limited_as_a_whole_keeps_its_limits_as_total_ones():
    flow.set_limits("other", concurrency=3)
    for n in range(5):
        two_at_once.enqueue(n)
        unlimited.enqueue(n)
    row = Topic.objects.get(name="other")
    assert (row.limit_key, row.concurrency_limit, row.total_concurrency_limit) == (
        "payload.task",
        None,
        3,
    )
    first = claimed("other")
    assert len(first) == 3 and first.count("two_at_once") <= 2


@pytest.mark.django_db(transaction=True)
def test_later_enqueues_cost_nothing_and_a_lost_entry_is_written_again():
    two_at_once.enqueue(0)
    with CaptureQueriesContext(connection) as captured:
        two_at_once.enqueue(1)
    topic_table = Topic._meta.db_table
    assert not [q for q in captured.captured_queries if topic_table in q["sql"]]
    # another process (the admin, a node applying TASKS_COORD["LIMITS"]) drops the entry
    Topic.objects.filter(name="other").update(key_limits=None)
    flow._cache.clear()
    topics.known_topics.clear()  # this process reads the topic again (within a minute)
    two_at_once.enqueue(2)  # its push reads the topic's limits, without the entry
    two_at_once.enqueue(3)  # which this enqueue sees: written again
    assert Topic.objects.get(name="other").key_limits == {
        two_at_once.module_path: {"concurrency": 2}
    }
    assert len(queue.poll("other", 100)) == 2


@task(queue_name="high")
def per_tenant(tenant):
    return tenant


@pytest.mark.django_db
def test_enqueues_of_a_queue_keyed_per_tenant_are_keyed_per_row():
    flow.set_limits("high", concurrency=1, key="payload.args.0")
    per_tenant.enqueue("acme")  # the topic's key is read
    with CaptureQueriesContext(connection) as captured:
        per_tenant.enqueue_many([(("acme",), {}), (("umbrella",), {}), (("acme",), {})])
    inserts = [q["sql"] for q in captured.captured_queries if "INSERT" in q["sql"].upper()]
    if connection.vendor == "postgresql":  # still one statement of arrays
        assert len(inserts) == 1 and "UNNEST" in inserts[0].upper()
    keys = TaskRow.objects.filter(topic_id="high").order_by("sequence")
    assert list(keys.values_list("concurrency_key", flat=True)) == [
        "acme",
        "acme",
        "umbrella",
        "acme",
    ]
    assert sorted(t.payload["args"][0] for t in queue.poll("high", 10)) == ["acme", "umbrella"]
