"""Periodic Django tasks: ``@task(timer=...)`` declares a job through ``scheduling.declared``.

The declared job (id: the task's dotted path) calls :func:`fire` with the task's path;
each slot enqueues the task once, with the result id ``<path>@<slot>``, so a job run
retried after its node died does not enqueue the slot's task twice. Declare such tasks
in an app's ``tasks.py``: every node imports those at start-up, before it syncs the
declared jobs (a declaration no node imports is disabled).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from django.utils.module_loading import import_string

from django_tasks_coord import db
from django_tasks_coord.models import Task as TaskRow
from django_tasks_coord.scheduling import declared

if TYPE_CHECKING:
    from django_tasks_coord.backends.tasks import CoordTask
    from django_tasks_coord.scheduling.runner import JobContext


@runtime_checkable
class EnqueuesAs(Protocol):
    """A backend that enqueues under a result id of the caller's choosing: this app's
    ``DatabaseBackend``. (A protocol rather than the class: the backend module imports
    the task class, which imports this module.)"""

    def enqueue_as(
        self, task: Any, args: Any, kwargs: Any, *, identifier: str | None = None
    ) -> Any: ...


def declare(task: CoordTask) -> None:
    """Declare the job that enqueues ``task`` on its timer (idempotent)."""
    options: dict[str, Any] = dict(task.timer_options or {})
    tz = options.pop("tz", None)
    assert task.timer is not None
    declared.job(task.timer, name=task.module_path, tz=tz, args=[task.module_path], **options)(fire)


def fire(ctx: JobContext, task_path: str) -> None:
    """The job of a periodic task: enqueue it once for the slot ``ctx.slot``."""
    task = import_string(task_path)
    backend = task.get_backend()
    identifier = f"{task_path}@{ctx.slot.isoformat()}" if ctx.slot is not None else None
    if identifier is not None and len(identifier) > 255:
        identifier = None  # too long to be an identifier: a fresh id, no slot dedupe
    if identifier is not None:
        topic = TaskRow.objects.using(db.alias()).filter(topic_id=task.queue_name)
        if topic.filter(identifier=identifier).exists():
            ctx.logger.info("Slot %s of %s was enqueued already.", ctx.slot, task_path)
            return
    if isinstance(backend, EnqueuesAs):  # this app's DatabaseBackend (or a subclass)
        backend.enqueue_as(task, [], {}, identifier=identifier)
    else:
        task.enqueue()
