"""Workflow tests: nodes in-process (``tests/node/conftest.py``), ``@task`` steps of
``tests/workflows/tasks.py`` on the default ``DatabaseBackend``, push steps for the
test consumers."""

from __future__ import annotations

from importlib.util import find_spec

import pytest

from django_tasks_coord import queue
from tests.node.conftest import _restore_registry, make_node, run, work_topic  # noqa: F401

HAS_TASKS = bool(find_spec("django.tasks") or find_spec("django_tasks"))

#: Without Django's task framework only the push steps could run: skip the package.
collect_ignore_glob = [] if HAS_TASKS else ["test_*.py"]


@pytest.fixture
def backend_queues(transactional_db):
    """The default backend's queues are topics, and the node runs them (as runscheduler's
    start-up does)."""
    from django_tasks_coord.backends.housekeeping import prepare_node

    prepare_node()
    return queue


def drain(make_node, *topics: str, timeout: float = 60) -> None:  # noqa: F811
    """Run a burst node on ``topics`` (default: the default queue and ``work``) until it
    finds nothing due."""
    assert run(make_node(topics=list(topics or ("default", "work"))), timeout) == 0
