"""Jobs declared in code with ``@scheduling.job(...)`` in an app's ``jobs.py``.

``runscheduler`` imports every installed app's ``jobs`` module, then
:func:`sync_declared` makes the ``periodic_task`` rows match the declarations: new
jobs are created, changed ones updated, unchanged ones left alone (their next run
and run count kept), and rows of jobs no longer declared are disabled, never
deleted with their history.
"""

from __future__ import annotations

import linecache
import logging
import re
import sys
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from django.utils.module_loading import autodiscover_modules, import_string

from django_tasks_coord import db
from django_tasks_coord.exceptions import InvalidArgumentError, JobDefinitionError, TimerError
from django_tasks_coord.models import JobKind, PeriodicTask
from django_tasks_coord.scheduling.definition import job_fields
from django_tasks_coord.scheduling.jobs import schedule_periodic
from django_tasks_coord.timers import Timer, parse

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Declaration:
    """One ``@job`` declaration."""

    name: str
    path: str
    timer: Timer
    options: dict[str, Any] = field(default_factory=dict)


_declarations: dict[str, Declaration] = {}
_lock = threading.Lock()


def job(
    timer: str | Timer, *, name: str | None = None, tz: str | None = None, **options: Any
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare the decorated module-level function as a periodic job.

    ``timer`` is anything :func:`~django_tasks_coord.timers.parse` accepts (checked
    now: a bad timer fails at import with the parser's message); ``name`` is the job
    id (default: the function's dotted path); the other options are those of
    ``scheduling.schedule_periodic``. Declaring the same name twice is an error.

    A timer that does not parse raises :class:`~django_tasks_coord.exceptions.TimerError`
    naming the job and where it is declared (``file:line``), which ``manage.py check``
    reports as ``tasks_coord.E004``.
    """
    try:
        parsed = parse(timer, tz=tz)
    except TimerError as exc:
        raise TimerError(f"{_declaration_site(name)}: {exc}") from exc

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        path = f"{func.__module__}.{func.__qualname__}"
        declaration = Declaration(name or path, path, parsed, options)
        try:  # the options now, not at the node's start-up (sync_declared); the callable
            # itself is checked later (E002): a stand-in validates the options alone
            job_fields(forget, JobKind.PERIODIC, parsed, job_id=declaration.name, **options)
        except (InvalidArgumentError, TypeError) as exc:
            raise JobDefinitionError(f"{_declaration_site(declaration.name)}: {exc}") from exc
        with _lock:
            known = _declarations.get(declaration.name)
            if known is not None and known.path != path:
                raise JobDefinitionError(
                    f"Job name {declaration.name!r} is declared twice: by {known.path} and by {path}."
                )
            _declarations[declaration.name] = declaration
        return func

    return decorate


_DEF = re.compile(r"\s*(?:async\s+)?def\s+(\w+)")


def _declaration_site(name: str | None) -> str:
    """``Job 'NAME' (FILE:LINE)`` for the ``@job(...)`` being evaluated by the caller.

    The declaring frame is the first one outside this package (``@task(timer=...)``
    declares through it). Without ``name``, the job is named after the function defined
    below the decorator, as its default name (the dotted path) will be.
    """
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith(
        "django_tasks_coord."
    ):
        frame = frame.f_back
    filename, line = frame.f_code.co_filename, frame.f_lineno
    if name is None:
        module = frame.f_globals.get("__name__", "?")
        name = f"{module}.?"
        for following in range(line, line + 20):
            match = _DEF.match(linecache.getline(filename, following))
            if match:
                name = f"{module}.{match.group(1)}"
                break
    return f"Job {name!r} ({filename}:{line})"


def declarations() -> dict[str, Declaration]:
    """Every declared job by name (a copy)."""
    with _lock:
        return dict(_declarations)


def forget(name: str) -> None:
    """Drop a declaration (tests)."""
    with _lock:
        _declarations.pop(name, None)


def problems(skip_modules: Collection[str] = ()) -> list[tuple[str, str]]:
    """``(job name, message)`` for each declaration whose callable does not import as declared.

    Never raises: a module that fails at import with another error (a timer typo next to
    this job) is a problem of this job too, unless the module is in ``skip_modules``
    (already reported by the caller).
    """
    found = []
    for declaration in declarations().values():
        if any(declaration.path.startswith(f"{module}.") for module in skip_modules):
            continue
        try:
            importable = import_string(declaration.path)
        except Exception as exc:  # noqa: BLE001 - reported as the job's problem, never raised
            found.append(
                (
                    declaration.name,
                    f"its callable {declaration.path} cannot be imported: "
                    + (
                        str(exc) if isinstance(exc, ImportError) else f"{type(exc).__name__}: {exc}"
                    ),
                )
            )
            continue
        if not callable(importable):
            found.append((declaration.name, f"{declaration.path} is not callable"))
    return found


def autodiscover() -> None:
    """Import every installed app's ``jobs`` module."""
    autodiscover_modules("jobs")


def sync_declared() -> dict[str, list[str]]:
    """Make ``periodic_task`` match the declarations; return the job ids per change."""
    changes: dict[str, list[str]] = {"created": [], "updated": [], "unchanged": [], "disabled": []}
    rows = {row.id: row for row in PeriodicTask.objects.using(db.alias()).all()}
    for name, declaration in declarations().items():
        row = rows.get(name)
        if row is not None and row.declared and row.enabled and _same(row, declaration):
            changes["unchanged"].append(name)
            continue
        schedule_periodic(
            declaration.path, declaration.timer, job_id=name, declared=True, **declaration.options
        )
        changes["created" if row is None else "updated"].append(name)
    gone = [
        job_id
        for job_id, row in rows.items()
        if row.declared and row.enabled and job_id not in declarations()
    ]
    if gone:
        PeriodicTask.objects.using(db.alias()).filter(pk__in=gone).update(
            enabled=False, nextrun=None
        )
        changes["disabled"] = gone
    for change, names in changes.items():
        if names and change != "unchanged":
            logger.info("Declared jobs %s: %s.", change, ", ".join(sorted(names)))
    return changes


def _same(row: PeriodicTask, declaration: Declaration) -> bool:
    """Whether the stored job already is exactly what the declaration says."""
    _, fields = job_fields(
        declaration.path,
        JobKind.PERIODIC,
        declaration.timer,
        job_id=declaration.name,
        declared=True,
        **declaration.options,
    )
    return all(getattr(row, column) == value for column, value in fields.items())
