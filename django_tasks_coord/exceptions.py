"""Every error this package raises on purpose derives from :class:`TasksCoordError`.

Each docstring says what happened and how to fix it; the messages repeat the
specifics (names, values, states) so a log line alone is enough to act on.
"""

from __future__ import annotations


class TasksCoordError(Exception):
    """Base class of every error raised by django-tasks-coord."""


class ConfigurationError(TasksCoordError):
    """The ``TASKS_COORD`` setting or a command-line flag has an invalid value.

    Fix the setting named in the message; see docs/reference/settings.md.
    """


class InvalidArgumentError(TasksCoordError, ValueError):
    """An argument has the wrong type or value (an unknown enum member, a negative limit...).

    The message names the argument and what is accepted.
    """


class PayloadError(InvalidArgumentError):
    """A task payload cannot be stored as JSON.

    Payloads must be JSON-serializable (dict, list, str, int, float, bool, None), nest at
    most ``validation.MAX_JSON_DEPTH`` levels, and hold no NUL character or lone surrogate
    (no database stores those alike). Convert other objects (datetimes, model instances,
    sets) before pushing. ``path`` is the JSON Pointer of the offending value, when one is.
    """

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class UnknownTopicError(TasksCoordError, LookupError):
    """A topic was used before it was registered.

    Register it once with ``queue.register_topic(name)`` (for example in a data
    migration or ``AppConfig.ready``); the message lists the registered topics.
    """


class UnknownTaskError(TasksCoordError, LookupError):
    """No task has this sequence: it was never made, or it was purged or pruned since.

    ``manage.py tasks_coord list`` and the admin's task list show the tasks there are.
    """


class ReservedTopicError(InvalidArgumentError):
    """``register_topic`` was given a name starting with the reserved ``tasks_coord.``.

    That prefix is for the package's own topics (the jobs topic, coordination groups'
    topics); choose another name for your topic.
    """


class LimitKeyConflictError(InvalidArgumentError):
    """Limits of a ``@task`` function or a job need their topic limited per one key
    (``payload.task``, ``identifier``), and the topic is limited per another.

    A ``@task`` function with ``rate`` or ``concurrency``: give it a ``queue_name`` of its
    own, or remove the other key from its queue's topic.
    """


class TaskStateError(TasksCoordError):
    """A task is not in a state that allows the requested operation.

    The message says the task's current state and which states are accepted.
    """


class TaskNotActiveError(TaskStateError):
    """``complete()`` was called on a task that is not currently claimed (ACTIVE).

    Only tasks returned by ``queue.poll`` can be completed, once.
    """


class TaskAlreadyCompletedError(TaskNotActiveError):
    """``complete()`` was called on a task that already has a completed state."""


class TaskRedundantError(TaskAlreadyCompletedError):
    """The task was made REDUNDANT while it ran (a REPLACE push for its identifier).

    The newer task replaces it; its result is discarded. Consumers usually ignore this.
    """


class TaskNotClaimedError(TaskNotActiveError):
    """The ``Task`` object passed to ``complete()`` or ``release()`` carries no claim.

    The task is ACTIVE, claimed by an owner, but this object's ``exec_id`` is None: it
    was not returned by ``queue.poll`` (it came from ``queue.push``, or from a lookup
    made before the task was claimed). A claim is identified by the ``exec_id`` that
    ``queue.poll`` gives the task and the objects it returns. Complete the object that
    ``queue.poll`` returned, or look the task up again to act under its current claim.
    """


class StaleClaimError(TaskNotActiveError):
    """The claim was lost: the task was expired and handed to another owner since it was polled.

    The holder's heartbeat went stale; the work is being (or was) redone elsewhere.
    Do not retry the completion.
    """


class OwnerError(TasksCoordError):
    """Base class of errors about owners (registered nodes)."""


class DuplicateOwnerError(OwnerError):
    """Another live owner already uses this name (node id).

    Node ids must be unique among running nodes. Pick another ``--node-id`` or stop
    the other node; a dead node's id is free again once its heartbeat is older than
    the liveness interval.
    """


class OwnerExpiredError(OwnerError):
    """This owner's row is gone: its heartbeat went stale and it was declared dead.

    Its tasks were handed back to the queue. The process must stop working on them
    and register again as a new owner.
    """


class JobError(TasksCoordError):
    """Base class of errors about scheduled jobs."""


class UnknownJobError(JobError, LookupError):
    """No job has this id. ``scheduling.running_jobs()`` and the admin list the jobs."""


