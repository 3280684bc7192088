"""Durable, coordinated background work for Django.

Public entry points live in submodules so that importing the package does not
import Django models: ``django_tasks_coord.queue``, ``django_tasks_coord.timers``
and (later) ``django_tasks_coord.scheduling``.
"""

__version__ = "0.1.0.dev0"
