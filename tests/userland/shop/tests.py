"""The shop's own tests, written as a user of django-tasks-coord writes them.

A TransactionTestCase empties every table after each test; the second test to run
enqueues and pushes after that flush.
"""

from django.test import TransactionTestCase
from shop.tasks import send_receipt

from django_tasks_coord import queue
from django_tasks_coord.enums import Insertion, TaskState
from django_tasks_coord.models import Task


class CheckoutTests(TransactionTestCase):
    def setUp(self):
        queue.register_topic("invoices")

    def checkout(self, order_id):
        result = send_receipt.enqueue(order_id)
        queue.push("invoices", f"order-{order_id}", {"order": order_id})
        return result

    def test_first_checkout(self):
        result = self.checkout(1)
        self.assertEqual(send_receipt.get_result(result.id).args, [1])
        self.assertEqual(Task.objects.count(), 2)

    def test_second_checkout(self):
        result = self.checkout(2)
        self.assertEqual(send_receipt.get_result(result.id).args, [2])
        self.assertEqual(Task.objects.count(), 2)

    def test_order_ids_differing_in_case_are_different_orders(self):
        # The project's database keeps its server's default collation (case-blind on
        # MariaDB/MySQL): the package's own tables still tell "Order-1" from "order-1".
        queue.push("invoices", "Order-1", {"order": 1})
        queue.push("invoices", "order-1", {"order": 2}, insertion=Insertion.REPLACE)
        states = dict(Task.objects.values_list("identifier", "state"))
        self.assertEqual(states, {"Order-1": TaskState.PENDING, "order-1": TaskState.PENDING})
