"""The shop's background tasks (Django's task framework, run by django-tasks-coord)."""

from django.tasks import task


@task
def send_receipt(order_id):
    return f"receipt for order {order_id}"
