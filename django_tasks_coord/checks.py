"""System checks. Ids are stable (``tasks_coord.E001``...) and listed in docs/reference/checks.md.

Checks without a database run with every management command. Checks that need one
(tagged ``database``) run with ``manage.py check --database default`` and before
``migrate``, like Django's own; they only look at ``TASKS_COORD["DATABASE"]``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from importlib import import_module
from typing import Any

from django.apps import AppConfig, apps
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import DatabaseError, connections
from django.utils.module_loading import module_has_submodule

from django_tasks_coord import db, flow, handlers, partitions, retention
from django_tasks_coord.conf import _merged, app_settings
from django_tasks_coord.exceptions import (
    ConfigurationError,
    DefinitionError,
    TasksCoordError,
    TimerError,
)
from django_tasks_coord.models import Owner, PeriodicTask
from django_tasks_coord.node.config import NodeConfig
from django_tasks_coord.scheduling import declared
from django_tasks_coord.scheduling.runner import import_problem
from django_tasks_coord.timers import parse

#: The modules of installed apps where jobs (``jobs``), task definitions (``tasks``,
#: ``jobs``) and consumers (``consumers``) are declared; ``runscheduler`` and the HTTP API
#: import them at start-up.
DECLARING_MODULES = ("jobs", "tasks", "consumers")

SETTINGS_HINT = "See docs/reference/settings.md for the accepted keys and values."


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``tasks_coord.E001``: ``TASKS_COORD`` is not a dict or has an unknown key;
    ``tasks_coord.E003``: a value has the wrong type or is out of range."""
    try:
        values = _merged()
    except ConfigurationError as exc:
        return [Error(str(exc), hint=SETTINGS_HINT, id="tasks_coord.E001")]
    return [
        Error(f"TASKS_COORD: {problem}", hint=SETTINGS_HINT, id="tasks_coord.E003")
        for problem in _setting_problems(values)
    ]


def _metrics_problems(values: dict[str, Any]) -> list[str]:
    """Invalid values of the metrics settings (docs/reference/metrics.md)."""
    problems = []
    if values["METRICS_PUBLIC"] not in (None, True, False):
        problems.append(
            f"METRICS_PUBLIC must be None, True or False, not {values['METRICS_PUBLIC']!r}."
        )
    port = values["METRICS_PORT"]
    if port is not None and (
        isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535
    ):
        problems.append(f"METRICS_PORT must be None or a port number (0 to 65535), not {port!r}.")
    if not isinstance(values["METRICS_ADDRESS"], str):
        problems.append(f"METRICS_ADDRESS must be a str, not {values['METRICS_ADDRESS']!r}.")
    return problems


def _listen_database_problems(values: dict[str, Any]) -> list[str]:
    """``LISTEN_DATABASE``: None, or a PostgreSQL alias in DATABASES while DATABASE is one."""
    listen = values["LISTEN_DATABASE"]
    if listen is None:
        return []
    if not isinstance(listen, str) or listen not in settings.DATABASES:
        return [
            f"LISTEN_DATABASE {listen!r} must be None or an alias in DATABASES "
            f"({', '.join(sorted(settings.DATABASES)) or 'none'})."
        ]
    app = values["DATABASE"]
    app_notifies = app in settings.DATABASES and db.has_notify(connections[app])
    if app_notifies and not db.has_notify(connections[listen]):
        return [
            f"LISTEN_DATABASE {listen!r} must be a PostgreSQL alias, like DATABASE {app!r}: "
            "it listens for the notifications sent on DATABASE."
        ]
    return []


