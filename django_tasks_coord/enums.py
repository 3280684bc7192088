"""The queue's vocabulary: task states, push/poll/complete options and the ``Decision`` value.

Import these from :mod:`django_tasks_coord.queue`; they live here so models and
services can share them without import cycles.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self

from django.db import models
from django.utils.translation import gettext_lazy as _

from django_tasks_coord.exceptions import InvalidArgumentError

if TYPE_CHECKING:
    from django_tasks_coord.attempts import Attempt


class TaskState(models.IntegerChoices):
    """Where a task is in its life.

    The values are ordinals chosen so that every *completed* state lies in one
    contiguous range (:attr:`COMPLETED_MIN` to :attr:`COMPLETED_MAX`): "all completed
    tasks" is a range select that an index serves. Gaps leave room for new states.
    """

    PENDING = 10, _("pending")  # waiting to be polled (optionally not before execute_at)
    REQUESTED = 20, _("requested")  # handed to an external executor, not started yet
    ACTIVE = 30, _("active")  # claimed by an owner, running
    SUCCEEDED = 40, _("succeeded")
    SUSPENDED = 41, _("suspended")  # kept for later; revived by reset() or junction()
    FILTERED = 42, _("filtered")  # irrelevant, nothing to do
    FAILED = 43, _("failed")
    CANCELED = 44, _("canceled")
    REDUNDANT = 45, _("redundant")  # replaced or superseded by a newer push

    @classmethod
    def completed_states(cls) -> list[TaskState]:
        """The completed states, in ordinal order."""
        return [s for s in cls if COMPLETED_MIN <= s.value <= COMPLETED_MAX]

    @property
    def is_completed(self) -> bool:
        """True for every state in the completed range."""
        return COMPLETED_MIN <= self.value <= COMPLETED_MAX


COMPLETED_MIN = TaskState.SUCCEEDED.value
COMPLETED_MAX = TaskState.REDUNDANT.value
#: States in which a task is held by someone (an owner or an external executor).
IN_FLIGHT = (TaskState.REQUESTED, TaskState.ACTIVE)


class _Choice(enum.StrEnum):
    """A string enum that also accepts its value or name, case-insensitively, via :meth:`coerce`."""

    @classmethod
    def coerce(cls, value: Any, argument: str) -> Self:
        """Return the member for ``value`` or raise :class:`InvalidArgumentError` naming ``argument``."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            for member in cls:
                if value.lower() in (member.value, member.name.lower()):
                    return member
        choices = ", ".join(f"{cls.__name__}.{m.name}" for m in cls)
        raise InvalidArgumentError(f"{argument}={value!r} is not one of {choices}.")


class Insertion(_Choice):
    """What a push does to existing tasks of the same identifier."""

    APPEND = "append"  #: add another task; leave the others alone
    REPLACE = "replace"  #: not-yet-completed tasks (active ones too) become REDUNDANT
    SUPERSEDE = "supersede"  #: not-yet-polled (PENDING) tasks become REDUNDANT
    DELETE = "delete"  #: earlier tasks that are not in flight are deleted


class Order(_Choice):
    """Which end of a topic ``poll`` takes from (within the highest priority first)."""

    FIFO = "fifo"
    LIFO = "lifo"


class Condition(_Choice):
    """Per-identifier ordering rules applied by ``poll``.

    "Earlier tasks" are tasks of the same topic and identifier with a lower sequence.
    REDUNDANT, CANCELED and FILTERED tasks never block.
    """

    #: skip a task while an earlier task of its identifier is not completed
    SINGULAR_BY_IDENTIFIER = "singular_by_identifier"
    #: ... and also while the latest earlier task FAILED
    SINGULAR_BY_IDENTIFIER_SUSPEND_ON_FAILURE = "singular_by_identifier_suspend_on_failure"
    #: ... and also until the latest earlier task SUCCEEDED (FAILED and SUSPENDED block)
    SINGULAR_BY_IDENTIFIER_SUSPEND_UNTIL_SUCCESS = "singular_by_identifier_suspend_until_success"


class Result(_Choice):
    """The outcome a consumer reports in a :class:`Decision`."""

    SUCCESS = "success"
    SUSPENSION = "suspension"  #: keep the task for later (revived by reset or junction)
    FILTER = "filter"  #: the task was irrelevant
    FAILURE = "failure"

    @property
    def state(self) -> TaskState:
        """The completed state a task takes for this result."""
        return _RESULT_STATES[self]


