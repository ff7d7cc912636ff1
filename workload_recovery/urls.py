from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from console.forms import ConsoleLoginForm

urlpatterns = [
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(
            authentication_form=ConsoleLoginForm, redirect_authenticated_user=True
        ),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/", include("api.urls")),
    path("", include("console.urls")),
]
