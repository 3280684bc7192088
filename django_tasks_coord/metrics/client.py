"""The optional ``prometheus_client`` dependency and the metrics' common name prefix."""

from __future__ import annotations

from types import ModuleType

from django_tasks_coord.exceptions import ConfigurationError

#: The prefix of every metric's name.
PREFIX = "tasks_coord_"


def require() -> ModuleType:
    """``prometheus_client``, or :class:`ConfigurationError` saying how to install it."""
    try:
        import prometheus_client
    except ImportError as exc:
        raise ConfigurationError(
            "Prometheus metrics need the prometheus_client package: install "
            "django-tasks-coord[metrics] (or remove the metrics URL / --metrics-port)."
        ) from exc
    return prometheus_client
