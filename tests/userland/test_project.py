"""The package in a user's own ``startproject`` project (see ``conftest.py``).

- The project's own test suite (``shop/tests.py``, a ``TransactionTestCase`` that
  enqueues a ``@task`` and pushes to a topic in two tests, and tells identifiers apart by
  case in a database of the server's default collation) passes under ``manage.py test``.
- ``manage.py runscheduler --burst`` runs a one-time job that is due, then exits.
"""

from __future__ import annotations

import pytest

from tests.userland.conftest import Project

pytestmark = pytest.mark.userland


def test_the_users_transaction_test_cases_pass(project: Project):
    done = project.manage("test", "shop", "--noinput", "-v", "2", timeout=300)
    assert "Ran 3 tests" in done.stderr, done.stderr
    assert "OK" in done.stderr.splitlines(), done.stderr


class JobDidNotRun(AssertionError):
    """The burst exited without running the due job."""


def test_a_burst_runs_a_due_one_time_job(project: Project, tmp_path):
    project.manage("migrate", "--noinput")
    marker = tmp_path / "marker.txt"
    scheduled = project.python_code(
        "from django.utils import timezone\n"
        "from django_tasks_coord import scheduling\n"
        "from shop.jobs import write_marker\n"
        f"print(scheduling.schedule_one_time(write_marker, timezone.now(), args=[{str(marker)!r}]))\n"
    )
    job_id = scheduled.stdout.strip().splitlines()[-1]
    done = project.manage("runscheduler", "--burst", timeout=120)
    if not marker.exists():
        raise JobDidNotRun(f"no run of {job_id}:\n{done.stderr}")
    assert marker.read_text() == f"ran {job_id} at attempt 1"
