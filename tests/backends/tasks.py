"""Django ``@task`` functions run by the backend tests (module level, as Django requires).

Every call is recorded as a ``tests.testapp.models.Run`` (topic: the queue, identifier:
the label) so tests can see which worker ran what, in which order, at which attempt.
"""

import asyncio
import os
import time

from django.utils import timezone

from django_tasks_coord.backends.compat import task
from django_tasks_coord.retry import RetryPolicy
from tests.testapp.models import Run

FAST = RetryPolicy(max_attempts=3, retry_interval=0, backoff="fixed", jitter=0)


def _record(context, label: str, queue: str = "default") -> None:
    result = context.task_result
    Run.objects.create(
        topic=queue,
        identifier=label,
        sequence=0,
        attempt=context.attempt,
        node=result.worker_ids[-1] if result.worker_ids else "",
        started_at=timezone.now(),
        pid=os.getpid(),
    )


@task()
def add(a, b):
    return a + b


@task(takes_context=True, retry=FAST)
def record(context, label):
    _record(context, label, context.task_result.task.queue_name)
    return label


@task(max_attempts=1)
def fail(message):
    raise ValueError(message)


@task(takes_context=True, retry=FAST)
def flaky(context, failures):
    """Fail the first ``failures`` attempts, then return the attempt number."""
    if context.attempt <= failures:
        raise RuntimeError(f"attempt {context.attempt} fails")
    return {"attempt": context.attempt}


@task(takes_context=True)
async def async_add(context, a, b):
    await asyncio.sleep(0.01)
    return {"sum": a + b, "attempt": context.attempt}


@task(max_attempts=1)
async def async_fail():
    await asyncio.sleep(0)
    raise KeyError("async boom")


@task(max_attempts=1, timeout=0.5)
def too_slow():
    for _ in range(600):  # Python-level work: the timeout interrupts it between iterations
        time.sleep(0.1)


@task(max_attempts=1, timeout=0.5)
async def async_too_slow():
    await asyncio.sleep(60)


@task(takes_context=True, max_attempts=3)
def sleep_first_attempt(context, seconds):
    """Sleep ``seconds`` on the first attempt only (the crash test kills that one)."""
    _record(context, "sleepy")
    if context.attempt == 1:
        time.sleep(seconds)
    return "done"


@task(max_attempts=1)
def not_json():
    return object()


@task(unique_key=lambda user_id: f"user-{user_id}")
def refresh_user(user_id):
    return user_id


@task(
    takes_context=True,
    retry=RetryPolicy(max_attempts=50, retry_interval=0.2, backoff="fixed", jitter=0),
)
def patient(context, label):
    """Like ``record``, retried through a database outage of several seconds."""
    _record(context, label, context.task_result.task.queue_name)
    return label


@task(takes_context=True, max_attempts=1)
def cancelled_while_running(context):
    """Canceled (as by an operator) while it runs: it must end CANCELED, not succeed."""
    from django_tasks_coord import queue
    from django_tasks_coord.models import Task as TaskRow

    queue.cancel(TaskRow.objects.get(identifier=context.task_result.id), "canceled by a test")
    return "done"


@task(takes_context=True, max_attempts=3)
def waits_for_cancel(context):
    """Reports progress, then loops (up to 30 s) until it is canceled; reports that it saw it."""
    context.report_progress({"waiting": True})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if context.cancel_requested():
            context.report_progress({"saw the cancel": True})
            context.raise_if_canceled()
        time.sleep(0.01)
    return "never canceled"


@task(takes_context=True, retry=FAST)
def durable_steps(context, label, fail_after):
    """Three durable steps (``context.step``), each recording a Run (identifier
    ``<label>:<step>``); the first attempt fails after step ``fail_after``."""

    def side_effect(name):
        _record(context, f"{label}:{name}")
        return name.upper()

    done = []
    for name in ("a", "b", "c"):
        done.append(context.step(name, side_effect, name))
        if name == fail_after and context.attempt == 1:
            raise RuntimeError(f"attempt 1 fails after step {name}")
    return {"done": done, "checkpoints": context.checkpoints()}


@task(takes_context=True)
async def async_checkpoint(context, value):
    """A coroutine stores a checkpoint through ``sync_to_async`` and reads it back."""
    from asgiref.sync import sync_to_async

    await sync_to_async(context.checkpoint)("value", value)
    return await sync_to_async(context.checkpoints)()
