"""Flow control in one process: limits read under the topic's lock, counted per key, the
rate window on the database clock (moved by back-dating the start log, never by sleeping)."""

import pytest
from django.core import checks
from django.db import connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_tasks_coord import db, flow, queue, topics
from django_tasks_coord.enums import TaskState
from django_tasks_coord.exceptions import InvalidArgumentError
from django_tasks_coord.flow import Rate
from django_tasks_coord.models import FlowStart, Task, Topic
from django_tasks_coord.store import flow as flow_claims
from tests.flow.conftest import age_starts, finish

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("spec", "rate"),
    [
        ("50/s", Rate(50, 1)),
        ("1000/m", Rate(1000, 60)),
        ("10/h", Rate(10, 3600)),
        ("100/10s", Rate(100, 10)),
    ],
)
def test_rates_parse(spec, rate):
    assert flow.parse_rate(spec) == rate
    assert flow.parse_rate(str(rate)) == rate


@pytest.mark.parametrize("spec", ["", "0/s", "5", "5/x", "a/s", "5/0s", None])
def test_bad_rates_are_refused(spec):
    with pytest.raises(InvalidArgumentError, match="N/unit"):
        flow.parse_rate(spec)


def test_bad_limits_are_refused(topic):
    with pytest.raises(InvalidArgumentError, match="concurrency"):
        flow.set_limits(topic.name, concurrency=0)
    with pytest.raises(InvalidArgumentError, match="limit key"):
        flow.set_limits(topic.name, concurrency=1, key="payload")
    with pytest.raises(InvalidArgumentError, match="fair claims need a key"):
        flow.set_limits(topic.name, fair=True)


def test_keys():
    assert flow.key_of("", "a", {"t": 1}) == ""
    assert flow.key_of("identifier", "a", None) == "a"
    assert flow.key_of("payload.tenant", "a", {"tenant": "acme"}) == "acme"
    assert flow.key_of("payload.t.1", "a", {"t": [5, {"x": 1}]}) == '{"x": 1}'
    assert flow.key_of("payload.missing", "a", {"t": 1}) == ""
    assert flow.key_of("payload.t", "a", {"t": "x" * 300}).startswith("sha256:")
    flow.register_key("first-letter", lambda identifier, payload: identifier[0])
    assert flow.key_of("callable:first-letter", "abc", None) == "a"
    with pytest.raises(InvalidArgumentError, match="register_key"):
        flow.key_of("callable:nobody", "a", None)


def test_a_push_stores_the_key_of_its_topics_limits(topic):
    flow.set_limits(topic.name, concurrency=2, key="payload.tenant")
    queue.push(topic, "a", {"tenant": "acme"})
    queue.push_many(topic, [("b", {"tenant": "umbrella"}), ("c", None)])
    keys = list(Task.objects.order_by("sequence").values_list("concurrency_key", flat=True))
    assert keys == ["acme", "umbrella", ""]


def test_concurrency_caps_the_tasks_in_flight(topic):
    flow.set_limits(topic.name, concurrency=3)
    queue.push_many(topic, [(f"t{i}", None) for i in range(10)])
    first = queue.poll(topic, 10)
    assert [t.identifier for t in first] == ["t0", "t1", "t2"]
    assert queue.poll(topic, 10) == []
    assert flow_claims.held_back_until([topic.name]) is not None
    finish(first[:2])
    assert [t.identifier for t in queue.poll(topic, 10)] == ["t3", "t4"]


def test_concurrency_per_key(topic):
    flow.set_limits(topic.name, concurrency=2, key="identifier")
    queue.push_many(topic, [("a", i) for i in range(5)] + [("b", i) for i in range(5)])
    claimed = queue.poll(topic, 100)
    assert sorted(t.identifier for t in claimed) == ["a", "a", "b", "b"]
    assert all(t.state == TaskState.ACTIVE and t.started_at is not None for t in claimed)
    assert queue.poll(topic, 100) == []


