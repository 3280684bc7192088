"""Idle back-off: how long an idle node waits between the polls nothing else replaces."""

from __future__ import annotations


class IdleBackoff:
    """``base`` seconds, doubled after each idle round, never more than ``cap``.

    :meth:`idle` records a round that found nothing to do, :meth:`reset` one that found
    work. A ``cap`` of ``base`` or less turns the back-off off (always ``base``).
    """

    def __init__(self, base: float, cap: float) -> None:
        self.base = base
        self.cap = max(cap, base)
        self.rounds = 0

    @property
    def wait(self) -> float:
        """Seconds to wait now."""
        return min(self.base * 2.0**self.rounds, self.cap)

    def idle(self) -> None:
        """One more round without work: wait longer next time (up to the cap)."""
        if self.wait < self.cap:
            self.rounds += 1

    def reset(self) -> None:
        """Work was found: back to ``base``."""
        self.rounds = 0
