"""Django application configuration."""

from __future__ import annotations

from importlib import import_module

from django.apps import AppConfig
from django.db.models.signals import post_migrate, pre_migrate

from django_tasks_coord import conf  # noqa: F401  (its setting_changed receiver)

#: Modules imported once the app registry is ready, for what importing them registers:
#: the system checks (``checks``), the topic cache's model signal receivers (``topics``)
#: and ``scheduling.runner``, whose ``register()`` adds the consumer of the jobs topic.
#: They import the models, which Django does not allow before
#: :meth:`TasksCoordConfig.ready`.
READY_MODULES = (
    "django_tasks_coord.checks",
    "django_tasks_coord.topics",
    "django_tasks_coord.scheduling.runner",
)


class TasksCoordConfig(AppConfig):
    """Registers the app's models, signals and system checks."""

    name = "django_tasks_coord"
    label = "django_tasks_coord"
    verbose_name = "Tasks coordination"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Import :data:`READY_MODULES`, register the jobs consumer, watch migrations.

        The ``task_pretty`` view is kept out of migrations' way.
        """
        for module in READY_MODULES:
            import_module(module)
        import_module("django_tasks_coord.scheduling.runner").register()
        # The task_pretty view: out of the way of migrations, then back with the current columns.
        dbviews = import_module("django_tasks_coord.dbviews")  # it imports the models
        pre_migrate.connect(dbviews.before_migrate, sender=self)
        post_migrate.connect(dbviews.after_migrate, sender=self)
