"""What the benchmarks share: paths, database servers, Django set-up, processes, metadata.

A benchmark is a module of the ``benchmarks`` package, run from the repository root as
``python -m benchmarks.NAME``; it imports what it needs from here like any module::

    from benchmarks import common

Only the standard library is imported here at module level: ``benchmarks.settings`` (the
settings of every subprocess) imports this module too, also in the peers' virtualenv, where
this project is not installed.
"""

from __future__ import annotations

import json
import math
import os
import platform
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"

# --- databases ------------------------------------------------------------------------------

#: Connection settings per database; ``NAME`` is added by :func:`database`.
SERVERS: dict[str, dict[str, Any]] = {
    "postgres": {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": "127.0.0.1",
        "PORT": 5432,
        "USER": "root",
        "PASSWORD": "",
    },
    "mysql": {
        "ENGINE": "django.db.backends.mysql",
        "HOST": "127.0.0.1",
        "PORT": 3306,
        "USER": "root",
        "PASSWORD": "",
        "OPTIONS": {"charset": "utf8mb4", "isolation_level": "read committed"},
    },
    "sqlite": {"ENGINE": "django.db.backends.sqlite3", "OPTIONS": {"timeout": 30}},
}
LABELS = {"postgres": "PostgreSQL", "mysql": "MariaDB", "sqlite": "SQLite"}


def database(vendor: str, name: str) -> dict[str, Any]:
    """The ``DATABASES`` entry for database ``name`` on ``vendor``'s server (SQLite: a temp file)."""
    config = json.loads(json.dumps(SERVERS[vendor]))
    if vendor == "sqlite":
        config["NAME"] = str(Path(tempfile.gettempdir()) / f"{name}.sqlite3")
    else:
        config["NAME"] = name
    return config


def vendor_of(config: dict[str, Any]) -> str:
    """``postgres``, ``mysql`` or ``sqlite``: the server of a ``DATABASES`` entry."""
    engine = config["ENGINE"]
    for vendor, server in SERVERS.items():
        if server["ENGINE"] == engine:
            return vendor
    raise ValueError(f"No benchmark server for {engine!r}.")


def database_from_url(url: str, name: str | None = None) -> dict[str, Any]:
    """The ``DATABASES`` entry of ``url`` (django-environ syntax), named ``name`` if given.

    The server's benchmark options (MySQL charset and isolation level, SQLite's busy
    timeout) are added as :data:`SERVERS` has them; a SQLite ``name`` is a file in the
    system temp directory, like :func:`database`'s.
    """
    import environ  # the project's test extra; only when a URL is given (not in the peers' venv)

    config: dict[str, Any] = dict(environ.Env.db_url_config(url))
    vendor = vendor_of(config)
    for key, value in SERVERS[vendor].get("OPTIONS", {}).items():
        config.setdefault("OPTIONS", {}).setdefault(key, value)
    if name is not None:
        config["NAME"] = database(vendor, name)["NAME"]
    return config


