"""Reading PostgreSQL plans of queries on the task table, partitioned or not."""

from __future__ import annotations

import re

from django.db import connection


def explain(sql: str, params: object = ()) -> str:
    """``EXPLAIN`` of ``sql``, with the task table's index names (see :func:`parent_index_names`)."""
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {sql}", params)
        return parent_index_names("\n".join(row[0] for row in cursor.fetchall()))


def parent_index_names(plan: str) -> str:
    """``plan`` with each partition's index named as the task table's index it belongs to.

    A partitioned table's indexes are made again in every partition under names PostgreSQL
    chooses; a plan scans those. Naming them after the index they were made from lets a test
    say which of the task table's indexes a query uses, partitioned or not.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT child.relname, parent.relname FROM pg_inherits i "
            "JOIN pg_class child ON child.oid = i.inhrelid "
            "JOIN pg_class parent ON parent.oid = i.inhparent "
            "WHERE child.relkind = 'i' AND parent.relkind = 'I'"
        )
        names = dict(cursor.fetchall())
    if not names:
        return plan
    pattern = re.compile(
        r"\b(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + r")\b"
    )
    return pattern.sub(lambda match: names[match[1]], plan)
