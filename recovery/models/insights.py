from __future__ import annotations

from django.db import models

from recovery.models.cluster import Cluster


class ClusterGoodputSnapshot(models.Model):
    """A cluster's goodput figures over a trailing window, as computed at ``taken_at``.

    The figures come from the audit trail, which is too long to read during a request; a
    periodic task (``recovery.read.insights.take_goodput_snapshots``) writes one row per cluster and
    the Console reads the rows. Durations are in seconds. Histograms are
    ``{"edges": [...], "counts": [...]}``: ``counts[i]`` values from ``edges[i]`` up to the next
    edge, the last one open-ended. Rows are derived data, so old ones are pruned.
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="goodput_snapshots")
    taken_at = models.DateTimeField(db_index=True)
    window_seconds = models.PositiveIntegerField(
        help_text="The figures cover workloads with events in this many seconds before taken_at."
    )
    workloads = models.PositiveIntegerField(default=0)
    failures = models.PositiveIntegerField(
        default=0, help_text="Failures detected within the window."
    )
    given_up = models.PositiveIntegerField(
        default=0,
        help_text="Workloads recovery stopped within the window (retry budget, no new "
        "checkpoint, an application fault): given up on, apart from those that failed.",
    )
    ettr = models.FloatField(
        null=True, blank=True, help_text="Productive over wall time within the window."
    )
    wall_seconds = models.FloatField(default=0.0)
    unproductive_seconds = models.FloatField(default=0.0)
    detection_latency_median = models.FloatField(null=True, blank=True)
    detection_latency_p95 = models.FloatField(null=True, blank=True)
    action_latency_median = models.FloatField(null=True, blank=True)
    action_latency_p95 = models.FloatField(null=True, blank=True)
    time_to_productive_median = models.FloatField(null=True, blank=True)
    time_to_productive_p95 = models.FloatField(null=True, blank=True)
    work_lost_median = models.FloatField(null=True, blank=True)
    work_lost_p95 = models.FloatField(null=True, blank=True)
    detection_latency_histogram = models.JSONField(default=dict, blank=True)
    action_latency_histogram = models.JSONField(default=dict, blank=True)
    time_to_productive_histogram = models.JSONField(default=dict, blank=True)
    anomalies_by_category = models.JSONField(
        default=dict, blank=True, help_text="Anomalies detected within the window, per category."
    )
    anomalies_by_attribution = models.JSONField(
        default=dict, blank=True, help_text="Anomalies detected within the window, per layer."
    )

    class Meta:
        ordering = ["-taken_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "taken_at"], name="goodput_snapshot_one_per_cluster_and_time"
            )
        ]

    def __str__(self) -> str:
        return f"{self.cluster_id} goodput at {self.taken_at:%Y-%m-%d %H:%M:%S}"

    @property
    def window_days(self) -> float:
        return self.window_seconds / 86400
