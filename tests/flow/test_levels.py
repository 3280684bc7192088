"""Flow control on two levels (per key and for the topic as a whole, at once) and the
limits of particular key values (``key_limits``), in one process on every database."""

import pytest
from django.core import checks
from django.test import override_settings

from django_tasks_coord import db, flow, queue
from django_tasks_coord.exceptions import InvalidArgumentError
from django_tasks_coord.flow import KeyLimit, Rate
from django_tasks_coord.models import FlowStart, Topic
from django_tasks_coord.store import claims
from django_tasks_coord.store import flow as flow_claims
from tests.flow.conftest import age_starts, finish

pytestmark = pytest.mark.django_db


def push_keys(topic, keys, each):
    queue.push_many(topic, [(key, i) for i in range(each) for key in keys])


def by_key(tasks):
    counts = {}
    for task in tasks:
        counts[task.identifier] = counts.get(task.identifier, 0) + 1
    return counts


# --- a topic-wide limit and per-key limits at once ---------------------------------------


def test_total_concurrency_caps_the_topic_while_each_key_has_its_own(topic):
    flow.set_limits(topic.name, concurrency=2, key="identifier", total_concurrency=5)
    push_keys(topic, ["a", "b", "c", "d"], 4)
    first = queue.poll(topic, 100)
    assert len(first) == 5  # the total, though 4 keys x 2 would allow 8
    assert max(by_key(first).values()) <= 2
    assert queue.poll(topic, 100) == []
    assert flow_claims.held_back_until([topic.name]) is not None
    finish(first[:3])
    second = queue.poll(topic, 100)
    assert len(second) == 3
    active = by_key([*first[3:], *second])
    assert max(active.values()) <= 2


def test_per_key_concurrency_still_holds_under_a_looser_total(topic):
    flow.set_limits(topic.name, concurrency=1, key="identifier", total_concurrency=50)
    push_keys(topic, ["a", "b"], 5)
    assert sorted(t.identifier for t in queue.poll(topic, 100)) == ["a", "b"]


def test_total_rate_caps_the_topic_while_each_key_has_its_own(topic):
    flow.set_limits(topic.name, rate="3/m", key="identifier", total_rate="5/m")
    push_keys(topic, ["a", "b", "c"], 5)
    first = queue.poll(topic, 100)
    assert len(first) == 5 and max(by_key(first).values()) <= 3
    finish(first)
    assert queue.poll(topic, 100) == []  # finished, but the total window is full
    age_starts(topic, 61)
    second = queue.poll(topic, 100)
    assert len(second) == 5 and max(by_key(second).values()) <= 3


def test_total_rate_with_a_longer_period_than_the_per_key_rate(topic):
    flow.set_limits(topic.name, rate="2/s", key="identifier", total_rate="5/h")
    push_keys(topic, ["a", "b", "c", "d"], 5)
    assert len(queue.poll(topic, 100)) == 5
    age_starts(topic, 10)  # every key's one-second window is clear, the hour is not
    assert queue.poll(topic, 100) == []
    assert FlowStart.objects.filter(topic=topic.name).exists()  # kept for the hour
    age_starts(topic, 3600)
    assert len(queue.poll(topic, 100)) == 5


def test_without_a_key_both_sets_apply_to_the_whole_topic(topic):
    flow.set_limits(topic.name, concurrency=4, total_concurrency=2)
    queue.push_many(topic, [(f"t{i}", None) for i in range(6)])
    claimed = queue.poll(topic, 10)
    assert len(claimed) == 2  # the tighter of the two
    finish(claimed)
    flow.set_limits(topic.name, rate="10/m", total_rate="1/m")
    assert len(queue.poll(topic, 10)) == 1
    assert queue.poll(topic, 10) == []
    flow.set_limits(topic.name, rate="1/m", total_rate="10/m")
    age_starts(topic, 120)
    assert len(queue.poll(topic, 10)) == 1


def test_a_topic_with_only_a_total_limit_is_limited(topic):
    flow.set_limits(topic.name, total_concurrency=1)
    assert flow.limits_of(topic.name, fresh=True).limited
    assert Topic.objects.filter(flow.LIMITED, name=topic.name).exists()
    queue.push_many(topic, [(f"t{i}", None) for i in range(3)])
    assert len(queue.poll(topic, 10)) == 1


