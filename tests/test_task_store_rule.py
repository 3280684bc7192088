"""The task store rule (``tests/store_rule.py``) catches a write of task rows outside the store.

Every test of the suite runs under the guard; these show that it reports what it should
and nothing else.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from django_tasks_coord import queue
from django_tasks_coord.models import Task
from tests import store_rule


def _compiled_in(relative: str, source: str) -> dict[str, Any]:
    """Run ``source`` as if it were the package's module ``relative``; return its names."""
    code = compile(source, store_rule.PACKAGE + relative, "exec")
    names: dict[str, Any] = {"Task": Task, "connection": connection}
    exec(code, names)
    return names


SNEAKY = """
def sneaky(pk):
    return Task.objects.filter(pk=pk).update(priority=7)

def sneaky_insert(topic):
    return Task.objects.insert([Task(topic_id=topic, identifier="x")])

def sneaky_sql(pk):
    with connection.cursor() as cursor:
        table = connection.ops.quote_name(Task._meta.db_table)
        cursor.execute(f"DELETE FROM {table} WHERE sequence = %s", [pk])
"""


def test_an_update_from_a_module_outside_the_store_is_reported(topic):
    task = queue.push(topic, "a")
    sneaky = _compiled_in("operations.py", SNEAKY)["sneaky"]
    with store_rule.capture() as found:
        assert sneaky(task.pk) == 1
    assert [v.writer for v in found] == ["django_tasks_coord.operations:sneaky:3"]
    assert found[0].sql.startswith("UPDATE")


def test_an_insert_through_the_queryset_and_raw_sql_are_reported_too(topic):
    names = _compiled_in("topics.py", SNEAKY)
    with store_rule.capture() as found:
        task = names["sneaky_insert"](topic.name)[0]
        names["sneaky_sql"](task.pk)
    assert [v.writer for v in found] == [
        "django_tasks_coord.topics:sneaky_insert:6",
        "django_tasks_coord.topics:sneaky_sql:11",
    ]
    assert [v.sql.split()[0] for v in found] == ["INSERT", "DELETE"]


def test_a_write_from_scheduling_is_reported(topic):
    """Scheduling writes its runs through the store (store/jobs.py): a write of its own is caught."""
    task = queue.push(topic, "a")
    sneaky = _compiled_in("scheduling/runner.py", SNEAKY)["sneaky"]
    with store_rule.capture() as found:
        sneaky(task.pk)
    assert [v.writer for v in found] == ["django_tasks_coord.scheduling.runner:sneaky:3"]


def test_the_store_tests_and_reads_are_not_reported(topic):
    task = queue.push(topic, "a")
    in_store = _compiled_in("store/anything.py", SNEAKY)["sneaky"]
    with store_rule.capture() as found:
        in_store(task.pk)  # the store itself
        Task.objects.filter(pk=task.pk).update(priority=3)  # a test writing directly
        queue.complete(queue.poll(topic)[0], queue.Result.SUCCESS)  # the API, through the store
        list(Task.objects.filter(pk=task.pk).select_for_update())  # a read, FOR UPDATE
    assert found == []


def test_the_fixture_fails_a_test_that_broke_the_rule(topic):
    task = queue.push(topic, "a")
    _compiled_in("queue.py", SNEAKY)["sneaky"](task.pk)  # not captured: recorded for the test
    assert [v.writer for v in store_rule.violations] == ["django_tasks_coord.queue:sneaky:3"]
    with pytest.raises(pytest.fail.Exception, match=r"django_tasks_coord\.queue:sneaky:3"):
        store_rule.check()
    assert store_rule.violations == []  # reported once; the fixture's own check passes
