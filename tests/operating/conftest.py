"""Fixtures of the operating tests: the node fixtures of tests/node, shared."""

from tests.node.conftest import _restore_registry, make_node, work_topic  # noqa: F401
