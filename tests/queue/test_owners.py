from datetime import timedelta

import pytest
from django.utils import timezone

from django_tasks_coord import queue
from django_tasks_coord.enums import TaskState
from django_tasks_coord.exceptions import DuplicateOwnerError, InvalidArgumentError
from django_tasks_coord.models import Owner, Task

pytestmark = pytest.mark.django_db


def age(owner, seconds):
    Owner.objects.filter(pk=owner.pk).update(heartbeat=timezone.now() - timedelta(seconds=seconds))


def test_register_owner_records_the_process():
    import os

    owner = queue.register_owner("node-1")
    assert owner.name == "node-1"
    assert owner.pid == os.getpid()
    assert owner.host
    assert owner.started_at is not None and owner.heartbeat is not None


def test_default_names_are_unique():
    assert queue.register_owner().name != queue.register_owner().name


def test_a_live_owner_name_cannot_be_taken():
    queue.register_owner("node-1")
    with pytest.raises(DuplicateOwnerError, match="node-1"):
        queue.register_owner("node-1")


def test_a_dead_owner_name_is_taken_over_and_its_tasks_freed(topic):
    old = queue.register_owner("node-1")
    queue.push(topic, "a")
    queue.poll(topic, owner=old)
    age(old, 3600)
    new = queue.register_owner("node-1")
    assert new.pk != old.pk
    assert Task.objects.get().state == TaskState.PENDING


def test_heartbeat():
    owner = queue.register_owner()
    age(owner, 100)
    assert queue.heartbeat(owner) is True
    owner.refresh_from_db()
    assert timezone.now() - owner.heartbeat < timedelta(minutes=1)
    Owner.objects.filter(pk=owner.pk).delete()
    assert queue.heartbeat(owner) is False


def test_expire_frees_the_tasks_of_stale_owners_only(topic):
    dead, alive = queue.register_owner("dead"), queue.register_owner("alive")
    queue.push_many(topic, [("a", None), ("b", None), ("c", None)])
    held_by_dead = queue.poll(topic, 2, owner=dead)
    queue.poll(topic, owner=alive)
    done = held_by_dead[0]
    queue.complete(done, queue.Result.SUCCESS)
    age(dead, 60)
    freed = queue.expire(older_than=timedelta(seconds=30))
    assert [t.identifier for t in freed] == ["b"]
    assert freed[0].state == TaskState.PENDING
    assert freed[0].attempts == 1  # the failed attempt stays counted
    assert not Owner.objects.filter(pk=dead.pk).exists()
    assert Owner.objects.filter(pk=alive.pk).exists()
    assert Task.objects.get(identifier="c").state == TaskState.ACTIVE
    (again,) = queue.poll(topic, owner=alive)
    assert again.identifier == "b"
    assert again.attempts == 2


def test_expire_uses_the_liveness_setting(topic, settings):
    owner = queue.register_owner()
    age(owner, 20)
    settings.TASKS_COORD = {"LIVENESS_INTERVAL": 30}
    assert queue.expire() == []
    assert Owner.objects.filter(pk=owner.pk).exists()
    settings.TASKS_COORD = {"LIVENESS_INTERVAL": 10}
    queue.expire()
    assert not Owner.objects.filter(pk=owner.pk).exists()


def test_expire_rejects_bad_bounds(db):
    with pytest.raises(InvalidArgumentError):
        queue.expire(older_than=30)


def test_unregister_owner_releases_its_tasks(topic):
    owner = queue.register_owner()
    queue.push(topic, "a")
    queue.poll(topic, owner=owner)
    released = queue.unregister_owner(owner)
    assert [t.identifier for t in released] == ["a"]
    assert Task.objects.get().state == TaskState.PENDING
    assert not Owner.objects.exists()


def test_sweep_counts_the_live_owners_in_one_statement_when_none_is_dead():
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_tasks_coord import owners

    for name in ("a", "b", "c"):
        queue.register_owner(name)
    with CaptureQueriesContext(connection) as queries:
        assert owners.sweep(timedelta(seconds=30)) == ([], 3)
    assert len(queries) == 1  # a read of two counts: no lock, no transaction


def test_sweep_frees_the_dead_and_counts_the_rest(topic):
    from django_tasks_coord import owners

    dead = queue.register_owner("dead")
    queue.register_owner("alive")
    queue.push(topic, "a")
    queue.poll(topic, owner=dead)
    age(dead, 60)
    freed, live = owners.sweep(timedelta(seconds=30))
    assert [t.identifier for t in freed] == ["a"]
    assert live == 1
    assert list(Owner.objects.values_list("name", flat=True)) == ["alive"]
    assert owners.sweep(timedelta(seconds=30)) == ([], 1)
    Owner.objects.all().delete()
    assert owners.sweep(timedelta(seconds=30)) == ([], 1)  # never 0: the caller is one


def test_survey_ranks_the_owner_among_the_live_ones_in_one_statement(topic):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_tasks_coord import owners

    first, dead, third = (queue.register_owner(name) for name in ("first", "dead", "third"))
    with CaptureQueriesContext(connection) as queries:
        assert owners.survey(third, timedelta(seconds=30)) == ([], 3, 2)
    assert len(queries) == 1  # still one read when nobody is dead
    age(dead, 60)
    # The dead one no longer counts (it is freed in the same sweep): the third is second now.
    assert owners.survey(third, timedelta(seconds=30)) == ([], 2, 1)
    assert owners.survey(first, timedelta(seconds=30)) == ([], 2, 0)
