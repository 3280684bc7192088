"""A valid job, then one with an invalid option (tasks_coord.E006 at check time, not at start-up)."""

from django_tasks_coord import scheduling


@scheduling.job("hourly", name="checks-options-valid")
def valid(ctx):
    return None


@scheduling.job("hourly", max_count=0)
def bad_option(ctx):
    return None
