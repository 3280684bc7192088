"""``manage.py prune``: deprecated alias of ``manage.py tasks_coord_prune``."""

from django_tasks_coord.management.commands import tasks_coord_prune
from django_tasks_coord.management.commands._deprecated import deprecated_alias

Command = deprecated_alias(tasks_coord_prune.Command, "prune", "tasks_coord_prune")
