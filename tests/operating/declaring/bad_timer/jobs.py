"""A job declared with a timer that does not parse (system check tasks_coord.E004)."""

from django_tasks_coord import scheduling


@scheduling.job("every other tuesday")
def never(ctx):
    return None
