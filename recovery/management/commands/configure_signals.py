"""``manage.py configure_signals``: connect to a site's log and metric stores and propose how to
read them; save the proposal to a cluster's settings on confirmation."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from recovery.clusters.configurator import (
    LogsInspection,
    MetricsInspection,
    inspect_logs,
    inspect_metrics,
    save_signals,
)
from recovery.models import Cluster


class Command(BaseCommand):
    help = (
        "Inspect a Loki/VictoriaLogs store (--logs) and a Prometheus with DCGM metrics "
        "(--metrics): labels, a classified sample, signals present and missing, a proposed "
        "label mapping. With --cluster, save it to that cluster's settings after confirmation."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--logs", metavar="URL", help="Loki or VictoriaLogs base URL")
        parser.add_argument("--kind", choices=["loki", "victorialogs"], help="skip detection")
        parser.add_argument("--metrics", metavar="URL", help="Prometheus base URL")
        parser.add_argument("--job", metavar="JOBID", default="", help="job to sample")
        parser.add_argument("--cluster", metavar="NAME", help="cluster to save the settings to")
        parser.add_argument("--yes", action="store_true", help="save without asking")
        parser.add_argument("--timeout", type=float, default=10.0, help="seconds per request")

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["logs"] and not options["metrics"]:
            raise CommandError("give --logs URL, --metrics URL or both")
        cluster = None
        if options["cluster"]:
            cluster = Cluster.objects.filter(name=options["cluster"]).first()
            if cluster is None:
                raise CommandError(f"no cluster is called {options['cluster']!r}")
        logs = metrics = None
        if options["logs"]:
            logs = inspect_logs(
                options["logs"],
                kind=options["kind"] or "",
                job_id=options["job"],
                timeout=options["timeout"],
            )
            self._show_logs(logs)
        if options["metrics"]:
            metrics = inspect_metrics(options["metrics"], timeout=options["timeout"])
            self._show_metrics(metrics)
        usable = [r for r in (logs, metrics) if r is not None and r.ok]
        if cluster is None:
            self.stdout.write("Not saved: name a cluster with --cluster to save these settings.")
        elif not usable:
            self.stdout.write("Nothing to save: no store could be read.")
        elif options["yes"] or self._confirmed(cluster):
            save_signals(cluster, logs=logs, metrics=metrics)
            self.stdout.write(self.style.SUCCESS(f"Saved to cluster {cluster.name}."))
        else:
            self.stdout.write("Not saved.")
        if any(r is not None and not r.ok for r in (logs, metrics)):
            raise CommandError("a store could not be used; see the diagnosis above")

    def _confirmed(self, cluster: Cluster) -> bool:
        answer = input(f"Save these settings to cluster {cluster.name}? [y/N] ")
        return answer.strip().lower() in {"y", "yes"}

    def _show_logs(self, report: LogsInspection) -> None:
        self.stdout.write(f"Logs: {report.url}")
        if report.kind:
            self.stdout.write(f"  store: {report.kind}")
        if report.labels:
            self.stdout.write("  labels: " + ", ".join(sorted(report.labels)))
        if report.mapping:
            proposal = ", ".join(f"{role}={name}" for role, name in report.mapping.items())
            self.stdout.write(f"  proposed mapping: {proposal}")
        if report.sample_job:
            self.stdout.write(f"  sample: job {report.sample_job}, {report.sample_lines} lines")
        self._show_signals(report)
        if report.diagnosis:
            self.stdout.write(self.style.ERROR(f"  problem: {report.diagnosis}"))

    def _show_metrics(self, report: MetricsInspection) -> None:
        self.stdout.write(f"Metrics: {report.url}")
        if report.node_label:
            self.stdout.write(f"  node label: {report.node_label} ({len(report.nodes)} nodes)")
        if report.metrics_present:
            self.stdout.write("  present: " + ", ".join(report.metrics_present))
        if report.metrics_missing:
            self.stdout.write("  missing: " + ", ".join(report.metrics_missing))
        self._show_signals(report)
        if report.diagnosis:
            self.stdout.write(self.style.ERROR(f"  problem: {report.diagnosis}"))

    def _show_signals(self, report: LogsInspection | MetricsInspection) -> None:
        for signal in report.signals:
            mark = "ok " if signal.present else "-- "
            self.stdout.write(f"  {mark}{signal.name}: {signal.detail}")
