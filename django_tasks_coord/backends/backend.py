"""``DatabaseBackend``: Django's task framework on this app's queue and nodes.

An enqueue is a :func:`queue.push <django_tasks_coord.queue.push>` to the topic named
like the task's queue; ``manage.py runscheduler`` nodes run it with retries, crash
recovery, timeouts and the attempt log that ``get_result()`` reads. See
docs/django-tasks.md.
"""

from __future__ import annotations

import dataclasses
import functools
import uuid
from datetime import timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core import checks
from django.db import DEFAULT_DB_ALIAS, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from django_tasks_coord import queue, topics
from django_tasks_coord.backends.calls import Calls, checked_calls
from django_tasks_coord.backends.compat import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    task_backends,
    task_enqueued,
)
from django_tasks_coord.backends.enqueue import Items, checked_items, ready, write
from django_tasks_coord.backends.limits import limits_of as flow_limits
from django_tasks_coord.backends.results import to_result
from django_tasks_coord.backends.tasks import CoordTask
from django_tasks_coord.conf import app_settings
from django_tasks_coord.enums import Insertion, TaskState
from django_tasks_coord.exceptions import ConfigurationError, InvalidArgumentError, TimerError
from django_tasks_coord.models import Task as TaskRow
from django_tasks_coord.models import Topic
from django_tasks_coord.retry import DEFAULT_RETRY, RetryPolicy
from django_tasks_coord.timers import parse

#: Topic names this app uses for itself; no Django queue may take them.
RESERVED_PREFIX = topics.RESERVED_PREFIX

#: ``OPTIONS`` keys and their defaults (see docs/django-tasks.md).
OPTION_DEFAULTS: dict[str, Any] = {
    # Database alias holding the tables; None: TASKS_COORD["DATABASE"] (they must agree).
    "DATABASE": None,
    # Inside transaction.atomic(), an enqueue becomes visible when the transaction commits.
    "ENQUEUE_ON_COMMIT": True,
    # Completed results older than this (seconds or timedelta) are pruned; None: kept.
    "RESULT_RETENTION": None,
    # Attempts and backoff of tasks that set none (a RetryPolicy or its keyword arguments).
    "RETRY": None,
    # Seconds an attempt may run before it fails with TaskTimeoutError; None: no limit.
    "TIMEOUT": None,
}


def _seconds(value: object, what: str) -> float | None:
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
        raise InvalidArgumentError(
            f"{what} must be positive seconds or a timedelta, not {value!r}."
        )
    return float(seconds)


