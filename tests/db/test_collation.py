"""Identifiers, topic names and keys compare byte for byte on every database: case, accents
and trailing spaces count (django_tasks_coord.db.collation; on MariaDB/MySQL migration 0019
converts the tables, which the database's default collation made case-blind)."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.db import connection

from django_tasks_coord import db, queue
from django_tasks_coord.enums import Insertion, TaskState
from django_tasks_coord.models import Task

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    "other", ["order-1", "Order-1 ", "Ordér-1"], ids=["case", "trailing space", "accent"]
)
def test_an_identifier_that_differs_only_in_case_spaces_or_accents_is_another_task(other):
    queue.register_topic("shop")
    queue.push("shop", "Order-1", {"n": 1})
    queue.push("shop", other, {"n": 2}, insertion=Insertion.REPLACE)
    rows = dict(Task.objects.values_list("identifier", "state"))
    assert rows == {"Order-1": TaskState.PENDING, other: TaskState.PENDING}


def test_topics_whose_names_differ_only_in_case_are_two_topics():
    queue.register_topic("Shop")
    queue.register_topic("shop")
    queue.push("shop", "a")
    assert queue.poll("Shop", 10) == []
    assert [t.identifier for t in queue.poll("shop", 10)] == ["a"]


@pytest.mark.skipif(connection.vendor != "mysql", reason="MariaDB/MySQL collations")
def test_every_text_column_of_the_package_has_the_binary_no_pad_collation():
    tables = [
        m._meta.db_table
        for m in apps.get_app_config("django_tasks_coord").get_models(include_auto_created=True)
    ]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT TABLE_NAME, COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = DATABASE() AND COLLATION_NAME IS NOT NULL AND TABLE_NAME IN "
            f"({', '.join(['%s'] * len(tables))})",
            tables,
        )
        columns = cursor.fetchall()
    expected = db.binary_collation(connection)
    assert expected in ("utf8mb4_nopad_bin", "utf8mb4_0900_bin")  # this server has one
    assert columns  # the package's text columns were found
    assert [c for c in columns if c[2] != expected] == []