def create_database(config: dict[str, Any]) -> None:
    """Create a benchmark database on its server if it does not exist yet (SQLite: nothing)."""
    name = config["NAME"]
    if config["ENGINE"].endswith("postgresql"):
        import psycopg

        with psycopg.connect(
            host=config["HOST"],
            port=config["PORT"] or 5432,
            user=config["USER"],
            dbname="postgres",
            autocommit=True,
        ) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
                conn.execute(f'CREATE DATABASE "{name}"')
    elif config["ENGINE"].endswith("mysql"):
        import MySQLdb

        conn = MySQLdb.connect(
            host=config["HOST"],
            port=int(config["PORT"] or 3306),
            user=config["USER"],
            passwd=config["PASSWORD"],
        )
        conn.cursor().execute(f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4")
        conn.close()


def reachable(vendor: str, name: str) -> bool:
    """Whether ``vendor``'s server answers (creating database ``name`` on the way)."""
    try:
        create_database(database(vendor, name))
    except Exception as exc:  # noqa: BLE001 - report and skip any unreachable server
        print(f"skipping {vendor}: {exc}")
        return False
    return True


#: The apps every benchmark process installs (subprocesses add their benchmark app).
BASE_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_tasks_coord"]


def configure_django(databases: dict[str, dict[str, Any]]) -> None:
    """Set up Django in this process (``settings.configure``) with ``databases``."""
    import django
    from django.conf import settings

    settings.configure(
        DATABASES=databases,
        INSTALLED_APPS=list(BASE_APPS),
        USE_TZ=True,
        TIME_ZONE="UTC",
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        LOGGING_CONFIG=None,
    )
    django.setup()


def query(alias: str, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    """Run raw SQL on ``alias`` (autocommit) and return its rows."""
    from django.db import connections

    with connections[alias].cursor() as cursor:
        cursor.execute(sql, params or [])
        return list(cursor.fetchall()) if cursor.description else []


def tidy(alias: str, *tables: str) -> None:
    """Refresh planner statistics after refilling ``tables`` (and drop dead rows on PostgreSQL).

    Closes the connection afterwards: nothing (on SQLite, no lock) is held while a
    subprocess runs.
    """
    from django.db import connections

    vendor = connections[alias].vendor
    for table in tables:
        if vendor == "postgresql":
            query(alias, f"VACUUM ANALYZE {table}")
        elif vendor == "mysql":
            query(alias, f"ANALYZE TABLE {table}")
    connections[alias].close()


@contextmanager
def on(alias: str) -> Iterator[None]:
    """Point this process's queue and scheduling API at database ``alias``."""
    from django.test.utils import override_settings

    with override_settings(TASKS_COORD={"DATABASE": alias}):
        yield


def as_datetime(value: Any) -> datetime:
    """A timestamp read with raw SQL, made aware: MySQL gives naive UTC, SQLite a string."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if not isinstance(value, datetime):
        raise TypeError(f"Expected a timestamp, got {value!r}.")
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def postgres_settings(alias: str, names: Iterable[str]) -> dict[str, Any]:
    """The PostgreSQL server settings ``names`` (``pg_settings``), by name."""
    rows = query(alias, "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)", [list(names)])
    return dict(rows)


def mysql_variables(alias: str) -> dict[str, Any]:
    """The MariaDB/MySQL version and the InnoDB settings that bound per-commit costs."""
    rows = query(
        alias,
        "SHOW VARIABLES WHERE Variable_name IN "
        "('version', 'innodb_flush_log_at_trx_commit', 'innodb_buffer_pool_size')",
    )
    return dict(rows)


# --- settings of the subprocesses -------------------------------------------------------------

# Imported by settings.py.
SECRET_KEY = "benchmarks-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
#: Quiet subprocesses (warnings to stderr): the benchmarks read the database, not the logs.
#: Warnings to stderr. The handler's level matters: Django's ``django`` logger passes INFO
#: records on to the root's handlers, and ``django.tasks`` logs two per task (a ``@task``'s
#: start and finish), which would turn a drain into a log-writing benchmark for every system.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler", "level": "WARNING"}},
    "root": {"handlers": ["stderr"], "level": "WARNING"},
}


# --- processes ------------------------------------------------------------------------------


def subprocess_env(settings_module: str | None, **values: str) -> dict[str, str]:
    """The environment of a subprocess run from the repository root: this one's, the root on
    ``PYTHONPATH``, ``DJANGO_SETTINGS_MODULE`` (unless None) and ``values``."""
    env = dict(os.environ)
    if settings_module is not None:
        env["DJANGO_SETTINGS_MODULE"] = settings_module
    env.update(PYTHONPATH=str(ROOT), **values)
    return env


def bench_env(
    config: dict[str, Any],
    *,
    app: str = "benchapp",
    tasks_coord: dict[str, Any] | None = None,
    **values: str,
) -> dict[str, str]:
    """The environment of a subprocess on ``benchmarks.settings``: database ``config``, the
    benchmark ``app``, ``TASKS_COORD`` overrides and further ``BENCH_*`` ``values`` (see that
    module's docstring)."""
    return subprocess_env(
        "benchmarks.settings",
        BENCH_DATABASE=json.dumps(config),
        BENCH_APP=app,
        BENCH_TASKS_COORD=json.dumps(tasks_coord or {}),
        **values,
    )


def terminate(procs: Iterable[subprocess.Popen[Any]], timeout: float) -> list[int]:
    """Stop processes gracefully: SIGTERM to each still running, then wait for each; one not
    gone ``timeout`` seconds later is killed. Their exit codes."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(proc.wait())
    return codes


# --- figures and metadata -------------------------------------------------------------------


def write_report(name: str, document: dict[str, Any], markdown: Callable[[], str]) -> None:
    """Write ``results/NAME.json`` (``document``), then ``results/NAME.md`` (what ``markdown``
    returns, printed too): a report that fails leaves the figures stored."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
    md = markdown()
    (RESULTS / f"{name}.md").write_text(md)
    print(md)


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(math.ceil(pct / 100 * len(ordered)) - 1, 0)]


def machine() -> str:
    """CPU model and count."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def load_average(sep: str = " ") -> str:
    """The 1/5/15-minute load averages, joined by ``sep``."""
    return sep.join(f"{x:.2f}" for x in os.getloadavg())


def git(*args: str) -> str:
    """Output of a read-only git command in the repository (no index lock taken)."""
    out = subprocess.run(
        ["git", "--no-optional-locks", *args], cwd=ROOT, capture_output=True, text=True
    )
    return out.stdout.strip()


def git_revision() -> str:
    """The commit measured, and whether the package differs from it."""
    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--", "django_tasks_coord")
    except OSError:
        return "unknown"
    return f"{head}{' + uncommitted changes in django_tasks_coord/' if dirty else ''}"
