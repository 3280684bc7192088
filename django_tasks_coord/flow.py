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
- ``total_rate``, ``total_concurrency``: limits of the topic as a whole, which hold at the
  same time as the per-key ``rate`` and ``concurrency`` (without a key, both sets apply
  to the whole topic).
- ``key_limits``: limits of particular key values (``{"acme": {"rate": "10/s"}}``), each
  instead of the per-key ``rate`` and ``concurrency`` for that key
  (:func:`set_key_limits`). ``@task(rate=..., concurrency=...)`` and
  :func:`django_tasks_coord.scheduling.set_limits` (job runs) are entries of these.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping
from typing import Any

from django.db import transaction
from django.db.models import Q

from django_tasks_coord import db, definitions, topics
from django_tasks_coord.conf import app_settings as settings
from django_tasks_coord.exceptions import InvalidArgumentError, LimitKeyConflictError
from django_tasks_coord.flow_limits import (
    KeyFunction,
    KeyLimit,
    Limits,
    Rate,
    canonical,
    check_key,
    key_of,
    parse_rate,
    register_key,
)
from django_tasks_coord.models import Topic

__all__ = [
    "FIELDS",
    "LIMITED",
    "KeyFunction",
    "KeyLimit",
    "Limits",
    "Rate",
    "apply_settings",
    "check_key",
    "key_of",
    "limits_of",
    "parse_rate",
    "register_key",
    "remember",
    "set_key_limits",
    "set_limits",
    "settings_problems",
]

#: The topic's columns :meth:`Limits.of` reads, in its order.
FIELDS = topics.LIMIT_FIELDS
#: Topics with limits or fairness (their claims go through store.flow).
LIMITED = (
    ~Q(rate_limit="")
    | Q(concurrency_limit__isnull=False)
    | Q(fair=True)
    | ~Q(total_rate_limit="")
    | Q(total_concurrency_limit__isnull=False)
    | Q(key_limits__isnull=False)
)


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


#: ``set_limits``'s ``key_limits`` when not given: leave the topic's as they are.
_KEEP: Any = object()
#: The options of ``TASKS_COORD["LIMITS"]`` entries (the arguments of :func:`set_limits`).
OPTIONS = ("rate", "concurrency", "key", "fair", "total_rate", "total_concurrency", "key_limits")


def set_limits(
    topic: str,
    *,
    rate: str | None = None,
    concurrency: int | None = None,
    key: str = "",
    fair: bool = False,
    total_rate: str | None = None,
    total_concurrency: int | None = None,
    key_limits: Mapping[str, Mapping[str, Any]] | None = _KEEP,
    internal: bool = False,
) -> Limits:
    """Set the limits of ``topic`` (registering it if needed; ``internal``: one of this
    package's own topics, the admin's), replacing all earlier ones.

    ``rate`` as :func:`parse_rate` reads it, ``concurrency`` an int >= 1, ``key`` as
    :func:`check_key` reads it (then each key gets ``rate`` and ``concurrency`` whole),
    ``fair`` claims round-robin across keys; ``total_rate`` and ``total_concurrency``
    limit the topic as a whole at the same time. ``key_limits`` (``{value: {"rate": ...,
    "concurrency": ...}}``) replaces the limits of particular key values; not given, they
    are left as they are (see :func:`set_key_limits`); ``None`` or ``{}`` removes them.
    No argument: no limits (but the key values' own). An executor definition's topic (its
    name) takes ``rate``, ``concurrency``, ``total_rate`` and ``total_concurrency``, all
    topic-wide, beside the definition's own ``concurrency_limit``; its tasks are keyed by
    the definition's ``concurrency_key_path``, so ``key`` (and with it ``fair`` and
    ``key_limits``) is refused there. Takes effect at the next claim on
    every node (a process whose cache says the topic has no limits claims nothing from it
    until the cache is refreshed: at a node's next read of its topics, within five seconds
    elsewhere).
    """
    limits = validated(
        rate=rate,
        concurrency=concurrency,
        key=key,
        fair=fair,
        total_rate=total_rate,
        total_concurrency=total_concurrency,
        key_limits=None if key_limits is _KEEP else key_limits,
        topic=topic,
    )
    _register(topic, internal)
    return _write(topic, limits, keep_key_limits=key_limits is _KEEP)


