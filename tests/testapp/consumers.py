"""Consumers used by the node tests (imported by handlers.autodiscover like any app's consumers.py).

Payload keys understood by ``work``: ``sleep`` (seconds of simulated work), ``fail_times``
(fail the first N attempts), ``only_first_attempt_sleeps``, ``result`` (a Result name to return),
``fenced`` (commit a side effect, a ``Run`` of topic ``fenced``, in the transaction that
completes the task under its claim: a run whose claim was lost commits neither).
"""

import os
import time

from django.db import transaction
from django.utils import timezone

from django_tasks_coord import handlers, queue
from django_tasks_coord.enums import Result
from django_tasks_coord.retry import RetryPolicy
from tests.testapp.models import Run

if os.environ.get("TESTAPP_IMPORT_PAUSE"):  # a slow start-up, for the start-up signal tests
    print("testapp.consumers: importing", flush=True)
    time.sleep(float(os.environ["TESTAPP_IMPORT_PAUSE"]))  # simulated slow import

FAST_RETRY = RetryPolicy(
    max_attempts=4, retry_interval=0.2, backoff="exponential", max_interval=5, jitter=0
)


class Flaky(Exception):
    pass


def record(task, topic=None):
    return Run.objects.create(
        topic=topic or task.topic_id,
        identifier=task.identifier,
        sequence=task.sequence,
        attempt=task.attempts,
        node=task.owner.name if task.owner_id else "",
        started_at=timezone.now(),
        pid=os.getpid(),
    )


@handlers.consumer("work", retry=FAST_RETRY)
def work(task):
    record(task)
    payload = task.payload or {}
    if payload.get("sleep") and not (
        payload.get("only_first_attempt_sleeps") and task.attempts > 1
    ):
        time.sleep(payload["sleep"])  # simulated work, not a test waiting for time to pass
    if task.attempts <= payload.get("fail_times", 0):
        raise Flaky(f"attempt {task.attempts} fails on purpose")
    if payload.get("fenced"):
        with transaction.atomic():  # the side effect commits with the completion, or not at all
            record(task, "fenced")
            queue.complete(task, Result.SUCCESS)
        return None
    if payload.get("result"):
        return Result[payload["result"]]
    return None


@handlers.consumer("chaos", retry=RetryPolicy(max_attempts=1000, retry_interval=0.1, jitter=0))
def chaos(task):
    """``work`` for the SIGKILL chaos runs (``tests/workflows/chaos.py``): every kill of a node
    counts an attempt of each task it held, so a task may lose many; it must not run out."""
    return work(task)


@handlers.consumer("noop", retry=RetryPolicy(max_attempts=3))
def noop(task):
    return None


def named(task):
    """A handler named by tasks themselves (``handler="tests.testapp.consumers.named"``)."""
    record(task)


#: Retries through a database outage of several seconds (tests of a restart under load).
PATIENT_RETRY = RetryPolicy(max_attempts=50, retry_interval=0.2, backoff="fixed", jitter=0)


@handlers.consumer("steady", retry=PATIENT_RETRY)
def steady(task):
    """Record the run and do a little work; a database outage fails it until it is over."""
    record(task)
    time.sleep((task.payload or {}).get("sleep", 0))  # simulated work


@handlers.consumer("cancelable")
def cancelable(task):
    """Loops for ``payload["seconds"]`` (60 by default), reporting progress. With
    ``payload["checks"]`` it stops at its first checkpoint once canceled; without, it ignores
    the cancel and returns success. A Run row marks its start; another (identifier
    ``<identifier>:stopped``, ``started_at``: when it stopped) its end."""
    from django_tasks_coord import running
    from django_tasks_coord.exceptions import TaskCanceledError

    record(task)
    payload = task.payload or {}
    deadline = time.monotonic() + float(payload.get("seconds", 60))
    ticks = 0
    try:
        while time.monotonic() < deadline:
            if payload.get("checks"):
                running.raise_if_canceled()
            ticks += 1
            running.report_progress({"ticks": ticks})
            time.sleep(0.01)
    except TaskCanceledError:
        Run.objects.create(
            topic=task.topic_id,
            identifier=f"{task.identifier}:stopped",
            sequence=task.sequence,
            attempt=task.attempts,
            started_at=timezone.now(),
            pid=os.getpid(),
        )
        raise
    return Result.SUCCESS


@handlers.consumer("durable", retry=RetryPolicy(max_attempts=3))
def durable(task):
    """``payload["steps"]`` durable steps (``running.step``), each recording a Run row
    (identifier ``<identifier>:step-<n>``) as its side effect. On its first attempt it
    holds (sleeps ``payload["hold"]`` seconds, 120 by default) once step
    ``payload["hold_after"]`` is done, or inside step ``payload["hold_in"]`` after its side
    effect (before its checkpoint), for a test to SIGKILL its node there."""
    from django_tasks_coord import running

    payload = task.payload or {}

    def side_effect(n):
        Run.objects.create(
            topic=task.topic_id,
            identifier=f"{task.identifier}:step-{n}",
            sequence=task.sequence,
            attempt=task.attempts,
            node=task.owner.name if task.owner_id else "",
            started_at=timezone.now(),
            pid=os.getpid(),
        )
        if n == payload.get("hold_in") and task.attempts == 1:
            time.sleep(float(payload.get("hold", 120)))  # killed here by the test
        return {"n": n}

    for n in range(1, int(payload.get("steps", 100)) + 1):
        assert running.step(f"step-{n}", side_effect, n) == {"n": n}
        if n == payload.get("hold_after") and task.attempts == 1:
            time.sleep(float(payload.get("hold", 120)))  # killed here by the test
    return None
