"""What `soakspec run` prints and how reports tell how a run went (issue 19), and signed
evidence (issue 15).

- After the rule lines, `run` prints a per-level summary (from results.json's document) and the
  `soakspec report DIR --format html` line; `--format json` carries the same as `run_summary`.
- `--quiet` leaves stdout as it is and stderr empty (no progress, warnings or notes).
- `run --out` onto a directory that already holds a run is a usage error (2): nothing ran.
- md, html and json reports show an abort's time and reason, each backend's crash diagnosis,
  a skipped pre-flight (`--no-preflight`, also in the verdict) and a restricted run.
- `run --sign KEY` signs manifest.json with `ssh-keygen -Y sign`; `verify --allowed-signers`
  checks it; `gate` and `verify` say whether the evidence is signed.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from runner_support import new_marker, run_soakspec, sim_spec, wait_no_survivors
from soakspec.cli import main
from soakspec.judge.testing import EvidenceBuilder, small_spec
from soakspec.report import prepare

SSH_KEYGEN = shutil.which("ssh-keygen")
needs_ssh_keygen = pytest.mark.skipif(SSH_KEYGEN is None, reason="ssh-keygen (OpenSSH) is not installed: signing cannot be tested")


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def soak(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    marker = new_marker()
    try:
        return run_soakspec(["run", *args], marker, tmp)
    finally:
        assert wait_no_survivors(marker) == []


SPEC = sim_spec(duration="1s", load="mode = closed\n    concurrency = [1, 2]", gate="require failed == 0\n  require p50(ttft) < 5s per level")


@pytest.fixture(scope="module")
def key(tmp_path_factory) -> tuple[Path, Path]:
    """A throwaway ed25519 key and an allowed_signers file naming it."""
    if SSH_KEYGEN is None:
        pytest.skip("ssh-keygen (OpenSSH) is not installed: signing cannot be tested")
    d = tmp_path_factory.mktemp("key")
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", "soak-tester", "-f", str(d / "id")], check=True, timeout=60)
    (d / "allowed_signers").write_text(f"tester@example.org {(d / 'id.pub').read_text().strip()}\n")
    return d / "id", d / "allowed_signers"


@pytest.fixture(scope="module")
def signed_run(tmp_path_factory, key) -> tuple[subprocess.CompletedProcess, Path]:
    """One real 2-level run, text format, signed, not quiet (about 5 s)."""
    base = tmp_path_factory.mktemp("signed")
    spec = base / "t.soak"
    spec.write_text(SPEC)
    proc = soak(base, str(spec), "--out", str(base / "ev"), "--sign", str(key[0]))
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    return proc, base / "ev"


# ------------------------------------------------------------------------------ the summary


def test_run_prints_a_per_level_summary_after_the_rule_lines(signed_run):
    proc, ev = signed_run
    out = proc.stdout.splitlines()
    verdict_at = next(i for i, x in enumerate(out) if x.startswith("PASS: all"))
    table = out[verdict_at + 1:]
    assert "per level (results.json):" in table
    head = next(x for x in table if x.strip().startswith("backend") and "req/s" in x)
    for col in ("req/s", "tok/s", "in flight", "completed", "failed", "timeouts", "rejected", "disconnected"):
        assert col in head
    lat = next(x for x in table if "TTFT p50/p95/p99 ms" in x)
    assert "ITL p50/p95/p99 ms" in lat and "TPOT p50/p95/p99 ms" in lat and "latency p50/p95/p99 ms" in lat
    results = json.loads((ev / "results.json").read_text())
    for lv in results["backends"][0]["levels"]:
        row = next(x for x in table if x.split()[:1] == ["b0"] and lv["label"] in x and "/" not in x)
        assert row.split()[-5:] == [str(lv["requests"][k]) for k in ("completed", "failed", "timeout", "rejected", "disconnected")]
        lat_row = next(x for x in table if x.split()[:1] == ["b0"] and lv["label"] in x and "/" in x)
        assert f"{lv['ttft']['p50'] * 1000:.1f} / {lv['ttft']['p95'] * 1000:.1f} / {lv['ttft']['p99'] * 1000:.1f}" in lat_row
    assert out[-1] == f"full report: soakspec report {ev} --format html --out report.html"
    assert "evidence: " in proc.stderr and "[b0]" in proc.stderr  # not quiet: progress and the directory


def test_json_carries_the_summary_and_quiet_leaves_stderr_empty(tmp_path):
    spec = tmp_path / "t.soak"
    spec.write_text(SPEC)
    proc = soak(tmp_path, str(spec), "--out", str(tmp_path / "ev"), "--format", "json", "--quiet", "--no-preflight")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == ""
    doc = json.loads(proc.stdout)  # one JSON document, nothing else on stdout
    assert doc["verdict"] == "PASS" and doc["run_summary"]["schema_version"] == 1
    levels = doc["run_summary"]["levels"]
    results = json.loads((tmp_path / "ev" / "results.json").read_text())
    want = results["backends"][0]["levels"]
    assert [(x["backend"], x["label"]) for x in levels] == [("b0", lv["label"]) for lv in want]
    for got, lv in zip(levels, want):
        assert got["ttft"] == {p: lv["ttft"][p] for p in ("mean", "p50", "p90", "p95", "p99")}
        assert got["requests"]["completed"] == lv["requests"]["completed"] and got["requests"]["timeouts"] == lv["requests"]["timeout"]
        assert got["achieved_rate"] > 0 and got["mean_in_flight"] > 0 and got["output_tokens_per_s"] > 0
    assert doc["run_summary"]["report_command"].startswith("soakspec report ")
    assert doc["run_summary"]["performance_evaluated"] is True
    # the skipped pre-flight is in the verdict itself
    assert any("pre-flight skipped (--no-preflight)" in n for n in doc["notes"])


def test_out_onto_an_existing_run_is_a_usage_error_and_runs_nothing(signed_run, tmp_path):
    _, ev = signed_run
    spec = tmp_path / "t.soak"
    spec.write_text(SPEC)
    before = sorted(p.name for p in ev.iterdir())
    proc = soak(tmp_path, str(spec), "--out", str(ev))
    assert proc.returncode == 2, proc.stderr
    assert "already holds a complete run" in proc.stderr and proc.stdout == "" and "[b0]" not in proc.stderr
    assert sorted(p.name for p in ev.iterdir()) == before


@pytest.mark.parametrize("left", ["backends/b0/requests.jsonl.gz", "client.jsonl", "results.json"])
def test_out_onto_a_runs_files_without_their_manifest_is_a_usage_error_and_runs_nothing(tmp_path, left):
    """A directory that holds a run's files but no manifest.json (removed, or a copy cut short):
    the run appended its records to the stale requests.jsonl.gz, loaded the whole soak, and
    only then aborted (exit 4) with "could not finish the evidence: ... invalid JSON" -- a
    day's soak lost to a file that was there before it started. Refused as the directory of a
    run is (2), before anything runs, and nothing there is touched."""
    spec = tmp_path / "t.soak"
    spec.write_text(SPEC)
    ev = tmp_path / "ev"
    (ev / left).parent.mkdir(parents=True, exist_ok=True)
    (ev / left).write_text("x\n")
    proc = soak(tmp_path, str(spec), "--out", str(ev))
    assert proc.returncode == 2, proc.stderr
    assert f"already holds a run's files ({left.split('/')[0]}) but no manifest.json" in proc.stderr, proc.stderr
    assert "[b0]" not in proc.stderr and proc.stdout == ""
    assert (ev / left).read_text() == "x\n" and not (ev / "manifest.json").exists()


def test_the_summary_shows_the_figures_when_performance_was_not_evaluated():
    """An evidence rule failed: the performance rules are not evaluated, the summary still shows
    every level's figures (the disconnected count included) and says they were not judged."""
    from soakspec.report.runsummary import summary_json, summary_lines

    spec = small_spec("require trace_coverage >= 100% per bucket\nrequire disconnected == 0", mode="open", levels="[1rps, 2rps]")
    b = EvidenceBuilder(spec, scheduled=False)
    b.set_outcome(list(b.measured("a", level=1, bucket=1))[0], "disconnected", "stream cut")
    b.untrace(list(b.measured("a", level=0, bucket=0))[0]["request_id"], "a")
    inp = prepare(spec, b.build())
    lines = summary_lines(inp.results, "/ev dir", inp.verdict)
    assert "Performance rules were not evaluated" in "\n".join(lines)
    head = next(x for x in lines if "req/s" in x and "offered" in x)  # open loop: offered beside achieved
    rows = [x for x in lines if x.strip().startswith("a ") and "(open loop" in x]
    # the builder's 8 arrivals a 60 s bucket: what was scheduled, the nominal 2 rps beside it
    assert len(rows) == 2 and "0.133 req/s scheduled (open loop, 2 nominal)" in rows[1]
    assert rows[1].split()[-1] == "1" and head.split()[-1] == "disconnected"
    assert lines[-1] == "full report: soakspec report '/ev dir' --format html --out report.html"
    doc = summary_json(inp.results, "/ev dir", inp.verdict)
    assert doc["performance_evaluated"] is False and doc["levels"][1]["requests"]["disconnected"] == 1
    assert doc["levels"][1]["offered_rate"] == 2.0