def _write(topic: str, limits: Limits, *, keep_key_limits: bool = False) -> Limits:
    """Write ``limits`` to the row of ``topic`` (registered); forget the cached ones."""
    changes: dict[str, Any] = {
        "rate_limit": str(limits.rate) if limits.rate else "",
        "concurrency_limit": limits.concurrency,
        "limit_key": limits.key,
        "fair": limits.fair,
        "total_rate_limit": str(limits.total_rate) if limits.total_rate else "",
        "total_concurrency_limit": limits.total_concurrency,
    }
    if not keep_key_limits:
        changes["key_limits"] = limits.stored_key_limits()
    with transaction.atomic(using=db.alias()):
        Topic.objects.using(db.alias()).filter(name=topic).update(**changes)
    forget(topic)
    return limits


def forget(topic: str) -> None:
    """Drop what this process caches of the limits of ``topic`` (they were just changed)."""
    _cache.clear()
    topics.known_topics.discard(topic)


def _register(topic: str, internal: bool) -> None:
    """Register ``topic`` if needed: one of the package's own (``internal``) or a user's."""
    if internal:
        topics.register_internal_topic(topic)
    else:
        topics.register_topic(topic)


def _locked_row(topic: str) -> tuple[Any, ...]:
    """The :data:`FIELDS` of ``topic``'s row, locked until the transaction ends."""
    rows = Topic.objects.using(db.alias()).filter(name=topic)
    locking = db.lock_kwargs(db.connection(), skip_locked=False)
    row = rows.select_for_update(**locking).values_list(*FIELDS).first()
    if row is None:
        raise InvalidArgumentError(f"Topic {topic!r} vanished while its limits were set.")
    return tuple(row)


def set_key_limits(
    topic: str,
    value: Any,
    *,
    rate: str | None = None,
    concurrency: int | None = None,
    internal: bool = False,
) -> Limits:
    """Give the key value ``value`` of ``topic`` its own limits, instead of the topic's
    per-key ``rate`` and ``concurrency`` (a key value without an entry gets those; with
    none set, it is unlimited). ``rate=None, concurrency=None`` removes the entry.

    ``value`` is a key as :func:`key_of` computes it (a str is taken as it is, other
    values by their JSON: ``42`` is the key ``"42"``). The entry is merged into
    ``Topic.key_limits`` under the lock of the topic's row (registering the topic if
    needed; ``internal``: one of this package's own topics, for job runs), so concurrent
    calls for other values keep each other's entries. The entries apply while the topic
    has a ``key``; the topic-wide ``total_rate`` and ``total_concurrency`` still hold.
    Returns the topic's limits as written.
    """
    entry = validated(rate=rate, concurrency=concurrency)
    if _is_definition(topic):
        raise InvalidArgumentError(_definition_keyed(topic))
    name = canonical(value)
    _register(topic, internal)
    with db.write_transaction():
        current = Limits.of(*_locked_row(topic))
        merged = dict(current.key_limits)
        if rate is None and concurrency is None:
            merged.pop(name, None)
        else:
            merged[name] = KeyLimit(entry.rate, entry.concurrency)
        limits = dataclasses.replace(current, key_limits=merged)
        Topic.objects.using(db.alias()).filter(name=topic).update(
            key_limits=limits.stored_key_limits()
        )
    forget(topic)
    return limits


def ensure_key(topic: str, key: str, *, internal: bool = False, fix: str = "") -> None:
    """Make ``key`` the limit key of ``topic`` (registering it if needed), keeping what its
    limits mean; nothing to write if it is the key already.

    For ``@task`` functions' and jobs' limits (entries of ``key_limits``, which need the
    key). A topic limited as a whole (``rate`` or ``concurrency`` without a key) keeps
    those limits as its total ones (``total_rate``, ``total_concurrency``; the tighter,
    where it has both), since with a key they would hold per key. A topic keyed otherwise
    (a user's key) raises :class:`LimitKeyConflictError`, whose message ends with ``fix``.
    """
    check_key(key)
    if _is_definition(topic):
        raise LimitKeyConflictError(f"{_definition_keyed(topic)} {fix}".strip())
    _register(topic, internal)
    with db.write_transaction():
        current = Limits.of(*_locked_row(topic))
        if current.key == key:
            return
        if current.key:
            raise LimitKeyConflictError(
                f"Topic {topic!r} is limited per {current.key!r}, so it cannot be limited per "
                f"{key!r} as well. {fix}".strip()
            )
        rates = [rate for rate in (current.rate, current.total_rate) if rate is not None]
        counts = [n for n in (current.concurrency, current.total_concurrency) if n is not None]
        total_rate = min(rates, key=lambda rate: rate.count / rate.period, default=None)
        Topic.objects.using(db.alias()).filter(name=topic).update(
            limit_key=key,
            rate_limit="",
            concurrency_limit=None,
            total_rate_limit=str(total_rate) if total_rate else "",
            total_concurrency_limit=min(counts, default=None),
        )
    forget(topic)


