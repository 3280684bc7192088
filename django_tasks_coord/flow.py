"""Flow control: rate and concurrency limits that hold across all nodes, and fair claims.

A topic's limits live on its row (``Topic.rate_limit``, ``concurrency_limit``,
``limit_key``, ``fair``), set in code (:func:`set_limits`, ``TASKS_COORD["LIMITS"]``) or
in the admin. Every claim of a limited topic (nodes, :func:`queue.poll
<django_tasks_coord.queue.poll>`) locks that row, reads the limits, counts what they
allow and claims within it (:mod:`django_tasks_coord.store.flow`), so a change takes
effect at the next claim, on every node, without a restart. See docs/flow-control.md.

- ``rate``: at most N starts per period (``"50/s"``, ``"1000/m"``, ``"10/h"``), counted
  over a sliding window on the database clock.
- ``concurrency``: at most N tasks ACTIVE at once.
- ``key``: with one, each key gets the limits whole: ``"identifier"``, ``"payload.<path>"``
  (dotted keys, integer indexes into lists) or ``"callable:<name>"`` (registered with
  :func:`register_key`). A task's key is computed when it is pushed and stored in its
  ``concurrency_key`` column.
- ``fair``: claims take tasks round-robin across keys (the oldest of each key first)
  instead of oldest first.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import Q

from django_tasks_coord import db, topics
from django_tasks_coord.conf import app_settings as settings
from django_tasks_coord.exceptions import InvalidArgumentError
from django_tasks_coord.models import Topic

__all__ = [
    "FIELDS",
    "LIMITED",
    "Limits",
    "Rate",
    "apply_settings",
    "key_of",
    "limits_of",
    "parse_rate",
    "register_key",
    "remember",
    "set_limits",
    "settings_problems",
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


def _canonical(value: object) -> str:
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
        return _canonical(identifier)
    if spec.startswith("callable:"):
        function = _key_functions.get(spec[len("callable:") :])
        if function is None:
            raise InvalidArgumentError(
                f"The limit key {spec!r} names no function registered with flow.register_key."
            )
        value = function(identifier, payload)
        return "" if value is None else _canonical(value)
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
    return "" if value is None else _canonical(value)


# --- limits ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """The flow control of one topic (see the module); all None/empty/False: none."""

    rate: Rate | None = None
    concurrency: int | None = None
    key: str = ""
    fair: bool = False

    @property
    def limited(self) -> bool:
        """Whether claims of the topic go through :mod:`django_tasks_coord.store.flow`."""
        return self.rate is not None or self.concurrency is not None or self.fair

    @classmethod
    def of(cls, rate: str, concurrency: int | None, key: str, fair: bool) -> Limits:
        """The limits a topic row stores (a malformed rate, written around the admin's
        validation, counts as none)."""
        try:
            parsed = parse_rate(rate) if rate else None
        except InvalidArgumentError:
            parsed = None
        return cls(parsed, concurrency, key, fair)

    def __str__(self) -> str:
        parts = []
        if self.rate is not None:
            parts.append(f"rate {self.rate}")
        if self.concurrency is not None:
            parts.append(f"concurrency {self.concurrency}")
        if self.key:
            parts.append(f"per {self.key}")
        if self.fair:
            parts.append("fair")
        return ", ".join(parts) or "none"


#: The topic's columns :meth:`Limits.of` reads, in its order.
FIELDS = topics.LIMIT_FIELDS
#: Topics with limits or fairness (their claims go through store.flow).
LIMITED = ~Q(rate_limit="") | Q(concurrency_limit__isnull=False) | Q(fair=True)


class _Cache:
    """Each topic's limits as last read, for ``ttl`` seconds: spares a query per claim of
    an unlimited topic. Limited claims re-read the row under its lock, and the claim of an
    unlimited topic takes nothing from a topic that has limits by now (its guard), so a
    stale entry can only hold claims back, never let them past a limit. Nodes refresh the
    entries of their topics whenever they re-read them (once per ``POLL_INTERVAL``)."""

    ttl = 5.0

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], tuple[float, Limits]] = {}
        self._lock = threading.Lock()

    def get(self, name: str, using: str, fresh: bool = False) -> Limits:
        now = time.monotonic()
        entry = self._entries.get((using, name))
        if entry is not None and now - entry[0] < self.ttl and not fresh:
            return entry[1]
        known = None if fresh else topics.known_topics.limits(name, self.ttl)
        if known is not None:  # read with the topic's existence a moment ago
            return Limits.of(*known)
        row = Topic.objects.using(using).filter(name=name).values_list(*FIELDS).first()
        limits = Limits() if row is None else Limits.of(*row)
        with self._lock:
            self._entries[(using, name)] = (now, limits)
        return limits

    def put(self, limits: Mapping[str, Limits], using: str) -> None:
        now = time.monotonic()
        with self._lock:
            for name, each in limits.items():
                self._entries[(using, name)] = (now, each)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


_cache = _Cache()


def remember(limits: Mapping[str, Limits], using: str | None = None) -> None:
    """Cache ``limits`` (topic -> limits) as just read from database ``using``."""
    _cache.put(limits, using or db.alias())


def limits_of(topic: str, using: str | None = None, *, fresh: bool = False) -> Limits:
    """The limits of ``topic`` (cached for up to five seconds unless ``fresh``; none for
    an unknown topic)."""
    return _cache.get(topic, using or db.alias(), fresh)


def set_limits(
    topic: str,
    *,
    rate: str | None = None,
    concurrency: int | None = None,
    key: str = "",
    fair: bool = False,
) -> Limits:
    """Set the limits of ``topic`` (registering it if needed), replacing all earlier ones.

    ``rate`` as :func:`parse_rate` reads it, ``concurrency`` an int >= 1, ``key`` as
    :func:`check_key` reads it (then each key gets the limits whole), ``fair`` claims
    round-robin across keys. No argument: no limits. Takes effect at the next claim on
    every node (a process whose cache says the topic has no limits claims nothing from it
    until the cache is refreshed: at a node's next read of its topics, within five seconds
    elsewhere).
    """
    limits = validated(rate=rate, concurrency=concurrency, key=key, fair=fair)
    topics.register_topic(topic)
    with transaction.atomic(using=db.alias()):
        Topic.objects.using(db.alias()).filter(name=topic).update(
            rate_limit=str(limits.rate) if limits.rate else "",
            concurrency_limit=limits.concurrency,
            limit_key=limits.key,
            fair=limits.fair,
        )
    _cache.clear()
    topics.known_topics.discard(topic)
    return limits


def validated(
    *, rate: str | None, concurrency: int | None, key: str = "", fair: bool = False
) -> Limits:
    """The :class:`Limits` of these arguments, or :class:`InvalidArgumentError`."""
    parsed = parse_rate(rate) if rate else None
    if concurrency is not None and (
        isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
    ):
        raise InvalidArgumentError(f"concurrency must be None or an int >= 1, not {concurrency!r}.")
    check_key(key)
    if not isinstance(fair, bool):
        raise InvalidArgumentError(f"fair must be a bool, not {fair!r}.")
    if fair and not key:
        raise InvalidArgumentError(
            "fair claims need a key to be fair across (e.g. key='identifier')."
        )
    return Limits(parsed, concurrency, key, fair)


def apply_settings(declared: Mapping[str, Mapping[str, Any]] | None = None) -> list[str]:
    """Write ``TASKS_COORD["LIMITS"]`` (``{topic: {"rate":, "concurrency":, "key":, "fair":}}``)
    to the topics' rows; ``runscheduler`` does it as it starts. Returns the topics set."""

    if declared is None:
        declared = settings.LIMITS or {}
    done = []
    for topic, options in declared.items():
        unknown = set(options) - {"rate", "concurrency", "key", "fair"}
        if unknown:
            raise InvalidArgumentError(
                f"TASKS_COORD['LIMITS'][{topic!r}] has unknown keys {sorted(unknown)}; "
                f"known: rate, concurrency, key, fair."
            )
        set_limits(topic, **options)
        done.append(topic)
    return done


def settings_problems(declared: Any) -> list[str]:
    """What is wrong with ``TASKS_COORD["LIMITS"]`` (system check ``tasks_coord.E003``)."""
    if not isinstance(declared, dict):
        return [f"LIMITS must be a dict of topic names to limits, not {declared!r}."]
    problems = []
    for topic, options in declared.items():
        if not isinstance(options, dict):
            problems.append(f"LIMITS[{topic!r}] must be a dict, not {options!r}.")
            continue
        unknown = sorted(set(options) - {"rate", "concurrency", "key", "fair"})
        if unknown:
            problems.append(
                f"LIMITS[{topic!r}] has unknown keys {unknown}: known are rate, concurrency, "
                f"key, fair."
            )
            continue
        try:
            validated(**{"rate": None, "concurrency": None, **options})
        except InvalidArgumentError as exc:
            problems.append(f"LIMITS[{topic!r}]: {exc}")
    return problems