def test_quiet_keeps_errors_on_stderr(tmp_path):
    spec = tmp_path / "bad.soak"
    spec.write_text("soak {")
    code, out, err = cli("run", str(spec), "--quiet")
    assert code == 2 and out == "" and "error" in err.lower()


# ------------------------------------------------------------------------------ how the run went


def _aborted():
    spec = small_spec(backends=("a", "b"))
    b = EvidenceBuilder(spec, scheduled=False)
    t0 = b.manifest["started_at_epoch"]
    b.manifest.update(status="aborted", incomplete_reason="backend b exited with status 1", aborted_at=t0 + 12.5)
    e = b.entry("b")
    e.update(aborted_reason="the server exited with status 1", aborted_at=t0 + 12.5,
             crash_diagnosis=["RuntimeError: CUDA error: out of memory", "torch.OutOfMemoryError: tried to allocate 2 GiB",
                              "ERROR retrying with Authorization: Bearer sk-live-0123456789abcdef0123"])
    return spec, b


def test_reports_show_when_and_why_a_run_aborted_and_the_crash_diagnosis():
    spec, b = _aborted()
    inp = prepare(spec, b.build())
    md = inp.render("md")
    assert "- run status: aborted (see How the run went)" in md
    section = md.split("### How the run went", 1)[1].split("###", 1)[0]
    assert "run status: aborted: backend b exited with status 1 (at +12.5s into the run" in section
    assert "backend b: aborted at +12.5s into the run" in section and "the server exited with status 1" in section
    assert "RuntimeError: CUDA error: out of memory | torch.OutOfMemoryError" in section
    assert "sk-live-0123456789abcdef0123" not in md and "Bearer <redacted>" in section  # a server log line is scrubbed
    assert section.strip().startswith("```text")  # evidence text, fenced
    page = inp.render("html")
    state = page.split('<ul class="run-state">', 1)[1].split("</ul>", 1)[0]
    assert "backend b crash diagnosis" in state and "CUDA error: out of memory" in state and "+12.5s" in state
    doc = json.loads(inp.render("json"))
    assert doc["run"]["status"] == "aborted" and doc["run"]["aborted_at"] == b.manifest["aborted_at"]
    assert doc["run"]["backends"]["b"]["crash_diagnosis"][0] == "RuntimeError: CUDA error: out of memory"
    assert doc["run"]["backends"]["a"]["crash_diagnosis"] == []
    junit = inp.render("junit")
    assert '<property name="run: run status" value="aborted: backend b exited with status 1 (at +12.5s' in junit
    assert '<property name="run: backend b crash diagnosis"' in junit


