"""Django's task framework (``django.tasks``, or the ``django-tasks`` backport on Django 5.2)
on this app: ``TASKS = {"default": {"BACKEND": "django_tasks_coord.backends.DatabaseBackend"}}``.

See docs/django-tasks.md. Importing this package without Django's task framework
raises an :class:`ImportError` saying what to install.
"""

from __future__ import annotations

from django_tasks_coord.backends import compat  # noqa: F401  (fails clearly without django.tasks)
from django_tasks_coord.backends.backend import DatabaseBackend, coord_backends
from django_tasks_coord.backends.results import CoordTaskResult
from django_tasks_coord.backends.tasks import CoordTask
from django_tasks_coord.backends.worker import CoordTaskContext

__all__ = ["CoordTask", "CoordTaskContext", "CoordTaskResult", "DatabaseBackend", "coord_backends"]
