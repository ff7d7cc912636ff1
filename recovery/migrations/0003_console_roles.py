"""Create the Console roles as groups: viewer, operator and admin."""

from django.contrib.auth.management import create_permissions
from django.db import migrations

from recovery.roles import ROLE_PERMISSIONS, ROLES, sync_roles

# The roles as they were at this migration: models added since have no permission yet here,
# and the migration that adds one grants it.
ADDED_SINCE = {"view_workflow"} | {
    f"{verb}_environmentbinding" for verb in ("view", "add", "change", "delete")
}
ROLES_THEN = {
    role: [codename for codename in codenames if codename not in ADDED_SINCE]
    for role, codenames in ROLE_PERMISSIONS.items()
}


def create_roles(apps, schema_editor):
    # Permissions are normally created after all migrations; the groups need them now.
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    sync_roles(apps.get_model("auth", "Group"), apps.get_model("auth", "Permission"), ROLES_THEN)


def remove_roles(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=ROLES).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("recovery", "0002_audit_event_append_only_triggers"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_roles, remove_roles)]
