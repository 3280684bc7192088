import pytest

from django_tasks_coord.scheduling import declared


@pytest.fixture(autouse=True)
def _forget_declarations():
    before = set(declared.declarations())
    yield
    for name in set(declared.declarations()) - before:
        declared.forget(name)
