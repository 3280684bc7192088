"""The operator's console: the Django admin for topics, tasks, jobs, nodes and leaders.

Importing this package (Django's admin autodiscovery does) registers one
``ModelAdmin`` per model on the default admin site, plus a dashboard page. Every
action calls the service layer (:mod:`~django_tasks_coord.queue`,
:mod:`~django_tasks_coord.scheduling`,
:mod:`~django_tasks_coord.workflows`), is POST-only and CSRF-protected, is recorded
in the admin log and needs one of the app's custom permissions. See docs/admin.md.
"""

from django_tasks_coord.admin import (
    coordination,
    dashboard,
    definitions,
    jobs,
    tasks,
    tokens,
    topics,
    workflows,
)

__all__ = [
    "coordination",
    "dashboard",
    "definitions",
    "jobs",
    "tasks",
    "tokens",
    "topics",
    "workflows",
]
