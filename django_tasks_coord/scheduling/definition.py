"""A job's definition: its callable, its id, and the ``periodic_task`` columns its options set.

Validation only: nothing here reads or writes the database. :func:`job_fields` checks
the options every ``schedule_*`` function (and ``@scheduling.job``) takes and returns
the columns they set; :mod:`~django_tasks_coord.scheduling.jobs` saves them.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from django.utils.module_loading import import_string

from django_tasks_coord.enums import ErrorPolicy, WaitingPolicy
from django_tasks_coord.exceptions import InvalidArgumentError, JobDefinitionError
from django_tasks_coord.models import CatchUp, JobKind, PeriodicTask
from django_tasks_coord.retry import RetryPolicy
from django_tasks_coord.timers import Timer
from django_tasks_coord.timers.base import zone_name

#: A job: a module-level callable, or its dotted path.
JobRef = Callable[..., Any] | str

#: Characters of a random hex suffix in a generated job id (64 bits).
ID_SUFFIX_LENGTH = 16
MAX_JOB_ID_LENGTH = PeriodicTask._meta.get_field("id").max_length or 200


def callable_path(job: JobRef) -> str:
    """The dotted path of a module-level callable; :class:`JobDefinitionError` otherwise."""
    if isinstance(job, str):
        try:
            import_string(job)
        except ImportError as exc:
            raise JobDefinitionError(f"Job callable {job!r} cannot be imported: {exc}") from exc
        return job
    module, qualname = getattr(job, "__module__", None), getattr(job, "__qualname__", "")
    if not callable(job) or not module or "<" in qualname or "." in qualname:
        raise JobDefinitionError(
            f"A job must be a module-level function or its dotted path, not {job!r} "
            "(nested functions, lambdas and methods cannot be found again by another process)."
        )
    return f"{module}.{qualname}"


def new_job_id(path: str, kind: JobKind | str) -> str:
    """A new job id, ``"<dotted path>:<kind>:<16 random hex digits>"``, unique on every call.

    The path is shortened from the left (keeping the function's name) if the id would
    not fit the ``periodic_task.id`` column.
    """
    suffix = f":{kind}:{uuid.uuid4().hex[:ID_SUFFIX_LENGTH]}"
    return path[-(MAX_JOB_ID_LENGTH - len(suffix)) :] + suffix


def aware(value: datetime | None, argument: str) -> datetime | None:
    """``value`` if it is an aware datetime or None; :class:`InvalidArgumentError` otherwise."""
    if value is not None and (not isinstance(value, datetime) or timezone.is_naive(value)):
        raise InvalidArgumentError(f"{argument} must be an aware datetime or None, not {value!r}.")
    return value


def job_fields(
    job: JobRef,
    kind: JobKind,
    timer: Timer,
    *,
    job_id: str | None = None,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    priority: int = 0,
    group: str = "",
    leader_only: bool = False,
    max_count: int = -1,
    start_time: datetime | None = None,
    end_time: datetime | None = None,
    policy: ErrorPolicy | str | None = None,
    waiting_policy: WaitingPolicy | str = WaitingPolicy.WAIT,
    waiting_time: float | timedelta = 60.0,
    retry: RetryPolicy | None = None,
    fixed_delay: bool = False,
    allow_overlap: bool = False,
    catch_up: CatchUp | str = CatchUp.ONCE,
    catch_up_limit: int = 10,
    declared: bool = False,
) -> tuple[str, dict[str, Any]]:
    """Validate a job definition; return its id and the ``periodic_task`` columns it sets.

    The keyword arguments are the common options of every ``schedule_*`` function;
    see docs/scheduling.md. Without ``job_id``, the id is a new one (:func:`new_job_id`).
    An unknown option raises ``TypeError``.
    """
    path = callable_path(job)
    job_id = _checked_id(new_job_id(path, kind) if job_id is None else job_id)
    start_time, end_time = aware(start_time, "start_time"), aware(end_time, "end_time")
    _check_bounds(job_id, group, leader_only, start_time, end_time, max_count)
    return job_id, {
        "kind": kind,
        "task": path,
        "timer": str(timer),
        "tz": zone_name(timer.tz),
        "args": list(args),
        "kwargs": dict(kwargs or {}),
        "priority": priority,
        "group": group,
        "leader_only": bool(leader_only),
        "max_count": max_count,
        "start_time": start_time,
        "end_time": end_time,
        **_policy_fields(policy, waiting_policy, waiting_time, retry, catch_up),
        "catch_up_limit": catch_up_limit,
        "fixed_delay": bool(fixed_delay),
        "allow_overlap": bool(allow_overlap),
        "declared": declared,
    }


def _checked_id(job_id: object) -> str:
    if not isinstance(job_id, str) or not 0 < len(job_id) <= MAX_JOB_ID_LENGTH:
        raise InvalidArgumentError(
            f"job_id must be a str of 1 to {MAX_JOB_ID_LENGTH} characters, not {job_id!r}."
        )
    return job_id


def _check_bounds(
    job_id: str,
    group: str,
    leader_only: bool,
    start_time: datetime | None,
    end_time: datetime | None,
    max_count: int,
) -> None:
    """Refuse a leader-only job without a group, an end before the start, a bad ``max_count``."""
    if leader_only and not group:
        raise JobDefinitionError(f"Job {job_id!r} is leader-only but names no group.")
    if start_time and end_time and end_time < start_time:
        raise JobDefinitionError(
            f"Job {job_id!r}: end_time {end_time} is before start_time {start_time}."
        )
    if (
        isinstance(max_count, bool)
        or not isinstance(max_count, int)
        or max_count < -1
        or max_count == 0
    ):
        raise InvalidArgumentError(
            f"max_count must be -1 (unlimited) or a positive int, not {max_count!r}."
        )


def _policy_fields(
    policy: ErrorPolicy | str | None,
    waiting_policy: WaitingPolicy | str,
    waiting_time: float | timedelta,
    retry: RetryPolicy | None,
    catch_up: CatchUp | str,
) -> dict[str, Any]:
    """The columns of the error, waiting, retry and missed-slot policies, validated in order."""
    if isinstance(waiting_time, timedelta):
        waiting_time = waiting_time.total_seconds()
    return {
        "error_policy": str(ErrorPolicy.coerce(policy or ErrorPolicy.LOG_AND_CONTINUE, "policy")),
        "waiting_policy": str(WaitingPolicy.coerce(waiting_policy, "waiting_policy")),
        "waiting_time": float(waiting_time),
        "retry": _retry_data(retry),
        "catch_up": str(CatchUp(catch_up))
        if catch_up in CatchUp.values
        else _bad_catch_up(catch_up),
    }


def _retry_data(retry: RetryPolicy | None) -> dict[str, Any] | None:
    if retry is None:
        return None
    if not isinstance(retry, RetryPolicy):
        raise InvalidArgumentError(f"retry must be a RetryPolicy or None, not {retry!r}.")
    data = dataclasses.asdict(retry)
    data["backoff"] = str(retry.backoff)
    return data


def _bad_catch_up(value: object) -> str:
    raise InvalidArgumentError(f"catch_up={value!r} is not one of {', '.join(CatchUp.values)}.")


__all__ = [
    "ID_SUFFIX_LENGTH",
    "MAX_JOB_ID_LENGTH",
    "JobRef",
    "aware",
    "callable_path",
    "job_fields",
    "new_job_id",
]
