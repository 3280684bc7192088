"""The task store's insert statements: compiled once per shape, every value written as given.

Each shape (which columns the rows leave to the database, how many rows) is compiled by
Django once; later inserts of that shape only prepare their values. These tests insert
rows of several shapes twice, so that the second insert runs from the kept shape.
"""

from __future__ import annotations

from collections import OrderedDict
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from django_tasks_coord import queue
from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Task, inserts
from django_tasks_coord.store import insert as store_insert

pytestmark = pytest.mark.django_db(transaction=True)

WHEN = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


def fields(task: Task) -> tuple:
    row = Task.objects.get(pk=task.pk)
    return (row.identifier, row.payload, row.priority, row.execute_at, row.handler, row.label)


@pytest.mark.parametrize("rows", [1, 3])
def test_every_shape_writes_its_values_the_first_time_and_from_the_kept_shape(topic, rows):
    shapes = [
        {"payload": None},
        {"payload": {"a": [1, "x"]}, "priority": 5},
        {"payload": [1, 2], "execute_at": WHEN, "handler": "tests.queue.handler"},
        {"payload": "text", "label": "hello", "requester": "me"},
    ]
    for attempt in range(2):
        for number, values in enumerate(shapes):
            tasks = [
                Task(topic_id="jobs", identifier=f"{attempt}-{number}-{i}", **values)
                for i in range(rows)
            ]
            created = store_insert.insert(tasks)
            for task in created:
                expected = (
                    task.identifier,
                    values.get("payload"),
                    values.get("priority", 0),
                    values.get("execute_at"),
                    values.get("handler", ""),
                    values.get("label", ""),
                )
                assert fields(task) == expected
                assert task.created_at is not None


def test_a_null_payload_is_stored_as_sql_null_not_json_null(topic):
    queue.push("jobs", "none", None)
    queue.push("jobs", "none again", None)  # from the kept shape
    assert Task.objects.filter(payload__isnull=True).count() == 2


def test_a_shape_is_compiled_once(topic, monkeypatch):
    monkeypatch.setattr(inserts, "_shapes", OrderedDict())  # none kept by earlier tests
    queue.push("jobs", "first", {"n": 1})
    compiled = []
    original = inserts._compiled
    monkeypatch.setattr(inserts, "_compiled", lambda *args: compiled.append(1) or original(*args))
    queue.push("jobs", "second", {"n": 2})
    queue.push_many("jobs", [("third", {"n": 3}), ("fourth", None)])
    queue.push_many("jobs", [("fifth", {"n": 5}), ("sixth", None)])
    assert len(compiled) == 1  # the two-row shape, once
    assert sorted(Task.objects.values_list("identifier", flat=True)) == sorted(
        ["first", "second", "third", "fourth", "fifth", "sixth"]
    )


def test_rows_that_take_the_database_default_and_rows_that_do_not_mix(topic):
    earlier = datetime.now(UTC) - timedelta(days=3)
    given = Task(topic_id="jobs", identifier="given", created_at=earlier)
    default = Task(topic_id="jobs", identifier="default")
    store_insert.insert([given, default])
    assert Task.objects.get(identifier="given").created_at == earlier
    assert Task.objects.get(identifier="default").created_at > earlier + timedelta(days=2)


def test_more_rows_than_one_statement_takes_are_all_written_in_order(topic):
    columns = [column.field for column in inserts._columns(Task)]
    limit = connection.features.max_query_params  # SQLite caps a statement's parameters
    count = 3000 if limit is None else limit // len(columns) + 10  # there: two statements
    created = queue.push_many("jobs", [(f"t{i}", {"i": i}) for i in range(count)])
    sequences = [task.sequence for task in created]
    assert sequences == sorted(sequences) and len(set(sequences)) == count
    stored = dict(Task.objects.values_list("identifier", "payload"))
    assert all(stored[f"t{i}"] == {"i": i} for i in range(0, count, 97))
    assert len(Task.objects.values_list("pk")) == count


def test_append_writes_each_row_with_the_shared_values_and_payload_defaults(topic):
    for attempt in range(2):  # the second from the kept statement
        created = store_insert.append(
            "jobs",
            [(f"a{attempt}", {"b": 3}), (f"n{attempt}", None), (f"c{attempt}", {"c": [1]})],
            defaults={"a": 1, "b": 2},
            priority=4,
            execute_at=WHEN,
            handler="tests.queue.handler",
        )
        rows = {t.identifier: t for t in Task.objects.filter(identifier__endswith=str(attempt))}
        assert [rows[f"{k}{attempt}"].payload for k in "anc"] == [
            {"a": 1, "b": 3},
            None,
            {"a": 1, "b": 2, "c": [1]},
        ]
        assert {(t.priority, t.execute_at, t.handler, t.state) for t in rows.values()} == {
            (4, WHEN, "tests.queue.handler", TaskState.PENDING)
        }
        assert created == [rows[f"{k}{attempt}"].created_at for k in "anc"]


@pytest.mark.skipif(
    connection.vendor == "sqlite", reason="SQLite checks the topic at the commit (adding_tasks)"
)
def test_append_to_a_missing_topic_inside_a_transaction_leaves_it_usable(topic):
    from django.db import IntegrityError, transaction

    with transaction.atomic():
        with pytest.raises(IntegrityError):
            store_insert.append("nope", [("a", {"x": 1})])
        store_insert.append("jobs", [("b", {"x": 2})])
    assert list(Task.objects.values_list("topic_id", "identifier")) == [("jobs", "b")]


@pytest.mark.parametrize("keyed", [False, True], ids=["no limit key", "limit key"])
def test_a_one_row_append_writes_the_row_a_many_row_append_writes(topic, keyed):
    from django.test.utils import CaptureQueriesContext

    from django_tasks_coord import flow

    if keyed:  # the one row's key is shared; the two rows' keys differ: a column of its own
        flow.set_limits("jobs", concurrency=2, key="payload.tenant")
    shared = {
        "defaults": {"a": 1, "b": 2, "tenant": "t0"},
        "priority": 4,
        "execute_at": WHEN,
        "handler": "tests.queue.handler",
    }
    for payload in ({"b": 3, "tenant": "t1"}, None, {}):
        Task.objects.all().delete()
        with CaptureQueriesContext(connection) as one:
            store_insert.append("jobs", [("x", payload)], **shared)
        store_insert.append("jobs", [("x", payload), ("y", {"tenant": "t2"})], **shared)
        rows = list(Task.objects.filter(identifier="x").order_by("sequence").values())
        for row in rows:  # what two inserts of one row must not share
            del row["sequence"], row["created_at"]
        assert rows[0] == rows[1]
        assert rows[0]["payload"] == (
            None if payload is None else {**shared["defaults"], **payload}
        )
        if connection.vendor == "postgresql":
            assert " VALUES " in one.captured_queries[-1]["sql"]
            assert "UNNEST" not in one.captured_queries[-1]["sql"]
