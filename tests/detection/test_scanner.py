"""Streaming: chunks from any offset, partial lines, CRLF, colours, binary and enormous lines."""

from __future__ import annotations

import pytest

from recovery.detection.classify import classify_scan, classify_text
from recovery.detection.engine import hyperscan_available
from recovery.detection.scanner.log_scanner import LogScanner, scan_text

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2231, GPU has fallen off the bus."
TIMEOUT = (
    "[rank{r}]:[E ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=52817, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, "
    "Timeout(ms)=600000) ran for 600041 milliseconds before timing out."
)
PROGRESS = (
    " iteration {step:8d}/  250000 | consumed samples: {samples} | elapsed time per iteration "
    "(ms): 8654.2 | learning rate: 9.150E-06 | global batch size:  1024 | lm loss: 2.504220E+00 "
    "| loss scale: 1.0 | grad norm: 0.231 | number of skipped iterations:   0 | number of nan "
    "iterations:   0 |"
)
ENGINES = ["re2", "hyperscan"] if hyperscan_available() else ["re2"]


def healthy_lines(count: int) -> list[str]:
    lines = []
    for step in range(1, count + 1):
        lines.append(PROGRESS.format(step=step, samples=step * 1024))
        lines.append(
            f"gpu-001:1234:1290 [{step % 8}] NCCL INFO Channel 00/24 : 0[0] -> 1[1] via P2P"
        )
    return lines


def scan_in_chunks(data: bytes, size: int, engine: str = "auto") -> LogScanner:
    scanner = LogScanner(engine=engine)
    for start in range(0, len(data), size):
        scanner.feed(data[start : start + size])
    return scanner


@pytest.mark.parametrize("engine", ENGINES)
def test_every_chunk_boundary_gives_the_same_findings(engine: str) -> None:
    text = "\n".join([*healthy_lines(5), XID, *healthy_lines(2), "KeyError: 'input_ids'"]) + "\n"
    data = text.encode()
    expected = scan_text(data, engine=engine)
    for size in [1, 2, 7, 64, 333, len(data)]:
        result = scan_in_chunks(data, size, engine).finish()
        assert [(f.signature, f.first_line, f.count) for f in result.findings] == [
            (f.signature, f.first_line, f.count) for f in expected.findings
        ], f"chunk size {size}"
        assert result.lines == expected.lines == text.count("\n")


def test_the_line_numbers_point_at_the_evidence() -> None:
    lines = [*healthy_lines(10), XID]
    result = scan_text("\n".join(lines) + "\n")
    (xid,) = [f for f in result.findings if f.signature == "nvidia-xid"]
    assert xid.first_line == len(lines)
    assert xid.detail["xid"] == 79


def test_it_understands_crlf_ansi_colours_and_prefixes() -> None:
    text = (
        "\x1b[31m2024-05-07T15:51:09.140Z [rank7]: torch.OutOfMemoryError: CUDA out of\x1b[0m"
        " memory. Tried to allocate 2.00 GiB\r\n"
    )
    verdict = classify_text(text)
    assert verdict.category == "gpu_oom"
    assert verdict.ranks == [7]
    assert "\x1b" not in verdict.evidence
    assert verdict.evidence.startswith("torch.OutOfMemoryError")


def test_a_last_line_without_newline_is_scanned_at_the_end() -> None:
    scanner = LogScanner()
    scanner.feed(b"step 1\nOSError: [Errno 116] Stale ")
    assert scanner.result().findings == []
    scanner.feed(b"file handle")
    verdict = classify_scan(scanner.finish())
    assert verdict.category == "storage_io"


def test_undecodable_bytes_do_not_stop_the_scan() -> None:
    data = b"\xff\xfe\x00garbage\x80\x81\n" + bytes(range(256)) + b"\n" + XID.encode() + b"\n"
    verdict = classify_scan(scan_text(data))
    assert verdict.category == "gpu_hardware"


def test_a_line_of_megabytes_is_handled_in_bounded_memory() -> None:
    huge = b"x" * (5 * 1024 * 1024) + b" RuntimeError: CUDA error: an illegal memory access"
    scanner = LogScanner(max_carry_bytes=1024 * 1024)
    for start in range(0, len(huge), 256 * 1024):
        scanner.feed(huge[start : start + 256 * 1024])
        assert len(scanner._carry) <= 1024 * 1024
    scanner.feed(b"\n" + XID.encode() + b"\n")
    result = scanner.finish()
    assert "nvidia-xid" in {f.signature for f in result.findings}
    assert all(len(f.evidence) <= 1000 for f in result.findings)


def test_a_flood_of_identical_lines_is_one_finding_with_a_count() -> None:
    text = "\n".join(XID for _ in range(100_000)) + "\n"
    result = scan_text(text)
    (finding,) = result.findings
    assert finding.count == 100_000
    assert finding.first_line == 1
    assert finding.detail["last_line"] == 100_000


