from django.urls import path

from console import views

app_name = "console"

urlpatterns = [
    path("", views.fleet, name="fleet"),
    path("workloads/<int:workload_id>/", views.workload_detail, name="workload"),
    path("approvals/", views.approvals, name="approvals"),
    path("nodes/", views.nodes, name="nodes"),
    path(
        "recommendations/<int:recommendation_id>/approve/",
        views.decide,
        {"decision": "approve"},
        name="approve",
    ),
    path(
        "recommendations/<int:recommendation_id>/reject/",
        views.decide,
        {"decision": "reject"},
        name="reject",
    ),
]
