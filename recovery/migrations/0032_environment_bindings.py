"""Environment bindings: which jobs may choose an environment's policy beyond their own job.

Also the job's account (a binding may name it), and the policy settings' help saying which
policy each is read from.
"""

import django.core.validators
import django.db.models.deletion
from django.contrib.auth.management import create_permissions
from django.db import migrations, models

import recovery.models.policy
from recovery.roles import ROLE_PERMISSIONS, ROLES

SITE_SETTING = "Effects on nodes and other jobs: read from the cluster's policy."


def roles_get_environment_bindings(apps, schema_editor):
    # Permissions are normally created after all migrations; the roles need these now.
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    Permission = apps.get_model("auth", "Permission")
    for group in apps.get_model("auth", "Group").objects.filter(name__in=ROLES):
        codenames = [c for c in ROLE_PERMISSIONS[group.name] if c.endswith("_environmentbinding")]
        group.permissions.add(
            *Permission.objects.filter(content_type__app_label="recovery", codename__in=codenames)
        )


class Migration(migrations.Migration):
    dependencies = [("recovery", "0031_node_state_read")]

    operations = [
        migrations.AddField(
            model_name="workload",
            name="account",
            field=models.CharField(
                blank=True,
                help_text="The account the scheduler charges the job to; empty when it has none "
                "or it is unknown, and then no environment binding by account applies to the job.",
                max_length=64,
            ),
        ),
        migrations.AlterField(
            model_name="policy",
            name="blast_radius_percent",
            field=models.PositiveIntegerField(
                default=10,
                help_text="Never exclude, restart or drain more than this share of the cluster in "
                "the window. " + SITE_SETTING,
                validators=[
                    django.core.validators.MinValueValidator(1),
                    django.core.validators.MaxValueValidator(100),
                ],
            ),
        ),
        migrations.AlterField(
            model_name="policy",
            name="blast_radius_window_minutes",
            field=models.PositiveIntegerField(
                default=60,
                help_text=SITE_SETTING,
                validators=[
                    django.core.validators.MinValueValidator(1),
                    django.core.validators.MaxValueValidator(1440),
                ],
            ),
        ),
        migrations.AlterField(
            model_name="policy",
            name="environment",
            field=models.CharField(
                blank=True,
                help_text="Empty: any. A job naming this environment gets this policy for its own "
                "recovery; for effects on nodes and other jobs only where it is the cluster's "
                "environment or an environment binding lets the job's partition or account "
                "choose it.",
                max_length=63,
            ),
        ),
        migrations.AlterField(
            model_name="policy",
            name="exclude_on_attributions",
            field=models.JSONField(
                blank=True,
                default=recovery.models.policy.default_exclusion_attributions,
                help_text="Attributions whose implicated nodes are excluded from the job's next "
                "attempt. In the cluster's policy also: the site facts that exclude a node on the "
                "cluster or count towards making it suspect.",
            ),
        ),
        migrations.AlterField(
            model_name="policy",
            name="exclude_on_categories",
            field=models.JSONField(
                blank=True,
                default=recovery.models.policy.default_exclusion_categories,
                help_text="Failure categories whose implicated nodes are excluded, as for the "
                "attributions above.",
            ),
        ),
        migrations.AlterField(
            model_name="policy",
            name="exclusion_hours",
            field=models.PositiveIntegerField(
                default=24,
                help_text="How long implicated nodes stay out of the job's own next attempts. In "
                "the cluster's policy also: how long a node a site fact implicated stays excluded "
                "on the cluster, an unhealthy node stays out of every restart, and a rejected "
                "drain is not asked again.",
                validators=[
                    django.core.validators.MinValueValidator(1),
                    django.core.validators.MaxValueValidator(2160),
                ],
            ),
        ),
        migrations.AlterField(
            model_name="policy",
            name="keep_out_cluster_nodes",
            field=models.JSONField(
                blank=True,
                default=recovery.models.policy.default_cluster_node_states,
                help_text="Nodes in these states on the cluster are kept out of every job's "
                "restart, besides the job's own implicated nodes (excluded, unhealthy, suspect). "
                "Empty: only the job's own. " + SITE_SETTING,
            ),
        ),
        migrations.AlterField(
            model_name="policy",
            name="recommendation_ttl_minutes",
            field=models.PositiveIntegerField(
                default=30,
                help_text="A ready recommendation nobody executed expires after this long; for "
                "drains and resumes, as the cluster's policy says.",
                validators=[
                    django.core.validators.MinValueValidator(1),
                    django.core.validators.MaxValueValidator(10080),
                ],
            ),
        ),
        migrations.AlterField(
            model_name="policy",
            name="suspect_node_workloads",
            field=models.PositiveIntegerField(
                default=3,
                help_text="A node implicated in this many workloads within the window is "
                "suspect. " + SITE_SETTING,
                validators=[
                    django.core.validators.MinValueValidator(2),
                    django.core.validators.MaxValueValidator(1000),
                ],
            ),
        ),
        migrations.AlterField(
            model_name="policy",
            name="suspect_window_hours",
            field=models.PositiveIntegerField(
                default=24,
                help_text=SITE_SETTING,
                validators=[
                    django.core.validators.MinValueValidator(1),
                    django.core.validators.MaxValueValidator(2160),
                ],
            ),
        ),
        migrations.CreateModel(
            name="EnvironmentBinding",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "environment",
                    models.CharField(help_text="As jobs name it in their comment.", max_length=63),
                ),
                (
                    "partition",
                    models.CharField(
                        blank=True,
                        help_text="Jobs running on this partition. Empty: any partition of the "
                        "given account.",
                        max_length=64,
                    ),
                ),
                (
                    "account",
                    models.CharField(
                        blank=True,
                        help_text="Jobs charged to this account, as the scheduler reports it. "
                        "Empty: any account on the given partition. With both, a job needs both.",
                        max_length=64,
                    ),
                ),
                (
                    "any_job",
                    models.BooleanField(
                        default=False,
                        help_text="Every job on the cluster may choose this environment for "
                        "effects on nodes and other jobs. Partition and account stay empty.",
                        verbose_name="any job on the cluster",
                    ),
                ),
                (
                    "note",
                    models.CharField(
                        blank=True, help_text="Why, for the next person.", max_length=255
                    ),
                ),
                ("updated_at", models.DateTimeField(auto_now=True)),
                (
                    "cluster",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="environment_bindings",
                        to="recovery.cluster",
                    ),
                ),
            ],
            options={
                "ordering": ["cluster", "environment", "partition", "account"],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("cluster", "environment", "partition", "account"),
                        name="environment_binding_scope",
                        violation_error_message="This cluster already binds this environment to "
                        "the same partition and account; edit that binding instead.",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(any_job=True, partition="", account="")
                        | (
                            models.Q(any_job=False)
                            & (~models.Q(partition="") | ~models.Q(account=""))
                        ),
                        name="environment_binding_says_which_jobs",
                        violation_error_message="Say which jobs may choose this environment: a "
                        "partition, an account or both, or any job on the cluster (then neither).",
                    ),
                ],
            },
        ),
        migrations.RunPython(roles_get_environment_bindings, migrations.RunPython.noop),
    ]
