"""Warm backup: who leads each coordination group, under which term, and its members."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _


class TokenHolder(models.Model):
    """Who holds a coordination group's token (its leader), and under which term.

    ``term`` only grows: every takeover increments it, so a deposed holder finds its
    term outdated (fencing). ``task_id`` is the holder's node id; empty while
    nobody holds the token (after a voluntary release).
    """

    group_id = models.CharField(_("group"), max_length=100, primary_key=True)
    task_id = models.CharField(_("holder (node id)"), max_length=200, blank=True, default="")
    term = models.PositiveBigIntegerField(_("term"), default=0)
    acquired_at = models.DateTimeField(_("acquired at"), null=True, blank=True)
    released_at = models.DateTimeField(_("released at"), null=True, blank=True)

    class Meta:
        db_table = "token_holder"
        verbose_name = _("leader")
        verbose_name_plural = _("leaders")
        ordering = ["group_id"]

    def __str__(self) -> str:
        return f"{self.group_id}: {self.task_id or '-'} (term {self.term})"


class HealthCheck(models.Model):
    """A node's membership of a coordination group and its last heartbeat (database clock)."""

    task_id = models.CharField(_("node id"), max_length=200)
    group_id = models.CharField(_("group"), max_length=100)
    last_heartbeat = models.DateTimeField(_("last heartbeat"), db_default=Now())

    class Meta:
        db_table = "health_check"
        verbose_name = _("group member")
        verbose_name_plural = _("group members")
        ordering = ["group_id", "task_id"]
        constraints = [
            models.UniqueConstraint(fields=["task_id", "group_id"], name="health_check_node_group")
        ]
        indexes = [models.Index(fields=["group_id", "last_heartbeat"], name="health_check_group")]

    def __str__(self) -> str:
        return f"{self.task_id}@{self.group_id}"
