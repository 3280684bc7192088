"""The task store rule, checked on every statement the tests run: outside the task store
(``django_tasks_coord/store/``), no module of the package writes task rows (nor rows of
the workflow tables, which ``store/workflows.py`` writes).

How: :func:`install` puts :func:`guard` among the execute wrappers of every database
connection (the open ones, and through the ``connection_created`` signal every one
opened later, in any thread: node threads included). For every ``INSERT``, ``UPDATE``
or ``DELETE`` whose target is the task table (or one of its partitions on PostgreSQL),
it walks the Python stack outward to the first frame inside the ``django_tasks_coord``
package that is not a data-layer frame (:data:`TRANSPARENT`: the models and their
querysets, the ``db`` helpers, which only run what their caller asked for). That frame
is the writer. If it is outside the store, a :class:`Violation` naming
``module:function:line`` is recorded, and the autouse fixture of ``tests/conftest.py``
fails the test during which it happened.

What it does not judge:

- Writes with no package frame on the stack at all: tests and their factories writing
  rows directly, Django's own code (a ``QuerySet.delete()`` called by a test). They are
  the caller's business.
- The Django admin: it has no add, change or delete permission on tasks or owners
  (``admin/base.py``), and a topic cannot be deleted while it has tasks
  (``on_delete=PROTECT``). Should an admin view or action ever write task rows, the
  package's admin classes are on the stack, so it would be reported like any module.
- Work in other processes (``runscheduler`` nodes started by tests, HTTP servers): only
  this process's connections are wrapped. The same code runs in-process elsewhere in
  the suite.
- :data:`EXEMPT`: schema operations that move rows without changing them.

The checkpoint table has a stricter rule of its own: its one writer is
``store/checkpoints.py`` (:data:`CHECKPOINT_WRITER`), the module that fences its writes.
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

import django_tasks_coord
from django_tasks_coord.models import Checkpoint, Task, Workflow, WorkflowStep

#: The package's directory, as code objects name their files.
PACKAGE = str(Path(django_tasks_coord.__file__).resolve().parent) + "/"
#: The task store, relative to :data:`PACKAGE`.
STORE = "store/"
#: Data-layer frames (relative to :data:`PACKAGE`): they write only what their caller
#: asks for, so the writer is further out.
TRANSPARENT = ("models.py", "models/", "db.py", "db/")
#: Modules that move rows without changing them, and why.
EXEMPT = {
    "partitions.py": "attaching a partition or converting the table moves rows between tables",
    "migrations/": "migrations change the schema",
}
_VERBS = ("INSERT", "UPDATE", "DELETE", "WITH")
#: The one module that writes the checkpoint table (relative to :data:`PACKAGE`).
CHECKPOINT_WRITER = "store/checkpoints.py"


@dataclass(frozen=True)
class Violation:
    """A write of task rows by a module outside the store."""

    writer: str  #: ``module:function:line`` of the frame that asked for it
    sql: str  #: the statement's beginning

    def __str__(self) -> str:
        return f"{self.writer} wrote task rows: {self.sql}"


violations: list[Violation] = []
_capturing = threading.local()


def _target(table: str) -> re.Pattern[str]:
    """Statements whose target is ``table`` or a partition of it."""
    name = re.escape(table) + r"(?:_default|_p_\w+)?"
    return re.compile(
        rf"\b(?:INSERT\s+(?:IGNORE\s+)?INTO|UPDATE|DELETE(?:\s+FROM)?|DELETE\s+\S+\s+FROM)"
        rf"\s+[`\"]?{name}[`\"]?(?:\s|\(|$)",
        re.IGNORECASE,
    )


_TABLE = Task._meta.db_table
#: The tables only the store writes: the tasks', and the workflows' (store/workflows.py).
_TABLES = (_TABLE, Workflow._meta.db_table, WorkflowStep._meta.db_table)
_WRITES = [_target(table) for table in _TABLES]


def _writes_tasks(
    sql: Any, tables: tuple[str, ...] = _TABLES, targets: list[re.Pattern[str]] = _WRITES
) -> bool:
    if not isinstance(sql, str) or not any(table in sql for table in tables):
        return False
    if not sql.lstrip()[:6].upper().startswith(_VERBS):
        return False
    return any(pattern.search(sql) for pattern in targets)


_CHECKPOINTS = (Checkpoint._meta.db_table,)
_WRITES_CHECKPOINTS = [_target(table) for table in _CHECKPOINTS]


def writer(frame: FrameType | None) -> tuple[str, str] | None:
    """The first package frame from ``frame`` outward that is not a data-layer frame:
    (its file relative to the package, ``module:function:line``); None if there is none."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(PACKAGE):
            relative = filename[len(PACKAGE) :]
            if not relative.startswith(TRANSPARENT):
                module = "django_tasks_coord." + relative.removesuffix(".py").replace("/", ".")
                where = (
                    f"{module.removesuffix('.__init__')}:{frame.f_code.co_name}:{frame.f_lineno}"
                )
                return relative, where
        frame = frame.f_back
    return None


def _judge(sql: str, allowed: str = STORE) -> None:
    found = writer(sys._getframe(2))
    if found is None:
        return  # no package frame: a test or Django itself wrote
    relative, where = found
    if relative.startswith(allowed) or relative.startswith(tuple(EXEMPT)):
        return
    violation = Violation(where, " ".join(sql.split())[:120])
    captured = getattr(_capturing, "found", None)
    (captured if captured is not None else violations).append(violation)


def guard(execute: Callable[..., Any], sql: Any, params: Any, many: bool, context: Any) -> Any:
    """The execute wrapper: judge a write of task rows, then run the statement."""
    if _writes_tasks(sql):
        _judge(sql)
    elif _writes_tasks(sql, _CHECKPOINTS, _WRITES_CHECKPOINTS):
        _judge(sql, CHECKPOINT_WRITER)
    return execute(sql, params, many, context)


def _wrap(connection: BaseDatabaseWrapper) -> None:
    if guard not in connection.execute_wrappers:
        connection.execute_wrappers.append(guard)


def _on_connection_created(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    _wrap(connection)


def install() -> None:
    """Guard the connections of this thread and every connection opened from now on."""
    connection_created.connect(_on_connection_created, weak=False, dispatch_uid=__name__)
    for connection in connections.all():
        _wrap(connection)


@contextmanager
def capture() -> Iterator[list[Violation]]:
    """Collect the violations of this thread inside the block (instead of failing the test):
    for tests of the guard itself."""
    found: list[Violation] = []
    _capturing.found = found
    try:
        yield found
    finally:
        _capturing.found = None


def check() -> None:
    """Fail (``pytest.fail``) if task rows were written outside the store since the last check."""
    found, violations[:] = list(violations), []
    if found:
        listed = "\n".join(f"  {violation}" for violation in found)
        pytest.fail(
            "Task rows written outside the task store (django_tasks_coord/store/); "
            f"move the write into the store:\n{listed}",
            pytrace=False,
        )