def test_usage_shows_both_levels(topic):
    flow.set_limits(topic.name, rate="10/m", concurrency=5, key="identifier", total_rate="20/m")
    push_keys(topic, ["a", "b"], 2)
    queue.push(topic, "a", 9)
    queue.poll(topic, 10)
    seen = flow_claims.usage(topic.name)
    assert seen["active"] == {"a": 3, "b": 2} and seen["started"] == {"a": 3, "b": 2}
    assert (seen["total_active"], seen["total_started"]) == (5, 5)
    assert seen["limits"].total_rate == Rate(20, 60)


def test_total_limits_from_settings_and_their_check(topic):
    declared = {topic.name: {"concurrency": 2, "key": "identifier", "total_concurrency": 8}}
    flow.apply_settings(declared)
    topic.refresh_from_db()
    assert (topic.total_concurrency_limit, topic.total_rate_limit) == (8, "")
    with override_settings(TASKS_COORD={"LIMITS": {"x": {"total_rate": "fast"}}}):
        errors = [e for e in checks.run_checks() if e.id == "tasks_coord.E003"]
    assert errors and "LIMITS['x']" in errors[0].msg
    with override_settings(TASKS_COORD={"LIMITS": {"x": {"total_concurrency": 0}}}):
        errors = [e for e in checks.run_checks() if e.id == "tasks_coord.E003"]
    assert errors and "total_concurrency" in errors[0].msg


def test_the_metrics_show_the_total_limits(topic):
    from django_tasks_coord.metrics import state

    flow.set_limits(topic.name, concurrency=2, key="identifier", total_rate="60/m")
    read = state.read()
    assert read.total_rate_limits == {topic.name: pytest.approx(1.0)}
    assert read.concurrency_limits == {topic.name: 2.0}
    assert read.total_concurrency_limits == {}


# --- limits of particular key values ------------------------------------------------------


def test_a_key_value_gets_its_own_limits_and_the_others_the_defaults(topic):
    flow.set_limits(topic.name, concurrency=1, key="payload.tenant")
    flow.set_key_limits(topic.name, "acme", concurrency=3)
    queue.push_many(topic, [(f"a{i}", {"tenant": "acme"}) for i in range(5)])
    queue.push_many(topic, [(f"u{i}", {"tenant": "umbrella"}) for i in range(5)])
    claimed = queue.poll(topic, 100)
    assert sorted(t.identifier for t in claimed) == ["a0", "a1", "a2", "u0"]


def test_without_defaults_a_key_value_without_an_entry_is_unlimited(topic):
    flow.set_limits(topic.name, key="identifier")
    flow.set_key_limits(topic.name, "slow", rate="2/m")
    push_keys(topic, ["slow", "fast"], 5)
    assert by_key(queue.poll(topic, 100)) == {"slow": 2, "fast": 5}
    assert queue.poll(topic, 100) == []


def test_a_topic_whose_only_limits_are_key_limits_is_limited(topic):
    queue.push_many(topic, [("a", i) for i in range(5)])
    assert not flow.limits_of(topic.name).limited  # cached: no limits
    flow.set_limits(topic.name, key="identifier")
    queue.push_many(topic, [("a", i) for i in range(5, 10)])
    Topic.objects.filter(name=topic.name).update(key_limits={"a": {"concurrency": 2}})
    assert Topic.objects.filter(flow.LIMITED, name=topic.name).exists()
    # A stale cache that says "no limits" claims nothing (the unlimited statement's guard)
    using = db.alias()
    flow._cache.put({topic.name: flow.Limits(key="identifier")}, using)
    stale = claims.claim(topic.name, 10, queue.Order.FIFO, None, None, using, db.connection())
    assert stale == []
    flow._cache.clear()
    assert flow.limits_of(topic.name, fresh=True).limited
    claimed = queue.poll(topic, 100)
    # the five pushed before the key have the key "": unlimited; two of the later five
    assert len(claimed) == 7


