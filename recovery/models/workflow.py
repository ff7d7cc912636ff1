from __future__ import annotations

from django.db import models

from recovery.models.cluster import Cluster


class Workflow(models.Model):
    """Jobs of one user on one cluster that belong together, such as a chain of submissions.

    Its jobs share one retry budget, one count of attempts without a new checkpoint, and the
    nodes their attempts excluded. The name is chosen by the jobs' owner in the opt-in comment,
    so a workflow is the owner's own: two users writing the same name have two workflows, and
    no job ever inherits another user's budget or exclusions.
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="workflows")
    user = models.CharField(max_length=64)
    name = models.CharField(max_length=128)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "user", "name"], name="workflow_identity")
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name}:{self.user}/{self.name}"