class JobImportError(JobError, ImportError):
    """A job's callable cannot be imported by the node that runs it (renamed, removed, not deployed).

    The scheduler pauses the job after the first such run instead of failing every slot.
    Deploy the code it names (or fix its dotted path), then resume the job
    (``scheduling.resume`` or Resume in the admin).
    """


class JobDefinitionError(JobError, InvalidArgumentError):
    """A job cannot be scheduled as defined: its callable is not a module-level function that
    imports, its end is before its start, its name is declared twice...

    The message names the job and the offending part.
    """


class FencedError(TasksCoordError):
    """This node's term as its group's leader has ended: another node holds the token now.

    Raised by fenced writes (``ctx.fenced()``, ``coordination.fenced``) so that a
    deposed leader (paused, partitioned) cannot act as leader any more. Do not retry:
    the new leader runs the work.
    """


class TokenBusyError(TasksCoordError):
    """A group's token row is locked by another process right now (maybe a frozen one).

    Transient: nodes treat it like a missed heartbeat and try again at the next one;
    a leader that keeps getting it steps down when its lease runs out.
    """


class TimerError(TasksCoordError, ValueError):
    """A timer specification (cron, calendar event, interval, datetime) is invalid.

    The message quotes the specification and points at the offending part.
    """


class DefinitionError(InvalidArgumentError):
    """A task definition is invalid: a negative timeout, a concurrency key path that does not
    start with ``"params"``, a JSON Schema that is not a valid schema, a name declared twice
    with different settings...

    The message names the definition and the offending setting.
    """


class UnknownDefinitionError(TasksCoordError, LookupError):
    """No task definition has this name.

    Declare it with ``definitions.define(name, ...)`` in an app's ``tasks.py`` (or
    ``jobs.py``); the message lists the known definitions.
    """


class SchemaViolationError(InvalidArgumentError):
    """A task's params, result or error does not match its definition's JSON Schema.

    ``document`` says which (``"params"``, ``"result"``, ``"error"``), ``path`` is the JSON
    Pointer of the failing value inside it, and the message says what the schema expected.
    Nothing was changed.
    """

    def __init__(self, message: str, *, document: str, path: str) -> None:
        super().__init__(message)
        self.document = document
        self.path = path


class ExecutionConflictError(TaskStateError):
    """An executor's call does not fit the task's current state: starting a task that is not
    requested, reporting on a task that is not in progress, or on one that is done.

    ``code`` is a machine-readable reason (``wrong_state``, ``task_done``). Nothing was
    changed. Do not retry the call; poll for new work instead.
    """

    code = "wrong_state"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class StaleExecIdError(ExecutionConflictError):
    """The ``exec_id`` quoted is not the task's current one.

    The task was handed out again since (after a timeout, or a retry), or the id is
    wrong. Stop working on it: its outcome belongs to the newer execution. Nothing was
    changed.
    """

    code = "stale_exec_id"


class TaskTimeoutError(TasksCoordError, TimeoutError):
    """A task attempt ran longer than its ``timeout`` (``@task(timeout=...)`` or the backend's
    ``OPTIONS["TIMEOUT"]``).

    The attempt fails with this error and is retried under the task's retry policy. A
    coroutine is cancelled; a plain function is interrupted at its next Python
    instruction (a blocking C call finishes first). Raise the timeout or make the task
    do less per call.
    """


class TaskCanceledError(TasksCoordError):
    """A cancel was requested for the task that is running (``queue.cancel``, the admin,
    ``manage.py tasks_coord cancel``, the executor API).

    Raised by :func:`django_tasks_coord.running.raise_if_canceled` and
    :func:`~django_tasks_coord.running.report_progress` (the checkpoints) inside a
    handler whose task was asked to stop. Let it propagate (or raise it yourself after
    cleaning up): the task ends CANCELED and is not retried. Catching it and returning
    changes nothing: a task whose cancel was requested ends CANCELED however its handler
    ends.
    """


class ProgressError(InvalidArgumentError):
    """A progress value is not JSON, or is larger than ``TASKS_COORD["PROGRESS_MAX_BYTES"]``
    once serialized (4096 by default). Report a small summary (a percentage, counts, a
    stage name), not data."""


class WorkflowError(TasksCoordError):
    """Base class of errors about workflows (:mod:`django_tasks_coord.workflows`)."""


class WorkflowDefinitionError(WorkflowError, InvalidArgumentError):
    """A workflow cannot be started as given: a cycle among its steps, a parent that is not
    one of its steps, two steps of one name, an unknown topic, definition or ``@task``
    function, or arguments that are not JSON.

    The message names the step and what is wrong with it. Nothing was written.
    """


class UnknownWorkflowError(WorkflowError, LookupError):
    """No workflow has this id (it was never started, or it was deleted)."""
