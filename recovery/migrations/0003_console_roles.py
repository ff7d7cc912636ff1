"""Create the Console roles as groups: viewer, operator and admin."""

from django.contrib.auth.management import create_permissions
from django.db import migrations

VIEW_MODELS = [
    "cluster",
    "node",
    "workload",
    "attempt",
    "anomaly",
    "verdict",
    "recommendation",
    "auditevent",
    "policy",
    "detectionpattern",
]
ADMIN_CHANGE_MODELS = ["cluster", "node", "workload", "policy", "detectionpattern"]


def create_roles(apps, schema_editor):
    # Permissions are normally created after all migrations; the groups need them now.
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None

    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")

    def perms(codenames):
        found = list(
            Permission.objects.filter(content_type__app_label="recovery", codename__in=codenames)
        )
        missing = set(codenames) - {p.codename for p in found}
        if missing:
            raise RuntimeError(f"permissions missing: {sorted(missing)}")
        return found

    view = [f"view_{model}" for model in VIEW_MODELS]
    decide = ["decide_recommendation"]
    change = [
        f"{action}_{model}"
        for model in ADMIN_CHANGE_MODELS
        for action in ("add", "change", "delete")
    ]

    viewer, _ = Group.objects.get_or_create(name="viewer")
    viewer.permissions.set(perms(view))
    operator, _ = Group.objects.get_or_create(name="operator")
    operator.permissions.set(perms(view + decide))
    admin, _ = Group.objects.get_or_create(name="admin")
    admin.permissions.set(perms(view + decide + change))


def remove_roles(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(
        name__in=["viewer", "operator", "admin"]
    ).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("recovery", "0002_audit_event_append_only_triggers"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_roles, remove_roles)]
