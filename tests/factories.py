"""factory-boy factories for the app's models (rows made directly, bypassing the queue API)."""

from __future__ import annotations

import factory
from factory.django import DjangoModelFactory

from django_tasks_coord.enums import TaskState
from django_tasks_coord.models import Owner, Task, Topic


class TopicFactory(DjangoModelFactory[Topic]):
    class Meta:
        model = Topic
        django_get_or_create = ("name",)

    name = factory.Sequence(lambda n: f"topic-{n}")


class OwnerFactory(DjangoModelFactory[Owner]):
    class Meta:
        model = Owner

    name = factory.Sequence(lambda n: f"node-{n}")
    host = "testhost"
    pid = factory.Sequence(lambda n: 1000 + n)


class TaskFactory(DjangoModelFactory[Task]):
    class Meta:
        model = Task

    topic = factory.SubFactory(TopicFactory)
    identifier = factory.Sequence(lambda n: f"id-{n}")
    payload = factory.Dict({"n": factory.Sequence(int)})
    state = TaskState.PENDING
