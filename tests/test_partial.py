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
    spec.write_text(sim_spec(duration="30s", bucket="1s", sim="ttft = 20ms\n    itl = 20ms",
                             extra_backend="  metrics {\n    every = 250ms\n  }\n",  # declared: metrics_scraped judged
                             gate="require failed == 0\n  require max(server(\"vllm:num_requests_running\")) < 1000"))
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
    # the requests judged are those of the closed buckets, not every one on disk
    assert "the run counted" not in text and "which the manifest does not list" not in text, text
    # the scrapes metrics.jsonl holds are judged (it was `FAIL metrics_scraped -- no scrape of the
    # server's metrics is recorded`: the partial entry had no metrics summary), and the rule over them
    scraped = out / "backends" / "b0" / "metrics.jsonl"
    assert scraped.stat().st_size > 0
    assert "PASS  metrics_scraped" in text and "no scrape of the server's metrics is recorded" not in text, text
    assert 'PASS  max(server("vllm:num_requests_running")) < 1000' in text, text
    code, doc = _gate_partial(capsys, out, "--format", "json")
    rule = next(r for r in json.loads(doc[: doc.index("\n}\n") + 2])["rules"] if r["rule"] == "failed == 0")
    assert rule["samples"] == sum(1 for r in recs if r.bucket in closed) < len(recs), (rule, len(recs))
    # the report says the run is incomplete and shows what it recorded, not a backend that "did not run"
    assert main(["report", str(out), "--format", "md"]) == 0
    md = capsys.readouterr().out
    assert "did not run (no evidence" not in md and "run status: running: the run is incomplete" in md, md
    row = next(ln for ln in md.splitlines() if ln.startswith("| b0 | "))
    assert row.split(" | ")[3] == str(sum(1 for r in recs if r.bucket in closed and r.outcome == "completed")), row


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


def _killed_in_bucket(root: Path, *, failed_in_open: bool = False, failed_in_closed: bool = False,
                      gate: str = "  require failed == 0\n  require goodput(ttft < 500ms) >= 90%\n", backend: str = "") -> dict[int, int]:
    """A run killed the way a SIGKILL leaves one, three 1-minute buckets in: the start-of-run
    manifest (a spec of 5 buckets), requests.jsonl.gz with the requests of buckets 0, 1 and 2
    (the runner's writer, one gzip member a bucket), buckets.jsonl with a line for bucket 0
    only (1 and 2 are within the level's deadline: not closed), server.log plain. With
    `failed_in_open`, one request of bucket 2 failed; with `failed_in_closed`, one of bucket 0.
    `gate`: the lines of the spec's gate block; `backend`: lines added to backend "a"'s block.
    Returns requests per bucket."""
    from soakspec.evidence import layout
    from soakspec.evidence.buckets import lines_for
    from soakspec.evidence.io import GzipJsonlWriter, JsonlWriter, read_json, write_json_atomic
    from soakspec.evidence.record import RequestRecord
    from soakspec.evidence.testing import SAMPLE_LEVEL, T0, _canonical, sample_request, sample_spec_text

    build_evidence_dir(root, backends=("a",), status="running")
    text = sample_spec_text(("a",)).replace("duration = 1m", "duration = 5m").replace(
        "gate {\n  require failed == 0\n}", "gate {\n" + gate + "}").replace("  sim {}\n", "  sim {}\n" + backend, 1)
    m = read_json(root / layout.MANIFEST)
    spec_text = _canonical(text)
    from soakspec.judge.evidence import embedded_spec_sha256

    m["spec"] = dict(m["spec"], text=spec_text, sha256=embedded_spec_sha256(spec_text))
    write_json_atomic(root / layout.MANIFEST, m)
    per_bucket = {0: 40, 1: 36, 2: 21}
    d = layout.RunLayout(root).backend_dir("a")
    i = 0
    (d / layout.REQUESTS).unlink()
    with GzipJsonlWriter(d / layout.REQUESTS) as w:
        for b, n in per_bucket.items():
            rows = []
            for _ in range(n):
                start = T0 + 60.0 * b + 1.0 + i % 50
                rows.append(sample_request(i, backend="a", bucket=b, intended_start=start, start=start, first_byte=start + 0.01,
                                           first_token=start + 0.02, end=start + 0.3))
                i += 1
            if (failed_in_open and b == 2) or (failed_in_closed and b == 0):
                rows[-1].update(outcome="failed", status=500, error="HTTP 500", output_tokens=0, itl_us=[], chunks=0,
                                tpot=None, first_token=None, first_byte=None, finish_reason=None, output_chars=0,
                                output_sha256=None)
            w.write_lines(b"".join(RequestRecord.from_json(r).to_line() for r in rows))
    level = dict(SAMPLE_LEVEL, planned_duration_s=300.0, buckets=[{"index": 0, "start": T0, "end": T0 + 60.0}])
    recs = [RequestRecord.from_json(sample_request(k, backend="a", bucket=0)).freeze() for k in range(per_bucket[0])]
    (d / layout.BUCKETS).unlink()
    with JsonlWriter(d / layout.BUCKETS) as w:
        for line in lines_for([level], recs):
            w.write(line)
    for f in (layout.FOLLOWUP, layout.TRACES):  # a killed run never got to its follow-up or trace collection
        (d / f).unlink()
    gz = d / layout.SERVER_LOG_GZ
    if gz.exists():  # a killed run never compressed its log
        import gzip

        (d / layout.SERVER_LOG).write_bytes(gzip.decompress(gz.read_bytes()))
        gz.unlink()
    return per_bucket


