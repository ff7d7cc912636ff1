from django.urls import path

from api import advisor, views

app_name = "api"

urlpatterns = [
    path("v1/health/", views.health, name="health"),
    path("v1/advisor/recommendations/", advisor.ready, name="advisor-ready"),
    path(
        "v1/advisor/recommendations/<int:recommendation_id>/claim/",
        advisor.claim,
        name="advisor-claim",
    ),
    path(
        "v1/advisor/recommendations/<int:recommendation_id>/report/",
        advisor.report,
        name="advisor-report",
    ),
]