def test_rate_holds_within_the_window_and_frees_as_it_slides(topic):
    flow.set_limits(topic.name, rate="5/m")
    queue.push_many(topic, [(f"t{i}", None) for i in range(20)])
    assert len(queue.poll(topic, 3)) == 3
    age_starts(topic, 30)
    assert len(queue.poll(topic, 10)) == 2  # 5 in the last minute
    assert queue.poll(topic, 10) == []
    held = flow_claims.held_back_until([topic.name])
    assert held is not None
    age_starts(topic, 31)  # the first 3 are 61 s old, the last 2 are 31 s old
    assert len(queue.poll(topic, 10)) == 3
    assert queue.poll(topic, 10) == []
    assert FlowStart.objects.filter(topic=topic.name).count() == 2  # the old ones pruned


def test_rate_counts_starts_not_tasks_in_flight(topic):
    flow.set_limits(topic.name, rate="2/h")
    queue.push_many(topic, [(f"t{i}", None) for i in range(5)])
    finish(queue.poll(topic, 5))
    assert queue.poll(topic, 5) == []  # finished, but started within the hour


def test_rate_per_key(topic):
    flow.set_limits(topic.name, rate="2/s", key="payload.tenant")
    queue.push_many(topic, [(f"a{i}", {"tenant": "a"}) for i in range(5)])
    queue.push_many(topic, [(f"b{i}", {"tenant": "b"}) for i in range(5)])
    assert sorted(t.identifier for t in queue.poll(topic, 100)) == ["a0", "a1", "b0", "b1"]
    assert queue.poll(topic, 100) == []


def test_fair_claims_take_each_key_in_turn(topic):
    flow.set_limits(topic.name, key="identifier", fair=True)
    queue.push_many(topic, [("big", i) for i in range(50)])
    queue.push_many(topic, [(f"small{k}", 0) for k in range(9)])
    first = queue.poll(topic, 10)
    assert sorted(t.identifier for t in first) == ["big"] + [f"small{k}" for k in range(9)]


def test_without_fairness_claims_stay_fifo(topic):
    flow.set_limits(topic.name, concurrency=100, key="identifier")
    queue.push_many(topic, [("big", i) for i in range(50)])
    queue.push_many(topic, [(f"small{k}", 0) for k in range(9)])
    assert {t.identifier for t in queue.poll(topic, 10)} == {"big"}


def test_a_change_takes_effect_at_the_next_claim(topic):
    flow.set_limits(topic.name, concurrency=1)
    queue.push_many(topic, [(f"t{i}", None) for i in range(5)])
    assert len(queue.poll(topic, 5)) == 1
    Topic.objects.filter(name=topic.name).update(concurrency_limit=3)  # as the admin does
    assert len(queue.poll(topic, 5)) == 2
    Topic.objects.filter(name=topic.name).update(concurrency_limit=None)
    flow._cache.clear()  # unlimited claims trust the cache (up to five seconds)
    assert len(queue.poll(topic, 5)) == 2


def test_conditions_hold_under_limits(topic):
    flow.set_limits(topic.name, concurrency=5)
    queue.push_many(topic, [("a", 1), ("a", 2), ("b", 1)])
    claimed = queue.poll(topic, 5, condition=queue.Condition.SINGULAR_BY_IDENTIFIER)
    assert sorted(t.identifier for t in claimed) == ["a", "b"]


def test_limits_from_settings_and_their_check(topic):
    declared = {topic.name: {"rate": "10/s", "concurrency": 2, "key": "identifier", "fair": True}}
    assert flow.apply_settings(declared) == [topic.name]
    topic.refresh_from_db()
    assert (topic.rate_limit, topic.concurrency_limit, topic.limit_key, topic.fair) == (
        "10/s",
        2,
        "identifier",
        True,
    )
    with override_settings(TASKS_COORD={"LIMITS": {"x": {"rate": "fast"}}}):
        errors = [e for e in checks.run_checks() if e.id == "tasks_coord.E003"]
    assert errors and "LIMITS['x']" in errors[0].msg


