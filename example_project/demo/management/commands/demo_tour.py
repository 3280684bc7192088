"""``manage.py demo_tour``: the queue API step by step in one process, printing each step.

No node runs; this process pushes, polls and completes by itself. ``manage.py demo`` runs
the whole system instead.
"""

from __future__ import annotations

from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand

from demo.consumers import send_email
from django_tasks_coord import queue
from django_tasks_coord.models import Task
from django_tasks_coord.queue import Condition, Insertion, Junction

TOPIC = "emails-tour"


class Command(BaseCommand):
    help = "Walk through the queue API in one process (SQLite by default; DATABASE_URL for another database)."

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("migrate", verbosity=0)
        queue.register_topic(TOPIC)
        queue.purge(TOPIC, queue.resolve(TOPIC, _far_future()))
        owner = queue.register_owner()
        self.step(f"Registered topic {TOPIC!r} and this process as owner {owner.name!r}.")

        queue.push(TOPIC, "alice", {"subject": "Welcome"})
        queue.push(TOPIC, "alice", {"subject": "Your invoice"})
        queue.push(TOPIC, "bob", {"subject": "Draft 1"})
        queue.push(TOPIC, "bob", {"subject": "Draft 2"}, insertion=Insertion.SUPERSEDE)
        queue.push(TOPIC, "carol", {"subject": "Hello", "bounce": True})
        queue.push(TOPIC, "dave", {"subject": "News", "unsubscribed": True})
        queue.push(TOPIC, "erin", {"subject": "Contract", "wait_for_approval": True})
        queue.push(TOPIC, "frank", {"subject": "Contract", "wait_for_approval": True})
        queue.push(TOPIC, "urgent", {"subject": "Password reset"}, priority=10)
        self.step(
            "Pushed 9 tasks (bob's Draft 1 is superseded by Draft 2; 'urgent' has priority 10)."
        )
        self.table()

        self.step("Processing in batches of 3, one task per identifier at a time:")
        rounds = 0
        while tasks := queue.poll(
            TOPIC, 3, condition=Condition.SINGULAR_BY_IDENTIFIER, owner=owner
        ):
            rounds += 1
            for task in tasks:
                decision = send_email(task)
                queue.complete(task, decision)
                self.stdout.write(
                    f"  round {rounds}: #{task.sequence} {task.identifier:7} -> "
                    f"{decision.result.name:10} {decision.message or ''}"
                )

        failed = Task.objects.for_topic(TOPIC).get(identifier="carol")
        copy = queue.recreate(failed)
        copy.payload = {"subject": "Hello (retry)"}
        copy.save(update_fields=["payload"])
        self.step(
            f"Recreated carol's failed task as #{copy.sequence} (recreated={copy.recreated})."
        )
        started = queue.junction(TOPIC, ["erin", "frank"], Junction.SINGULAR)
        self.step(
            f"Junction started the suspended tasks of {[t.identifier for t in started]} together."
        )
        Task.objects.filter(pk__in=[t.pk for t in started]).update(
            payload={"subject": "Contract (approved)"}
        )
        for task in queue.poll(TOPIC, 10, owner=owner):
            queue.complete(task, send_email(task))
        self.table()
        self.step(
            f"{queue.count(TOPIC)} tasks in {TOPIC!r}, "
            f"{queue.count(TOPIC, latest_per_identifier=True)} identifiers."
        )
        queue.unregister_owner(owner)

    def step(self, text: str) -> None:
        self.stdout.write(self.style.MIGRATE_HEADING(text))

    def table(self) -> None:
        for task in Task.objects.for_topic(TOPIC).order_by("sequence"):
            self.stdout.write(
                f"  #{task.sequence:<4} {task.identifier:7} {task.get_state_display():10} "
                f"attempts={task.attempts} {task.payload} {task.message or ''}"
            )


def _far_future() -> Any:
    from datetime import timedelta

    from django.utils import timezone

    return timezone.now() + timedelta(days=3650)