def test_partial_gate_judges_the_scrapes_a_killed_run_recorded_and_none_yet_is_inconclusive(tmp_path, capsys):
    """A declared `metrics { }` of a killed run: with no scrape in metrics.jsonl yet,
    metrics_scraped is INCONCLUSIVE (it FAILED: the partial entry had no metrics summary, read
    as "no scrape is recorded"); a failed scrape the file records still FAILS it."""
    from soakspec.evidence import layout
    from soakspec.evidence.io import JsonlWriter
    from soakspec.evidence.testing import T0

    root = tmp_path / "run1"
    _killed_in_bucket(root, backend="  metrics {}\n")
    scraped = layout.RunLayout(root).metrics("a")
    scraped.unlink(missing_ok=True)
    code, out = _gate_partial(capsys, root)
    line = next(ln for ln in out.splitlines() if "metrics_scraped" in ln)
    assert code == 3 and line.lstrip().startswith("????") and "not finished" in line, out
    with JsonlWriter(scraped, schema="metrics") as w:
        w.write({"schema_version": 1, "t": T0 + 1.0, "ok": False, "status": 503, "error": "HTTP 503", "families": {}})
    code, out = _gate_partial(capsys, root)
    line = next(ln for ln in out.splitlines() if "metrics_scraped" in ln)
    assert line.lstrip().startswith("FAIL") and "1 of 1 scrape of /metrics failed; first: HTTP 503" in line, out


def test_partial_gate_judges_only_the_requests_of_closed_buckets(tmp_path, capsys):
    """Killed in bucket 2 of 5 with bucket 0 closed: every rule counts bucket 0's 40 requests,
    not the 97 on disk; the level's count of requests sent is what is judged, and no request
    of a bucket still open reads as one the manifest does not list."""
    root = tmp_path / "run1"
    per_bucket = _killed_in_bucket(root)
    code, out = _gate_partial(capsys, root, "--verbose")
    assert code == 3, out
    assert "judged buckets 0-0 of 5" in out, out
    assert "(40 of 40 requests meet it" in out, out
    assert "97" not in out, out
    assert "57 recorded requests of buckets not closed (or of the follow-up) left out" in out, out
    assert "the run counted" not in out and "which the manifest does not list" not in out, out
    assert "fewest: 40 in backend a" in out, out
    # the killed run never hashed its files: nothing was checked against a sha256, and not a pass
    assert "????  artifacts_verified — manifest.json: " in out and "never hashed" in out, out
    assert "all 0 artifacts" not in out, out
    code, doc = _gate_partial(capsys, root, "--format", "json")
    v = json.loads(doc[: doc.index("\n}\n") + 2])
    rule = next(r for r in v["rules"] if r["rule"] == "failed == 0")
    assert rule["status"] == "pass" and rule["samples"] == per_bucket[0], rule


def test_partial_gate_does_not_fail_a_rule_on_a_bucket_still_open(tmp_path, capsys):
    """A failed request in bucket 2, not closed: `failed == 0` holds over the closed bucket --
    the failure is judged once its bucket closes, not reported as already failing."""
    root = tmp_path / "run1"
    _killed_in_bucket(root, failed_in_open=True)
    code, out = _gate_partial(capsys, root)
    assert code == 3, out
    assert "already failing" not in out, out