def _positive(value: Any, name: str) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise InvalidArgumentError(f"{name} must be None or an int >= 1, not {value!r}.")
    return value


def _checked_key_limits(key_limits: Any) -> dict[str, KeyLimit]:
    if key_limits is None:
        return {}
    if not isinstance(key_limits, Mapping):
        raise InvalidArgumentError(
            f'key_limits is a dict of key values to {{"rate": ..., "concurrency": ...}}, '
            f"not {key_limits!r}."
        )
    checked = {}
    for value, entry in key_limits.items():
        if not isinstance(entry, Mapping) or set(entry) - {"rate", "concurrency"}:
            raise InvalidArgumentError(
                f'key_limits[{value!r}] must be a dict with "rate" and/or "concurrency", '
                f"not {entry!r}."
            )
        rate = entry.get("rate")
        checked[canonical(value)] = KeyLimit(
            parse_rate(rate) if rate else None,
            _positive(entry.get("concurrency"), f"key_limits[{value!r}]['concurrency']"),
        )
    return checked


def validated(
    *,
    rate: str | None,
    concurrency: int | None,
    key: str = "",
    fair: bool = False,
    total_rate: str | None = None,
    total_concurrency: int | None = None,
    key_limits: Mapping[str, Mapping[str, Any]] | None = None,
    topic: str | None = None,
) -> Limits:
    """The :class:`Limits` of these arguments (for ``topic``, if given), or
    :class:`InvalidArgumentError`."""
    parsed = parse_rate(rate) if rate else None
    _positive(concurrency, "concurrency")
    check_key(key)
    if not isinstance(fair, bool):
        raise InvalidArgumentError(f"fair must be a bool, not {fair!r}.")
    if fair and not key:
        raise InvalidArgumentError(
            "fair claims need a key to be fair across (e.g. key='identifier')."
        )
    checked = Limits(
        parsed,
        concurrency,
        key,
        fair,
        parse_rate(total_rate) if total_rate else None,
        _positive(total_concurrency, "total_concurrency"),
        _checked_key_limits(key_limits),
    )
    if (key or checked.key_limits) and topic is not None and _is_definition(topic):
        raise InvalidArgumentError(_definition_keyed(topic))
    return checked


def _is_definition(topic: str) -> bool:
    """Whether ``topic`` holds the tasks of an executor definition (declared or stored)."""
    return topic in definitions.names()


def _definition_keyed(topic: str) -> str:
    """Why ``topic``, an executor definition's, takes no key nor limits per key value."""
    return (
        f"{topic!r} is an executor definition's topic: its tasks are keyed by the "
        f"definition's concurrency_key_path, so its limits take no key (nor fair, nor "
        f"key_limits); set rate, concurrency, total_rate and total_concurrency alone (they "
        f"hold topic-wide)."
    )


def apply_settings(declared: Mapping[str, Mapping[str, Any]] | None = None) -> list[str]:
    """Write ``TASKS_COORD["LIMITS"]`` (``{topic: {"rate":, "concurrency":, "key":, "fair":,
    "total_rate":, "total_concurrency":, "key_limits":}}``, the arguments of
    :func:`set_limits`) to the topics' rows; ``runscheduler`` does it as it starts. An
    entry without ``key_limits`` leaves the topic's as they are. Returns the topics set."""

    if declared is None:
        declared = settings.LIMITS or {}
    done = []
    for topic, options in declared.items():
        unknown = set(options) - set(OPTIONS)
        if unknown:
            raise InvalidArgumentError(
                f"TASKS_COORD['LIMITS'][{topic!r}] has unknown keys {sorted(unknown)}; "
                f"known: {', '.join(OPTIONS)}."
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
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            problems.append(
                f"LIMITS[{topic!r}] has unknown keys {unknown}: known are {', '.join(OPTIONS)}."
            )
            continue
        try:
            validated(**{"rate": None, "concurrency": None, **options})
        except InvalidArgumentError as exc:
            problems.append(f"LIMITS[{topic!r}]: {exc}")
            continue
        keyed = options.get("key") or options.get("key_limits")
        if keyed and definitions.declared(topic) is not None:
            problems.append(
                f"LIMITS[{topic!r}] has a key or key_limits, but {topic!r} is an executor "
                f"definition's topic, keyed by its concurrency_key_path: set rate, "
                f"concurrency, total_rate and total_concurrency alone."
            )
    return problems
