"""Where Django's task framework comes from: ``django.tasks`` (Django 6.0+) or the backport.

On Django 5.2 the same names come from the ``django-tasks`` backport package. Without
either, importing this module (and so the backend) raises an :class:`ImportError`
that says what to install; Django reports it as an ``InvalidTaskBackend`` naming the
backend path.
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import TYPE_CHECKING

if TYPE_CHECKING or find_spec("django.tasks") is not None:  # type-checked against Django 6
    from django.tasks import task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import (
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
        task,
    )
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    SOURCE = "django.tasks"
elif find_spec("django_tasks") is not None:  # pragma: no cover - Django 5.2 with the backport
    from django_tasks import task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import (
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
        task,
    )
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import (
        task_enqueued,
        task_finished,
        task_started,
    )
    from django_tasks.utils import normalize_json

    SOURCE = "django_tasks"
else:
    raise ImportError(
        "django_tasks_coord.backends needs Django's task framework: django.tasks (Django 6.0 "
        "or later), or on Django 5.2 the django-tasks backport package "
        "(pip install 'django-tasks>=0.12'). Neither is importable.",
        name="django.tasks",  # the missing module, as Python's own ImportError names it
    )

__all__ = [
    "DEFAULT_TASK_QUEUE_NAME",
    "SOURCE",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
