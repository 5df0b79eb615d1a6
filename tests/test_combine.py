"""`soakspec combine`: per-backend children re-verified and re-judged, then combined."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pytest

from soakspec.cli import main
from soakspec.evidence.testing import edit_requests
from soakspec.judge.testing import EvidenceBuilder
from soakspec.lang import load_spec

SEED = Path(__file__).resolve().parents[1] / "specs" / "dsv2lite.soak"


@pytest.fixture(scope="module")
def spec():
    return load_spec(SEED)[0]


def children(spec, tmp_path, edit=lambda name, b: None, **options):
    dirs = []
    for i, name in enumerate(("host-staged", "nccl")):
        b = EvidenceBuilder(spec, only=(name,), run_id=f"run-{name}", t0=1_747_000_000.0 + 1000 * i, **options)
        edit(name, b)
        dirs.append(str(b.write(tmp_path / name)))
    return dirs


def run_combine(dirs, out, capsys, *extra):
    code = main(["combine", *dirs, "--out", str(out), *extra])
    return code, capsys.readouterr()


def checks(out: Path) -> dict[str, str]:
    doc = json.loads((out / "combined.json").read_text())
    return {c["name"]: c["status"] for c in doc["checks"]}


def test_two_clean_children_pass(spec, tmp_path, capsys):
    dirs = children(spec, tmp_path)
    out = tmp_path / "out"
    code, cap = run_combine(dirs, out, capsys)
    assert code == 0, cap.out
    doc = json.loads((out / "combined.json").read_text())
    assert doc["verdict"] == "PASS" and doc["exit_code"] == 0
    assert set(checks(out).values()) == {"pass"}
    assert [c["verdict"] for c in doc["children"]] == ["PASS", "PASS"]
    for c in doc["children"]:
        assert len(c["manifest_sha256"]) == 64
        assert "backends/" + ("nccl" if "nccl" in c["dir"] else "host-staged") + "/requests.jsonl.gz" in c["artifacts"]
    assert {b["name"]: b["runtime_boundary"]["status"] for b in doc["backends"]} == {"host-staged": "declared", "nccl": "confirmed"}
    sidecar = (out / "combined.json.sha256").read_text()
    assert sidecar == hashlib.sha256((out / "combined.json").read_bytes()).hexdigest() + "  combined.json\n"


def test_json_format(spec, tmp_path, capsys):
    code, cap = run_combine(children(spec, tmp_path), tmp_path / "out", capsys, "--format", "json")
    assert code == 0
    doc = json.loads(cap.out)
    assert doc["combined_sha256"] == hashlib.sha256((tmp_path / "out" / "combined.json").read_bytes()).hexdigest()


def test_a_failing_child_fails(spec, tmp_path, capsys):
    def edit(name, b):
        if name == "nccl":
            b.set_outcome(next(b.measured("nccl")), "failed", "engine died")

    out = tmp_path / "out"
    code, cap = run_combine(children(spec, tmp_path, edit), out, capsys)
    assert code == 1
    assert checks(out)["children_pass"] == "fail"
    assert "nccl: FAIL: 1 of 15 required rules failed (failed == 0)" in cap.out


def test_children_are_reverified_not_trusted(spec, tmp_path, capsys):
    dirs = children(spec, tmp_path)
    p = Path(dirs[1]) / "backends" / "nccl" / "traces.jsonl.gz"  # a trace row repeated: one more gzip member
    p.write_bytes(p.read_bytes() + gzip.compress(gzip.decompress(p.read_bytes()).splitlines(keepends=True)[0]))
    out = tmp_path / "out"
    code, cap = run_combine(dirs, out, capsys)
    assert code == 1
    assert "artifacts_verified: FAIL — backends/nccl/traces.jsonl.gz" in cap.out


def test_different_model_revisions_fail(spec, tmp_path, capsys):
    def edit(name, b):
        if name == "nccl":
            b.entry("nccl")["model"]["revision"] = "1" * 40

    out = tmp_path / "out"
    code, cap = run_combine(children(spec, tmp_path, edit), out, capsys)
    assert code == 1
    assert checks(out)["model_provenance"] == "fail"
    assert "different model revisions" in cap.out


def test_different_fingerprints_fail_even_when_children_pass(spec, tmp_path, capsys):
    def edit(name, b):
        if name == "nccl":
            b.entry("nccl")["model"]["fingerprint"] = "e" * 64

    out = tmp_path / "out"
    code, _ = run_combine(children(spec, tmp_path, edit), out, capsys)
    assert code == 1
    c = checks(out)
    assert c["children_pass"] == "pass" and c["model_provenance"] == "fail"


def test_different_commits_fail(spec, tmp_path, capsys):
    def edit(name, b):
        if name == "nccl":
            src = b.entry("nccl")["source"]
            src["commit_before"] = src["commit_after"] = "a" * 40

    out = tmp_path / "out"
    code, _ = run_combine(children(spec, tmp_path, edit), out, capsys)
    assert code == 1
    assert checks(out)["one_commit"] == "fail"


def test_a_backend_twice_or_missing_fails(spec, tmp_path, capsys):
    d = str(EvidenceBuilder(spec, only=("nccl",)).write(tmp_path / "a"))
    e = str(EvidenceBuilder(spec, only=("nccl",), run_id="run2").write(tmp_path / "b"))
    out = tmp_path / "out"
    code, _ = run_combine([d, e], out, capsys)
    assert code == 1
    assert checks(out)["backends_once"] == "fail"
    doc = json.loads((out / "combined.json").read_text())
    assert "backend host-staged is in no child" in next(c["message"] for c in doc["checks"] if c["name"] == "backends_once")


def test_inconclusive_child_makes_the_combination_inconclusive(spec, tmp_path, capsys):
    # a time-scaled run, built as one (its bucket windows follow the scaled plan: the judge
    # checks windows against the plan, so only editing the manifest's time_scale is malformed)
    out = tmp_path / "out"
    code, _ = run_combine(children(spec, tmp_path, time_scale=0.5), out, capsys)
    assert code == 3


def test_a_dirty_tree_fails_the_combination(spec, tmp_path, capsys):
    def edit(name, b):
        if name == "nccl":
            b.entry("nccl")["source"].update(dirty_before=True, dirty_after=True)

    out = tmp_path / "out"
    code, _ = run_combine(children(spec, tmp_path, edit), out, capsys)
    assert code == 1
    doc = json.loads((out / "combined.json").read_text())
    one = next(c for c in doc["checks"] if c["name"] == "one_commit")
    assert one["status"] == "fail" and "uncommitted changes" in one["message"]


def test_simulated_backends_can_combine(tmp_path, capsys):
    """`sim` (and `url`, `shell`) backends have no server binary soakspec can hash, and a spec
    without a source repository records no commit: neither is required of them."""
    demo = load_spec(SEED.parent / "demo.soak")[0]
    dirs = []
    for i, b in enumerate(demo.backends):
        eb = EvidenceBuilder(demo, only=(b.name,), run_id=f"run-{b.name}", t0=1_747_000_000.0 + 1000 * i, per_bucket=30)
        dirs.append(str(eb.write(tmp_path / b.name)))
    out = tmp_path / "out"
    code, cap = run_combine(dirs, out, capsys)
    assert code == 0, cap.out
    assert set(checks(out).values()) == {"pass"}


# ------------------------------------------------------------------------------ issue 19


def test_the_combined_directory_is_evidence_that_verify_gate_and_report_accept(spec, tmp_path, capsys):
    out = tmp_path / "out"
    code, cap = run_combine(children(spec, tmp_path), out, capsys)
    assert code == 0, cap.out
    assert main(["verify", str(out)]) == 0
    assert "intact and complete" in capsys.readouterr().out
    assert main(["gate", str(out)]) == 0
    gate = capsys.readouterr().out
    assert "completed_run — run complete: 2 backends" in gate
    assert main(["report", str(out), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {b["name"] for b in doc["results"]["backends"]} == {"host-staged", "nccl"}
    m = json.loads((out / "manifest.json").read_text())
    assert [c["run_id"] for c in m["combined_from"]] == ["run-host-staged", "run-nccl"]
    assert "only" not in m and "combined.json" in m["artifacts"]


def test_a_child_file_changed_after_the_combined_copy_is_caught_by_verify(spec, tmp_path, capsys):
    out = tmp_path / "out"
    assert run_combine(children(spec, tmp_path), out, capsys)[0] == 0
    f = out / "backends" / "nccl" / "requests.jsonl.gz"
    edit_requests(f, lambda t: t.replace('"completed"', '"failed"', 1))
    assert main(["verify", str(out)]) == 1
    assert main(["gate", str(out)]) == 1


def _url_children(tmp_path, edit=lambda b: None):
    from soakspec.judge.testing import small_spec

    s = small_spec(backends=("a", "b"))
    dirs = []
    for name in ("a", "b"):
        b = EvidenceBuilder(s, only=(name,), run_id=f"run-{name}")
        e = b.entry(name)
        e["source"] = {"repo": None, "commit_before": None, "commit_after": None, "dirty_before": None, "dirty_after": None,
                       "reason": "the spec declares no source repository"}
        e["model"].update(revision=None, fingerprint=None, reason="the spec declares no model")
        e["server_binary"] = {"path": None, "sha256": None}  # a url backend launches nothing
        edit(b)
        dirs.append(str(b.write(tmp_path / name)))
    return dirs


def test_provenance_the_spec_never_declared_is_not_required(tmp_path, capsys):
    out = tmp_path / "out"
    code, cap = run_combine(_url_children(tmp_path), out, capsys)
    assert code == 0, cap.out
    c = checks(out)
    assert c["one_commit"] == "pass" and c["model_provenance"] == "pass"
    assert "no source repository declared" in cap.out
    assert main(["verify", str(out)]) == 0


def test_declared_provenance_is_still_required(spec, tmp_path, capsys):
    def edit(name, b):
        if name == "nccl":
            src = b.entry("nccl")["source"]
            src["commit_before"] = src["commit_after"] = None

    out = tmp_path / "out"
    code, cap = run_combine(children(spec, tmp_path, edit), out, capsys)
    assert code == 1
    assert checks(out)["one_commit"] == "fail" and "no commit recorded for nccl" in cap.out


def test_two_runs_of_the_same_backend_are_a_before_after_series(spec, tmp_path, capsys):
    before = EvidenceBuilder(spec, run_id="before")
    after = EvidenceBuilder(spec, run_id="after", t0=1_748_000_000.0)
    for name in ("host-staged", "nccl"):
        e = after.entry(name)
        e["source"]["commit_before"] = e["source"]["commit_after"] = "c" * 40
        e["server_binary"]["sha256"] = "d" * 64
    dirs = [str(before.write(tmp_path / "before")), str(after.write(tmp_path / "after"))]
    out = tmp_path / "out"
    code, cap = run_combine(dirs, out, capsys)
    assert code == 0, cap.out
    assert set(checks(out).values()) == {"pass"}
    assert "before/after series" in cap.out
    assert "soakspec compare" in cap.err
    assert (out / "combined.json").is_file() and not (out / "manifest.json").exists()


def test_out_must_be_new_or_empty(spec, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, cap = run_combine(children(spec, tmp_path), out, capsys)
    assert code == 2 and "not an empty directory" in cap.err
    assert (out / "keep.txt").read_text() == "mine"


# ------------------------------------------------------------------------------ client health


def _client_health(out: Path, capsys) -> dict:
    main(["gate", str(out), "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    return next(r for r in doc["rules"] if r["rule"] == "client_healthy")


def test_the_combined_directory_carries_each_childs_client_health(spec, tmp_path, capsys):
    """combine copies client.jsonl (each child's lines for its backend): the combined run is
    judged on its load generator's health, not passed for want of samples."""
    out = tmp_path / "out"
    code, cap = run_combine(children(spec, tmp_path, lambda name, b: b.with_client()), out, capsys)
    assert code == 0, cap.out
    rows = [json.loads(x) for x in (out / "client.jsonl").read_text().splitlines()]
    assert {r["backend"] for r in rows} == {"host-staged", "nccl"}
    assert "client.jsonl" in json.loads((out / "manifest.json").read_text())["artifacts"]
    assert main(["verify", str(out)]) == 0
    capsys.readouterr()
    health = _client_health(out, capsys)
    assert health["status"] == "pass" and health["message"].startswith("the load generator kept up in"), health


def test_a_saturated_childs_client_makes_the_combined_run_inconclusive(spec, tmp_path, capsys):
    def edit(name, b):
        b.with_client(lag=0.2 if name == "nccl" else 0.002)

    out = tmp_path / "out"
    code, _ = run_combine(children(spec, tmp_path, edit), out, capsys)
    assert code == 3
    health = _client_health(out, capsys)
    assert health["status"] == "inconclusive" and "backend nccl" in health["message"] and "saturated" in health["message"], health


def test_a_child_from_before_client_health_beside_one_with_it_is_not_a_pass(spec, tmp_path, capsys):
    """One child measured its client, the other has no client.jsonl: the combined run measured
    its client, so the other backend's buckets have no sample -- INCONCLUSIVE naming it."""
    def edit(name, b):
        if name == "host-staged":
            b.with_client()

    out = tmp_path / "out"
    code, cap = run_combine(children(spec, tmp_path, edit), out, capsys)
    assert code == 0, cap.out  # each child passes on its own (nccl's health is not judged: it never measured it)
    health = _client_health(out, capsys)
    assert health["status"] == "inconclusive" and "backend nccl" in health["message"], health
    assert "no client-health sample in bucket" in health["message"], health


# ------------------------------------------------------------------------------ audit: time scales


def _scaled_children(tmp_path, scales, specs=None):
    """Children a and b of a spec whose gate allows rehearsals (so a time-scaled child passes
    its own gate), each built as run at its time scale (and with its spec of `specs`)."""
    from soakspec.judge.testing import small_spec

    s = small_spec(backends=("a", "b"), gate="allow_rehearsal = true")
    dirs = []
    for name, scale, sp in zip(("a", "b"), scales, specs or (s, s)):
        b = EvidenceBuilder(sp, only=(name,), run_id=f"run-{name}", time_scale=scale, t0=1_747_000_000.0 + (name == "b") * 1000)
        e = b.entry(name)
        e["source"] = {"repo": None, "commit_before": None, "commit_after": None, "dirty_before": None, "dirty_after": None,
                       "reason": "the spec declares no source repository"}
        e["model"].update(revision=None, fingerprint=None, reason="the spec declares no model")
        e["server_binary"] = {"path": None, "sha256": None}
        dirs.append(str(b.write(tmp_path / name)))
    return dirs


def test_children_at_different_time_scales_fail_and_the_combined_run_claims_no_full_scale(tmp_path, capsys):
    dirs = _scaled_children(tmp_path, (1.0, 0.5))
    out = tmp_path / "out"
    code, cap = run_combine(dirs, out, capsys)
    assert code == 1, cap.out
    assert "PASS         children_pass" in cap.out  # each child passes its own gate
    assert f"FAIL         same_workload — different time scales: {dirs[0]}: 1 (full scale), {dirs[1]}: 0.5" in cap.out
    assert cap.out.rstrip().endswith("FAIL: same_workload")
    assert checks(out)["same_workload"] == "fail"
    # a failed combination leaves no evidence directory to gate or report as one run
    assert not (out / "manifest.json").exists() and not (out / "backends").exists()
    assert "the combination fails same_workload: no combined evidence directory" in cap.err
    # the manifest it would have written never says it ran at a scale b did not run at
    from soakspec.commands.combine import combined_manifest
    from soakspec.judge.combine import Child
    from soakspec.judge.evidence import load_evidence
    from soakspec.judge.judge import judge
    from soakspec.judge.testing import spec_from_text

    kids = []
    for d in dirs:
        ev = load_evidence(d)
        sp = spec_from_text(ev.spec_text)
        kids.append(Child(d, sp, ev, judge(sp, ev)))
    m = combined_manifest(kids)
    assert m["time_scale"] == 0.5 and [c["time_scale"] for c in m["combined_from"]] == [1.0, 0.5]


def test_children_of_different_workloads_leave_no_evidence_directory_that_could_pass(tmp_path, capsys):
    """b ran another workload (3-minute levels, not 2): same_workload fails, and combine writes
    no evidence directory: judged as one run with a's spec, such a directory passed `gate` (exit 0)."""
    from soakspec.judge.testing import small_spec

    sa = small_spec(backends=("a", "b"), gate="allow_rehearsal = true")
    sb = small_spec(backends=("a", "b"), gate="allow_rehearsal = true", duration="3m")
    dirs = _scaled_children(tmp_path, (1.0, 1.0), specs=(sa, sb))
    out = tmp_path / "out"
    code, cap = run_combine(dirs, out, capsys)
    assert code == 1, cap.out
    assert "PASS         children_pass" in cap.out and cap.out.rstrip().endswith("FAIL: same_workload")
    assert f"FAIL         same_workload — workloads differ from {dirs[0]} in {dirs[1]}" in cap.out
    assert "the combination fails same_workload: no combined evidence directory" in cap.err, cap.err
    assert "wrote " + str(out) + " (an evidence directory" not in cap.err
    assert sorted(p.name for p in out.iterdir()) == ["combined.json", "combined.json.sha256"]
    doc = json.loads((out / "combined.json").read_text())
    assert doc["verdict"] == "FAIL" and doc["evidence_directory"] is False
    assert doc["evidence_directory_reason"].startswith("the combination fails same_workload")
    # nothing there for gate to pass: it is not an evidence directory
    assert main(["gate", str(out)]) == 2
    capsys.readouterr()


def test_children_at_one_time_scale_combine_at_that_scale(tmp_path, capsys):
    dirs = _scaled_children(tmp_path, (0.5, 0.5))
    out = tmp_path / "out"
    code, cap = run_combine(dirs, out, capsys)
    assert code == 0, cap.out
    assert "same_workload — every child ran the same spec, at time scale 0.5" in cap.out
    assert json.loads((out / "manifest.json").read_text())["time_scale"] == 0.5
    assert main(["gate", str(out)]) == 0
    assert "time-scaled by 0.5; the gate allows rehearsals" in capsys.readouterr().out


def test_a_child_is_held_without_its_requests_while_the_next_is_read(spec, tmp_path, capsys, monkeypatch):
    """combine judged every child and held them all until it combined them: a day-long child's
    request table is hundreds of MiB, three children three times that. Each child is now judged
    and re-derived as it is read and held without its requests: no child's table is alive as
    the next one is read, nor when the combined directory is judged; combined.json says the
    same as when every child was held whole."""
    from soakspec.commands import combine as cmd, gate
    from soakspec.judge.combine import Child, combine
    from soakspec.judge.judge import judge
    from soakspec.judge.testing import tables_alive as tables

    dirs = children(spec, tmp_path)
    before = tables()  # any that another test left alive
    load, alive = gate.load_for_judging, []

    def counted(*a, **k):  # the tables alive as each child is read
        alive.append(tables())
        return load(*a, **k)

    write_results, at_results = cmd._write_results, []
    monkeypatch.setattr(gate, "load_for_judging", counted)
    monkeypatch.setattr(cmd, "_write_results", lambda out, s: at_results.append(tables()) or write_results(out, s))
    code, cap = run_combine(dirs, tmp_path / "out", capsys, "--format", "json")
    assert code == 0, cap.out
    assert alive == [before, before] and at_results == [before]
    doc = json.loads(cap.out)
    monkeypatch.setattr(gate, "load_for_judging", load)
    whole = []
    for d in dirs:  # every child held whole, as before: the same checks, children and backends
        s, ev = load(*("combine", d, None), name_dir=True)
        whole.append(Child(d.rstrip("/"), s, ev, judge(s, ev)))
    got = combine(whole).to_json()
    for key in ("checks", "children", "backends", "verdict"):
        assert doc[key] == got[key], key


def test_sweep_children_combine_as_their_own_gates_judge_them(tmp_path, capsys):
    """A sweep's child is judged and re-derived apart from the judge's join (which narrowed it
    to each probe): two runs of one sweep -- a before/after series -- combine to what combining
    the whole children gives, each child judged as the sweep it ran. Judged as the plain
    levels of its probes, each child would FAIL: the probes above 4 are slow."""
    from soakspec.commands import gate
    from soakspec.judge.combine import Child, combine
    from soakspec.judge.joined import join
    from soakspec.judge.judge import judge
    from soakspec.judge.testing import spec_from_text
    from test_sweep import PROBES, _probed_run, _sweep_spec

    spec = spec_from_text(_sweep_spec())
    dirs = []
    for name in ("before", "after"):
        b = _probed_run(spec_from_text(_sweep_spec(f"concurrency = {PROBES}")))
        b.run_id, b.spec = name, spec  # what the runner embeds: the spec it ran, the sweep's
        b.manifest["run_id"] = name
        b.manifest["spec"] = {"path": spec.path, "text": spec.canonical_text, "sha256": spec.sha256}
        dirs.append(str(b.write(tmp_path / name)))
        assert main(["gate", dirs[-1]]) == 0
        assert "max_sustainable_concurrency" in capsys.readouterr().out
    code, cap = run_combine(dirs, tmp_path / "out", capsys, "--format", "json")
    doc = json.loads(cap.out)
    whole = []
    for d in dirs:
        s, ev = gate.load_for_judging("combine", d, None, name_dir=True)
        assert join(s, ev).sweep  # judged as the sweep it ran
        whole.append(Child(d, s, ev, judge(s, ev)))
    got = combine(whole).to_json()
    assert code == got["exit_code"] == 0, cap.out
    assert [c["verdict"] for c in doc["children"]] == ["PASS", "PASS"]
    for key in ("checks", "children", "backends", "verdict"):
        assert doc[key] == got[key], key
