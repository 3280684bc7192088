"""A periodic Django task, imported only by the test that declares it."""

from django_tasks_coord.backends.compat import task


@task(timer="*-*-* *:*:00", timer_options={"tz": "UTC", "catch_up": "skip"}, max_attempts=1)
def every_minute():
    return "tick"