def _setting_problems(values: dict[str, Any]) -> list[str]:
    """Every invalid value of the merged settings, one message each.

    Long because: one flat list of independent checks reads better than a split one."""
    problems = []
    if values["DATABASE"] not in settings.DATABASES:
        problems.append(
            f"DATABASE {values['DATABASE']!r} is not an alias in DATABASES "
            f"({', '.join(sorted(settings.DATABASES)) or 'none'})."
        )
    problems.extend(_listen_database_problems(values))
    for key in ("NODE_ID", "GROUP"):
        value = values[key]
        limit = 200 if key == "NODE_ID" else 100
        if value is not None and not (isinstance(value, str) and 0 < len(value) <= limit):
            problems.append(
                f"{key} must be None or a str of 1 to {limit} characters, not {value!r}."
            )
    topics = values["TOPICS"]
    if topics is not None and not (
        isinstance(topics, list | tuple) and all(isinstance(t, str) and t for t in topics)
    ):
        problems.append(f"TOPICS must be None or a list of topic names, not {topics!r}.")
    for key in ("LISTEN_NOTIFY", "SCHEDULER", "PARTITION_TASKS", "TASK_PRETTY_VIEW"):
        if not isinstance(values[key], bool):
            problems.append(f"{key} must be True or False, not {values[key]!r}.")
    for key in (
        "LONG_POLL_MAX_TIMEOUT",
        "LONG_POLL_INTERVAL",
        "MAX_POLL_INTERVAL",
        "NOTIFIED_POLL_INTERVAL",
        "FLOW_RECHECK_INTERVAL",
    ):
        value = values[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            problems.append(f"{key} must be a positive number of seconds, not {value!r}.")
    problems += _count_problems(values) + _metrics_problems(values)
    problems += flow.settings_problems(values["LIMITS"]) + retention.settings_problems(values)
    problems += NodeConfig.settings_problems(values)
    return problems


def _count_problems(values: dict[str, Any]) -> list[str]:
    """Batch sizes, and the progress of running tasks (its largest value and interval)."""
    problems = []
    for key in ("RETENTION_BATCH_SIZE", "PROGRESS_MAX_BYTES"):
        value = values[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(f"{key} must be an int of at least 1, not {value!r}.")
    wait = values["PROGRESS_INTERVAL"]
    if isinstance(wait, bool) or not isinstance(wait, int | float) or wait < 0:
        problems.append(f"PROGRESS_INTERVAL must be a non-negative number, not {wait!r}.")
    return problems


@register()
def check_declarations(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """``tasks_coord.E004`` a declared job's timer does not parse; ``E005`` a task
    definition is invalid (a JSON Schema, a setting); ``E006`` an app's ``jobs`` or
    ``tasks`` or ``consumers`` module fails to import otherwise; ``E002`` a job declared
    with ``@scheduling.job`` cannot be imported by its dotted path; ``E007`` two consumers
    are declared for one topic.

    Each module and declaration is checked on its own: one bad declaration never hides
    the others' problems, and nothing raises out of this check.
    """
    messages = _import_declaring_modules(app_configs)
    failed = {message.obj for message in messages}
    messages.extend(
        Error(
            f"Declared job {name!r}: {problem}.",
            hint="Declare jobs on module-level functions of an importable module (an app's jobs.py).",
            id="tasks_coord.E002",
        )
        for name, problem in declared.problems(skip_modules=failed)
    )
    messages.extend(
        Error(
            f"Topic {topic!r} has two consumers: {first} and {second}; the last one "
            "imported wins, so which one runs depends on import order.",
            hint="Keep one @handlers.consumer per topic (a consumer can dispatch on the "
            "task's payload), or give the second one its own topic.",
            obj=topic,
            id="tasks_coord.E007",
        )
        for topic, first, second in handlers.registry.conflicts()
    )
    return messages


def _import_declaring_modules(app_configs: Iterable[AppConfig] | None) -> list[CheckMessage]:
    """Import each app's ``jobs``, ``tasks`` and ``consumers`` module, reporting each one
    that fails (this app's own ``consumers`` module is the node's start-up: not imported).

    Unlike ``autodiscover_modules``, one failing module does not hide the others'
    problems. A module that fails stays out of ``sys.modules``, so ``runscheduler``
    still fails on it at start-up.
    """
    messages: list[CheckMessage] = []
    for app_config in app_configs if app_configs is not None else apps.get_app_configs():
        for name in DECLARING_MODULES:
            if not module_has_submodule(app_config.module, name):
                continue
            module = f"{app_config.name}.{name}"
            if module == "django_tasks_coord.consumers":
                continue  # the node's start-up (it registers topics), not declarations
            try:
                import_module(module)
            except Exception as exc:  # noqa: BLE001 - any import failure is reported, not raised
                messages.append(_import_error(module, exc))
    return messages


def _import_error(module: str, exc: Exception) -> CheckMessage:
    """The check message for ``module`` failing at import with ``exc``.

    The error is classified by its cause too: ``@task(timer=...)`` wraps the timer's
    error in Django's ``InvalidTask``, whose message names the task.
    """
    if _cause(exc, TimerError) is not None:
        return Error(
            f"{module}: a declared job's timer does not parse: {exc}",
            hint="Fix the timer; docs/timers.md lists the accepted forms "
            "(systemd calendar events, cron, intervals, ISO dates).",
            obj=module,
            id="tasks_coord.E004",
        )
    if _cause(exc, DefinitionError) is not None:
        return Error(
            f"{module}: {exc}",
            hint="Fix the definition's settings or JSON Schema (Draft 2020-12 "
            "unless the schema names its own $schema).",
            obj=module,
            id="tasks_coord.E005",
        )
    return Error(
        f"{module} cannot be imported: {type(exc).__name__}: {exc}",
        hint="runscheduler imports this module at start-up and would fail "
        "the same way; run `python manage.py shell -c 'import "
        f"{module}'` to see the traceback.",
        obj=module,
        id="tasks_coord.E006",
    )


def _cause(exc: BaseException, kind: type[Exception]) -> Exception | None:
    """``exc`` or the first exception of ``kind`` in its chain of causes, if any."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, kind):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


@register()
def check_sqlite_group(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``tasks_coord.W001``: a coordination group (several nodes) is configured on SQLite."""
    try:
        group, alias = app_settings.GROUP, app_settings.DATABASE
    except ConfigurationError:
        return []  # reported as E001
    if not group or alias not in connections or not db.locks_whole_database(connections[alias]):
        return []
    return [
        Warning(
            f"TASKS_COORD['GROUP'] is {group!r} on SQLite: a coordination group is for several "
            "nodes, and SQLite serves one node (it has no row locks; claims are serialized).",
            hint="Run several nodes on PostgreSQL or MariaDB/MySQL; on SQLite, run one node "
            "without a group.",
            id="tasks_coord.W001",
        )
    ]


def _database_connection(databases: Sequence[str] | None) -> Any:
    """The app's connection when the checks were asked to look at its database, else None."""
    try:
        alias = app_settings.DATABASE
    except ConfigurationError:
        return None
    if not databases or alias not in databases or alias not in connections:
        return None
    return connections[alias]


@register(Tags.database)
def check_database(
    app_configs: Any = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """``tasks_coord.E010``: the database has no ``SKIP LOCKED``; ``tasks_coord.W002``:
    nodes of several hosts registered on SQLite."""
    conn = _database_connection(databases)
    if conn is None:
        return []
    if db.locks_whole_database(conn):  # SQLite: no row locks to skip; one node
        return _sqlite_hosts(conn.alias)
    if not conn.features.has_select_for_update_skip_locked:
        return [
            Error(
                f"The database {conn.alias!r} ({conn.display_name}) does not support "
                "SELECT ... FOR UPDATE SKIP LOCKED: concurrent claims would wait on each other's "
                "row locks instead of skipping them.",
                hint="Use PostgreSQL 12+, MySQL 8.0.1+ or MariaDB 10.6+.",
                id="tasks_coord.E010",
            )
        ]
    return []


@register(Tags.database)
def check_partitioning(
    app_configs: Any = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """``tasks_coord.W004``: on PostgreSQL, the task table's shape is not the one
    ``PARTITION_TASKS`` asks for (migrate converts only an empty table)."""
    conn = _database_connection(databases)
    if conn is None or not partitions.supported(conn):
        return []
    try:
        with conn.cursor() as cursor:
            if partitions.table() not in conn.introspection.table_names(cursor):
                return []  # not migrated yet
        partitioned = partitions.is_partitioned(conn)
    except DatabaseError:
        return []
    if partitioned == partitions.wanted(conn):
        return []
    shape = "is not partitioned by topic" if not partitioned else "is partitioned by topic"
    return [
        Warning(
            f"The task table {shape}, but TASKS_COORD['PARTITION_TASKS'] is "
            f"{partitions.wanted(conn)}.",
            hint="Run `manage.py tasks_coord_partition`: it converts the table online, in "
            "batches (docs/howto/production.md).",
            id="tasks_coord.W004",
        )
    ]


def _sqlite_hosts(alias: str) -> list[CheckMessage]:
    try:
        hosts = sorted(set(Owner.objects.using(alias).values_list("host", flat=True)))
    except DatabaseError:  # not migrated yet: nothing registered
        return []
    if len(hosts) <= 1:
        return []
    return [
        Warning(
            f"Nodes of {len(hosts)} hosts ({', '.join(hosts)}) are registered on the SQLite "
            f"database {alias!r}: SQLite serves one node, and its locking is not reliable "
            "on a network file system.",
            hint="Run several nodes on PostgreSQL or MariaDB/MySQL.",
            id="tasks_coord.W002",
        )
    ]


@register(Tags.database)
def check_stored_jobs(
    app_configs: Any = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """``tasks_coord.W003``: an enabled job scheduled at run time has a callable that cannot
    be imported, or a timer that does not parse."""
    conn = _database_connection(databases)
    if conn is None:
        return []
    try:
        jobs = list(
            PeriodicTask.objects.using(conn.alias)
            .filter(enabled=True, declared=False)
            .values_list("id", "task", "timer", "tz")
        )
    except DatabaseError:  # not migrated yet
        return []
    messages: list[CheckMessage] = []
    for job_id, path, timer, tz in jobs:
        problem = import_problem(path)
        problems = [problem] if problem else []
        try:
            parse(timer, tz=tz or None)
        except TasksCoordError as exc:
            problems.append(f"its timer {timer!r} does not parse: {exc}")
        messages.extend(
            Warning(
                f"Job {job_id!r}: {problem}.",
                hint="Unschedule the job (scheduling.unschedule) or deploy the code it names; "
                "its first run pauses it (a bad timer: the scheduler disables it).",
                obj=job_id,
                id="tasks_coord.W003",
            )
            for problem in problems
        )
    return messages


@register(Tags.database)
def check_listen_database(
    app_configs: Any = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """``tasks_coord.W005``: ``LISTEN_DATABASE`` reaches another database than ``DATABASE``
    (another database name, or another server), so notifications sent on one never reach
    the LISTEN connections of the other."""
    conn = _database_connection(databases)
    try:
        listen = app_settings.LISTEN_DATABASE
    except ConfigurationError:
        return []  # reported as E001
    if conn is None or not listen or listen not in connections or listen == conn.alias:
        return []
    if not (db.has_notify(conn) and db.has_notify(connections[listen])):
        return []  # reported as E003
    query = "SELECT current_database(), pg_postmaster_start_time()"
    try:
        with conn.cursor() as cursor:
            cursor.execute(query)
            app_side = cursor.fetchone()
        with connections[listen].cursor() as cursor:
            cursor.execute(query)
            listen_side = cursor.fetchone()
    except DatabaseError:
        return []  # a server that does not answer is not this check's to report
    if app_side == listen_side:
        return []
    return [
        Warning(
            f"TASKS_COORD['LISTEN_DATABASE'] {listen!r} reaches the database {listen_side[0]!r} "
            f"of a server started at {listen_side[1]}, but DATABASE {conn.alias!r} reaches "
            f"{app_side[0]!r} of a server started at {app_side[1]}: nodes and long-polls "
            "would never be woken by a NOTIFY (they would poll).",
            hint="Point LISTEN_DATABASE at the same PostgreSQL database, connecting directly "
            "rather than through the pooler (docs/howto/pgbouncer.md).",
            id="tasks_coord.W005",
        )
    ]
