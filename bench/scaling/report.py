"""What ``make bench-scale`` prints: the per-step tables, one poll taken apart, the verdict.

The verdict names the largest step within the latency targets and what saturates first; the
scaling-out notes follow it.
"""

from __future__ import annotations

import os

from bench.scaling.console_probe import describe
from bench.scaling.steps import (
    MIN_SAMPLES,
    TARGET_IDLE_JOB_COST_MS,
    TARGET_MEDIAN_S,
    TARGET_P95_S,
    Step,
    StepResult,
    median,
    percentile,
    seconds,
)


def cpu_text(cpu: dict[str, float]) -> str:
    return " ".join(f"{role.split()[0]} {value:.0f}%" for role, value in cpu.items())


def print_table(results: list[StepResult], poll_seconds: int) -> None:
    print()
    header = (
        f"{'jobs':>5} {'nodes':>5} {'run':>4} {'written':>8} {'ingested':>8} {'backlog':>8} "
        f"{'poll s':>11} {'polls':>13} {'lag s':>10} {'LLEN':>7} {'sim lag':>8} "
        f"{'latency s':>11} {'n':>4} {'db q/s':>7}"
    )
    print(header)
    print(
        f"{'':>5} {'':>5} {'jobs':>4} {'lines/s':>8} {'lines/s':>8} {'lines':>8} "
        f"{'med/p95':>11} {'ok/skip/exp':>13} {'med/max':>10} {'med/max':>7} {'med s':>8} "
        f"{'med/p95':>11} {'':>4} {'':>7}"
    )
    for r in results:
        runtimes = r.poll_runtimes
        lags = r.queue_lags
        poll = f"{median(runtimes):.1f}/{percentile(runtimes, 95):.1f}" if runtimes else "-"
        lag = f"{median(lags):.1f}/{max(lags):.1f}" if lags else "-"
        llen = f"{median(r.queue_lengths):.0f}/{max(r.queue_lengths)}" if r.queue_lengths else "-"
        lat = (
            f"{seconds(median(r.latencies))}/{seconds(percentile(r.latencies, 95))}"
            if r.latencies
            else "-"
        )
        print(
            f"{r.step.jobs:>5} {r.step.nodes:>5} {r.jobs_running:>4.0f} {r.written_lines_s:>8,.0f} "
            f"{r.ingested_lines_s:>8,.0f} {r.backlog_lines:>8,} {poll:>11} "
            f"{f'{r.polls_done}/{r.polls_skipped}/{r.polls_expired}':>13} {lag:>10} {llen:>7} "
            f"{median(r.sim_lags):>8.1f} {lat:>11} {len(r.latencies):>4} {r.db_queries_s:>7,.0f}"
        )
    print(
        f"(poll every {poll_seconds} s; 'polls' ok/skipped by the cluster's poll lock/expired "
        "in the queue; latency: crashes whose evidence is a log line, evidence → 'detected' audit event)"
    )
    print()
    print(
        f"{'jobs':>5} {'nodes':>5} {'workers':>7} {'job polls':>9} {'shard s':>9} "
        f"{'shards':>9} {'queries':>8} {'worker CPU s':>12} {'lines /':>9} {'job polls /':>11} "
        f"{'reads':>6} {'read':>6}"
    )
    print(
        f"{'':>5} {'':>5} {'':>7} {'/s':>9} {'med/p95':>9} {'skip/exp':>9} {'/job poll':>8} "
        f"{'/1000 lines':>12} {'CPU s':>9} {'CPU s':>11} {'/s':>6} {'every':>6}"
    )
    for r in results:
        shard = (
            f"{median(r.shard_runtimes):.2f}/{percentile(r.shard_runtimes, 95):.2f}"
            if r.shard_runtimes
            else "-"
        )
        cpu_s = r.worker_cpu_s
        print(
            f"{r.step.jobs:>5} {r.step.nodes:>5} {r.workers:>7} "
            f"{r.job_polls / r.window_s if r.window_s else 0:>9,.0f} {shard:>9} "
            f"{f'{r.shards_skipped}/{r.shards_expired}':>9} {r.queries_per_job_poll:>8.2f} "
            f"{r.cpu_s_per_1000_lines:>12.3f} "
            f"{r.lines_ingested / cpu_s if cpu_s else 0:>9,.0f} "
            f"{r.job_polls / cpu_s if cpu_s else 0:>11,.0f} "
            f"{r.workloads_processed / r.window_s if r.window_s else 0:>6,.0f} "
            f"{seconds(r.read_interval_s):>6}"
        )
    print(
        "(job polls: opted-in jobs listed by the snapshots; reads: workloads the shard tasks "
        "read, and how often that reads each running job's output; shards expired: queued by "
        "a snapshot, never run before the next poll)"
    )
    print(
        "(worker CPU: user + system time of every worker process from /proc, so time spent "
        "waiting on MariaDB, Redis or files is not in it; MariaDB and Redis add "
        + ", ".join(f"{r.service_cpu_s_per_1000_lines:.3f}" for r in results)
        + " CPU s per 1000 lines)"
    )
    print()
    print(f"{'jobs':>5} {'nodes':>5}  CPU % of one core over the window, and other figures")
    for r in results:
        anomalies = ", ".join(f"{count} {label}" for label, count in sorted(r.anomalies.items()))
        print(
            f"{r.step.jobs:>5} {r.step.nodes:>5}  {cpu_text(r.cpu)}; machine {r.machine_busy:.0f}% "
            f"of {100 * (os.cpu_count() or 1)}%"
        )
        print(
            f"{'':>13}ingest {r.ingested_mb_s:.2f} MB/s; sim state {r.state_kb:,.0f} KB; "
            f"anomalies: {anomalies or 'none'}; {r.undetected_note}"
        )
        ran, skipped, expired = r.judges
        print(
            f"{'':>13}cluster checks and decisions (judge_cluster): {ran} ran, {skipped} skipped "
            f"(one still running), {expired} expired in the queue"
        )
        if r.console:
            print(f"{'':>13}Console while it ran: {describe(r.console)}")
        if r.stamp_early:
            print(
                f"{'':>13}Anomaly.detected_at is {median(r.stamp_early):.1f} s (median; max "
                f"{max(r.stamp_early):.1f} s) earlier than the detection was recorded"
            )


