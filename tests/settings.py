"""Settings for the test suite.

The database comes from one environment variable, ``DATABASE_URL`` (django-environ
syntax); without it, a SQLite file in the system temp directory. Examples::

    DATABASE_URL=postgres://root@127.0.0.1:5432/test
    DATABASE_URL=mysql://root@127.0.0.1:3306/test

``TEST_DB_SUFFIX`` keeps concurrent runs (tox in parallel, several developers) from
sharing a test database.
"""

from __future__ import annotations

import json
import os
import tempfile
from importlib.util import find_spec
from pathlib import Path

import environ

env = environ.Env()
SUFFIX = env.str("TEST_DB_SUFFIX", default="")
_sqlite_file = Path(tempfile.gettempdir()) / f"tasks_coord{SUFFIX}.sqlite3"

DATABASES = {
    "default": env.db_url_config(os.environ.get("DATABASE_URL") or f"sqlite:///{_sqlite_file}")
}
_db = DATABASES["default"]
if "TASKS_COORD_TEST_DB" in os.environ:
    # Set by tests for the subprocesses they start: the exact test database of the parent.
    DATABASES["default"] = _db = json.loads(os.environ["TASKS_COORD_TEST_DB"])
elif _db["ENGINE"] == "django.db.backends.sqlite3":
    # A file, not :memory:, so that subprocesses of multi-process tests share it.
    _db["TEST"] = {"NAME": str(_sqlite_file.with_name(f"test_tasks_coord{SUFFIX}.sqlite3"))}
    _db.setdefault("OPTIONS", {}).setdefault("timeout", 30)
else:
    _db["TEST"] = {"NAME": f"test_{_db['NAME']}{SUFFIX}"}
# More aliases for the subprocesses of a test (tests/node/test_pooled.py: a direct alias
# for LISTEN beside a default alias that goes through PgBouncer).
DATABASES.update(json.loads(os.environ.get("TASKS_COORD_EXTRA_DATABASES", "{}")))
if _db["ENGINE"] == "django.db.backends.mysql":
    _db.setdefault("OPTIONS", {}).update(
        {"charset": "utf8mb4", "isolation_level": "read committed"}
    )
    _db.setdefault("TEST", {}).update({"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_bin"})

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_tasks_coord",
    "tests.testapp",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
# The admin's browser tests: the live server serves the admin's CSS through staticfiles.
STATIC_URL = "static/"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"null": {"class": "logging.NullHandler"}},
    "root": {"handlers": ["null"], "level": "WARNING"},
}
BASE_DIR = Path(__file__).resolve().parent.parent

# Subprocesses started by end-to-end tests get their node timings this way.
TASKS_COORD = json.loads(os.environ.get("TASKS_COORD_JSON", "{}"))

# Django's task framework (django.tasks, or the django-tasks backport on Django 5.2) runs on
# this app's backend; tests/backends start nodes with another TASKS in TASKS_JSON if needed.
if find_spec("django.tasks") or find_spec("django_tasks"):
    TASKS = json.loads(os.environ.get("TASKS_JSON", "null")) or {
        "default": {
            "BACKEND": "django_tasks_coord.backends.DatabaseBackend",
            "QUEUES": ["default", "high", "other"],
        }
    }
