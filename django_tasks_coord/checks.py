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


@register()
def check_declared_jobs(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``tasks_coord.E002``: a job declared with ``@scheduling.job`` cannot be imported by its path.

    (A declared timer that does not parse fails at import, with the parser's message.)
    """
    from django_tasks_coord.scheduling import declared

    declared.autodiscover()
    return [
        Error(
            f"Declared job {name!r}: {problem}.",
            hint="Declare jobs on module-level functions of an importable module (an app's jobs.py).",
            id="tasks_coord.E002",
        )
        for name, problem in declared.problems()
    ]
