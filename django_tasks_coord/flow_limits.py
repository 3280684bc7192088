"""The limits of flow control themselves, without the database: rates (:func:`parse_rate`),
keys (:func:`key_of`, :func:`register_key`), a key value's limits (:class:`KeyLimit`) and a
topic's (:class:`Limits`). :mod:`django_tasks_coord.flow` re-exports them, reads them from
the topics' rows and writes them there; see docs/flow-control.md.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django_tasks_coord.exceptions import InvalidArgumentError

__all__ = [
    "KeyFunction",
    "KeyLimit",
    "Limits",
    "Rate",
    "canonical",
    "check_key",
    "key_of",
    "parse_rate",
    "register_key",
]

#: Seconds of each period unit of a rate.
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*([smhd])\s*$")
#: Width of ``Task.concurrency_key``; longer keys are replaced by their SHA-256 digest.
_KEY_WIDTH = 255


@dataclass(frozen=True)
class Rate:
    """At most ``count`` starts in any ``period`` seconds."""

    count: int
    period: float

    def __str__(self) -> str:
        for unit, seconds in _UNITS.items():
            if self.period == seconds:
                return f"{self.count}/{unit}"
        return f"{self.count}/{self.period:g}s"


def parse_rate(spec: str) -> Rate:
    """``"50/s"``, ``"1000/m"``, ``"10/h"``, ``"5/d"``, or with a multiple: ``"100/10s"``."""
    match = _RATE.match(spec) if isinstance(spec, str) else None
    if match is None or int(match[1]) < 1 or match[2] == "0":
        raise InvalidArgumentError(
            f'A rate is "N/unit" with N >= 1 and unit s, m, h or d (e.g. "50/s", "1000/m", '
            f'"100/10s"), not {spec!r}.'
        )
    return Rate(int(match[1]), int(match[2] or 1) * _UNITS[match[3]])


# --- keys ------------------------------------------------------------------------------

KeyFunction = Callable[[str, Any], object]
_key_functions: dict[str, KeyFunction] = {}


def register_key(name: str, function: KeyFunction) -> KeyFunction:
    """Register ``function(identifier, payload)`` as the limit key ``"callable:<name>"``.

    Register it where every process that pushes tasks imports it (an app's ``ready()``,
    a ``consumers`` module). It returns the key (a ``str``; other values are keyed by
    their JSON). Returns ``function``, so it can be used as a decorator's body.
    """
    if not isinstance(name, str) or not name or not callable(function):
        raise InvalidArgumentError("register_key needs a non-empty name and a callable.")
    _key_functions[name] = function
    return function


def check_key(spec: str) -> str:
    """``spec`` if it is a valid limit key (see the module), else :class:`InvalidArgumentError`."""
    if not isinstance(spec, str):
        raise InvalidArgumentError(f"A limit key is a str, not {spec!r}.")
    if spec in ("", "identifier"):
        return spec
    if spec.startswith("payload.") and all(spec.split(".")[1:]):
        return spec
    if spec.startswith("callable:") and spec[len("callable:") :]:
        return spec
    raise InvalidArgumentError(
        f'A limit key is "identifier", "payload.<path>" (e.g. "payload.tenant") or '
        f'"callable:<name>" (see flow.register_key), not {spec!r}.'
    )


def canonical(value: object) -> str:
    """The key a value stands for: a str as it is, anything else by its JSON (sorted keys);
    past 255 characters, its SHA-256 digest."""
    key = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    if len(key) > _KEY_WIDTH:
        key = "sha256:" + hashlib.sha256(key.encode()).hexdigest()
    return key


def key_of(spec: str, identifier: str, payload: Any) -> str:
    """The key a task with ``identifier`` and ``payload`` counts under (``""``: none, or the
    path finds nothing). An unregistered callable raises :class:`InvalidArgumentError`."""
    if not spec:
        return ""
    if spec == "identifier":
        return canonical(identifier)
    if spec.startswith("callable:"):
        function = _key_functions.get(spec[len("callable:") :])
        if function is None:
            raise InvalidArgumentError(
                f"The limit key {spec!r} names no function registered with flow.register_key."
            )
        value = function(identifier, payload)
        return "" if value is None else canonical(value)
    value = payload
    for part in spec.split(".")[1:]:
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.lstrip("-").isdigit():
            index = int(part)
            if not -len(value) <= index < len(value):
                return ""
            value = value[index]
        else:
            return ""
    return "" if value is None else canonical(value)


# --- limits ----------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyLimit:
    """The limits of one key value (an entry of ``Topic.key_limits``); None: no limit."""

    rate: Rate | None = None
    concurrency: int | None = None

    def stored(self) -> dict[str, Any]:
        """The entry as ``Topic.key_limits`` stores it (``{"rate": "10/s", "concurrency": 2}``)."""
        entry: dict[str, Any] = {}
        if self.rate is not None:
            entry["rate"] = str(self.rate)
        if self.concurrency is not None:
            entry["concurrency"] = self.concurrency
        return entry


def _lenient_rate(spec: Any) -> Rate | None:
    """The rate ``spec`` stands for; None if empty or malformed (written around the checks)."""
    try:
        return parse_rate(spec) if spec else None
    except InvalidArgumentError:
        return None


def _lenient_concurrency(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    return value if ok else None


def _lenient_key_limits(stored: Any) -> dict[str, KeyLimit]:
    """``Topic.key_limits`` as :class:`KeyLimit` entries (malformed parts count as none)."""
    if not isinstance(stored, dict):
        return {}
    return {
        str(value): KeyLimit(
            _lenient_rate(entry.get("rate")), _lenient_concurrency(entry.get("concurrency"))
        )
        for value, entry in stored.items()
        if isinstance(entry, dict)
    }


@dataclass(frozen=True)
class Limits:
    """The flow control of one topic (see the module); all None/empty/False: none."""

    rate: Rate | None = None
    concurrency: int | None = None
    key: str = ""
    fair: bool = False
    total_rate: Rate | None = None
    total_concurrency: int | None = None
    key_limits: Mapping[str, KeyLimit] = field(default_factory=dict, hash=False)

    @property
    def limited(self) -> bool:
        """Whether claims of the topic go through :mod:`django_tasks_coord.store.flow`."""
        return (
            self.rate is not None
            or self.concurrency is not None
            or self.fair
            or self.total_rate is not None
            or self.total_concurrency is not None
            or bool(self.key_limits)
        )

    @classmethod
    def of(
        cls,
        rate: str,
        concurrency: int | None,
        key: str,
        fair: bool,
        total_rate: str = "",
        total_concurrency: int | None = None,
        key_limits: Any = None,
    ) -> Limits:
        """The limits a topic row stores (:data:`FIELDS`, in order; a malformed rate or
        entry, written around the admin's validation, counts as none)."""
        return cls(
            _lenient_rate(rate),
            concurrency,
            key,
            fair,
            _lenient_rate(total_rate),
            total_concurrency,
            _lenient_key_limits(key_limits),
        )

    def for_key(self, key: str) -> KeyLimit:
        """The per-key limits of ``key``: its own entry of ``key_limits`` if it has one (and
        the topic has a key), else the topic's ``rate`` and ``concurrency``."""
        if self.key and key in self.key_limits:
            return self.key_limits[key]
        return KeyLimit(self.rate, self.concurrency)

    def rates(self) -> list[Rate]:
        """Every rate of the topic: per key, overrides and total."""
        found = [self.rate, self.total_rate]
        if self.key:
            found += [entry.rate for entry in self.key_limits.values()]
        return [rate for rate in found if rate is not None]

    def concurrencies(self) -> bool:
        """Whether any concurrency limit applies (per key, overrides or total)."""
        return (
            self.concurrency is not None
            or self.total_concurrency is not None
            or (bool(self.key) and any(e.concurrency is not None for e in self.key_limits.values()))
        )

    def stored_key_limits(self) -> dict[str, dict[str, Any]] | None:
        """``key_limits`` as ``Topic.key_limits`` stores them (None: no entry)."""
        return {value: entry.stored() for value, entry in self.key_limits.items()} or None

    def __str__(self) -> str:
        parts = []
        if self.rate is not None:
            parts.append(f"rate {self.rate}")
        if self.concurrency is not None:
            parts.append(f"concurrency {self.concurrency}")
        if self.key:
            parts.append(f"per {self.key}")
        if self.key_limits:
            n = len(self.key_limits)
            parts.append(f"{n} key value{'s' if n != 1 else ''} with their own")
        if self.total_rate is not None:
            parts.append(f"total rate {self.total_rate}")
        if self.total_concurrency is not None:
            parts.append(f"total concurrency {self.total_concurrency}")
        if self.fair:
            parts.append("fair")
        return ", ".join(parts) or "none"