def test_usage_reports_what_the_limits_see(topic):
    flow.set_limits(topic.name, rate="10/m", concurrency=5, key="identifier")
    queue.push_many(topic, [("a", 1), ("a", 2), ("b", 1)])
    queue.poll(topic, 5)
    seen = flow_claims.usage(topic.name)
    assert seen["active"] == {"a": 2, "b": 1}
    assert seen["started"] == {"a": 2, "b": 1}


def test_a_stale_cache_never_claims_past_a_new_limit(topic):
    queue.push_many(topic, [(f"t{i}", None) for i in range(5)])
    assert not flow.limits_of(topic.name).limited  # cached: no limits
    Topic.objects.filter(name=topic.name).update(concurrency_limit=1)  # another process
    assert queue.poll(topic, 5) == []  # the cache is stale: nothing, rather than too much
    flow._cache.clear()  # it expires (five seconds)
    topics.known_topics.clear()
    assert len(queue.poll(topic, 5)) == 1


def test_fair_claims_go_round_the_keys_from_claim_to_claim(topic):
    flow.set_limits(topic.name, key="identifier", fair=True)
    queue.push_many(topic, [("big", i) for i in range(50)])
    queue.push_many(topic, [(key, 0) for key in ("a", "c", "b")])
    one_by_one = [queue.poll(topic, 1)[0].identifier for _ in range(6)]
    assert one_by_one == ["a", "b", "big", "c", "big", "big"]
    Topic.objects.filter(name=topic.name).update(fair_cursor="")
    queue.push_many(topic, [("a", 1), ("b", 1)])
    assert [t.identifier for t in queue.poll(topic, 2)] == ["a", "b"]
    assert [t.identifier for t in queue.poll(topic, 2)] == ["big", "big"]


def test_the_metrics_show_the_limits(topic):
    from django_tasks_coord.metrics import state

    queue.register_topic("unlimited")
    flow.set_limits(topic.name, rate="1000/m", concurrency=4, key="identifier")
    read = state.read()
    assert read.rate_limits == {topic.name: pytest.approx(1000 / 60)}
    assert read.concurrency_limits == {topic.name: 4.0}


def test_limits_without_a_key_cost_a_few_statements_beside_the_claim_without_limits(topic):
    # The lock of the topic's row, its room counted in one statement (clock included), the
    # claim statement of a topic without limits, the start logged: not a read of the
    # candidates and an update of them by key, nor a statement per count.
    other = queue.register_topic("unlimited")
    queue.push_many(other, [(f"u{i}", None) for i in range(10)])
    queue.push_many(topic, [(f"t{i}", None) for i in range(10)])
    flow.set_limits(topic.name, rate="1000/s", concurrency=1000, total_concurrency=1000)
    for name in (topic.name, other.name):  # known and their limits cached, as on a node
        topics.topic_name(name), flow.limits_of(name)
    conn = connections[db.alias()]
    with CaptureQueriesContext(conn) as unlimited:
        assert len(queue.poll(other, 5)) == 5
    for _ in range(2):  # the second claim finds the first one's start in the log
        with CaptureQueriesContext(conn) as limited:
            claimed = queue.poll(topic, 5)
        assert [t.state for t in claimed] == [TaskState.ACTIVE] * 5
        extra = 4 if db.locks_whole_database(conn) else 3  # SQLite: its write lock
        assert len(_statements(limited)) <= len(_statements(unlimited)) + extra, [
            q[:60] for q in _statements(limited)
        ]
    assert [t.identifier for t in claimed] == [f"t{i}" for i in range(5, 10)]
    assert FlowStart.objects.filter(topic=topic.name).count() == 2


def _statements(captured: CaptureQueriesContext) -> list[str]:
    """The statements ``captured``, without the savepoints of the test's transaction."""
    sql = [query["sql"] for query in captured.captured_queries]
    return [q for q in sql if not q.startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))]
