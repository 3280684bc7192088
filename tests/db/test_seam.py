"""The database seam (``django_tasks_coord.db``): what it answers per database, the rule that
nobody else asks ``connection.vendor``, its index helper, and the one LISTEN policy."""

from __future__ import annotations

import ast
import asyncio
import logging
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import OperationalError, connection, transaction

from django_tasks_coord import db
from django_tasks_coord.models import Task

try:
    import psycopg
except ImportError:  # the SQLite-only envs install no PostgreSQL driver
    psycopg = None

#: The LISTEN policy's tests patch psycopg's connect: they need the driver installed.
needs_psycopg = pytest.mark.skipif(psycopg is None, reason="needs psycopg (the [postgres] extra)")

PACKAGE = Path(db.__file__).parent.parent


def _reads_vendor(path: Path) -> list[int]:
    """Lines of ``path`` that read a ``.vendor`` attribute (``db.vendor``, the module, aside)."""
    tree = ast.parse(path.read_text())
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr == "vendor"
        and not (isinstance(node.value, ast.Name) and node.value.id == "db")
    ]


def test_only_db_vendor_branches_on_the_vendor():
    """Callers ask :mod:`django_tasks_coord.db` what the database can do (its docstring says so)."""
    allowed = {
        PACKAGE / "db" / "vendor.py",
        # Frozen migration: adds MySQL's virtual column on MySQL only (see db.uses_virtual_columns).
        PACKAGE / "migrations" / "0011_mysql_unfinished_identifier.py",
    }
    found = {
        f"{path.relative_to(PACKAGE)}:{line}"
        for path in PACKAGE.rglob("*.py")
        if path not in allowed
        for line in _reads_vendor(path)
    }
    assert found == set()


def test_the_seam_imports_nothing_of_the_package_but_its_settings():
    """No cycle through the models: db imports conf and its own modules only."""
    imported = set()
    for path in (PACKAGE / "db").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("django_tasks"):
                imported.add(node.module)
    assert {m for m in imported if not m.startswith("django_tasks_coord.db.")} == {
        "django_tasks_coord.conf"
    }


def fake(vendor: str, *, mariadb: bool = False) -> Any:
    return SimpleNamespace(vendor=vendor, mysql_is_mariadb=mariadb)


@pytest.mark.parametrize(
    ("vendor", "expected"),
    [
        (
            "postgresql",
            {"locks_whole_database": False, "has_notify": True, "has_row_estimates": True},
        ),
        ("mysql", {"locks_whole_database": False, "has_notify": False, "has_row_estimates": True}),
        ("sqlite", {"locks_whole_database": True, "has_notify": False, "has_row_estimates": False}),
    ],
)
def test_capabilities_per_database(vendor, expected):
    conn = fake(vendor)
    answers = {name: getattr(db, name)(conn) for name in expected}
    assert answers == expected
    assert db.supports_partitioning(conn) is (vendor == "postgresql")
    assert db.uses_virtual_columns(conn) is (vendor == "mysql")
    assert db.topic_in_key_lookups(conn) is (vendor != "mysql")


def test_listen_is_supported_on_postgresql_only():
    assert db.supports_listen("default") is (connection.vendor == "postgresql")


@pytest.mark.django_db
def test_row_estimates_where_the_database_keeps_them():
    estimate = db.table_rows(connection, Task._meta.db_table)
    planned = db.planner_rows(connection, f"SELECT 1 FROM {Task._meta.db_table}")
    if db.has_row_estimates(connection):
        assert isinstance(estimate, int) and isinstance(planned, int)
    else:
        assert (estimate, planned) == (None, None)