_RESULT_STATES = {
    Result.SUCCESS: TaskState.SUCCEEDED,
    Result.SUSPENSION: TaskState.SUSPENDED,
    Result.FILTER: TaskState.FILTERED,
    Result.FAILURE: TaskState.FAILED,
}


class _Unset(enum.Enum):
    UNSET = "unset"


#: :attr:`Decision.value` of a decision that returns no value (``Task.result`` is left alone).
UNSET = _Unset.UNSET


class Junction(_Choice):
    """When ``junction`` starts the tasks of several identifiers together."""

    SINGULAR = "singular"  #: the latest task of every identifier must be SUSPENDED
    ETERNAL = "eternal"  #: every identifier must have a task, in any state


@dataclass(frozen=True, slots=True)
class Decision:
    """What a consumer decided about a task: a :class:`Result`, an optional message and exception.

    ``message`` is stored in ``Task.message``; ``exception`` is stored in ``Task.error``
    as its class, message and traceback. ``continue_`` (the source system's
    ``continue`` flag) lets a composite task go on to its next steps after a step
    decided something other than SUCCESS; see :mod:`django_tasks_coord.composite`.

    A task type returns the rest of its outcome here too, for the node to write with
    the completion: ``value`` (stored in ``Task.result``; :data:`UNSET` leaves it as it
    is) and ``attempt``, the :class:`~django_tasks_coord.attempts.Attempt` entry of the
    attempt that ended (see :mod:`django_tasks_coord.attempts`). Neither takes part in
    comparisons: two decisions are equal when they decide the same.
    """

    result: Result
    message: str | None = None
    exception: BaseException | None = None
    continue_: bool = False
    value: Any = field(default=UNSET, compare=False)
    attempt: Attempt | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "result", Result.coerce(self.result, "result"))
        if self.message is not None and not isinstance(self.message, str):
            raise InvalidArgumentError(
                f"Decision message must be a str or None, not {type(self.message).__name__}."
            )
        if self.exception is not None and not isinstance(self.exception, BaseException):
            raise InvalidArgumentError(
                "Decision exception must be an exception instance or None, "
                f"not {type(self.exception).__name__}."
            )

    @classmethod
    def success(cls, message: str | None = None) -> Decision:
        """Shortcut for ``Decision(Result.SUCCESS, message)``."""
        return cls(Result.SUCCESS, message)

    @classmethod
    def failure(
        cls, exception: BaseException | None = None, message: str | None = None
    ) -> Decision:
        """Shortcut for ``Decision(Result.FAILURE, message, exception)``."""
        return cls(Result.FAILURE, message, exception)


class ErrorPolicy(_Choice):
    """What a node does when a task type's task fails for good (its attempts are exhausted)."""

    LOG_AND_CONTINUE = "log_and_continue"  #: log the failure with its traceback, keep going
    CONTINUE = "continue"  #: keep going quietly (the failure is still stored on the task)
    LOG_AND_TERMINATE = "log_and_terminate"  #: log it and pause the topic
    TERMINATE = "terminate"  #: pause the topic

    @property
    def logs(self) -> bool:
        """Whether the failure is logged at ERROR level."""
        return self in (ErrorPolicy.LOG_AND_CONTINUE, ErrorPolicy.LOG_AND_TERMINATE)

    @property
    def terminates(self) -> bool:
        """Whether the topic is paused after the failure."""
        return self in (ErrorPolicy.TERMINATE, ErrorPolicy.LOG_AND_TERMINATE)


class WaitingPolicy(_Choice):
    """What a node does with a task that could not start within ``waiting_time`` of its ``execute_at``."""

    WAIT = "wait"  #: run it anyway, late
    IGNORE = "ignore"  #: skip it (FILTERED, with a message saying how late it was)
    LOG_AND_IGNORE = "log_and_ignore"  #: skip it and log a warning


class Backoff(_Choice):
    """How the delay between retries grows."""

    FIXED = "fixed"  #: always ``retry_interval``
    EXPONENTIAL = (
        "exponential"  #: ``retry_interval * 2 ** (attempt - 1)``, capped at ``max_interval``
    )
