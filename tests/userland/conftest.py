"""The userland layer: the package as a user gets it, in a project of their own.

Once per test session: the wheel is built from this checkout, installed into a fresh
virtual environment (with Django and the database driver, from the package index pip is
configured with, as a user installs it), and ``django-admin startproject`` makes a project
in a temporary directory that is set up as the quickstart says: ``django_tasks_coord`` in
``INSTALLED_APPS``, ``TASKS`` on its ``DatabaseBackend``, and an app of the user's
(``shop``, copied from ``tests/userland/shop/``). Its database is the one ``DATABASE_URL``
names (SQLite without it; PostgreSQL or MariaDB/MySQL: a database of its own on that
server).

Tests get the :class:`Project` (fixture ``project``) and run ``manage.py`` commands and
Python code in it: nothing of this test run (settings, ``sys.path``, the test database)
leaks into it.
"""

from __future__ import annotations

import os
import pprint
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import environ
import pytest

from tests.processes import ROOT

#: The user's app, as files to copy into the project (``startapp shop`` makes the rest).
SHOP = Path(__file__).resolve().parent / "shop"
#: The project's name (``startproject``): its settings are ``mysite.settings``.
NAME = "mysite"
#: Environment variables of this test run that must not reach the user's project.
_OURS = ("DJANGO_SETTINGS_MODULE", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "DATABASE_URL")
_OUR_PREFIXES = ("TASKS_COORD", "TASKS_JSON", "TEST_DB_SUFFIX")

pytestmark = pytest.mark.userland


@dataclass
class Project:
    """A ``startproject`` project with the wheel installed, and ways to run things in it."""

    path: Path
    python: Path
    env: dict[str, str]
    vendor: str

    def run(
        self, *args: str | Path, timeout: float = 120, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run a command in the project's directory, with its virtual environment first on PATH.

        ``check``: fail the test, showing the output, unless it exits 0.
        """
        done = subprocess.run(
            [str(arg) for arg in args],
            cwd=self.path,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            pytest.fail(
                f"{' '.join(map(str, args))} exited {done.returncode}\n"
                f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
            )
        return done

    def manage(
        self, *args: str, timeout: float = 120, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """``python manage.py ARGS``."""
        return self.run(self.python, "manage.py", *args, timeout=timeout, check=check)

    def python_code(
        self, code: str, *, timeout: float = 120, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run ``code`` with the project's Python, Django set up (as in ``manage.py shell``)."""
        script = (
            "import os, django\n"
            f"os.environ.setdefault('DJANGO_SETTINGS_MODULE', '{NAME}.settings')\n"
            "django.setup()\n"
        )
        return self.run(self.python, "-c", script + code, timeout=timeout, check=check)

    def write(self, relative: str, text: str) -> Path:
        """Write a file of the project (e.g. a module of the ``shop`` app)."""
        target = self.path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        return target


def _user_env(venv: Path) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in _OURS and not key.startswith(_OUR_PREFIXES)
    }
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _build_wheel(into: Path) -> Path:
    """The wheel of this checkout (built from a copy: concurrent runs share no build dir)."""
    source = into / "source"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git",
            ".venv",
            ".tox",
            "build",
            "dist",
            "*.egg-info",
            "__pycache__",
            "site",
            "*.sqlite3",
            ".*_cache",
        ),
    )
    wheels = into / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--quiet",
            "-w",
            str(wheels),
            str(source),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    [wheel] = wheels.glob("django_tasks_coord-*.whl")
    return wheel


def _database(vendor: str, url: str, name: str, sqlite_file: Path) -> dict[str, object]:
    """The project's ``DATABASES["default"]``: a SQLite file, or a database of its own on the
    PostgreSQL or MariaDB/MySQL server (Django's defaults otherwise, as a user has them)."""
    if vendor == "sqlite":
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": str(sqlite_file)}
    config = environ.Env.db_url_config(url)
    keys = ("ENGINE", "HOST", "PORT", "USER", "PASSWORD")
    return {**{key: config[key] for key in keys if config.get(key)}, "NAME": name}


def _postgres(settings: dict[str, object], sql: str) -> None:
    import psycopg

    with psycopg.connect(
        dbname="postgres",
        host=str(settings.get("HOST") or ""),
        port=str(settings.get("PORT") or ""),
        user=str(settings.get("USER") or ""),
        password=str(settings.get("PASSWORD") or ""),
        autocommit=True,
    ) as conn:
        conn.execute(sql)  # type: ignore[arg-type]


def _mysql(settings: dict[str, object], sql: str) -> None:
    import MySQLdb

    conn = MySQLdb.connect(
        host=str(settings.get("HOST") or "127.0.0.1"),
        port=int(str(settings.get("PORT") or 3306)),
        user=str(settings.get("USER") or ""),
        password=str(settings.get("PASSWORD") or ""),
    )
    try:
        conn.cursor().execute(sql)
    finally:
        conn.close()


