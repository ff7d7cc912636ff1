from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponseRedirect
from django.templatetags.static import static
from django.urls import include, path

from api.metrics import metrics
from console.views.login import console_login, refuse_when_locked


def favicon(request: HttpRequest) -> HttpResponseRedirect:
    # Pages name their icon; browsers still ask for /favicon.ico on pages that do not (admin).
    return HttpResponseRedirect(static("console/icon.svg"))


urlpatterns = [
    path("favicon.ico", favicon),
    path("accounts/login/", console_login, name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    # Before the admin's own URLs: its sign-in form checks passwords too, so it is throttled
    # with the Console's.
    path("admin/login/", refuse_when_locked(admin.site.login)),
    path("admin/", admin.site.urls),
    path("metrics", metrics, name="metrics"),
    path("api/", include("api.urls")),
    path("", include("console.urls")),
]

# JSON under /api/, the Console's pages elsewhere.
handler404 = "api.errors.not_found"
handler500 = "api.errors.server_error"
