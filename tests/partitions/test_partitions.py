"""PostgreSQL: the task table partitioned by topic (django_tasks_coord.partitions).

The test database is migrated like a new installation, so its task table is partitioned
from the start. Tests that convert the table leave it partitioned again.
"""

from __future__ import annotations

import importlib
import json
import signal
from collections.abc import Iterator
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import override_settings

from django_tasks_coord import checks, partitions, queue
from django_tasks_coord.models import Task, Topic
from tests.processes import reap, run_together, start

postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the task table is partitioned on PostgreSQL only"
)


def where(task: Task) -> str:
    """The table a task's row is stored in."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT tableoid::regclass::text FROM {partitions.table()} "
            "WHERE topic_id = %s AND sequence = %s",
            [task.topic_id, task.sequence],
        )
        return cursor.fetchone()[0]


@pytest.fixture
def partitioned_again() -> Iterator[None]:
    """Whatever a test does to the table's shape, the next test finds it partitioned."""
    yield
    if connection.vendor == "postgresql":
        partitions.convert(partitioned=True)


@postgres_only
@pytest.mark.django_db
class TestPartitionPerTopic:
    def test_a_new_installation_is_partitioned_with_a_default_partition(self) -> None:
        assert partitions.is_partitioned(connection)
        assert partitions.partitions(connection)[partitions.default_partition()] == "DEFAULT"

    def test_registering_a_topic_creates_its_partition_and_its_tasks_go_there(self) -> None:
        queue.register_topic("Invoices / EU")
        name = partitions.partition_name("Invoices / EU")
        assert partitions.partitions(connection)[name] == "FOR VALUES IN ('Invoices / EU')"
        assert where(queue.push("Invoices / EU", "a")) == name

    def test_registering_again_changes_nothing(self) -> None:
        queue.register_topic("emails")
        before = partitions.partitions(connection)
        queue.register_topic("emails")
        assert not partitions.ensure_partition("emails")
        assert partitions.partitions(connection) == before

    def test_a_topic_saved_by_the_orm_gets_its_partition_too(self) -> None:
        Topic.objects.create(name="made by hand")
        assert partitions.partition_name("made by hand") in partitions.partitions(connection)

    def test_tasks_of_a_topic_without_partition_wait_in_the_default_and_move_later(self) -> None:
        Topic.objects.bulk_create([Topic(name="bulk")])  # no signal: no partition
        task = queue.push("bulk", "x")
        assert where(task) == partitions.default_partition()
        assert partitions.ensure_partition("bulk")
        assert where(task) == partitions.partition_name("bulk")
        assert queue.poll("bulk")[0].sequence == task.sequence

    def test_partition_names_fit_postgresql_and_differ_by_topic(self) -> None:
        names = {partitions.partition_name(t) for t in ["a" * 100, "a" * 99 + "b", "A", "a"]}
        assert len(names) == 4
        assert all(len(name) <= 63 for name in names)

    def test_a_claim_of_one_topic_reads_only_its_partition(self) -> None:
        queue.register_topic("one")
        queue.register_topic("other")
        queue.push("one", "x")
        with connection.cursor() as cursor:
            cursor.execute(
                f"EXPLAIN SELECT * FROM {partitions.table()} WHERE topic_id = 'one' "
                "AND state = 10 ORDER BY priority DESC, sequence LIMIT 10 FOR UPDATE SKIP LOCKED"
            )
            plan = "\n".join(row[0] for row in cursor.fetchall())
        assert partitions.partition_name("one") in plan
        assert partitions.partition_name("other") not in plan
        assert partitions.default_partition() not in plan

    def test_every_partition_has_an_index_on_the_task_number(self) -> None:
        """The primary key leads with the topic; look-ups by number need their own index."""
        queue.register_topic("one")
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = %s::regclass AND NOT EXISTS ("
                "  SELECT 1 FROM pg_index x JOIN pg_attribute a ON a.attrelid = x.indrelid "
                "  AND a.attnum = x.indkey[0] WHERE x.indrelid = c.oid AND x.indnatts = 1 "
                "  AND a.attname = 'sequence')",
                [partitions.table()],
            )
            assert cursor.fetchall() == []
        task = queue.push("one", "x")
        assert Task.objects.get(pk=task.pk).identifier == "x"


