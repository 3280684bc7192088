"""The demo's consumer: what a node does with each task of the ``emails`` topic.

``runscheduler`` imports this module at start-up (every installed app's ``consumers.py``),
which registers :func:`deliver` as the consumer of ``emails``.
"""

from django_tasks_coord import handlers
from django_tasks_coord.models import Task
from django_tasks_coord.queue import Decision, Result
from django_tasks_coord.retry import RetryPolicy

TOPIC = "emails"


class MailboxFullError(Exception):
    pass


def send_email(task: Task) -> Decision:
    """Pretend to send an email; the payload decides how it goes."""
    payload = task.payload or {}
    if payload.get("bounce"):
        try:
            raise MailboxFullError(f"mailbox of {task.identifier} is full")
        except MailboxFullError as exc:
            return Decision(Result.FAILURE, message="bounced", exception=exc)
    if payload.get("unsubscribed"):
        return Decision(Result.FILTER, message="recipient unsubscribed")
    if payload.get("wait_for_approval"):
        return Decision(Result.SUSPENSION, message="waiting for approval")
    return Decision(Result.SUCCESS, message=f"sent {payload.get('subject', '')!r}")


@handlers.consumer(TOPIC, retry=RetryPolicy(max_attempts=3, retry_interval=1.0))
def deliver(task: Task) -> Decision:
    """The nodes' consumer of ``emails``: a bounce is retried twice (after 1 s, then 2 s), then failed."""
    return send_email(task)