def _lock_window(conn: Any) -> str | None:
    """The server's idle-in-transaction limit of this session, where it has one."""
    with conn.cursor() as cursor:
        if conn.vendor == "postgresql":
            cursor.execute("SHOW idle_in_transaction_session_timeout")
        elif getattr(conn, "mysql_is_mariadb", False):
            cursor.execute("SELECT @@SESSION.idle_transaction_timeout")
        else:
            return None
        return str(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_a_lock_window_bounds_one_transaction():
    before = _lock_window(connection)
    with transaction.atomic():
        db.set_lock_window(connection, timedelta(seconds=7))
        inside = _lock_window(connection)
    db.reset_lock_window(connection)
    if before is None:
        assert inside is None  # MySQL, SQLite: no such setting, nothing set
    else:
        assert inside in {"7s", "7"} and _lock_window(connection) == before


def test_pending_index_is_the_partial_state_index_under_its_old_name():
    index = db.PendingIndex(fields=["deadline"], name="x", states=[20, 30])
    assert type(index) is db.PartialStateIndex
    path, args, kwargs = index.deconstruct()
    assert path == "django_tasks_coord.db.PartialStateIndex"
    assert db.PartialStateIndex(*args, **kwargs) == index
    assert kwargs["states"] == [20, 30]


# --- the one LISTEN policy -----------------------------------------------------------------


class FakeListenConnection:
    """A psycopg connection as far as :class:`db.Listening` uses it."""

    def __init__(self, executed: list[str]) -> None:
        self.executed = executed

    def execute(self, sql: str) -> None:
        self.executed.append(sql)

    def __enter__(self) -> FakeListenConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class FakeAsyncListenConnection(FakeListenConnection):
    async def execute(self, sql: str) -> None:  # type: ignore[override]
        self.executed.append(sql)

    async def __aenter__(self) -> FakeAsyncListenConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass


def failing(times: int, make: Any) -> Any:
    """A ``connect`` that fails ``times`` times as a down server does, then returns ``make()``."""
    calls = []

    def connect(**params: Any) -> Any:
        calls.append(params)
        if len(calls) <= times:
            raise psycopg.OperationalError("connection refused")
        return make()

    return connect


@pytest.fixture
def no_params(monkeypatch):
    """LISTEN connections of these tests connect to nothing: no parameters needed."""
    monkeypatch.setattr(db.listen, "listen_params", lambda using: {})


@needs_psycopg
@pytest.mark.usefixtures("no_params")
def test_a_listen_connection_backs_off_like_every_loop_then_serves(monkeypatch, caplog):
    executed: list[str] = []
    monkeypatch.setattr(psycopg, "connect", failing(3, lambda: FakeListenConnection(executed)))
    policy = db.Listening("LISTEN for the test", using="default")
    waits: list[float] = []
    served: list[bool] = []
    with caplog.at_level(logging.DEBUG, logger="django_tasks_coord.db"):
        policy.run(
            lambda conn: served.append(policy.up.is_set()),
            stopped=lambda: False,
            wait=waits.append,
        )
    assert waits == [db.RECONNECT_DELAY, 2 * db.RECONNECT_DELAY, 4 * db.RECONNECT_DELAY]
    assert executed == [f"LISTEN {db.NOTIFY_CHANNEL}"] and served == [True]
    assert not policy.up.is_set()  # served and closed
    levels = [r.levelname for r in caplog.records if r.getMessage().startswith("LISTEN for")]
    assert levels.count("WARNING") == 1 and levels.count("INFO") == 1


@needs_psycopg
@pytest.mark.usefixtures("no_params")
def test_a_listen_connection_gives_up_when_its_user_stops(monkeypatch):
    monkeypatch.setattr(psycopg, "connect", failing(100, lambda: None))
    policy = db.Listening("LISTEN for the test", using="default")
    waits: list[float] = []
    policy.run(lambda conn: None, stopped=lambda: len(waits) >= 2, wait=waits.append)
    assert len(waits) == 2 and not policy.up.is_set()


@needs_psycopg
@pytest.mark.usefixtures("no_params")
def test_the_long_polls_listen_connection_follows_the_same_policy(monkeypatch):
    executed: list[str] = []
    connect = failing(2, lambda: FakeAsyncListenConnection(executed))

    async def aconnect(**params: Any) -> FakeAsyncListenConnection:
        return connect(**params)

    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(psycopg.AsyncConnection, "connect", aconnect)
    monkeypatch.setattr(asyncio, "sleep", sleep)
    policy = db.Listening("LISTEN for the test", using="default")
    served: list[bool] = []

    async def serve(conn: Any) -> None:
        served.append(policy.up.is_set())

    asyncio.run(policy.arun(serve, stopped=lambda: False))
    assert waits == [db.RECONNECT_DELAY, 2 * db.RECONNECT_DELAY]
    assert executed == [f"LISTEN {db.NOTIFY_CHANNEL}"] and served == [True]


@needs_psycopg
@pytest.mark.usefixtures("no_params")
def test_an_error_while_serving_is_a_lost_connection_too(monkeypatch):
    """What ``serve`` raises (the connection broke while reading) starts the back-off."""
    executed: list[str] = []
    monkeypatch.setattr(psycopg, "connect", failing(0, lambda: FakeListenConnection(executed)))
    policy = db.Listening("LISTEN for the test", using="default")
    rounds: list[int] = []

    def serve(conn: Any) -> None:
        rounds.append(1)
        if len(rounds) == 1:
            raise OperationalError("server closed the connection unexpectedly")

    waits: list[float] = []
    policy.run(serve, stopped=lambda: False, wait=waits.append)
    assert (len(rounds), waits) == (2, [db.RECONNECT_DELAY])


@needs_psycopg
def test_listen_connections_open_with_the_listen_database(monkeypatch, settings):
    """The node's and the long-poll's policies (no ``using``) connect with the alias
    ``LISTEN_DATABASE`` names, read at each connection; without it, with ``DATABASE``."""
    asked: list[str] = []
    monkeypatch.setattr(db.listen, "listen_params", lambda using: asked.append(using) or {})
    monkeypatch.setattr(psycopg, "connect", failing(0, lambda: FakeListenConnection([])))
    policy = db.Listening("LISTEN for the test")
    policy.run(lambda conn: None, stopped=lambda: False, wait=lambda seconds: None)
    settings.TASKS_COORD = {"LISTEN_DATABASE": "direct"}
    assert db.listen_alias() == "direct"
    policy.run(lambda conn: None, stopped=lambda: False, wait=lambda seconds: None)
    assert asked == ["default", "direct"]