def test_a_complete_run_has_no_how_it_went_section():
    spec = small_spec()
    inp = prepare(spec, EvidenceBuilder(spec, scheduled=False).build())
    md = inp.render("md")
    assert "- run status: complete\n" in md and "How the run went" not in md
    assert 'class="run-state"' not in inp.render("html")


def test_skipped_preflight_and_restricted_run_are_in_every_report():
    spec = small_spec(backends=("a", "b"))
    b = EvidenceBuilder(spec, only=("a",), scheduled=False)
    b.manifest["preflight"] = False
    inp = prepare(spec, b.build())
    for fmt in ("md", "html", "json", "junit"):
        text = inp.render(fmt)
        assert "pre-flight skipped (--no-preflight)" in text, fmt
        assert "restricted to backend a; not run: b" in text, fmt
    code_text = __import__("soakspec.judge.verdict", fromlist=["render_text"]).render_text(inp.verdict)
    assert "pre-flight skipped" in code_text and "restricted to backend a" in code_text


# ------------------------------------------------------------------------------ signed evidence


@needs_ssh_keygen
def test_signed_evidence_verifies_against_its_allowed_signers(signed_run, key):
    _, ev = signed_run
    assert (ev / "manifest.json.sig").read_text().startswith("-----BEGIN SSH SIGNATURE-----")
    code, out, _ = cli("verify", str(ev), "--allowed-signers", str(key[1]))
    assert code == 0, out
    assert "signature: signed by tester@example.org (ED25519 key SHA256:" in out
    assert "intact and complete" in out.splitlines()[-1]  # the signature file is not an unlisted artifact
    code, out, _ = cli("verify", str(ev), "--format", "json", "--allowed-signers", str(key[1]))
    doc = json.loads(out)
    assert code == 0 and doc["signature"]["status"] == "valid" and doc["signature"]["principal"] == "tester@example.org"
    code, out, _ = cli("verify", str(ev))  # without allowed signers: nothing is run, it says it is signed
    assert code == 0 and "signature: signed (manifest.json.sig), not checked here" in out
    code, out, _ = cli("gate", str(ev))
    assert code == 0 and "note: evidence signed (manifest.json.sig)" in out


