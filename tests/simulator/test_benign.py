"""Benign events: what healthy jobs, their administrators and their nodes do that can look like
trouble, on a schedule drawn from the seed, and never a fault in the journal."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bench.soak import corpus
from recovery.detection.facts.slurm import node_state_finding
from recovery.detection.kernel_log.facts import DeviceFact, ProcessEvent, ProcessFact
from recovery.detection.kernel_log.reading import parse_kernel_log
from recovery.detection.tracebacks import Printed, printed_as
from recovery.simulator import benign
from recovery.simulator.cluster import SimConfig, SimulatedCluster
from recovery.simulator.cluster.benign import ADMIN_DRAIN_REASONS
from tests.simulator.test_cluster import START, log_text, quiet_config, run

STEP_LINE = re.compile(r"Z (\S+): step:\s+(\d+) ")


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "benign-corpus.json"
    corpus.write(path)
    return path


def benign_config(tmp_path: Path, corpus_file: Path, **rates: float) -> SimConfig:
    """A quiet cluster of one job whose benign events are only ``rates`` (per real hour)."""
    return quiet_config(
        tmp_path,
        benign_events=tuple(rates.items()),
        benign_corpus=str(corpus_file),
        benign_pause_seconds=(10.0, 20.0),
    )


def events_of(cluster: SimulatedCluster, kind: str | None = None) -> list[dict[str, Any]]:
    events = [dict(event) for event in cluster.benign_journal()["events"]]
    return [event for event in events if kind is None or event["kind"] == kind]


def step_times(text: str) -> list[float]:
    """When each progress line was printed (first rank), as epoch seconds."""
    times = []
    for line in text.splitlines():
        if STEP_LINE.search(line) and line.startswith("0: "):
            stamp = line.split(" ")[1]
            times.append(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp())
    return times


def test_rates_name_known_kinds_and_are_not_negative() -> None:
    with pytest.raises(ValueError, match="unknown benign event"):
        benign.BenignTable({"coffee_break": 1.0})
    with pytest.raises(ValueError, match="must not be negative"):
        benign.BenignTable({"eval_pause": -1.0})
    assert not benign.BenignTable({"eval_pause": 0.0}).enabled


def test_printing_real_text_needs_the_corpus(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="benign_corpus"):
        SimulatedCluster(quiet_config(tmp_path, benign_events=(("warning", 1.0),)), now=START)


def test_a_cluster_without_benign_events_saves_none_and_draws_as_before(
    tmp_path: Path, corpus_file: Path
) -> None:
    """GIVEN one cluster without benign events and one whose only benign events are kernel
    lines (they change nothing of the jobs) WHEN both run from the same seed THEN the jobs write
    the same bytes: benign events draw from a generator of their own."""
    plain = SimulatedCluster(quiet_config(tmp_path / "plain", faults_per_job_hour=20.0), now=START)
    with_kernel = SimulatedCluster(
        quiet_config(
            tmp_path / "kernel",
            faults_per_job_hour=20.0,
            benign_events=(("kernel_nvrm", 600.0), ("kernel_app_xid", 600.0)),
        ),
        now=START,
    )
    for cluster in (plain, with_kernel):
        run(cluster, 120)
    assert "benign" not in plain.to_state()
    assert events_of(with_kernel)
    names = sorted(path.name for path in (tmp_path / "plain" / "lab").glob("*.out"))
    assert names
    for name in names:
        assert (tmp_path / "plain" / "lab" / name).read_bytes() == (
            tmp_path / "kernel" / "lab" / name
        ).read_bytes()
    assert plain.journal() == with_kernel.journal()


def test_the_schedule_is_the_same_for_the_same_seed_and_another_for_another(
    tmp_path: Path, corpus_file: Path
) -> None:
    rates = dict(benign.SOAK_RATES)
    schedules = []
    for folder, seed in (("a", 3), ("b", 3), ("c", 4)):
        config = replace(
            benign_config(tmp_path / folder, corpus_file, **{k: v * 20 for k, v in rates.items()}),
            seed=seed,
            jobs=3,
        )
        cluster = SimulatedCluster(config, now=START)
        run(cluster, 240)
        schedules.append([(e["job_id"], e["at"], e["kind"]) for e in events_of(cluster)])
    assert schedules[0] and schedules[0] == schedules[1]
    assert schedules[0] != schedules[2]
    assert (tmp_path / "a" / "lab" / "1001.out").read_bytes() == (
        tmp_path / "b" / "lab" / "1001.out"
    ).read_bytes()


def test_an_evaluation_is_announced_and_no_step_completes_until_it_ends(
    tmp_path: Path, corpus_file: Path
) -> None:
    cluster = SimulatedCluster(benign_config(tmp_path, corpus_file, eval_pause=120.0), now=START)
    run(cluster, 300)
    pauses = events_of(cluster, "eval_pause")
    assert pauses
    text = log_text(cluster, "1001")
    times = step_times(text)
    for pause in pauses:
        assert 10.0 <= pause["detail"]["seconds"] <= 20.0
        assert pause["until"] == pytest.approx(pause["at"] + pause["detail"]["seconds"])
        inside = [t for t in times if pause["at"] < t < pause["until"]]
        assert inside == [], pause
    announced = text.index("***** Running Evaluation *****")
    assert "'eval_loss'" in text[announced:]


def test_a_checkpoint_pause_goes_from_its_start_line_to_its_saved_line(
    tmp_path: Path, corpus_file: Path
) -> None:
    cluster = SimulatedCluster(
        benign_config(tmp_path, corpus_file, checkpoint_pause=120.0), now=START
    )
    run(cluster, 300)
    pauses = events_of(cluster, "checkpoint_pause")
    assert pauses
    lines = log_text(cluster, "1001").splitlines()
    for pause in pauses:
        if pause["until"] > cluster.now:
            continue
        started = [i for i, line in enumerate(lines) if "saving checkpoint at iteration" in line]
        saved = [i for i, line in enumerate(lines) if "successfully saved checkpoint" in line]
        assert len(saved) >= len(pauses) - 1 and started
    # Between a long save's two lines nothing but other benign chatter: no step.
    for start in (i for i, line in enumerate(lines) if "saving checkpoint at iteration" in line):
        end = next(i for i in range(start, len(lines)) if "successfully saved" in lines[i])
        assert not any(STEP_LINE.search(line) for line in lines[start:end])


def test_a_stall_is_unannounced_and_shorter_than_a_quiet_phase_the_attempt_showed(
    tmp_path: Path, corpus_file: Path
) -> None:
    cluster = SimulatedCluster(
        benign_config(tmp_path, corpus_file, eval_pause=60.0, dataloader_stall=120.0),
        now=START,
    )
    run(cluster, 600)
    stalls = events_of(cluster, "dataloader_stall")
    assert stalls
    evals = events_of(cluster, "eval_pause")
    for stall in stalls:
        longest = max(e["detail"]["seconds"] for e in evals if e["at"] < stall["at"])
        assert stall["detail"]["longest_before"] == longest
        assert stall["detail"]["seconds"] <= 0.8 * longest
        assert stall["detail"]["announced"] == "none"


def test_a_handled_traceback_is_printed_as_logging_prints_it_with_its_source(
    tmp_path: Path, corpus_file: Path
) -> None:
    cluster = SimulatedCluster(
        benign_config(tmp_path, corpus_file, traceback_then_pause=200.0), now=START
    )
    run(cluster, 200)
    events = events_of(cluster, "traceback_then_pause")
    assert events
    sources = {
        entry["id"]: entry["source"] for entry in json.loads(corpus_file.read_text())["tracebacks"]
    }
    lines = log_text(cluster, "1001").splitlines()
    for event in events:
        assert event["detail"]["source"] == sources[event["detail"]["corpus"]]
        assert event["detail"]["then"] in {"eval", "checkpoint", "stall"}
    headers = [i for i, line in enumerate(lines) if line.split(": ", 1)[-1].startswith("Traceback")]
    assert headers
    for index in headers:
        before = lines[index - 1]
        assert "ERROR:" in before or "[ERROR] - " in before
        first_frame = lines[index + 1].split(": ", 1)[1]
        message_before = before.split("Z ", 1)[-1].split(": ", 1)[-1]
        assert printed_as(message_before, first_frame) == Printed.HANDLED


def test_an_administrators_requeue_and_a_users_cancel_are_their_commands_not_faults(
    tmp_path: Path, corpus_file: Path
) -> None:
    config = replace(
        benign_config(tmp_path, corpus_file, admin_requeue=120.0, user_cancel=40.0), jobs=2
    )
    cluster = SimulatedCluster(config, now=START)
    run(cluster, 600)
    journal = cluster.journal()
    assert journal["failures"] == []
    callers = {(c["argv"][0], c["argv"][1], c["caller"]) for c in journal["commands"]}
    assert ("scontrol", "requeue", benign.ADMINISTRATOR) in callers
    assert any(caller == benign.USER and argv0 == "scancel" for argv0, _, caller in callers)
    ended_by_command = [a for a in journal["attempts"] if a["end"] and a["by_command"]]
    assert {a["end"] for a in ended_by_command} <= {"requeued", "CANCELLED"}
    assert len(ended_by_command) == len(events_of(cluster, "admin_requeue")) + len(
        events_of(cluster, "user_cancel")
    )


def test_a_preemption_is_slurms_own_requeue_and_no_fault(tmp_path: Path, corpus_file: Path) -> None:
    cluster = SimulatedCluster(benign_config(tmp_path, corpus_file, preemption=120.0), now=START)
    run(cluster, 300)
    journal = cluster.journal()
    assert events_of(cluster, "preemption")
    assert journal["failures"] == [] and journal["commands"] == []
    assert any(a["end"] == "requeued" and not a["by_command"] for a in journal["attempts"])
    assert "DUE TO PREEMPTION" in log_text(cluster, "1001")


def test_a_node_drained_under_a_running_job_keeps_it_running_until_the_admin_resumes_it(
    tmp_path: Path, corpus_file: Path
) -> None:
    cluster = SimulatedCluster(benign_config(tmp_path, corpus_file, admin_drain=60.0), now=START)
    run(cluster, 30)
    for _ in range(60):
        run(cluster, 5)
        drains = events_of(cluster, "admin_drain")
        if drains:
            break
    drain = drains[0]
    node = next(n for n in cluster.nodes() if n.name == drain["node"])
    assert "DRAIN" in node.flags and not (node.reason or "").startswith("workload-recovery")
    job = next(j for j in cluster.jobs() if j.job_id == "1001")
    assert job.native_state == "RUNNING" and drain["node"] in job.nodes
    run(cluster, drain["until"] - cluster.now + 2)
    node = next(n for n in cluster.nodes() if n.name == drain["node"])
    assert "DRAIN" not in node.flags
    kernel = Path(cluster.kernel_log_template().replace("{node}", drain["node"])).read_text()
    assert "NVRM: loading NVIDIA UNIX x86_64 Kernel Module" in kernel
    on_node = [c for c in cluster.journal()["commands"] if f"NodeName={node.name}" in c["argv"]]
    assert [(c["argv"][3], c["caller"]) for c in on_node[:2]] == [
        ("State=DRAIN", benign.ADMINISTRATOR),
        ("State=RESUME", benign.ADMINISTRATOR),
    ]


def test_kernel_lines_hold_no_hardware_fact_and_xids_are_the_applications(
    tmp_path: Path, corpus_file: Path
) -> None:
    config = replace(
        benign_config(tmp_path, corpus_file, kernel_nvrm=200.0, kernel_app_xid=200.0), jobs=2
    )
    cluster = SimulatedCluster(config, now=START)
    run(cluster, 300)
    logs = list((tmp_path / "lab" / "kernel").glob("*.log"))
    assert logs
    xids = 0
    for path in logs:
        read = parse_kernel_log(path.read_bytes())
        assert read.continuations == 0 and read.foreign == 0
        for entry in read.entries:
            assert not isinstance(entry.fact, DeviceFact)
            assert isinstance(entry.fact, ProcessFact)
            assert entry.fact.event == ProcessEvent.APPLICATION_XID and entry.fact.job_id is None
            assert entry.fact.detail["xid"] in {13, 31, 43}
            xids += 1
    assert xids == len(events_of(cluster, "kernel_app_xid")) > 0


def test_a_slow_rank_slows_its_node_and_recovers(tmp_path: Path, corpus_file: Path) -> None:
    cluster = SimulatedCluster(benign_config(tmp_path, corpus_file, slow_rank=30.0), now=START)
    run(cluster, 600)
    slow = events_of(cluster, "slow_rank")
    assert len(slow) >= 2
    first, second = slow[0], slow[1]
    assert benign.SLOW_RANK_FACTOR[0] <= first["detail"]["factor"] <= benign.SLOW_RANK_FACTOR[1]
    throughput: dict[str, list[float]] = {"before": [], "slow": [], "after": []}
    for at, node, value in node_throughput(log_text(cluster, "1001")):
        if node != first["node"] or at >= second["at"]:
            continue
        phase = "before" if at < first["at"] else "slow" if at < first["until"] else "after"
        if phase != "after" or at > first["until"] + 5:  # the first step after is still slow
            throughput[phase].append(value)
    assert throughput["slow"] and throughput["after"]
    assert max(throughput["slow"]) < min(throughput["before"] + throughput["after"])


def node_throughput(text: str) -> list[tuple[float, str, float]]:
    found = []
    for line in text.splitlines():
        step = STEP_LINE.search(line)
        if step is None:
            continue
        stamp = line.split(" ")[1]
        at = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        found.append(
            (at, step.group(1), float(line.rsplit("tps: ", 1)[1].split()[0].replace(",", "")))
        )
    return found


def test_warnings_are_real_lines_with_this_jobs_time_host_and_rank(
    tmp_path: Path, corpus_file: Path
) -> None:
    cluster = SimulatedCluster(benign_config(tmp_path, corpus_file, warning=300.0), now=START)
    run(cluster, 120)
    warnings = events_of(cluster, "warning")
    assert warnings
    text = log_text(cluster, "1001")
    assert "cvlab189" not in text and "2024-09-11" not in text
    for event in warnings:
        assert event["detail"]["source"].startswith("https://github.com/")


def test_a_cluster_restored_from_its_state_goes_on_with_the_same_benign_events(
    tmp_path: Path, corpus_file: Path
) -> None:
    """GIVEN two clusters of one seed WHEN one is saved and restored (as every process using it
    does) at each tick THEN both have the same benign events and write the same bytes."""
    rates = {name: rate * 20 for name, rate in benign.SOAK_RATES}
    kept = SimulatedCluster(benign_config(tmp_path / "kept", corpus_file, **rates), now=START)
    config = benign_config(tmp_path / "saved", corpus_file, **rates)
    saved = SimulatedCluster(config, now=START)
    for _ in range(240):
        now = datetime.fromtimestamp(kept.now, tz=UTC) + timedelta(seconds=0.5)
        kept.advance(now)
        saved = SimulatedCluster(config, json.loads(json.dumps(saved.to_state())), now=now)
        saved.advance(now)
        saved.to_state()
    assert events_of(kept) and events_of(kept) == events_of(saved)
    assert (tmp_path / "kept" / "lab" / "1001.out").read_bytes() == (
        tmp_path / "saved" / "lab" / "1001.out"
    ).read_bytes()


def test_a_hung_job_prints_nothing_benign_until_it_is_restarted(
    tmp_path: Path, corpus_file: Path
) -> None:
    cluster = SimulatedCluster(
        benign_config(tmp_path, corpus_file, warning=600.0, eval_pause=300.0), now=START
    )
    now = run(cluster, 30)
    cluster.inject("1001", "hang", 0, now.timestamp())
    run(cluster, 5)
    before = len(events_of(cluster))
    size = Path(cluster.log_path("1001")).stat().st_size
    run(cluster, 120)
    assert len(events_of(cluster)) == before
    assert Path(cluster.log_path("1001")).stat().st_size == size


def test_an_administrators_maintenance_reason_names_no_failing_component() -> None:
    """Found by the first full soak: a drain "replace fan tray" is the scheduler's word that the
    node has a hardware problem, and the loop rightly kept the node out of every restart; a
    benign drain is routine maintenance."""
    for reason in ADMIN_DRAIN_REASONS:
        finding = node_state_finding("gpu-0001", "MIXED+DRAIN", reason)
        assert finding is not None and finding.attribution == "unknown", reason