def test_progress_and_checkpoints_are_tracked() -> None:
    text = "\n".join(
        [
            *healthy_lines(3),
            "successfully saved checkpoint from iteration       3 to /ckpt/llama",
            *[PROGRESS.format(step=s, samples=s) for s in (4, 5)],
        ]
    )
    result = scan_text(text)
    assert [p.step for p in result.progress] == [1, 2, 3, 4, 5]
    saved = [c for c in result.checkpoints if c.completed]
    assert [c.step for c in saved] == [3]
    assert result.findings == []


def test_the_checkpoint_hint_covers_every_line_the_parser_accepts() -> None:
    from recovery.detection.linear_regex import compile_linear
    from recovery.detection.progress import ProgressParser
    from recovery.detection.scanner.log_scanner import CHECKPOINT_SAVE_HINT
    from tests.detection import test_progress

    hint = compile_linear(CHECKPOINT_SAVE_HINT)
    parser = ProgressParser()
    lines = [
        str(case.values[0])
        for case in test_progress.CHECKPOINT_SAVED + test_progress.CHECKPOINT_STARTED
    ]
    assert lines
    for line in lines:
        if parser.parse_checkpoint(line) or parser.parse_checkpoint_started(line):
            assert hint.search(line), line
    assert not hint.search(
        "UserWarning: torch.utils.checkpoint: please pass in use_reentrant=True explicitly."
    )


def test_a_line_reporting_a_lost_peer_implicates_no_node() -> None:
    from recovery.detection.scanner.log_scanner import scan_text

    log = (
        "2024-05-01 10:00:00 node07: node07:39964:40044 [0] misc/socket.cc:49 NCCL WARN "
        "socketProgress: Connection closed by remote peer node1<57557>\n"
    )
    (finding,) = scan_text(log).findings
    assert (finding.category, finding.signature) == ("interconnect", "nccl-socket-peer-lost")
    assert finding.nodes == [] and finding.ranks == []
    assert finding.detail["reported_by_nodes"] == ["node07"]


def test_a_node_failure_implicates_the_node_srun_names_not_the_one_printing_the_notice() -> None:
    notice = (
        "slurmstepd: error: *** JOB 48213 ON gpu-001 CANCELLED AT 2026-11-28T03:14:15 DUE TO "
        "NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***\n"
    )
    (alone,) = scan_text(notice).findings
    assert (alone.signature, alone.nodes) == ("slurm-node-failure", [])
    assert alone.detail["reported_by_nodes"] == ["gpu-001"]

    (named,) = scan_text(notice + "gpu-001: srun: error: Node failure on gpu-007\n").findings
    assert named.nodes == ["gpu-007"]
    assert named.detail["reported_by_nodes"] == ["gpu-001"]


def test_an_unkillable_task_implicates_the_node_that_reports_it() -> None:
    (finding,) = scan_text("gpu-003: slurmstepd: error: Kill task failed\n").findings
    assert (finding.signature, finding.nodes) == ("slurm-node-failure", ["gpu-003"])


def _ranked_progress(rounds: int, ranks: int, rare_rank: int | None = None) -> bytes:
    """Each round, every rank prints its step; ``rare_rank`` only every third round."""
    lines = []
    for step in range(1, rounds + 1):
        for rank in range(ranks):
            if rank == rare_rank and step % 3:
                continue
            lines.append(
                f"[rank{rank}]: iteration {step:8d}/ 100000 | consumed samples: {step * 8:10d} |"
                " elapsed time per iteration (ms): 1012.3 | lm loss: 2.345E+00 |"
            )
    return ("\n".join(lines) + "\n").encode()


def test_per_stream_sampling_keeps_every_ranks_last_lines_and_stops_parsing_early(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """
    GIVEN 200 rounds of progress from 8 ranks (1,600 lines), rank 7 printing only every third
          round, in one read
    WHEN it is scanned with 4 samples per stream out of 256 per block
    THEN each rank has exactly its last 4 steps, rank 7 included, and the lines parsed are
         those back to rank 7's fourth-last (88) and two rounds more, not 256
    """
    parsed = []
    original = LogScanner._parse_progress_at

    def counting(self: LogScanner, block: object, start: int) -> object:
        parsed.append(start)
        return original(self, block, start)  # type: ignore[arg-type]

    monkeypatch.setattr(LogScanner, "_parse_progress_at", counting)
    scanner = LogScanner(progress_samples_per_block=256, progress_samples_per_stream=4)
    scanner.feed(_ranked_progress(200, 8, rare_rank=7))
    result = scanner.finish()

    by_rank: dict[int | None, list[int]] = {}
    for point in result.progress:
        by_rank.setdefault(point.rank, []).append(point.step)
    assert by_rank == {
        **{rank: [197, 198, 199, 200] for rank in range(7)},
        7: [189, 192, 195, 198],
    }
    assert len(parsed) <= 88 + 2 * 8 + 16


def test_without_per_stream_sampling_the_block_limit_alone_applies() -> None:
    scanner = LogScanner(progress_samples_per_block=64)
    scanner.feed(_ranked_progress(20, 8))
    result = scanner.finish()
    assert len(result.progress) == 64
    assert {point.rank for point in result.progress} == set(range(8))