def test_set_key_limits_merges_and_removes_entries(topic):
    flow.set_limits(topic.name, rate="5/s", key="payload.tenant")
    flow.set_key_limits(topic.name, "acme", rate="10/s", concurrency=2)
    flow.set_key_limits(topic.name, 42, concurrency=1)
    topic.refresh_from_db()
    assert topic.key_limits == {
        "acme": {"rate": "10/s", "concurrency": 2},
        "42": {"concurrency": 1},
    }
    limits = flow.limits_of(topic.name, fresh=True)
    assert limits.for_key("acme") == KeyLimit(Rate(10, 1), 2)
    assert limits.for_key("42") == KeyLimit(None, 1)
    assert limits.for_key("other") == KeyLimit(Rate(5, 1), None)
    flow.set_limits(topic.name, rate="1/s", key="payload.tenant")  # leaves key_limits alone
    topic.refresh_from_db()
    assert set(topic.key_limits) == {"acme", "42"}
    flow.set_key_limits(topic.name, "acme")
    flow.set_key_limits(topic.name, 42, rate=None, concurrency=None)
    topic.refresh_from_db()
    assert topic.key_limits is None
    assert (
        not Topic.objects.filter(flow.LIMITED, name=topic.name).exclude(rate_limit="1/s").exists()
    )
    flow.set_limits(topic.name, key="payload.tenant", key_limits={"x": {"rate": "1/h"}})
    topic.refresh_from_db()
    assert topic.key_limits == {"x": {"rate": "1/h"}}
    flow.set_limits(topic.name, key_limits=None)
    topic.refresh_from_db()
    assert topic.key_limits is None and not flow.limits_of(topic.name, fresh=True).limited


def test_bad_key_limits_are_refused(topic):
    with pytest.raises(InvalidArgumentError, match="N/unit"):
        flow.set_key_limits(topic.name, "a", rate="fast")
    with pytest.raises(InvalidArgumentError, match="concurrency"):
        flow.set_key_limits(topic.name, "a", concurrency=0)
    with pytest.raises(InvalidArgumentError, match="key_limits"):
        flow.set_limits(topic.name, key="identifier", key_limits={"a": {"speed": 1}})
    with pytest.raises(InvalidArgumentError, match="key_limits"):
        flow.set_limits(topic.name, key="identifier", key_limits=["a"])


def test_the_rate_window_is_kept_for_the_longest_rate_of_the_topic(topic):
    flow.set_limits(topic.name, rate="5/s", key="identifier")
    flow.set_key_limits(topic.name, "hourly", rate="2/h")
    push_keys(topic, ["hourly", "often"], 5)
    assert by_key(queue.poll(topic, 100)) == {"hourly": 2, "often": 5}
    age_starts(topic, 10)  # past the default's second, within the hour
    assert by_key(queue.poll(topic, 100)) == {}  # "often" has nothing left, "hourly" waits
    queue.push_many(topic, [("often", i) for i in range(5, 8)])
    assert by_key(queue.poll(topic, 100)) == {"often": 3}
    assert queue.poll(topic, 100) == []
    age_starts(topic, 3600)
    assert by_key(queue.poll(topic, 100)) == {"hourly": 2}


def test_a_held_back_key_value_says_when_to_look_again(topic):
    flow.set_limits(topic.name, key="identifier")
    flow.set_key_limits(topic.name, "a", rate="1/h")
    queue.push_many(topic, [("a", i) for i in range(3)])
    assert len(queue.poll(topic, 10)) == 1
    assert queue.poll(topic, 10) == []
    held = flow_claims.held_back_until([topic.name])
    assert held is not None
    import time

    assert held - time.monotonic() > 3000  # the hour's window, not the recheck interval


def test_the_admin_form_checks_the_new_fields(topic):
    from django_tasks_coord.admin.topics import TopicForm

    data = {"rate_limit": "", "limit_key": "identifier", "total_rate_limit": "fast"}
    form = TopicForm(data=data, instance=topic)
    assert not form.is_valid()
    data = {"limit_key": "identifier", "key_limits": '{"a": {"concurrency": 0}}'}
    assert not TopicForm(data=data, instance=topic).is_valid()
    data = {"limit_key": "identifier", "key_limits": '{"a": {"concurrency": 2}}'}
    assert TopicForm(data=data, instance=topic).is_valid()
