from django.urls import path

from console.views import (
    approvals,
    approvals_count,
    audit,
    clusters,
    fleet,
    insights,
    nodes,
    readiness,
    replay,
    signals,
    unexplained,
    workflows,
    workloads,
)

app_name = "console"

urlpatterns = [
    path("", fleet.fleet, name="fleet"),
    path("workloads/<int:workload_id>/", workloads.workload_detail, name="workload"),
    path(
        "workloads/<int:workload_id>/timeline.json",
        workloads.workload_timeline,
        name="workload_timeline",
    ),
    path("workflows/", workflows.workflow_list, name="workflows"),
    path("workflows/<int:workflow_id>/", workflows.workflow_detail, name="workflow"),
    path(
        "workflows/<int:workflow_id>/timeline.json",
        workflows.workflow_timeline,
        name="workflow_timeline",
    ),
    path("approvals/", approvals.approvals, name="approvals"),
    path("approvals/count/", approvals_count.approvals_count, name="approvals_count"),
    path("approvals/bulk/", approvals.bulk_decide, name="bulk_decide"),
    path(
        "recommendations/<int:recommendation_id>/approve/",
        approvals.decide,
        {"decision": "approve"},
        name="approve",
    ),
    path(
        "recommendations/<int:recommendation_id>/reject/",
        approvals.decide,
        {"decision": "reject"},
        name="reject",
    ),
    path(
        "recommendations/<int:recommendation_id>/acknowledge/",
        approvals.acknowledge,
        name="acknowledge",
    ),
    path("nodes/", nodes.nodes, name="nodes"),
    path("nodes/<int:node_id>/return/", nodes.return_node, name="return_node"),
    path("nodes/<int:node_id>/resume/", nodes.resume_node, name="resume_node"),
    path("unexplained/", unexplained.unexplained, name="unexplained"),
    path(
        "unexplained/<int:anomaly_id>/teach/",
        unexplained.teach_pattern,
        name="teach_pattern",
    ),
    path("insights/", insights.insights, name="insights"),
    path("audit/", audit.audit_trail, name="audit"),
    path("audit/export.csv", audit.audit_csv, name="audit_csv"),
    path("audit/<int:event_id>/", audit.audit_event, name="audit_event"),
    path("clusters/", clusters.clusters, name="clusters"),
    path("clusters/<int:cluster_id>/signals/", signals.cluster_signals, name="cluster_signals"),
    path("clusters/<int:cluster_id>/readiness/", readiness.readiness, name="readiness"),
    path("clusters/<int:cluster_id>/replay/", replay.replay, name="replay"),
]