def print_profile(step: Step, runs: list[dict[str, tuple[float, int]]], top: str) -> None:
    print()
    print(f"One poll taken apart: {step.jobs} jobs on {step.nodes} nodes, in this process")
    labels = [label for label in runs[0] if label not in {"total", "summary"}]
    timed = runs[:-1] or runs
    total = median([run["total"][0] for run in timed])
    print(f"{'phase':<44}{'median s':>9}{'share':>7}{'queries':>9}{'ms/query':>9}")
    for label in sorted(labels, key=lambda name: -median([run[name][0] for run in timed])):
        spent = median([run[label][0] for run in timed])
        queries = median([run[label][1] for run in timed])
        per_query = f"{spent / queries * 1000:.2f}" if queries else ""
        print(f"{label:<44}{spent:>9.2f}{spent / total:>7.0%}{queries:>9,.0f}{per_query:>9}")
    queries = median([run["total"][1] for run in timed])
    log_bytes = median([run["summary"][0] for run in timed])
    print(
        f"{'whole poll':<44}{total:>9.2f}{1:>7.0%}{queries:>9,.0f}   "
        f"({log_bytes / 1e3:,.0f} KB of new output, {step.nodes:,} nodes, "
        f"{median([run['summary'][1] for run in timed]):.0f} jobs)"
    )
    print("\ncProfile of one more poll (top by own time):")
    lines = [line for line in top.splitlines() if line.strip()]
    start = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
    for line in lines[start:]:
        print("  " + line.strip()[:150])