@postgres_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("partitioned_again")
class TestConversion:
    def test_both_ways_keeps_every_row_and_the_numbering(self) -> None:
        for name in ("a", "b"):
            queue.register_topic(name)
        for i in range(30):
            queue.push("a" if i % 3 else "b", f"id{i}", {"i": i})
        queue.complete_many(queue.poll("a", 5), "success")
        before = sorted(Task.objects.values_list("sequence", "topic_id", "state", "payload"))

        assert partitions.convert(partitioned=False, batch_size=7)
        assert not partitions.is_partitioned(connection)
        assert (
            sorted(Task.objects.values_list("sequence", "topic_id", "state", "payload")) == before
        )

        assert partitions.convert(partitioned=True, batch_size=4)
        assert partitions.is_partitioned(connection)
        assert (
            sorted(Task.objects.values_list("sequence", "topic_id", "state", "payload")) == before
        )
        assert set(partitions.partitions(connection)) == {
            partitions.default_partition(),
            partitions.partition_name("a"),
            partitions.partition_name("b"),
        }
        assert queue.push("a", "later").sequence > before[-1][0]
        assert not partitions.convert(partitioned=True)  # nothing to do

    def test_the_table_keeps_its_index_and_constraint_names(self) -> None:
        def names() -> set[str]:
            with connection.cursor() as cursor:
                constraints = connection.introspection.get_constraints(cursor, partitions.table())
            return set(constraints) - {partitions.SEQUENCE_INDEX}

        partitioned = names()
        partitions.convert(partitioned=False)
        assert names() == partitioned
        assert "tasks_coord_one_run_per_slot" in partitioned
        assert "tasks_coord_claim_fifo" in partitioned

    @pytest.mark.multiprocess
    def test_online_while_a_worker_pushes_claims_completes_and_deletes(self) -> None:
        """Nothing is lost or resurrected while the table is converted under load."""
        queue.register_topic("busy")
        queue.register_topic("quiet")
        queue.push_many("quiet", [(f"q{i}", {"i": i}) for i in range(300)])
        partitions.convert(partitioned=False)
        for converted_to in (True, False, True):
            worker = start("tests.partitions.churn", "busy")
            try:
                assert worker.stdout.readline().strip() == "ready", worker.stderr.read()
                out = StringIO()
                with override_settings(TASKS_COORD={"PARTITION_TASKS": converted_to}):
                    call_command("tasks_coord_partition", batch_size=20, stdout=out)
                worker.stdin.write("stop\n")
                worker.stdin.flush()
                stdout, stderr = worker.communicate(timeout=120)
                assert worker.returncode == 0, stderr
            finally:
                reap(worker, signal.SIGKILL)
            assert partitions.is_partitioned(connection) is converted_to
            assert "Copied up to sequence" in out.getvalue()
            done = json.loads(stdout.strip().splitlines()[-1])
            assert len(done["pushed"]) > 1
            rows = dict(Task.objects.for_topic("busy").values_list("sequence", "state"))
            alive = set(done["pushed"]) - set(done["deleted"])
            assert set(rows) == alive  # nothing lost, nothing deleted came back
            for sequence in set(done["completed"]) & alive:
                assert rows[sequence] == 40
            assert Task.objects.for_topic("quiet").count() == 300
            Task.objects.for_topic("busy").delete()


@postgres_only
@pytest.mark.multiprocess
@pytest.mark.django_db(transaction=True)
def test_processes_registering_topics_at_once_neither_deadlock_nor_lose_tasks() -> None:
    """Nodes starting together register their topics together: each new topic gets its
    partition, and no process dies of a deadlock (attaching a partition locks the topic
    table, so register_topic makes the partition before it inserts the topic's row)."""
    results = run_together("tests.partitions.register", count=4)
    pushed = [sequence for result in results for sequence in result["pushed"]]
    assert sorted(Task.objects.values_list("sequence", flat=True)) == sorted(pushed)
    attached = partitions.partitions(connection)
    for topic in Topic.objects.values_list("name", flat=True):
        assert partitions.partition_name(topic) in attached
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {partitions.default_partition()}")
        assert cursor.fetchone()[0] == 0


@postgres_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("partitioned_again")
class TestCommandAndChecks:
    def test_the_command_follows_the_setting_and_reports_with_check(self) -> None:
        out = StringIO()
        call_command("tasks_coord_partition", "--check", stdout=out)
        assert "already partitioned by topic" in out.getvalue()
        with override_settings(TASKS_COORD={"PARTITION_TASKS": False}):
            with pytest.raises(SystemExit) as exit_:
                call_command("tasks_coord_partition", "--check", stdout=StringIO())
            assert exit_.value.code == 1
            assert [m.id for m in checks.check_partitioning(databases=["default"])] == [
                "tasks_coord.W004"
            ]
            call_command("tasks_coord_partition", stdout=StringIO())
            assert not partitions.is_partitioned(connection)
            assert checks.check_partitioning(databases=["default"]) == []
        assert [m.id for m in checks.check_partitioning(databases=["default"])] == [
            "tasks_coord.W004"
        ]
        call_command("tasks_coord_partition", stdout=StringIO())
        assert partitions.is_partitioned(connection)

    def test_keep_old_keeps_the_previous_table_until_the_next_run(self) -> None:
        with override_settings(TASKS_COORD={"PARTITION_TASKS": False}):
            call_command("tasks_coord_partition", "--keep-old", stdout=StringIO())
        with connection.cursor() as cursor:
            assert f"{partitions.table()}_old" in connection.introspection.table_names(cursor)
        call_command("tasks_coord_partition", stdout=StringIO())
        with connection.cursor() as cursor:
            assert f"{partitions.table()}_old" not in connection.introspection.table_names(cursor)

    def test_the_command_drops_empty_partitions_of_deleted_topics(self) -> None:
        queue.register_topic("short-lived")
        Topic.objects.filter(name="short-lived").delete()
        assert partitions.orphans(connection) == [partitions.partition_name("short-lived")]
        out = StringIO()
        call_command("tasks_coord_partition", stdout=out)
        assert "Dropped" in out.getvalue()
        assert partitions.orphans(connection) == []

    def test_migrate_leaves_a_table_with_history_unpartitioned(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        partitions.convert(partitioned=False)
        queue.register_topic("history")
        queue.push("history", "x")
        migration = importlib.import_module(
            "django_tasks_coord.migrations.0009_partition_task_table"
        )
        with connection.schema_editor() as editor:
            migration.partition_if_empty(None, editor)
        assert not partitions.is_partitioned(connection)
        assert "tasks_coord_partition" in caplog.text
        Task.objects.all().delete()
        with connection.schema_editor() as editor:
            migration.partition_if_empty(None, editor)
        assert partitions.is_partitioned(connection)


@pytest.mark.skipif(connection.vendor == "postgresql", reason="PostgreSQL is partitioned")
@pytest.mark.django_db
def test_other_databases_keep_one_table() -> None:
    queue.register_topic("emails")
    assert not partitions.is_partitioned(connection)
    assert not partitions.ensure_partition("emails")
    assert checks.check_partitioning(databases=["default"]) == []
    with pytest.raises(CommandError, match="PostgreSQL only"):
        call_command("tasks_coord_partition")
