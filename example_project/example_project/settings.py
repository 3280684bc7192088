"""Demo settings: SQLite next to this file unless DATABASE_URL says otherwise.

DATABASE_URL=postgres://root@127.0.0.1:5432/demo  or  mysql://root@127.0.0.1:3306/demo
(the database must exist; ``./run demo`` installs the driver the URL needs).
"""

import os
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent
DATABASES = {
    "default": environ.Env.db_url_config(
        os.environ.get("DATABASE_URL") or f"sqlite:///{BASE_DIR / 'db.sqlite3'}"
    )
}
_db = DATABASES["default"]
if _db["ENGINE"].endswith("sqlite3"):
    # Several processes of this machine share the file (two nodes, the web server): a
    # write waits up to 30 s for SQLite's write lock instead of failing at once.
    _db.setdefault("OPTIONS", {})["timeout"] = 30
elif _db["ENGINE"].endswith("mysql"):
    _db.setdefault("OPTIONS", {}).update(
        {"charset": "utf8mb4", "isolation_level": "read committed"}
    )

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "demo-only-not-secret")
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
USE_TZ = True
TIME_ZONE = "Europe/Berlin"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_tasks_coord",
    "demo",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "example_project.urls"
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
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Django's @task API runs on this app's nodes (demo/tasks.py).
TASKS = {
    "default": {
        "BACKEND": "django_tasks_coord.backends.DatabaseBackend",
        "QUEUES": ["default"],
        "OPTIONS": {"RESULT_RETENTION": 3600},
    }
}

# Node timings: quick enough to watch (a standby takes over ten seconds after the leader
# dies), nothing else differs from the defaults.
TASKS_COORD = {
    "HEARTBEAT_FREQUENCY": 1.0,
    "LIVENESS_INTERVAL": 10.0,
    "POLL_INTERVAL": 0.5,
    "SHUTDOWN_MAX_WAIT": 5.0,
    "STATUS_INTERVAL": 30.0,
    "WORKERS": 4,
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"short": {"format": "%(levelname)-7s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "short"}},
    "loggers": {
        "django_tasks_coord": {"handlers": ["console"], "level": "INFO"},
        "demo": {"handlers": ["console"], "level": "INFO"},
        "django.tasks": {"level": "WARNING"},  # one line per task state: too chatty here
    },
}
