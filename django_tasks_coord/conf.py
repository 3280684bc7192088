"""App settings: one ``TASKS_COORD`` dict, read lazily, merged with defaults.

``app_settings.HEARTBEAT_FREQUENCY`` reads ``settings.TASKS_COORD`` on first access
and caches the merged dict; the cache is dropped on Django's ``setting_changed``
signal so ``override_settings(TASKS_COORD=...)`` works in tests. Nothing here is
read at import time.
"""

from __future__ import annotations

from datetime import timedelta
from functools import cache
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from django_tasks_coord.exceptions import ConfigurationError

DEFAULTS: dict[str, Any] = {
    # Database alias used for the app's own queries (claims, heartbeats, reaping).
    "DATABASE": "default",
    # How often a node refreshes its Owner heartbeat, in seconds.
    "HEARTBEAT_FREQUENCY": 1.0,
    # A node whose heartbeat is older than this many seconds is dead; its tasks are expired.
    "LIVENESS_INTERVAL": 30.0,
    # runscheduler: this node's id (the Owner name); None: host:pid:random.
    "NODE_ID": None,
    # runscheduler: worker threads running tasks.
    "WORKERS": 5,
    # runscheduler: tasks claimed ahead of the workers, so a free worker never waits on the database.
    "BUFFER": 10,
    # runscheduler: at most this many tasks per claim query.
    "BATCH_SIZE": 100,
    # runscheduler: topics to process; None: every topic with a registered consumer.
    "TOPICS": None,
    # runscheduler: seconds between polls when idle (and between checks of paused topics).
    "POLL_INTERVAL": 1.0,
    # runscheduler: idle back-off. While a node finds nothing to do, the dispatcher's and the
    # scheduler's safety-net polls wait POLL_INTERVAL, then twice that after each idle round,
    # up to this many seconds; any work resets it. The latency it costs: work announced by
    # another process starts at once on PostgreSQL (NOTIFY) and within WATCH_INTERVAL
    # elsewhere (the work watch); a new schedule made by another process starts up to this
    # late on MariaDB/MySQL and SQLite, and so would a push with WATCH_INTERVAL 0.
    # POLL_INTERVAL or less: no back-off.
    "MAX_POLL_INTERVAL": 5.0,
    # runscheduler: the idle back-off's cap while something announces work: on PostgreSQL the
    # node's LISTEN connection (NOTIFY announces pushes, due retries, schedule changes and
    # resumed topics), elsewhere the dispatcher's work watch (WATCH_INTERVAL; the scheduler
    # keeps MAX_POLL_INTERVAL there). The polls are then a safety net for changes made
    # outside this package (raw SQL); with the listener down, MAX_POLL_INTERVAL applies. A
    # value of MAX_POLL_INTERVAL or less: MAX_POLL_INTERVAL everywhere.
    "NOTIFIED_POLL_INTERVAL": 30.0,
    # PostgreSQL: wake up on NOTIFY (nodes, and the HTTP API's long-polls) instead of waiting
    # for the next poll. False: poll-only mode, no LISTEN connection at all (NOTIFY is still
    # sent; it costs nothing when nobody listens).
    "LISTEN_NOTIFY": True,
    # PostgreSQL: the database alias LISTEN connections are opened with; None: DATABASE.
    # Behind PgBouncer (or any pooler) in transaction or statement mode, LISTEN does not
    # work: name an alias that connects to the same database directly (docs/howto/pgbouncer.md).
    "LISTEN_DATABASE": None,
    # runscheduler, where no NOTIFY wakes nodes (MariaDB/MySQL, SQLite, LISTEN_NOTIFY off):
    # how often the waiting nodes of a cluster look, together, for work pushed by other
    # processes (one cheap statement; of N live nodes each looks every N x WATCH_INTERVAL).
    # While they watch, their full polls back off up to NOTIFIED_POLL_INTERVAL. 0: no watch
    # (work pushed elsewhere starts within MAX_POLL_INTERVAL).
    "WATCH_INTERVAL": 0.2,
    # runscheduler: seconds running tasks get to finish after SIGTERM before they are released.
    "SHUTDOWN_MAX_WAIT": 30.0,
    # runscheduler: seconds between status lines (0: none).
    "STATUS_INTERVAL": 10.0,
    # runscheduler: seconds between sweeps for dead owners (and external executors'
    # timeouts) in the cluster. Any node can sweep for all: a node alone sweeps every
    # REAP_INTERVAL; N live owners take turns in slots of REAP_INTERVAL seconds (wall clock),
    # two per slot, so the cluster sweeps at every slot even when one of them is dead.
    "REAP_INTERVAL": 5.0,
    # runscheduler: run the job scheduler (submitting due slots of periodic jobs) in this node.
    "SCHEDULER": True,
    # runscheduler: coordination group for warm backup (leader-only jobs); None: no group.
    "GROUP": None,
    # PostgreSQL: the task table LIST-partitioned by topic (a partition per registered topic).
    # Read by migration 0009 and by `manage.py tasks_coord_partition`, which converts an
    # existing table either way (see django_tasks_coord.partitions).
    "PARTITION_TASKS": True,
    # The `task_pretty` database view (state names instead of ordinals), kept by migrate.
    "TASK_PRETTY_VIEW": True,
    # runscheduler: seconds between a node's retention passes (topic retention policies,
    # django_tasks_coord.retention); 0: the node applies none (call retention.apply() yourself).
    "RETENTION_INTERVAL": 60.0,
    # Retention: tasks deleted per batch, each batch a short transaction of its own.
    "RETENTION_BATCH_SIZE": 1000,
    # Retention of finished workflows (and their steps), applied by the same passes: days
    # after a workflow ended SUCCEEDED or CANCELED (completed), or FAILED, before it is
    # deleted; None keeps them for ever, as a topic without a retention policy keeps its tasks.
    "WORKFLOW_KEEP_COMPLETED_DAYS": None,
    "WORKFLOW_KEEP_FAILED_DAYS": None,
    # The metrics view (django_tasks_coord.metrics.views): True, anyone may read it; False,
    # only users with the view_metrics permission (session or API token); None: public
    # while DEBUG is on, else as False.
    "METRICS_PUBLIC": None,
    # runscheduler: serve the node's metrics on this port (None: no metrics server);
    # --metrics-port overrides it. Needs the [metrics] extra.
    "METRICS_PORT": None,
    # runscheduler: the address the node's metrics server listens on.
    "METRICS_ADDRESS": "0.0.0.0",
    # Progress reports of running tasks (django_tasks_coord.running.report_progress): the
    # largest value, in bytes of compact JSON; and the fewest seconds between two writes of
    # one task's progress (reports in between are coalesced: the last one is written).
    "PROGRESS_MAX_BYTES": 4096,
    "PROGRESS_INTERVAL": 1.0,
    # Flow control (docs/flow-control.md): limits per topic, written to the topics' rows when
    # a node starts: {"topic": {"rate": "50/s", "concurrency": 3, "key": "payload.tenant",
    # "fair": True}}. The admin can change them later; the next node start writes these again.
    "LIMITS": {},
    # runscheduler: while a claim was held back by a concurrency limit, look again after at
    # most this many seconds (a slot freed on another node wakes nobody here).
    "FLOW_RECHECK_INTERVAL": 0.1,
    # runscheduler: seconds between a node's looks for workflow steps whose task ended
    # (django_tasks_coord.workflows), while workflows move; rounds that find nothing back off
    # (doubling) up to MAX_POLL_INTERVAL. Tasks completed on a node wake its advancer at once;
    # the looks catch tasks completed elsewhere (an executor, another process's
    # queue.complete, a cancel). 0: this node advances no workflows (no thread, no
    # connection); other nodes must.
    "WORKFLOW_POLL_INTERVAL": 1.0,
    # HTTP API: the longest wait (seconds) a long-poll may ask for.
    "LONG_POLL_MAX_TIMEOUT": 60.0,
    # HTTP API: seconds between a waiting long-poll's checks where no NOTIFY wakes it.
    "LONG_POLL_INTERVAL": 0.5,
    # HTTP API: the threads doing the database work of the API calls served by serve_api and
    # of every long-poll's checks; each keeps its own connections (CONN_MAX_AGE).
    "API_THREADS": 8,
}


@cache
def _merged() -> dict[str, Any]:
    user = getattr(settings, "TASKS_COORD", {}) or {}
    if not isinstance(user, dict):
        raise ConfigurationError(f"TASKS_COORD must be a dict, not {type(user).__name__}.")
    unknown = sorted(set(user) - set(DEFAULTS))
    if unknown:
        raise ConfigurationError(
            f"Unknown TASKS_COORD key(s): {', '.join(unknown)}. "
            f"Known keys: {', '.join(sorted(DEFAULTS))}."
        )
    return {**DEFAULTS, **user}


class AppSettings:
    """Attribute access to the merged ``TASKS_COORD`` settings."""

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(name)
        return _merged()[name]

    @property
    def liveness_interval(self) -> timedelta:
        """``LIVENESS_INTERVAL`` as a timedelta."""
        return timedelta(seconds=float(self.LIVENESS_INTERVAL))


app_settings = AppSettings()


@receiver(setting_changed)
def _reset_cache(*, setting: str, **kwargs: Any) -> None:
    if setting == "TASKS_COORD":
        _merged.cache_clear()
