"""A node's configuration: the ``TASKS_COORD`` settings, overridden by command-line flags."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from django_tasks_coord.conf import app_settings
from django_tasks_coord.exceptions import ConfigurationError


@dataclass(frozen=True)
class NodeConfig:
    """Everything a :class:`~django_tasks_coord.node.Node` needs to know. See docs/node.md."""

    node_id: str | None
    workers: int
    buffer: int
    batch_size: int
    topics: tuple[str, ...] | None
    poll_interval: float
    listen_notify: bool
    shutdown_max_wait: float
    status_interval: float
    reap_interval: float
    heartbeat_frequency: float
    liveness_interval: float
    retention_interval: float = 60.0
    scheduler: bool = True
    group: str | None = None
    burst: bool = False
    #: Idle back-off cap (``MAX_POLL_INTERVAL``); at most ``poll_interval``: no back-off.
    max_poll_interval: float = 5.0
    #: Idle back-off cap while NOTIFY or the work watch tells the node (``NOTIFIED_POLL_INTERVAL``).
    notified_poll_interval: float = 30.0
    #: Where nothing announces work: how often the cluster's waiting nodes look for it,
    #: together (``WATCH_INTERVAL``; 0: never; see :mod:`~django_tasks_coord.node.watch`).
    watch_interval: float = 0.2
    #: Seconds between a node's looks for workflow steps whose task ended elsewhere
    #: (``WORKFLOW_POLL_INTERVAL``; completions on the node itself wake it at once; 0: the
    #: node advances no workflows, others do).
    workflow_poll_interval: float = 1.0

    @classmethod
    def settings_problems(cls, values: Mapping[str, Any]) -> list[str]:
        """What is wrong with the node's settings among ``values`` (``TASKS_COORD``, merged
        with the defaults): the system check ``tasks_coord.E003`` reports it."""
        keys = (
            "WORKERS",
            "BUFFER",
            "BATCH_SIZE",
            "POLL_INTERVAL",
            "SHUTDOWN_MAX_WAIT",
            "STATUS_INTERVAL",
            "REAP_INTERVAL",
            "HEARTBEAT_FREQUENCY",
            "LIVENESS_INTERVAL",
            "RETENTION_INTERVAL",
            "WATCH_INTERVAL",
            "WORKFLOW_POLL_INTERVAL",
        )
        node_values = {key.lower(): values[key] for key in keys}
        try:
            cls(node_id=None, topics=None, listen_notify=True, **node_values).validate()
        except ConfigurationError as exc:
            return [str(exc)]
        except TypeError as exc:  # e.g. a str compared with a number
            return [f"a node setting has the wrong type: {exc}."]
        return []

    @classmethod
    def from_settings(cls, **overrides: Any) -> NodeConfig:
        """Build from ``TASKS_COORD``; keyword arguments that are not None win (command flags)."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name == "burst":
                continue
            values[f.name] = getattr(app_settings, f.name.upper())
        values.update({k: v for k, v in overrides.items() if v is not None})
        if values.get("topics") is not None:
            values["topics"] = tuple(values["topics"])
        config = cls(**values)
        config.validate()
        return config

    def validate(self) -> None:
        """Raise :class:`ConfigurationError` naming the first bad value."""
        for name in ("workers", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(
                    f"{name.upper()} must be an int of at least 1, not {value!r}."
                )
        if isinstance(self.buffer, bool) or not isinstance(self.buffer, int) or self.buffer < 0:
            raise ConfigurationError(f"BUFFER must be a non-negative int, not {self.buffer!r}.")
        for name in ("poll_interval", "heartbeat_frequency", "liveness_interval", "reap_interval"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value <= 0:
                raise ConfigurationError(
                    f"{name.upper()} must be a positive number of seconds, not {value!r}."
                )
        for name in (
            "shutdown_max_wait",
            "status_interval",
            "retention_interval",
            "workflow_poll_interval",
        ):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value < 0:
                raise ConfigurationError(
                    f"{name.upper()} must be a non-negative number of seconds, not {value!r}."
                )
        watch = self.watch_interval
        if isinstance(watch, bool) or not (isinstance(watch, int | float) and watch >= 0):
            raise ConfigurationError(
                f"WATCH_INTERVAL must be a non-negative number of seconds, not {watch!r}."
            )
        for name in ("max_poll_interval", "notified_poll_interval"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, int | float) and value > 0):
                raise ConfigurationError(
                    f"{name.upper()} must be a positive number of seconds, not {value!r}."
                )
        if self.heartbeat_frequency * 2 > self.liveness_interval:
            raise ConfigurationError(
                f"LIVENESS_INTERVAL ({self.liveness_interval}s) must be at least twice "
                f"HEARTBEAT_FREQUENCY ({self.heartbeat_frequency}s), or live nodes would be declared dead."
            )

    @property
    def idle_heartbeat(self) -> float:
        """Seconds between the heartbeats of a node that holds nothing and leads no group:
        ``max(HEARTBEAT_FREQUENCY, LIVENESS_INTERVAL / 4)``, so even a beat that fails, and
        the next one, leave it alive with room to spare."""
        return max(self.heartbeat_frequency, self.liveness_interval / 4)

    @property
    def capacity(self) -> int:
        """How many tasks the node holds at most: one per worker plus the buffer."""
        return self.workers + self.buffer
