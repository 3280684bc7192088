"""The node fixtures of ``tests/node`` (a burst node in this process, the ``work`` topic)."""

from tests.node.conftest import _restore_registry, make_node, work_topic  # noqa: F401