@needs_ssh_keygen
def test_an_edited_manifest_or_an_unknown_key_fails_the_signature(signed_run, key, tmp_path):
    _, ev = signed_run
    bad = tmp_path / "edited"
    shutil.copytree(ev, bad)
    m = json.loads((bad / "manifest.json").read_text())
    m["backends"][0]["exit_status"] = 0 if m["backends"][0].get("exit_status") else 1  # an edit, hashes untouched
    (bad / "manifest.json").write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")
    code, out, _ = cli("verify", str(bad), "--allowed-signers", str(key[1]))
    assert code == 1 and "signature: INVALID: the signature does not match manifest.json for tester@example.org" in out
    other = tmp_path / "other"
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True, timeout=60)
    (tmp_path / "allowed").write_text(f"someone@else {(tmp_path / 'other.pub').read_text().strip()}\n")
    code, out, _ = cli("verify", str(ev), "--allowed-signers", str(tmp_path / "allowed"))
    assert code == 1 and "INVALID: the signing key is not in" in out


@needs_ssh_keygen
def test_unsigned_evidence_says_so_and_fails_when_a_signature_is_required(key, tmp_path):
    d = EvidenceBuilder(small_spec(), scheduled=False).write(tmp_path / "run")
    code, out, _ = cli("verify", str(d), "--allowed-signers", str(key[1]))
    assert code == 1 and "INVALID: no manifest.json.sig: the evidence is not signed" in out
    code, out, _ = cli("verify", str(d))
    assert code == 0 and "signature: not signed: its sha256 hashes catch accidents, not a determined editor" in out
    code, out, _ = cli("gate", str(d), "--format", "json")
    assert any(n.startswith("evidence not signed") for n in json.loads(out)["notes"])
    code, _, err = cli("verify", str(d), "--allowed-signers", str(tmp_path / "missing"))
    assert code == 2 and "no such file" in err


def test_sign_with_a_missing_key_is_a_usage_error_before_anything_runs(tmp_path):
    spec = tmp_path / "t.soak"
    spec.write_text(SPEC)
    code, out, err = cli("run", str(spec), "--out", str(tmp_path / "ev"), "--sign", str(tmp_path / "nokey"))
    assert code == 2 and out == ""
    assert "--sign" in err and not (tmp_path / "ev").exists()


def test_verify_and_gate_start_no_process_without_allowed_signers(signed_run, monkeypatch):
    """Saying whether evidence is signed reads a file; only `--allowed-signers` runs ssh-keygen."""
    _, ev = signed_run
    started = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(a) or (_ for _ in ()).throw(AssertionError("spawned")))
    assert cli("verify", str(ev))[0] == 0
    assert cli("gate", str(ev))[0] == 0
    assert started == []
    code, out, _ = cli("verify", str(ev), "--allowed-signers", str(ev / "manifest.json"))
    assert started and code != 0  # with allowed signers it does run ssh-keygen (here refused by the patch)


def test_the_summary_notes_a_level_whose_itl_gaps_are_mostly_coalesced():
    """A client that read late (or a server that writes tokens in chunks) gives ITL gaps of 0:
    the terminal's ITL p50 of 0.0 ms is then how the tokens were read. The summary says so under
    the tables for that level, and not for a level whose gaps are independent."""
    from soakspec.report.runsummary import summary_lines

    spec = small_spec(mode="open", levels="[1rps, 2rps]")
    b = EvidenceBuilder(spec, scheduled=False)
    for r in b.measured("a", level=1):
        gap = r["itl"][0]
        r["itl"] = [0.0] * 40 + [gap * 63 / 23] * 23  # 40 of 63 gaps share a read; the sum is the same
        r["coalesced"] = 40
    inp = prepare(spec, b.build())
    lines = summary_lines(inp.results, "/ev dir", inp.verdict)
    notes = [x for x in lines if x.startswith("note: ITL of")]
    assert len(notes) == 1 and "rate 2 rps" in notes[0] and "(63%) coalesced" in notes[0], lines
    n = sum(1 for _ in b.measured("a", level=1))
    assert f"{40 * n:,} of {63 * n:,} gaps" in notes[0]