def _recreate(vendor: str, database: dict[str, object]) -> None:
    """Drop the server's database ``database["NAME"]`` if it exists, and create it empty."""
    name = database["NAME"]
    if vendor == "postgresql":
        _postgres(database, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        _postgres(database, f'CREATE DATABASE "{name}"')
    else:
        _mysql(database, f"DROP DATABASE IF EXISTS `{name}`")
        _mysql(database, f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")


def _drop(vendor: str, database: dict[str, object]) -> None:
    name = database["NAME"]
    if vendor == "postgresql":
        _postgres(database, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    else:
        _mysql(database, f"DROP DATABASE IF EXISTS `{name}`")


#: ``DATABASE_URL`` schemes of the servers this layer runs on (SQLite without a URL).
_VENDORS = {"postgres": "postgresql", "pgsql": "postgresql", "mysql": "mysql"}
#: The extra a user installs for each database's driver.
_EXTRAS = {"postgresql": "[postgres]", "mysql": "[mysql]", "sqlite": ""}


@dataclass
class Installation:
    """The wheel of this checkout installed into a fresh virtual environment."""

    base: Path
    python: Path
    env: dict[str, str]
    vendor: str
    url: str

    def startproject(self, directory: str) -> Project:
        """A new ``django-admin startproject mysite`` project in ``base / directory``."""
        path = self.base / directory
        path.mkdir()
        project = Project(path=path, python=self.python, env=dict(self.env), vendor=self.vendor)
        project.run(self.python.parent / "django-admin", "startproject", NAME, ".")
        return project

    def database(self, name: str) -> dict[str, object]:
        """``DATABASES["default"]`` for a project: SQLite in ``base``, else a new database
        ``name`` on the server (made now, dropped by :meth:`drop_databases`)."""
        suffixed = f"{name}{os.environ.get('TEST_DB_SUFFIX', '')}"
        database = _database(self.vendor, self.url, suffixed, self.base / f"{name}.sqlite3")
        if self.vendor != "sqlite":
            _recreate(self.vendor, database)
            self._made.append(database)
        return database

    def drop_databases(self) -> None:
        """Drop the server databases :meth:`database` made."""
        for database in self._made:
            _drop(self.vendor, database)

    def __post_init__(self) -> None:
        self._made: list[dict[str, object]] = []


@pytest.fixture(scope="session")
def installation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installation]:
    """The wheel of this checkout in a fresh virtual environment (one per test session)."""
    url = os.environ.get("DATABASE_URL", "")
    vendor = _VENDORS.get(url.split(":", 1)[0], "") if url else "sqlite"
    if not vendor:
        pytest.skip("the userland layer runs on SQLite, PostgreSQL and MariaDB/MySQL")
    base = tmp_path_factory.mktemp("userland")
    wheel = _build_wheel(base)
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = _user_env(venv)
    python = venv / "bin" / "python"
    requirement = f"{wheel}{_EXTRAS[vendor]}"
    installed = Installation(base=base, python=python, env=env, vendor=vendor, url=url)
    Project(path=base, python=python, env=env, vendor=vendor).run(
        python, "-m", "pip", "install", "--quiet", requirement, timeout=900
    )
    try:
        yield installed
    finally:
        installed.drop_databases()


@pytest.fixture(scope="session")
def project(installation: Installation) -> Project:
    """A fresh project set up as the quickstart says, with the user's app ``shop``."""
    project = installation.startproject("project")
    project.manage("startapp", "shop")
    for module in SHOP.glob("*.py"):
        shutil.copy(module, project.path / "shop" / module.name)
    _configure(project.path / NAME / "settings.py", installation.database("tasks_coord_project"))
    return project


def _configure(settings: Path, database: dict[str, object]) -> None:
    """Edit ``settings.py`` as the quickstart says: the app installed, the tasks backend chosen."""
    text = settings.read_text()
    text, found = re.subn(
        r"(INSTALLED_APPS = \[\n(?:    (['\"])[\w.]+\2,\n)+)\]",
        r'\1    "django_tasks_coord",\n    "shop",\n]',
        text,
    )
    assert found == 1, "startproject's INSTALLED_APPS changed shape"
    text += (
        "\n# django-tasks-coord (docs/quickstart.md, docs/django-tasks.md)\n"
        'TASKS = {"default": {"BACKEND": "django_tasks_coord.backends.DatabaseBackend"}}\n'
        f"DATABASES = {{'default': {pprint.pformat(database)}}}\n"
    )
    settings.write_text(text)
