"""A record of every handler call, written by the test consumers (kept even if the task is retried)."""

from django.db import models


class Run(models.Model):
    topic = models.CharField(max_length=100)
    identifier = models.CharField(max_length=255)
    sequence = models.BigIntegerField()
    attempt = models.PositiveIntegerField()
    slot = models.DateTimeField(null=True)
    term = models.PositiveBigIntegerField(null=True)
    node = models.CharField(max_length=200, blank=True)
    started_at = models.DateTimeField()
    pid = models.PositiveIntegerField()

    class Meta:
        app_label = "testapp"

    def __str__(self) -> str:
        return f"{self.topic}#{self.sequence} attempt {self.attempt} on {self.node}"
