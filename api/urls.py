from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from api import advisor, decisions, goodput, job_tokens, readiness, views

app_name = "api"

urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api:schema"), name="docs"),
    path("v1/health/", views.health, name="health"),
    path("v1/workloads/<int:workload_id>/goodput/", goodput.workload, name="workload-goodput"),
    path("v1/clusters/<int:cluster_id>/goodput/", goodput.cluster, name="cluster-goodput"),
    path(
        "v1/clusters/<str:cluster_name>/readiness/",
        readiness.cluster_readiness,
        name="cluster-readiness",
    ),
    path(
        "v1/recommendations/<int:recommendation_id>/approve/",
        decisions.approve,
        name="recommendation-approve",
    ),
    path(
        "v1/recommendations/<int:recommendation_id>/reject/",
        decisions.reject,
        name="recommendation-reject",
    ),
    path("v1/clusters/<int:cluster_id>/job-tokens/", job_tokens.issue, name="job-token-issue"),
    path("v1/job-tokens/<int:token_id>/revoke/", job_tokens.revoke, name="job-token-revoke"),
    path("v1/ingest/", include("api.ingest.urls")),
    path("v1/", include("api.resources.urls")),
    path("v1/advisor/recommendations/", advisor.ready, name="advisor-ready"),
    path("v1/advisor/identity/", advisor.identity, name="advisor-identity"),
    path(
        "v1/advisor/recommendations/<int:recommendation_id>/renew/",
        advisor.renew,
        name="advisor-renew",
    ),
    path(
        "v1/advisor/recommendations/<int:recommendation_id>/claim/",
        advisor.claim,
        name="advisor-claim",
    ),
    path(
        "v1/advisor/recommendations/<int:recommendation_id>/dispatch/",
        advisor.dispatch,
        name="advisor-dispatch",
    ),
    path(
        "v1/advisor/recommendations/<int:recommendation_id>/report/",
        advisor.report,
        name="advisor-report",
    ),
]
