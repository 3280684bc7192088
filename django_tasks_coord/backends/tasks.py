"""The backend's ``task_class``: Django's ``Task`` plus retries, a timeout, a unique key and a timer.

Django 6.1 hands every extra keyword argument of ``@task(...)`` to the backend's
``task_class``, so these options need no second decorator::

    from django.tasks import task

    @task(max_attempts=5, timeout=30, unique_key=lambda user_id: str(user_id))
    def refresh_profile(user_id): ...

    @task(timer="Mon..Fri 09:00", timer_options={"tz": "Europe/Berlin"})
    def morning_report(): ...

    @task(rate="10/s", concurrency=2)   # across all nodes (docs/flow-control.md)
    def call_partner_api(order_id): ...
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django_tasks_coord.backends.calls import Calls
from django_tasks_coord.backends.compat import InvalidTask, Task, TaskResult
from django_tasks_coord.backends.periodic import declare
from django_tasks_coord.backends.worker import DJANGO_TASK_TYPE
from django_tasks_coord.handlers import TaskType
from django_tasks_coord.retry import RetryPolicy

#: ``unique_key``: a fixed key, or a callable that gets the call's arguments and returns the key.
UniqueKey = str | Callable[..., str]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CoordTask(Task):  # type: ignore[type-arg]
    """A Django ``Task`` with this app's options (all optional; see docs/django-tasks.md).

    ``max_attempts`` (runs in all, the first included) and ``retry`` (a
    :class:`~django_tasks_coord.retry.RetryPolicy`: interval, backoff, cap, jitter)
    override the backend's ``OPTIONS["RETRY"]``; ``timeout`` (seconds) fails an attempt
    that runs longer; ``unique_key`` makes enqueues of the same key share one result id
    and applies ``insertion`` (default ``"supersede"``: a newer enqueue replaces a
    waiting one); ``timer`` (anything :func:`~django_tasks_coord.timers.parse`
    accepts) enqueues the task on that schedule, with ``timer_options`` passed to the
    job declaration (``tz``, ``catch_up``, ``waiting_time``...); ``rate`` (``"10/s"``,
    ``"1000/m"``...) and ``concurrency`` (an int >= 1) limit the starts and the runs at once
    of this function across all nodes (its queue's topic is keyed by the function,
    :mod:`django_tasks_coord.backends.limits`; see docs/flow-control.md).
    """

    max_attempts: int | None = None
    retry: RetryPolicy | None = None
    timeout: float | None = None
    unique_key: UniqueKey | None = dataclasses.field(default=None, compare=False)
    insertion: str = "supersede"
    timer: str | None = None
    timer_options: dict[str, Any] | None = dataclasses.field(
        default=None, compare=False, hash=False
    )
    rate: str | None = None
    concurrency: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.timeout, timedelta):
            object.__setattr__(self, "timeout", self.timeout.total_seconds())
        if isinstance(self.retry, dict):
            object.__setattr__(self, "retry", RetryPolicy(**self.retry))
        # Explicit base call: zero-argument super() does not work in slotted dataclasses.
        Task.__post_init__(self)
        if self.timer is not None:
            declare(self)

    def using(
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: datetime | None = None,
        backend: str | None = None,
        unique_key: UniqueKey | None = None,
        max_attempts: int | None = None,
        timeout: float | timedelta | None = None,
    ) -> CoordTask:
        """Django's ``using()``, plus ``unique_key``, ``max_attempts`` and ``timeout`` per call."""
        task: Any = Task.using(
            self, priority=priority, queue_name=queue_name, run_after=run_after, backend=backend
        )
        extra = {"unique_key": unique_key, "max_attempts": max_attempts, "timeout": timeout}
        changes: dict[str, Any] = {k: v for k, v in extra.items() if v is not None}
        replaced: CoordTask = dataclasses.replace(task, **changes) if changes else task
        return replaced

    def enqueue_many(self, calls: Calls) -> list[TaskResult]:  # type: ignore[type-arg]
        """Enqueue this task once per ``(args, kwargs)`` of ``calls``, in one statement.

        ``send_report.enqueue_many([((1,), {}), ((2,), {"urgent": True})])``: see
        :meth:`DatabaseBackend.enqueue_many <django_tasks_coord.backends.DatabaseBackend.enqueue_many>`.
        """
        results: list[TaskResult] = self._many_backend().enqueue_many(self, calls)  # type: ignore[type-arg]
        return results

    async def aenqueue_many(self, calls: Calls) -> list[TaskResult]:  # type: ignore[type-arg]
        """:meth:`enqueue_many` from async code."""
        results: list[TaskResult] = await self._many_backend().aenqueue_many(self, calls)  # type: ignore[type-arg]
        return results

    def _many_backend(self) -> Any:
        backend = self.get_backend()
        if not hasattr(backend, "enqueue_many"):
            raise InvalidTask(
                f"enqueue_many needs django_tasks_coord's DatabaseBackend; the task's backend "
                f"{self.backend!r} is a {type(backend).__name__}."
            )
        return backend

    @property
    def task_type(self) -> TaskType:
        """The task type the node runs these tasks with (``handlers.Registry.named`` reads it)."""
        return DJANGO_TASK_TYPE
