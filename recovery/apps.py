from django.apps import AppConfig


class RecoveryConfig(AppConfig):
    name = "recovery"
    verbose_name = "Workload Recovery"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the simulated clusters' adapter builder beside Slurm's: the scheduler
        # package knows no simulator, and a cluster's poll finds every builder here.
        from recovery.simulator import adapter  # noqa: F401
