"""``manage.py createapitoken``: deprecated alias of ``manage.py tasks_coord_createapitoken``."""

from django_tasks_coord.management.commands import tasks_coord_createapitoken
from django_tasks_coord.management.commands._deprecated import deprecated_alias

Command = deprecated_alias(
    tasks_coord_createapitoken.Command, "createapitoken", "tasks_coord_createapitoken"
)
