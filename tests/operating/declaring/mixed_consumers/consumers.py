"""A valid consumer, then one with an invalid option (tasks_coord.E006, no traceback)."""

from django_tasks_coord import handlers


@handlers.consumer("checks-valid-consumer")
def valid(task):
    return None


@handlers.consumer("checks-bad-consumer", retry=3)
def bad(task):
    return None
