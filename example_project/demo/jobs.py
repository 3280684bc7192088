"""The demo's jobs. ``runscheduler`` imports every installed app's ``jobs.py`` at start-up and
stores the ``@scheduling.job`` declarations in the ``periodic_task`` table; ``countdown`` is
scheduled at run time by ``manage.py demo`` (``scheduling.schedule_recurring``).
"""

import random

from demo.consumers import TOPIC
from demo.tasks import THUMBNAIL, word_count
from django_tasks_coord import executions, queue, scheduling
from django_tasks_coord.models import PeriodicTask, Task
from django_tasks_coord.scheduling import JobContext

GROUP = "demo"
PEOPLE = ["alice", "bob", "carol", "dave", "erin"]


@scheduling.job("*:*:0/5", name="demo-feed", tz="Europe/Berlin", catch_up="skip")
def feed(ctx: JobContext) -> None:
    """Every 5 seconds (a systemd calendar event): new work of each kind.

    Two emails (one may bounce: retried, then failed), a Django task, and a thumbnail for
    the external executor.
    """
    person = random.choice(PEOPLE)
    queue.push(TOPIC, person, {"subject": f"News of {ctx.slot:%H:%M:%S}"})
    queue.push(TOPIC, "mallory", {"subject": "Spam", "bounce": random.random() < 0.3})
    word_count.enqueue(f"the slot of {ctx.slot:%H:%M:%S} fired on the node that won it")
    executions.create(
        THUMBNAIL,
        {"image": f"photo-{ctx.task.sequence}.jpg", "width": random.choice([64, 128, 256])},
        label=f"feed {ctx.slot:%H:%M:%S}",
        requester="demo-feed",
    )
    ctx.logger.info(
        "slot %s: pushed 2 emails, enqueued 1 Django task, created 1 thumbnail", ctx.slot
    )


@scheduling.job("*:*:0/10", name="demo-ledger", group=GROUP, leader_only=True, catch_up="skip")
def ledger(ctx: JobContext) -> None:
    """Every 10 seconds, on the leader of group ``demo`` only, fenced by its term.

    Kill the leading node (``kill -9``; its pid is printed at start) and the other node
    takes over within ``LIVENESS_INTERVAL`` (10 s), with the term incremented.
    """
    with ctx.fenced():  # commits only while this node still leads under ctx.term
        Task.objects.filter(pk=ctx.task.pk).update(
            message=f"closed by {ctx.node_id} under term {ctx.term}"
        )
    ctx.logger.info("leader %s (term %s) closed slot %s", ctx.node_id, ctx.term, ctx.slot)


def countdown(ctx: JobContext) -> None:
    """A recurring job with ``max_count``: ``manage.py demo`` schedules it every 3 s, 5 times."""
    job = PeriodicTask.objects.get(id=ctx.job_id)
    ctx.logger.info("run %s of %s (slot %s)", job.run_count, job.max_count, ctx.slot)
