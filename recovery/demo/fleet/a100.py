"""demo-a100: a cluster in monitor mode, where every action waits for an operator.

Its policy restarts a straggler without its slow node and stops a job after two attempts; the
stories are in ``a100_hardware`` and ``a100_software``.
"""

from __future__ import annotations

from recovery.choices import (
    ClusterMode,
    Connection,
    DivergenceAction,
    NodeHealth,
    OptInMode,
    SchedulerKind,
    StragglerAction,
)
from recovery.demo.fleet import a100_hardware, a100_software
from recovery.demo.fleet.builder import Build, Builder
from recovery.demo.fleet.parts import NodeSpec, a100, hostlist, opt_in

A100_CLUSTER = "demo-a100"
A100_CONTROLLER = "controller:slurm-advisor-1"
A100_NODES = a100(*range(1, 17))


def seed_a100(b: Builder) -> None:
    cluster = b.cluster(
        A100_CLUSTER,
        scheduler_kind=SchedulerKind.SIMULATED,
        connection=Connection.SIMULATED,
        mode=ClusterMode.MONITOR,
        acknowledge_scheduler_actions=False,
        environment="prod",
        connection_settings={"recorded": {"nodes": hostlist(A100_NODES), "gpus_per_node": 8}},
    )
    b.policy(
        cluster,
        "demo-a100",
        straggler_action=StragglerAction.RESTART_EXCLUDING,
        divergence_action=DivergenceAction.STOP,
        max_attempts=2,
    )
    allocated = {*a100(1, 2, 3, 4, 5, 6, 8, 9, 11), *a100(12, 13), *a100(15, 16)}
    specs = {
        name: NodeSpec(state="ALLOCATED" if name in allocated else "IDLE") for name in A100_NODES
    }
    specs[a100(7)[0]] = NodeSpec(
        state="DRAINED",
        reason="Xid 79 GPU fell off the bus",
        health=NodeHealth.UNHEALTHY,
        times_implicated=1,
        implicated_hours_ago=10.2,
        excluded_hours=24,
    )
    specs[a100(12)[0]] = NodeSpec(
        state="ALLOCATED",
        health=NodeHealth.SUSPECT,
        times_implicated=1,
        implicated_hours_ago=0.6,
    )
    specs[a100(14)[0]] = NodeSpec(
        state="IDLE",
        health=NodeHealth.SUSPECT,
        times_implicated=1,
        implicated_hours_ago=1.6,
    )
    b.nodes(cluster, A100_NODES, specs)

    def story(job_id: str, build: Build, **fields: object) -> None:
        b.story(cluster, job_id, build, controller=A100_CONTROLLER, **fields)

    observe = opt_in(OptInMode.OBSERVE)
    story(
        "48188",
        a100_hardware.llama70b_first,
        name="llama-70b-pretrain",
        user="mchen",
        partition="gpu-long",
        workflow="llama-70b-pretrain-v3",
        submit_time=b.ago(hours=47, minutes=36),
        **observe,
    )
    story(
        "48191",
        a100_software.whisper,
        name="whisper-large-v3-distill",
        user="apatel",
        partition="gpu",
        submit_time=b.ago(hours=44, minutes=6),
        **observe,
    )
    story(
        "48198",
        a100_hardware.deepseek_ib,
        name="deepseek-moe-16b-pretrain",
        user="lwang",
        partition="gpu-long",
        submit_time=b.ago(hours=38, minutes=14),
        **observe,
    )
    story(
        "48201",
        a100_software.llama13b_nan,
        name="llama-13b-math-cpt",
        user="jnovak",
        partition="gpu",
        workflow="math-cpt-sweep-07",
        submit_time=b.ago(hours=34, minutes=2),
        **observe,
    )
    story(
        "48205",
        a100_software.neox_storage,
        name="gpt-neox-20b-finetune",
        user="skumar",
        partition="gpu",
        submit_time=b.ago(hours=30, minutes=3),
        **observe,
    )
    story(
        "48209",
        a100_software.mistral_oom,
        name="mistral-7b-sft-32k",
        user="emartin",
        partition="gpu",
        submit_time=b.ago(hours=27, minutes=1),
        **observe,
    )
    story(
        "48213",
        a100_hardware.llama70b_xid,
        name="llama-70b-pretrain",
        user="mchen",
        partition="gpu-long",
        workflow="llama-70b-pretrain-v3",
        submit_time=b.ago(hours=23, minutes=34),
        **observe,
    )
    story(
        "48216",
        a100_software.sdxl_healthy,
        name="sdxl-finetune-product-shots",
        user="tnguyen",
        partition="gpu",
        submit_time=b.ago(hours=20, minutes=1),
        **observe,
    )
    story(
        "48221",
        a100_hardware.mixtral_straggler,
        name="mixtral-8x7b-sft",
        user="fsilva",
        partition="gpu",
        workflow="mixtral-sft-r4",
        submit_time=b.ago(hours=14, minutes=2),
        **observe,
    )
    story(
        "48224",
        a100_software.qwen_illegal_access,
        name="qwen2-72b-sft",
        user="ychoi",
        partition="gpu",
        submit_time=b.ago(hours=9, minutes=4),
        **observe,
    )
    story(
        "48230",
        a100_software.vit_hang,
        name="vit-h-14-clip",
        user="okoval",
        partition="gpu",
        submit_time=b.ago(hours=4, minutes=1),
        **observe,
    )
    story(
        "48233",
        a100_software.bert_keyerror,
        name="bert-large-mlm-ablation",
        user="rkim",
        partition="gpu",
        submit_time=b.ago(hours=3, minutes=8),
        **observe,
    )
    story(
        "48238",
        a100_software.gemma_loss_spike,
        name="gemma-7b-cpt",
        user="hlee",
        partition="gpu",
        submit_time=b.ago(hours=2, minutes=16),
        **observe,
    )
    story(
        "48236",
        a100_software.not_opted_in,
        name="llama-8b-dpo",
        user="dpark",
        partition="gpu",
        submit_time=b.ago(minutes=41),
        opted_in=False,
        opt_in_error=(
            "job comment is not valid JSON: Expecting property name enclosed in double "
            "quotes: line 1 column 2 (char 1)"
        ),
    )
