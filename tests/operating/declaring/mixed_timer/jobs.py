"""A valid job, then one whose timer has a typo (system check tasks_coord.E004, no traceback)."""

from django_tasks_coord import scheduling


@scheduling.job("hourly", name="checks-valid")
def valid(ctx):
    return None


@scheduling.job("Mon..Fri 09:00:0x")
def typo(ctx):
    return None
