"""The demo's consumer: what a worker does with each task of the ``emails`` topic."""

from django_tasks_coord.models import Task
from django_tasks_coord.queue import Decision, Result


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
