"""Two consumers declared for one topic (system check tasks_coord.E007)."""

from django_tasks_coord import handlers


@handlers.consumer("checks-dup")
def first(task):
    return None


@handlers.consumer("checks-dup")
def second(task):
    return None
