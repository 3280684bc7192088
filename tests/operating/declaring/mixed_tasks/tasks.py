"""A valid periodic task, then one whose timer has a typo (tasks_coord.E004, no traceback)."""

from django_tasks_coord.backends.compat import task


@task(timer="daily")
def valid_report():
    return None


@task(timer="Mon..Fri 9:0x")
def typo_report():
    return None
