from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "Recovery Console"

    def ready(self) -> None:
        # Connects the receivers that count failed sign-ins.
        from console import login_throttle  # noqa: F401