class DatabaseBackend(BaseTaskBackend):
    """Run Django's ``@task`` functions on ``runscheduler`` nodes.

    ``TASKS = {"default": {"BACKEND": "django_tasks_coord.backends.DatabaseBackend"}}``.
    Each queue is a topic of the same name; results are ``Task`` rows read back by
    :meth:`get_result`. Beyond Django's API: retries with backoff, timeouts, unique
    keys and periodic tasks (the :class:`CoordTask` options), crash recovery, and
    enqueues that commit with the caller's transaction.
    """

    task_class = CoordTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.settings = {**OPTION_DEFAULTS, **self.options}

    # --- options --------------------------------------------------------------------

    @property
    def database(self) -> str:
        """The alias the tables live on (``OPTIONS["DATABASE"]`` or ``TASKS_COORD["DATABASE"]``)."""
        return str(self.settings["DATABASE"] or app_settings.DATABASE)

    @property
    def enqueue_on_commit(self) -> bool:
        """``OPTIONS["ENQUEUE_ON_COMMIT"]``."""
        return bool(self.settings["ENQUEUE_ON_COMMIT"])

    @property
    def result_retention(self) -> timedelta | None:
        """``OPTIONS["RESULT_RETENTION"]`` as a timedelta (None: keep results)."""
        seconds = _seconds(self.settings["RESULT_RETENTION"], "RESULT_RETENTION")
        return None if seconds is None else timedelta(seconds=seconds)

    @property
    def default_retry(self) -> RetryPolicy:
        """``OPTIONS["RETRY"]`` (the app's default policy when unset)."""
        value = self.settings["RETRY"]
        if value is None:
            return DEFAULT_RETRY
        return value if isinstance(value, RetryPolicy) else RetryPolicy(**value)

    @property
    def default_timeout(self) -> float | None:
        """``OPTIONS["TIMEOUT"]`` in seconds."""
        return _seconds(self.settings["TIMEOUT"], "TIMEOUT")

    def topics(self) -> list[str]:
        """The topics of this backend's queues (every topic when ``QUEUES`` is empty)."""
        if self.queues:
            return sorted(self.queues)
        return list(Topic.objects.using(self.database).values_list("name", flat=True))

    # --- validation -----------------------------------------------------------------

    def validate_task(self, task: Task) -> None:  # type: ignore[type-arg]
        """Django's checks, plus: the queue can be a topic, and this app's options are valid."""
        super().validate_task(task)
        name = task.queue_name
        if not 0 < len(name) <= 100 or name != name.strip() or name.startswith(RESERVED_PREFIX):
            raise InvalidTask(
                f"Queue {name!r} cannot be a topic: use 1 to 100 characters without surrounding "
                f"spaces, not starting with {RESERVED_PREFIX!r}."
            )
        if not isinstance(task, CoordTask):
            return
        try:
            self._policy(task)
            _seconds(task.timeout, "timeout")
            Insertion.coerce(task.insertion, "insertion")
            if task.timer is not None:
                parse(task.timer, tz=(task.timer_options or {}).get("tz"))
            flow_limits(task)
        except (InvalidArgumentError, TimerError, TypeError) as exc:
            raise InvalidTask(f"Task {task.module_path}: {exc}") from exc
        key = task.unique_key
        if key is not None and not callable(key) and not (isinstance(key, str) and key):
            raise InvalidTask(
                f"Task {task.module_path}: unique_key must be a non-empty str or a callable, "
                f"not {key!r}."
            )

    def _policy(self, task: Task) -> RetryPolicy:  # type: ignore[type-arg]
        policy = self.default_retry
        if isinstance(task, CoordTask):
            if task.retry is not None:
                if not isinstance(task.retry, RetryPolicy):
                    raise InvalidArgumentError(
                        f"retry must be a RetryPolicy or a dict, not {task.retry!r}."
                    )
                policy = task.retry
            if task.max_attempts is not None:
                policy = dataclasses.replace(policy, max_attempts=task.max_attempts)
        return policy

    # --- enqueue --------------------------------------------------------------------

    def _identifier(self, task: Task, args: Any, kwargs: Any) -> tuple[str, Insertion]:  # type: ignore[type-arg]
        if not isinstance(task, CoordTask) or task.unique_key is None:
            return uuid.uuid4().hex, Insertion.APPEND
        key = task.unique_key
        value = key(*args, **kwargs) if callable(key) else key
        identifier = f"{task.module_path}:{value}"
        if not isinstance(value, str) or not value or len(identifier) > 255:
            raise InvalidTask(
                f"Task {task.module_path}: its unique key must be a non-empty str that keeps "
                f"'<module path>:<key>' within 255 characters, not {value!r}."
            )
        return identifier, Insertion.coerce(task.insertion, "insertion")

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:  # type: ignore[type-arg]
        """Push the task to its queue's topic and return its (READY) result.

        In the caller's transaction on the tasks database: a rolled-back enqueue never
        existed. With ``ENQUEUE_ON_COMMIT`` and the tables on a database of their own,
        an enqueue inside a transaction on the default database waits for its commit.
        """
        return self.enqueue_as(task, args, kwargs)

    def enqueue_as(
        self,
        task: Task,  # type: ignore[type-arg]
        args: Any,
        kwargs: Any,
        *,
        identifier: str | None = None,
    ) -> TaskResult:  # type: ignore[type-arg]
        """:meth:`enqueue` with a chosen result id (periodic runs use one per slot)."""
        self.validate_task(task)
        insertion = Insertion.APPEND
        if identifier is None:
            identifier, insertion = self._identifier(task, args, kwargs)
        return self._submit(task, [ready(self.alias, task, identifier, args, kwargs)], insertion)[0]

    def enqueue_many(
        self,
        task: Task,  # type: ignore[type-arg]
        calls: Calls,
    ) -> list[TaskResult]:  # type: ignore[type-arg]
        """Enqueue ``task`` once per ``(args, kwargs)`` of ``calls``, in one statement.

        Like as many :meth:`enqueue` calls (the same checks, unique keys, signals and
        transaction semantics; every call is checked before anything is written), but
        one ``INSERT`` of all the rows (on SQLite as many as its parameter limit allows
        per statement, in one transaction). Returns the results in the order of
        ``calls``. Also :meth:`CoordTask.enqueue_many
        <django_tasks_coord.backends.CoordTask.enqueue_many>`.
        """
        self.validate_task(task)
        results, insertion = [], Insertion.APPEND
        for args, kwargs in checked_calls(calls):
            identifier, insertion = self._identifier(task, args, kwargs)
            results.append(ready(self.alias, task, identifier, args, kwargs))
        return self._submit(task, results, insertion)

    async def aenqueue_many(
        self,
        task: Task,  # type: ignore[type-arg]
        calls: Calls,
    ) -> list[TaskResult]:  # type: ignore[type-arg]
        """:meth:`enqueue_many` from async code (in a thread, like Django's ``aenqueue``)."""
        calls = list(calls)
        results: list[TaskResult] = await sync_to_async(  # type: ignore[type-arg]
            self.enqueue_many, thread_sensitive=True
        )(task, calls)
        return results

    def _submit(
        self,
        task: Task,  # type: ignore[type-arg]
        results: list[TaskResult],  # type: ignore[type-arg]
        insertion: Insertion,
    ) -> list[TaskResult]:  # type: ignore[type-arg]
        """Push ``results`` now, or at the default database's commit (:meth:`_defer`).

        Everything is checked first, also when the push waits for a commit.
        """
        if not results:
            return results
        policy, timeout = self._policy(task), self.default_timeout
        items = checked_items(self.alias, task, results, policy, timeout)
        push = functools.partial(self._push, task, results, items, insertion)
        if self._defer():
            transaction.on_commit(push, using=DEFAULT_DB_ALIAS)
        else:
            push()
        return results

    def _defer(self) -> bool:
        """Whether to wait for the commit of a transaction on another database than ours."""
        return (
            self.enqueue_on_commit
            and self.database != DEFAULT_DB_ALIAS
            and not transaction.get_connection(self.database).in_atomic_block
            and transaction.get_connection(DEFAULT_DB_ALIAS).in_atomic_block
        )

    def _push(
        self,
        task: Task,  # type: ignore[type-arg]
        results: list[TaskResult],  # type: ignore[type-arg]
        items: Items,
        insertion: Insertion,
    ) -> None:
        """Write the rows (:func:`~django_tasks_coord.backends.enqueue.write`), then send
        ``task_enqueued`` once per result."""
        for result, created in zip(results, write(task, results, items, insertion), strict=True):
            object.__setattr__(result, "enqueued_at", created or timezone.now())
            task_enqueued.send(type(self), task_result=result)

    # --- results --------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult:  # type: ignore[type-arg]
        """The result with id ``result_id`` (the newest enqueue, for a unique key)."""
        if not isinstance(result_id, str) or not 0 < len(result_id) <= 255:
            raise TaskResultDoesNotExist(result_id)
        rows = TaskRow.objects.using(self.database).filter(
            topic_id__in=self.topics(), identifier=result_id
        )
        row = rows.order_by("-sequence").first()
        payload = row.payload if row is not None else None
        if row is None or not isinstance(payload, dict) or "task" not in payload:
            raise TaskResultDoesNotExist(result_id)
        return to_result(row)

    def cancel(self, result_id: str, message: str | None = None) -> TaskResult:  # type: ignore[type-arg]
        """Cancel the task of ``result_id`` (:func:`django_tasks_coord.queue.cancel`): at once
        if it has not started, else ask it to stop (``cancel_requested``; it ends with the
        status FAILED, as canceled, however its function ends). Returns the result as it
        is now; raises ``TaskResultDoesNotExist`` for an unknown id and
        :class:`~django_tasks_coord.exceptions.TaskStateError` for a finished task."""
        self.get_result(result_id)  # refuses ids that are not this backend's tasks
        rows = TaskRow.objects.using(self.database).filter(
            topic_id__in=self.topics(), identifier=result_id
        )
        row = rows.order_by("-sequence").first()
        assert row is not None
        queue.cancel(row, message)
        return self.get_result(result_id)

    # --- checks ---------------------------------------------------------------------

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """``tasks_coord.E020`` bad ``OPTIONS``; ``E021`` a database the nodes do not use; ``E022`` a bad queue."""
        messages: list[checks.CheckMessage] = list(super().check(**kwargs))
        unknown = sorted(set(self.options) - set(OPTION_DEFAULTS))
        problems = [f"unknown key(s) {', '.join(unknown)}"] if unknown else []
        for read in ("result_retention", "default_retry", "default_timeout"):
            try:
                getattr(self, read)
            except (InvalidArgumentError, TypeError) as exc:
                problems.append(str(exc))
        for problem in problems:
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias!r}]['OPTIONS']: {problem}.",
                    hint=f"Known keys: {', '.join(OPTION_DEFAULTS)}; see docs/django-tasks.md.",
                    id="tasks_coord.E020",
                )
            )
        try:
            nodes_database, database = app_settings.DATABASE, self.database
        except ConfigurationError:  # a bad TASKS_COORD: tasks_coord.E001 reports it
            return messages
        if database != nodes_database:
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias!r}]['OPTIONS']['DATABASE'] is {self.database!r} but nodes "
                    f"use TASKS_COORD['DATABASE'] = {nodes_database!r}.",
                    hint="Put the tables on one database: set TASKS_COORD['DATABASE'] to the same alias.",
                    id="tasks_coord.E021",
                )
            )
        for name in sorted(self.queues):
            if not 0 < len(name) <= 100 or name.startswith(RESERVED_PREFIX):
                messages.append(
                    checks.Error(
                        f"TASKS[{self.alias!r}]['QUEUES'] has {name!r}, which cannot be a topic.",
                        hint=f"Use 1 to 100 characters, not starting with {RESERVED_PREFIX!r}.",
                        id="tasks_coord.E022",
                    )
                )
        return messages


def coord_backends() -> list[DatabaseBackend]:
    """Every configured task backend that is (a subclass of) :class:`DatabaseBackend`.

    Other backends are not instantiated (a misconfigured one must not stop a node).
    """
    found = []
    for alias, params in (getattr(settings, "TASKS", None) or {}).items():
        try:
            backend_class = import_string(params["BACKEND"])
        except (ImportError, KeyError, TypeError):
            continue
        if isinstance(backend_class, type) and issubclass(backend_class, DatabaseBackend):
            found.append(task_backends[alias])
    return [backend for backend in found if isinstance(backend, DatabaseBackend)]


__all__ = ["CoordTask", "DatabaseBackend", "TaskState", "coord_backends"]
