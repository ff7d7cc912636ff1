"""Refuse UPDATE and DELETE of audit events inside MySQL/MariaDB itself.

The ORM already refuses them; the triggers also stop raw SQL and other clients. SQLite has no
such triggers here because Django's test flush clears tables with DELETE there.
"""

from django.db import migrations

TRIGGERS = {
    "recovery_auditevent_no_update": "UPDATE",
    "recovery_auditevent_no_delete": "DELETE",
}


def create_triggers(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    for name, operation in TRIGGERS.items():
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}")
        schema_editor.execute(
            f"CREATE TRIGGER {name} BEFORE {operation} ON recovery_auditevent "
            "FOR EACH ROW SIGNAL SQLSTATE '45000' "
            "SET MESSAGE_TEXT = 'audit events are append-only: they cannot be updated or deleted'"
        )


def drop_triggers(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    for name in TRIGGERS:
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [("recovery", "0001_initial")]

    operations = [migrations.RunPython(create_triggers, drop_triggers, atomic=False)]
