"""Django application configuration."""

from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_migrate, pre_migrate


class TasksCoordConfig(AppConfig):
    """Registers the app's models, signals and system checks."""

    name = "django_tasks_coord"
    label = "django_tasks_coord"
    verbose_name = "Tasks coordination"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers receivers and checks, and the consumer of the jobs topic.
        from django_tasks_coord import checks, conf, dbviews, topics  # noqa: F401
        from django_tasks_coord.scheduling import runner

        runner.register()

        # The task_pretty view: out of the way of migrations, then back with the current columns.
        pre_migrate.connect(dbviews.before_migrate, sender=self)
        post_migrate.connect(dbviews.after_migrate, sender=self)
