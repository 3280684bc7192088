"""Storage: topics, tasks and owners, scheduled jobs, leadership, task definitions and API tokens.

One ``Task`` table carries the work of every entry point (queue pushes, periodic
firings, jobs, ``django.tasks`` enqueues, HTTP-created tasks). The models describe
rows, and ``Task.objects`` (a :class:`TaskQuerySet`) reads them; every write of task
rows goes through the task store, :mod:`django_tasks_coord.store`
(``tests/store_rule.py`` keeps it so).

This package re-exports the models of its modules: :mod:`~.tasks` (topics, owners,
tasks), :mod:`~.workflows` (workflows and their steps), :mod:`~.querysets` (the task queryset), :mod:`~.jobs` (scheduled jobs),
:mod:`~.coordination` (leaders and group members), :mod:`~.api` (task definitions
and API tokens) and :mod:`~.checkpoints` (what running tasks recorded as done).
"""

from __future__ import annotations

from django_tasks_coord.models.api import ApiToken, TaskDefinition
from django_tasks_coord.models.checkpoints import Checkpoint
from django_tasks_coord.models.coordination import HealthCheck, TokenHolder
from django_tasks_coord.models.jobs import CatchUp, JobKind, PeriodicTask
from django_tasks_coord.models.querysets import UNFINISHED_IDENTIFIER, TaskQuerySet
from django_tasks_coord.models.tasks import Dashboard, FlowStart, Owner, Task, Topic
from django_tasks_coord.models.workflows import (
    OnFailure,
    StepKind,
    StepState,
    Workflow,
    WorkflowState,
    WorkflowStep,
)

__all__ = [
    "UNFINISHED_IDENTIFIER",
    "ApiToken",
    "CatchUp",
    "Checkpoint",
    "Dashboard",
    "FlowStart",
    "HealthCheck",
    "JobKind",
    "OnFailure",
    "Owner",
    "PeriodicTask",
    "StepKind",
    "StepState",
    "Task",
    "TaskDefinition",
    "TaskQuerySet",
    "TokenHolder",
    "Topic",
    "Workflow",
    "WorkflowState",
    "WorkflowStep",
]
