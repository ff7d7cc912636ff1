from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("recovery", "0018_evidence_trust"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="auditevent",
            index=models.Index(
                fields=["cluster", "workload", "occurred_at"], name="recovery_au_cluster_6cfae2_idx"
            ),
        ),
    ]
