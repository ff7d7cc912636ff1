from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("recovery", "0030_divergence_and_slowdown")]

    operations = [
        migrations.AlterField(
            model_name="node",
            name="scheduler_state",
            field=models.CharField(blank=True, max_length=255),
        ),
        migrations.AddField(
            model_name="node",
            name="state_flags",
            field=models.JSONField(
                blank=True,
                default=list,
                help_text="Every flag of the state as the last poll read it (DRAIN, "
                "NOT_RESPONDING...).",
            ),
        ),
        migrations.AddField(
            model_name="node",
            name="reason_set_by",
            field=models.CharField(
                blank=True, help_text="Who set the reason, where the scheduler says.", max_length=64
            ),
        ),
        migrations.AddField(
            model_name="node",
            name="reason_set_at",
            field=models.DateTimeField(
                blank=True,
                help_text="When the reason was set, where the scheduler says.",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="node",
            name="unreadable",
            field=models.JSONField(
                blank=True,
                default=dict,
                help_text="What the last poll could not read of the node, and why. With its state "
                "or reason unknown, recovery neither drains nor resumes the node.",
            ),
        ),
    ]