def test_report_of_a_killed_run_says_it_is_incomplete_and_shows_what_was_recorded(tmp_path, capsys):
    """A killed run's manifest lists no backend: the report reads it as `gate --partial` does --
    the backend's recorded requests up to its last closed bucket, the run called incomplete --
    never "did not run (no evidence for it)"."""
    root = tmp_path / "run1"
    _killed_in_bucket(root)
    assert main(["report", str(root), "--format", "md"]) == 0
    md = capsys.readouterr().out
    assert "did not run (no evidence" not in md and "not run" not in md.split("### How the run went")[0], md
    assert "run status: running: the run is incomplete -- its manifest was never finalized (still going, or killed" in md
    assert "partial: the run is incomplete (status running); judged up to the last closed bucket" in md
    assert "**Verdict: INCONCLUSIVE**" in md
    row = next(ln for ln in md.splitlines() if ln.startswith("| a | "))
    assert row.split(" | ")[3:5] == ["40", "0 / 0"], row  # Completed, Failed/timeouts: bucket 0's
    assert main(["report", str(root), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"]["verdict"] == "INCONCLUSIVE", doc["verdict"]
    assert doc["run"]["status"] == "running"
    # plain gate reads no backend of it, and says why and what to run instead
    assert main(["gate", str(root)]) == 3
    out = capsys.readouterr().out
    assert "did not run (no evidence" not in out and "backend a: its evidence was not read: the run is incomplete" in out, out
    assert "`soakspec gate --partial` judges what it recorded" in out


def test_plain_gate_of_a_killed_run_does_not_call_its_client_samples_missing(tmp_path, capsys):
    """A run SIGKILLed mid-level left a client.jsonl of samples (1.4 kB), but its manifest lists
    no backend yet, so plain `gate` read none of them -- and client_healthy said "client.jsonl
    has no client-health samples", sending the user to a file that is fine. It says the samples
    were not read and why, as completed_run does for the backends."""
    root = tmp_path / "run1"
    _killed_in_bucket(root)
    assert (root / "client.jsonl").stat().st_size > 0
    assert main(["gate", str(root)]) == 3
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "client_healthy" in ln)
    assert "has no client-health samples" not in line, line
    assert "not read" in line and "`soakspec gate --partial`" in line, line


def test_partial_gate_with_a_newer_spec_reads_the_runs_levels_as_the_run_planned_them(tmp_path, capsys):
    """`gate --partial --spec NEWER` of a running run at concurrency 4, NEWER planning 6: the
    closed buckets' levels were laid out from NEWER's plan, so level 0 read as concurrency 6
    and was judged as that (a run of [8, 16] judged with [16, 8] said its load generator
    could not keep up, "achieved concurrency 7.92 of 16 offered"). They are laid out from the
    run's own spec, and the level NEWER plans there is named as another load."""
    from soakspec.evidence.testing import sample_spec_text

    root = tmp_path / "run1"
    build_evidence_dir(root, status="running")
    newer = tmp_path / "newer.soak"
    newer.write_text(sample_spec_text(("a",)).replace("concurrency = [4]", "concurrency = [6]"))
    code, out = _gate_partial(capsys, root, "--spec", str(newer))
    assert code == 3, out
    assert "a short / concurrency 4: judged buckets 0-0 of 1" in out, out
    assert "ran with concurrency 4 (the spec plans 6)" in out, out


REQUIRE_WHOLE_RUN = "  require completed_run\n  require failed == 0\n  require follow_up\n"


def test_partial_gate_judges_the_performance_rules_of_a_spec_that_requires_completed_run_and_follow_up(tmp_path, capsys):
    """A killed run whose spec writes `require completed_run` and `require follow_up` (as
    specs/demo.soak does), with a failed request in its closed bucket: a run not finished has
    no final status and no follow-up yet, which is inconclusive, not a failure -- so they no
    longer block the performance rules ("---- failed == 0 -- a required validity or evidence
    check failed"): `failed == 0` is judged and FAILs on the closed bucket, and the note says so."""
    root = tmp_path / "run1"
    _killed_in_bucket(root, failed_in_closed=True, gate=REQUIRE_WHOLE_RUN)
    code, out = _gate_partial(capsys, root)
    assert code == 3, out
    assert "cannot support it" not in out and "----" not in out, out
    assert "FAIL  failed == 0 — backend a, concurrency 4, bucket 0 [" in out and ": 1 failed request (HTTP 500" in out, out
    assert "already failing on the closed buckets: failed == 0" in out, out
    assert "????  completed_run — the run's status is running: not finished (still going, or killed)" in out, out
    assert "????  follow_up — backend a: no follow-up yet: it is sent after the last level" in out, out
    assert "followup.json missing" not in out and "FAIL  completed_run" not in out and "FAIL  follow_up" not in out, out
    assert "buckets 1-4 of 5 not closed yet (the run is still going, or was killed)" in out, out
    assert "did not run its full duration" not in out and "cut short" not in out, out
    assert "INCONCLUSIVE: " in out and "1 failed on the evidence so far (failed == 0)" in out, out


def test_partial_gate_with_nothing_failing_yet_is_inconclusive_never_pass(tmp_path, capsys):
    """The same spec, every closed request completed: the performance rules pass so far, the
    verdict stays INCONCLUSIVE (the run is not finished), and nothing reads as a failure."""
    root = tmp_path / "run1"
    _killed_in_bucket(root, gate=REQUIRE_WHOLE_RUN)
    code, out = _gate_partial(capsys, root, "--format", "json")
    v = json.loads(out[: out.index("\n}\n") + 2])
    assert code == 3 and v["verdict"] == "INCONCLUSIVE", out
    status = {r["rule"]: r["status"] for r in v["rules"]}
    assert status["failed == 0"] == "pass" and status["completed_run"] == status["follow_up"] == "inconclusive", status
    assert "fail" not in status.values() and "not_evaluated" not in status.values(), status


def test_partial_gate_of_a_run_still_writing_does_not_say_its_writer_was_killed(tmp_path, capsys):
    """requests.jsonl.gz ends in a line still being written while the run holds the .lock: the
    writer is alive, so the cut-off line is not "the writer was killed" -- and, once the lock is
    gone, it is."""
    import gzip

    from soakspec.evidence.io import RunLock

    root = tmp_path / "run1"
    _killed_in_bucket(root, gate=REQUIRE_WHOLE_RUN)
    with open(root / "backends" / "a" / "requests.jsonl.gz", "ab") as f:
        f.write(gzip.compress(b'{"request_id": "run1-a-09999", "backend": "a", "wor'))
    with RunLock(root, allow_existing=True):  # the run, still writing
        code, out = _gate_partial(capsys, root)
    assert code == 3, out
    assert "requests.jsonl.gz ends in a line still being written (the run holds the .lock)" in out, out
    assert "writer was killed" not in out and "FAIL  completed_run" not in out, out
    code, out = _gate_partial(capsys, root)
    assert "requests.jsonl.gz ends in a cut-off line (no process holds the .lock: the writer was killed)" in out, out
    assert "FAIL  completed_run" not in out, out


def test_partial_gate_of_a_level_whose_every_bucket_closed_does_not_call_it_cut_short(tmp_path, capsys):
    """Every planned bucket of the level closed (1 of 1): it ran its full duration -- only the
    run's end (status, hashes) is missing, and no level is called "completed = false"."""
    root = tmp_path / "run1"
    build_evidence_dir(root, backends=("a",), status="running")
    code, out = _gate_partial(capsys, root)
    assert code == 3, out
    assert "judged buckets 0-0 of 1" in out, out
    assert "did not run its full duration" not in out and "not closed yet" not in out, out


def test_plain_gate_of_a_run_still_in_progress_says_so_and_judges_nothing(tmp_path, capsys):
    """Plain `gate` of a run a live `soakspec run` still writes (it holds the .lock) FAILed
    `require completed_run` ("the run's status is running") though nothing had failed: the
    run is not over. It judges nothing, says the run is in progress (naming the lock's pid)
    and points to `gate --partial`: a usage error, exit 2, whatever the format -- `gate --write`
    too, which said only "holds no finished run (status running)". A killed run's leftover
    .lock (its process gone, nothing holds the flock) is judged as before."""
    from soakspec.evidence.io import RunLock

    root = tmp_path / "run1"
    _killed_in_bucket(root, gate=REQUIRE_WHOLE_RUN)
    with RunLock(root, allow_existing=True):  # the run, still going: this process holds its lock
        for args in (["--format", "text"], ["--format", "json"], ["--write"]):
            code = main(["gate", str(root), *args])
            out = capsys.readouterr()
            assert code == 2, out
            assert out.out == "", out.out  # no verdict: nothing was judged
            assert f"holds a run still in progress (its .lock is held by pid {os.getpid()})" in out.err, out.err
            assert f"`soakspec gate --partial {root}` judges it up to its last closed bucket" in out.err, out.err
    # killed: the lock file is left behind with its pid, but no live process holds it
    (root / ".lock").write_text("4194000\n")
    code = main(["gate", str(root)])
    out = capsys.readouterr().out
    assert code == 1 and "FAIL  completed_run — the run's status is running" in out, out
    assert "`soakspec gate --partial` judges what it recorded" in out, out
