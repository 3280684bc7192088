"""Django application configuration."""

from __future__ import annotations

from django.apps import AppConfig


class TasksCoordConfig(AppConfig):
    """Registers the app's models, signals and system checks."""

    name = "django_tasks_coord"
    label = "django_tasks_coord"
    verbose_name = "Tasks coordination"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers receivers and checks, and the consumer of the jobs topic.
        from django_tasks_coord import checks, conf, topics  # noqa: F401
        from django_tasks_coord.scheduling import runner  # noqa: F401
