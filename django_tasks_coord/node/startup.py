"""What a node does once as it starts, so that mistakes are loud rather than silent.

- The topic of every consumer declared in code (``@handlers.consumer``) is registered,
  as the queues of ``TASKS`` are: a consumer never sits idle waiting for someone to
  register its topic by hand.
- A topic the node is told to process (``--topic``, ``TASKS_COORD["TOPICS"]``) that has
  no consumer here and is not registered gets a warning: the node would wait on it forever.
- The flow limits declared in ``TASKS_COORD["LIMITS"]`` are written to their topics'
  rows (:func:`django_tasks_coord.flow.apply_settings`).
- An enabled job whose callable does not import here gets a warning (its runs would
  fail; the first one pauses it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django_tasks_coord import db, flow, topics
from django_tasks_coord.exceptions import TasksCoordError
from django_tasks_coord.handlers import Registry
from django_tasks_coord.models import PeriodicTask, Topic
from django_tasks_coord.node.config import NodeConfig
from django_tasks_coord.scheduling.runner import import_problem

logger = logging.getLogger("django_tasks_coord.node")


def prepare(config: NodeConfig, handlers: Registry) -> None:
    """Everything above, in that order."""
    register_consumer_topics(handlers)
    apply_limits()
    warn_unknown_topics(config.topics or (), handlers)
    if config.scheduler:
        warn_unimportable_jobs()


def register_consumer_topics(handlers: Registry) -> list[str]:
    """Register the topic of each consumer (but this package's own); return their names."""
    names = sorted(
        name for name in handlers.consumers() if not name.startswith(topics.RESERVED_PREFIX)
    )
    registered = []
    for name in names:
        try:
            topics.register_topic(name)
        except TasksCoordError as exc:  # an invalid name: this consumer cannot have tasks
            logger.error("Consumer of topic %r: its topic cannot be registered: %s", name, exc)
            continue
        registered.append(name)
    return registered


def apply_limits() -> list[str]:
    """Write ``TASKS_COORD["LIMITS"]`` to the topics' rows; return the topics set. A bad
    declaration is logged as an ERROR (system check ``tasks_coord.E003`` reports it too)."""
    try:
        return flow.apply_settings()
    except TasksCoordError as exc:
        logger.error("TASKS_COORD['LIMITS'] could not be applied: %s", exc)
        return []


def warn_unknown_topics(names: Iterable[str], handlers: Registry) -> list[str]:
    """Warn about each of ``names`` that has no consumer and is not registered; return them."""
    consumers = handlers.consumers()
    wanted = [name for name in names if name not in consumers]
    known = set(
        Topic.objects.using(db.alias()).filter(name__in=wanted).values_list("name", flat=True)
    )
    unknown = [name for name in wanted if name not in known]
    for name in unknown:
        logger.warning(
            "Topic %r has no consumer and is not registered: this node will find no task in it. "
            "Check the name (--topic, TASKS_COORD['TOPICS']), declare a consumer "
            "(@handlers.consumer(%r)) or register the topic (queue.register_topic(%r)).",
            name,
            name,
            name,
        )
    return unknown


def warn_unimportable_jobs() -> list[str]:
    """Warn about each enabled job whose callable does not import here; return their ids."""
    found = []
    jobs = PeriodicTask.objects.using(db.alias()).filter(enabled=True)
    for job_id, path, paused in jobs.values_list("id", "task", "paused").order_by("id"):
        problem = import_problem(path)
        if problem is None:
            continue
        found.append(job_id)
        logger.warning(
            "Job %r: %s; %s",
            job_id,
            problem,
            "it is paused until the code is deployed and it is resumed."
            if paused
            else "its next run will fail and pause it. Deploy the code or unschedule the job.",
        )
    return found
