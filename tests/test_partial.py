"""A run still going, or killed, is inspectable: buckets.jsonl has one line per closed bucket,
`verify` reads a SIGKILLed run as incomplete (never corrupt) and `gate --partial` judges it up
to its last closed bucket, INCONCLUSIVE."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner_support import manifest, new_marker, run_env, sim_spec, soakspec_cmd, wait_no_survivors
from soakspec.cli import main
from soakspec.evidence.io import iter_jsonl
from soakspec.evidence.record import iter_records
from soakspec.evidence.testing import build_evidence_dir


@pytest.fixture(autouse=True)
def nice_calls(monkeypatch) -> list[int]:
    """os.nice seen, not done: a partial gate in this process would lower pytest's own priority."""
    calls: list[int] = []

    def nice(inc: int) -> int:
        calls.append(inc)
        return sum(calls)

    monkeypatch.setattr(os, "nice", nice)
    return calls


def _gate_partial(capsys, root: Path, *extra: str) -> tuple[int, str]:
    code = main(["gate", "--partial", str(root), *extra])
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    return code, out.out + out.err


def test_partial_gate_of_a_running_run_is_inconclusive_and_says_how_far(tmp_path, capsys, nice_calls):
    root = tmp_path / "run1"
    build_evidence_dir(root, status="running")  # a run still going: no backends in its manifest yet
    code, out = _gate_partial(capsys, root)
    assert code == 3, out
    # it may share the machine with the soak's load generator: judged at low CPU priority, said
    assert nice_calls == [10] and "judging it at low CPU priority (nice 10)" in out
    assert "INCONCLUSIVE" in out and "partial: the run is incomplete (status running)" in out
    assert "a short / concurrency 4: judged buckets 0-0 of 1" in out
    # plain gate cannot judge it at all (no backends yet): --partial is the way to look
    code, doc = _gate_partial(capsys, root, "--format", "json")
    v = json.loads(doc[: doc.rindex("}") + 1])
    assert v["partial"] is True and v["verdict"] == "INCONCLUSIVE"
    # its failed == 0 rule was judged over the closed bucket's requests
    assert any(r["rule"] == "failed == 0" and r["status"] == "pass" for r in v["rules"]), v["rules"]


def test_partial_gate_of_a_finished_run_judges_it_in_full(tmp_path, capsys, nice_calls):
    root = tmp_path / "run1"
    build_evidence_dir(root)
    code, out = _gate_partial(capsys, root)
    assert code == main(["gate", str(root)]) and "judged in full" in out
    assert nice_calls == []  # a finished run competes with nothing: full priority


def _sigkill_mid_bucket(cmd: list[str], cwd: Path, ready, what: str, sig: int = signal.SIGKILL) -> tuple[int, str, str]:
    """Run `cmd` (a `soakspec run`), wait until `ready()` (at most 60 s: else fail saying `what`
    did not happen), then SIGKILL it (or send `sig`) half a second into a bucket; no process of
    it may survive. Returns its (exit status, stdout, stderr)."""
    marker = new_marker()
    proc = subprocess.Popen(cmd, cwd=cwd, env=run_env(marker), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    try:
        while not ready():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, f"{what} within 60 s"
            time.sleep(0.05)
        time.sleep(0.5)  # mid-bucket
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert wait_no_survivors(marker, timeout=10) == []
    return proc.returncode, out, err


@pytest.mark.slow
def test_sigkill_mid_bucket_leaves_evidence_verify_calls_incomplete_and_gate_partial_judges(tmp_path, capsys):
    spec = tmp_path / "t.soak"
    spec.write_text(sim_spec(duration="30s", bucket="1s", sim="ttft = 20ms\n    itl = 20ms"))
    out = tmp_path / "ev"
    buckets = out / "backends" / "b0" / "buckets.jsonl"
    _sigkill_mid_bucket(soakspec_cmd("run", str(spec), "--out", str(out), "--quiet"), tmp_path,
                        lambda: buckets.exists() and buckets.read_bytes().count(b"\n") >= 2, "no two closed buckets")
    assert manifest(out)["status"] == "running"

    lines = [r for _, r in iter_jsonl(buckets)]
    closed = {r["bucket"] for r in lines}
    assert len(lines) >= 2 and closed == set(range(len(lines)))
    assert all(r["requests"]["completed"] > 0 and r["ttft"]["p50"] is not None for r in lines)
    # every request a closed bucket's line counted is on disk
    bad: list = []
    recs = [r for _, r in iter_records(out / "backends" / "b0" / "requests.jsonl.gz", bad)]
    assert not [m for _, m in bad if m is not None]
    for line in lines:
        on_disk = sum(1 for r in recs if r.bucket == line["bucket"] and r.outcome == "completed")
        assert on_disk >= line["requests"]["completed"]

    assert main(["verify", str(out)]) == 3
    text = capsys.readouterr().out
    assert "intact but incomplete" in text and "V104" not in text and "V105" not in text, text

    code, text = _gate_partial(capsys, out)
    assert code == 3 and "INCONCLUSIVE" in text, text
    assert f"judged buckets 0-{max(closed)} of 30" in text, text


# `soakspec run` with server.log's cap made small, so that lines are moved out while it runs
SMALL_CAP_RUN = ("import sys; from soakspec.evidence import serverlog as s; "
                 "s.HEAD_BYTES, s.TAIL_BYTES, s.STEP_BYTES = 16 << 10, 32 << 10, 16 << 10; "
                 "from soakspec.cli import main; sys.exit(main(sys.argv[1:]))")


@pytest.mark.slow
def test_sigkill_after_server_log_was_moved_leaves_a_log_that_reads_whole(tmp_path, capsys):
    """Killed after server.log's older lines were moved out (compressed, punched out of the
    plain file): `verify` still reads the run as intact but incomplete, `gate --partial`
    judges it, and the log reads whole -- every trace of the closed buckets' requests there."""
    from soakspec.evidence import layout
    from soakspec.evidence.traces import TraceSource, collect_traces
    from soakspec.lang import simtrace

    spec = tmp_path / "t.soak"
    spec.write_text(sim_spec(duration="30s", bucket="1s", sim="ttft = 2ms\n    itl = 0ms",
                             load="mode = closed\n    concurrency = [16]", follow_up=False))
    out = tmp_path / "ev"
    d = out / "backends" / "b0"
    _sigkill_mid_bucket([sys.executable, "-c", SMALL_CAP_RUN, "run", str(spec), "--out", str(out), "--quiet"], tmp_path,
                        lambda: ((d / layout.SERVER_LOG_MOVED_STATE).exists() and (d / "buckets.jsonl").exists()
                                 and (d / "buckets.jsonl").read_bytes().count(b"\n") >= 3),
                        "no move and three closed buckets")
    log = d / layout.SERVER_LOG
    assert layout.server_log_file(d) == log and (d / layout.SERVER_LOG_MOVED).is_file()
    assert log.stat().st_blocks * 512 < log.stat().st_size  # its moved range takes no disk

    assert main(["verify", str(out)]) == 3
    text = capsys.readouterr().out
    assert "intact but incomplete" in text and "V104" not in text and "V105" not in text, text
    code, text = _gate_partial(capsys, out)
    assert code == 3 and "INCONCLUSIVE" in text, text

    traces, bad = collect_traces(log, 0, TraceSource(kind="log", pattern=simtrace.TRACE_PATTERN))
    ids = [t.trace_id for t in traces]
    assert bad == [] and len(ids) == len(set(ids))
    lines = [r for _, r in iter_jsonl(d / "buckets.jsonl")]
    assert len(ids) >= sum(r["requests"]["completed"] for r in lines) > 0
