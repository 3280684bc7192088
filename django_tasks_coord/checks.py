"""System checks. Ids are stable (``tasks_coord.E001``...) and listed in docs/reference/checks.md."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Error, register

from django_tasks_coord.exceptions import ConfigurationError


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``tasks_coord.E001``: the ``TASKS_COORD`` setting is malformed."""
    from django_tasks_coord.conf import _merged

    try:
        _merged()
    except ConfigurationError as exc:
        return [
            Error(
                str(exc),
                hint="See docs/reference/settings.md for the accepted keys.",
                id="tasks_coord.E001",
            )
        ]
    return []
