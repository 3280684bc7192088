"""The calls of :meth:`DatabaseBackend.enqueue_many
<django_tasks_coord.backends.DatabaseBackend.enqueue_many>`: ``(args, kwargs)`` pairs, checked."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django_tasks_coord.exceptions import InvalidArgumentError

#: What ``enqueue_many`` takes: ``[(args, kwargs), ...]``.
Calls = Iterable[tuple[Sequence[Any], Mapping[str, Any]]]


def checked_calls(calls: object) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """The ``(args, kwargs)`` pairs of :meth:`DatabaseBackend.enqueue_many`, checked."""
    if isinstance(calls, str | bytes | Mapping) or not isinstance(calls, Iterable):
        raise InvalidArgumentError(
            f"enqueue_many takes an iterable of (args, kwargs) pairs, not {calls!r}."
        )
    checked = []
    for call in calls:
        if (
            not isinstance(call, tuple | list)
            or len(call) != 2
            or not isinstance(call[0], tuple | list)
            or not isinstance(call[1], Mapping)
            or not all(isinstance(key, str) for key in call[1])
        ):
            raise InvalidArgumentError(
                "enqueue_many takes (args, kwargs) pairs: a list or tuple of positional "
                f"arguments and a dict of keyword arguments, e.g. ((1, 2), {{}}); not {call!r}."
            )
        checked.append((tuple(call[0]), dict(call[1])))
    return checked
