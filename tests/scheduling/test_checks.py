import pytest
from django.core import checks

from django_tasks_coord import scheduling


def make_nested():
    @scheduling.job("hourly", name="nested-job")
    def nested(ctx):
        return None

    return nested


pytestmark = pytest.mark.django_db  # model checks ask the database about JSON support


def test_a_declared_job_that_cannot_be_imported_is_reported():
    make_nested()
    (error,) = [m for m in checks.run_checks() if m.id == "tasks_coord.E002"]
    assert "Declared job 'nested-job'" in error.msg
    assert "cannot be imported" in error.msg


def test_declared_jobs_that_import_pass():
    from tests.testapp import job_functions

    scheduling.job("hourly", name="fine-job")(job_functions.noop)
    assert not [m for m in checks.run_checks() if m.id == "tasks_coord.E002"]
