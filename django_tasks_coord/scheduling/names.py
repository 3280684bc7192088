"""The names scheduling gives topics and notifications: constants, no import side effects.

Runs of ordinary jobs go to :data:`JOBS_TOPIC`; runs of a group's leader-only jobs go to
the group's own topic (:func:`group_topic`), which only the group's leader processes.
Importing this module registers nothing, so any module may take a name from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from django_tasks_coord.models import PeriodicTask

#: The topic every job run is pushed to.
JOBS_TOPIC = "tasks_coord.jobs"
#: NOTIFY payload telling schedulers that a schedule changed or a run ended.
SCHEDULE_CHANGED = "tasks_coord.schedule"
#: Runs of a group's leader-only jobs go to ``GROUP_TOPIC_PREFIX + group``.
GROUP_TOPIC_PREFIX = "tasks_coord.group."


def group_topic(group: str) -> str:
    """The topic of ``group``'s leader-only runs, processed only by the group's leader."""
    return GROUP_TOPIC_PREFIX + group


def group_of(topic: str) -> str | None:
    """The group whose leader topic ``topic`` is, or None."""
    return topic[len(GROUP_TOPIC_PREFIX) :] if topic.startswith(GROUP_TOPIC_PREFIX) else None


def run_topic(job: PeriodicTask) -> str:
    """The topic a job's runs go to: its group's leader topic for leader-only jobs."""
    return group_topic(job.group) if job.leader_only else JOBS_TOPIC


__all__ = [
    "GROUP_TOPIC_PREFIX",
    "JOBS_TOPIC",
    "SCHEDULE_CHANGED",
    "group_of",
    "group_topic",
    "run_topic",
]
