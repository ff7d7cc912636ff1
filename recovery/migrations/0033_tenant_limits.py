from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("recovery", "0032_environment_bindings")]

    operations = [
        migrations.AddField(
            model_name="recommendation",
            name="lease_instance",
            field=models.CharField(
                blank=True,
                help_text="The controller process holding the lease (the instance id it made at "
                "start): two controllers sharing one token are two holders.",
                max_length=64,
            ),
        ),
        migrations.AlterField(
            model_name="ingesttoken",
            name="job_submit_time",
            field=models.DateTimeField(
                blank=True,
                help_text="With job_id: that job's submit time, so a reused id fails. Tokens "
                "issued without one (before it was required) cover no job.",
                null=True,
            ),
        ),
        migrations.AlterField(
            model_name="auditevent",
            name="kind",
            field=models.CharField(
                choices=[
                    ("detected", "Detected"),
                    ("confirmed", "Crash confirmed"),
                    ("survived", "Crash survived"),
                    ("stalled", "Stalled after an error"),
                    ("attributed", "Attributed"),
                    ("recommended", "Recommended"),
                    ("approved", "Approved"),
                    ("rejected", "Rejected"),
                    ("superseded", "Superseded"),
                    ("expired", "Expired"),
                    ("claimed", "Claimed by a controller"),
                    ("lease_expired", "Controller lease expired"),
                    ("dispatched", "Dispatched"),
                    ("scheduler_action", "Scheduler action"),
                    ("action_skipped", "Action skipped (already done)"),
                    ("action_failed", "Action failed"),
                    ("action_retry", "Action to be retried"),
                    ("report_refused", "Controller report refused"),
                    ("watchdog_released", "Released by the watchdog"),
                    ("state_changed", "Scheduler state changed"),
                    ("restart_allocated", "Restart allocated"),
                    ("progress_resumed", "Progress resumed"),
                    ("checkpoint_saved", "Checkpoint saved"),
                    ("training_completed", "Training completed"),
                    ("stopped", "Stopped"),
                    ("input_ignored", "Input ignored"),
                    ("node_suspect", "Node flagged as suspect"),
                    ("node_returned", "Node returned to service"),
                    ("policy_failed", "Policy engine failed"),
                    ("attribution_degraded", "Attribution provider unavailable"),
                    ("anomalies_folded", "Anomaly cap reached"),
                    ("scheduler_hook", "Scheduler hook received"),
                    ("abandonment_acknowledged", "Abandoned action acknowledged"),
                    ("mode_changed", "Cluster mode changed"),
                    ("acknowledgement_changed", "Acknowledgement of scheduler actions changed"),
                    ("automatic_drain_changed", "Automatic drains changed"),
                    ("drain_withheld", "Drain withheld (blast radius)"),
                    ("drain_refused", "Drain refused (node not recovery's)"),
                ],
                max_length=32,
            ),
        ),
    ]