def verdict(
    results: list[StepResult],
    reference: dict[str, float] | None,
    profiles: list[tuple[Step, list[dict[str, tuple[float, int]]], str]],
    poll_seconds: int,
) -> None:
    print()
    for r in results:
        if r.step.quiet:
            share = r.workloads_left_quiet / max(1, r.workloads_left_quiet + r.workloads_processed)
            print(
                f"Quiet, {r.step.jobs} jobs on {r.step.nodes} nodes: "
                f"{r.idle_job_cost_ms:.3f} ms of worker CPU per job poll, everything included "
                f"(target <= {TARGET_IDLE_JOB_COST_MS:g} ms); {share:.0%} of the workloads the "
                f"shards were given were left alone as quiet."
            )
    passing = [r for r in results if r.passed and not r.step.quiet]
    if passing:
        best = max(passing, key=lambda r: (r.ingested_lines_s, r.step.jobs))
        print(
            f"Sustained: {best.step.jobs} jobs on {best.step.nodes} nodes, "
            f"{best.ingested_lines_s:,.0f} log lines/s ingested, detection latency median "
            f"{seconds(median(best.latencies))} s / p95 "
            f"{seconds(percentile(best.latencies, 95))} s "
            f"(targets < {TARGET_MEDIAN_S:g} s / < {TARGET_P95_S:g} s, "
            f"{len(best.latencies)} crashes)."
        )
    else:
        print(
            f"No step kept the detection latency within median < {TARGET_MEDIAN_S:g} s and "
            f"p95 < {TARGET_P95_S:g} s."
        )
    for r in results:
        if r.step.quiet:
            continue
        state = "within" if r.passed else "MISSES"
        why = []
        if r.poll_runtimes and median(r.poll_runtimes) >= poll_seconds:
            why.append(
                f"a poll takes {median(r.poll_runtimes):.1f} s, "
                f"{median(r.poll_runtimes) / poll_seconds:.1f}x the {poll_seconds} s interval"
            )
        if r.polls_sent and (r.polls_skipped + r.polls_expired) / r.polls_sent > 0.3:
            why.append(
                f"{r.polls_skipped + r.polls_expired} of {r.polls_sent} polls skipped or expired"
            )
        if r.written_lines_s and r.ingested_lines_s < 0.9 * r.written_lines_s:
            why.append(
                f"ingests {r.ingested_lines_s / r.written_lines_s:.0%} of the lines written "
                f"({r.backlog_lines:,} lines behind at the end)"
            )
        if r.sim_lags and median(r.sim_lags) > 2.5:
            why.append(f"the simulator's clock lags {median(r.sim_lags):.1f} s")
        if r.queue_lags and median(r.queue_lags) > poll_seconds:
            why.append(f"polls wait {median(r.queue_lags):.1f} s in the queue")
        if r.cpu.get("mariadb", 0) > 80:
            why.append(f"MariaDB uses {r.cpu['mariadb']:.0f}% of a core")
        if r.missed:
            why.append(f"{r.missed} crashes never read before the drain ended")
        if len(r.latencies) < MIN_SAMPLES:
            why.append(f"only {len(r.latencies)} crashes measured")
        print(
            f"  {r.step.jobs:>5} jobs / {r.step.nodes:>5} nodes: {state} targets"
            + (f" - {'; '.join(why)}" if why else "")
        )
    if reference is not None and results:
        print()
        print(
            f"Reference, the detector alone on one core, on the largest step's logs "
            f"({reference['files']:.0f} files, {reference['mb']:.1f} MB, {reference['lines']:,.0f} "
            f"lines): {reference['whole_lines_s']:,.0f} lines/s ({reference['whole_mb_s']:.1f} "
            f"MB/s) as one stream; {reference['per_file_lines_s']:,.0f} lines/s scanning file by "
            f"file as ingestion does ({reference['per_file_ms']:.1f} ms per file)."
        )
        for r in results:
            print(
                f"  {r.step.jobs:>5} jobs / {r.step.nodes:>5} nodes: the system ingests "
                f"{r.ingested_lines_s:,.0f} lines/s = {r.ingested_lines_s / reference['whole_lines_s']:.3f}x "
                f"the detector alone"
            )
    for profile_step, profile_runs, _ in profiles:
        timed = profile_runs[:-1] or profile_runs
        total = median([run["total"][0] for run in timed])
        nodes = median([run.get("sync nodes", (0.0, 0))[0] for run in timed])
        jobs_part = total - nodes
        jobs = profile_step.jobs
        per_node = nodes / profile_step.nodes
        per_job = jobs_part / max(1, jobs)
        print()
        print(
            f"Where a poll's time goes at {jobs} jobs / {profile_step.nodes} nodes: "
            f"{nodes:.2f} s syncing nodes ({per_node * 1000:.2f} ms a node, every poll, changed "
            f"or not) and {jobs_part:.2f} s for the jobs ({per_job * 1000:.1f} ms a job: sync, "
            f"log ingestion, monitors), all in one process here; split across workers, only "
            f"the snapshot runs under the cluster's lock and the workloads' part is shared."
        )


def scale_out_notes(results: list[StepResult], scale_out: Step | None) -> None:
    """The same load with 1, 2 and 4 worker processes: work done per worker CPU second."""
    runs = [r for r in results if r.step == scale_out and r.concurrency == 1]
    if not runs:
        return
    print()
    print(
        f"Scaling out: {scale_out.jobs if scale_out else 0} jobs on "
        f"{scale_out.nodes if scale_out else 0} nodes with "
        + ", ".join(str(r.worker_processes) for r in runs)
        + " worker processes (one pool process each, named as separate hosts): a cluster's "
        "snapshot runs on one of them under the cluster's lock, its workloads' shards on all."
    )
    for r in runs:
        cpu_s = r.worker_cpu_s
        print(
            f"  {r.worker_processes} worker process(es): {r.job_polls / r.window_s:,.0f} job "
            f"polls/s, {r.ingested_lines_s:,.0f} lines/s; per worker CPU second "
            f"{r.job_polls / cpu_s if cpu_s else 0:,.0f} job polls and "
            f"{r.lines_ingested / cpu_s if cpu_s else 0:,.0f} lines; detection median "
            f"{seconds(median(r.latencies)) if r.latencies else '-'} s; shards skipped "
            f"{r.shards_skipped}, expired {r.shards_expired}; machine {r.machine_busy:.0f}% of "
            f"{100 * (os.cpu_count() or 1)}%"
        )
    print(
        "  On a machine with fewer cores than workers the wall-clock rates cannot grow; the "
        "work per worker CPU second staying level as workers are added is what shows the "
        "work is shared, not repeated or serialised."
    )
