"""The REST API's resources under /api/v1/.

A router without a root view or format suffixes: api/urls.py routes approve/reject and goodput
under the same prefixes first, and these detail routes take digits only, so none is shadowed.
"""

from django.urls import URLPattern, URLResolver
from rest_framework.routers import SimpleRouter

from api.resources import views

router = SimpleRouter()
router.register("clusters", views.ClusterViewSet, basename="cluster")
router.register("nodes", views.NodeViewSet, basename="node")
router.register("workloads", views.WorkloadViewSet, basename="workload")
router.register("workflows", views.WorkflowViewSet, basename="workflow")
router.register("attempts", views.AttemptViewSet, basename="attempt")
router.register("anomalies", views.AnomalyViewSet, basename="anomaly")
router.register("verdicts", views.VerdictViewSet, basename="verdict")
router.register("recommendations", views.RecommendationViewSet, basename="recommendation")
router.register("audit-events", views.AuditEventViewSet, basename="auditevent")

urlpatterns: list[URLPattern | URLResolver] = list(router.urls)
