"""argparse types shared by the app's commands: numbers within bounds, with clear messages.

A bad value is refused by argparse with ``ArgumentTypeError``: the command prints its usage
and one line, never a traceback.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def number(
    kind: Callable[[str], float],
    minimum: float,
    what: str,
    *,
    exclusive: bool = False,
    maximum: float | None = None,
) -> Callable[[str], Any]:
    """An argparse type converting with ``kind`` (``int``, ``float``), refusing values below
    ``minimum`` (or equal to it with ``exclusive``) and above ``maximum``.

    ``what`` names what the value must be ("a process id") in the message for a value that
    does not convert.
    """

    def convert(value: str) -> float:
        try:
            found = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not {what}") from None
        if maximum is not None and not minimum <= found <= maximum:
            raise argparse.ArgumentTypeError(f"{value!r} must be between {minimum} and {maximum}")
        if exclusive and found <= minimum:
            raise argparse.ArgumentTypeError(f"{value!r} must be more than {minimum}")
        if found < minimum:
            raise argparse.ArgumentTypeError(f"{value!r} must be at least {minimum}")
        return found

    return convert


positive_int = number(int, 1, "an integer")
non_negative_float = number(float, 0, "a number")
