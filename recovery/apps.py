from django.apps import AppConfig


class RecoveryConfig(AppConfig):
    name = "recovery"
    verbose_name = "Workload Recovery"
    default_auto_field = "django.db.models.BigAutoField"
