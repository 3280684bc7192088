"""Retry policies: how many attempts a task gets and how long to wait between them.

Pure functions of the attempt number (and a random source for jitter), so they are
tested without a clock.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta

from django_tasks_coord.enums import Backoff
from django_tasks_coord.exceptions import InvalidArgumentError


def non_negative_seconds(value: float | timedelta, argument: str) -> float:
    """``value`` (seconds or a timedelta) as float seconds; InvalidArgumentError naming ``argument``."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds >= 0:
        raise InvalidArgumentError(
            f"{argument} must be a non-negative number of seconds or a timedelta, not {value!r}."
        )
    return float(seconds)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Attempts and backoff for a task type.

    ``max_attempts`` counts every run, the first included (1 = never retry). A task
    whose node died mid-run has used an attempt too. ``jitter`` (0 to 1) spreads
    retries by up to that fraction of the delay, so failures of many tasks at once
    do not retry in lockstep.
    """

    max_attempts: int = 3
    retry_interval: float | timedelta = 1.0
    backoff: Backoff | str = Backoff.EXPONENTIAL
    max_interval: float | timedelta = 300.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if (
            isinstance(self.max_attempts, bool)
            or not isinstance(self.max_attempts, int)
            or self.max_attempts < 1
        ):
            raise InvalidArgumentError(
                f"max_attempts must be an int of at least 1, not {self.max_attempts!r}."
            )
        object.__setattr__(
            self, "retry_interval", non_negative_seconds(self.retry_interval, "retry_interval")
        )
        object.__setattr__(
            self, "max_interval", non_negative_seconds(self.max_interval, "max_interval")
        )
        object.__setattr__(self, "backoff", Backoff.coerce(self.backoff, "backoff"))
        if not isinstance(self.jitter, int | float) or not 0 <= self.jitter <= 1:
            raise InvalidArgumentError(f"jitter must be a number from 0 to 1, not {self.jitter!r}.")

    def can_retry(self, attempts: int) -> bool:
        """Whether a task that has used ``attempts`` attempts may run again."""
        return attempts < self.max_attempts

    def delay(self, attempt: int, rng: random.Random | None = None) -> timedelta:
        """How long to wait after failed attempt number ``attempt`` (1-based) before the next."""
        base = float(self.retry_interval)  # type: ignore[arg-type]
        if self.backoff is Backoff.EXPONENTIAL:
            base *= 2 ** max(attempt - 1, 0)
        base = min(base, float(self.max_interval))  # type: ignore[arg-type]
        if self.jitter:
            base *= 1 + (rng or random).uniform(-self.jitter, self.jitter)
        return timedelta(seconds=max(base, 0.0))


#: The policy of task types that do not set one.
DEFAULT_RETRY = RetryPolicy()
NO_RETRY = RetryPolicy(max_attempts=1)
