"""Re-judging retained evidence with a spec other than the run's (`gate --spec NEWER`): the
judge pairs the plan's levels with the evidence's by index, so a level list, load or deadline
edited in the newer spec must not be judged on the evidence of another level (missing data is
never a pass)."""

from __future__ import annotations

from soakspec.cli import main
from soakspec.judge.judge import judge
from soakspec.judge.testing import EvidenceBuilder, small_spec


def _completed_run(verdict):
    return next(r for r in verdict.rules if r.rule == "completed_run")


def test_a_level_list_edited_in_the_newer_spec_is_not_judged_on_another_levels_evidence():
    """Run at concurrency [2, 4], judged with [3, 4]: the evidence's level 0 is concurrency 2,
    never the planned concurrency 3 (it passed, its rules judged on concurrency 2's requests)."""
    ev = EvidenceBuilder(small_spec(levels="[2, 4]")).build()
    v = judge(small_spec(levels="[3, 4]"), ev)
    cr = _completed_run(v)
    assert v.outcome == "INCONCLUSIVE" and cr.status == "inconclusive", v.to_json()
    assert "concurrency 2 (the spec plans 3)" in cr.message and "concurrency 3" in cr.message, cr.message
    assert "level 1" not in cr.message  # concurrency 4 is the planned level 1
    # the same levels in another order: neither is the planned level of its index
    v = judge(small_spec(levels="[4, 2]"), ev)
    assert v.outcome == "INCONCLUSIVE" and "(and 1 more)" in _completed_run(v).message
    # written `require completed_run`: FAIL, as any other broken run
    v = judge(small_spec("require completed_run\nrequire failed == 0", levels="[3, 4]"), ev)
    assert v.outcome == "FAIL" and _completed_run(v).status == "fail"
    # the run's own spec: no problem
    assert judge(small_spec(levels="[2, 4]"), ev).outcome == "PASS"


def test_a_rate_changed_in_the_newer_spec_is_not_judged_on_the_old_rates_evidence():
    ev = EvidenceBuilder(small_spec(mode="open", levels="[2rps]")).build()
    v = judge(small_spec(mode="open", levels="[2.5rps]"), ev)
    assert v.outcome == "INCONCLUSIVE" and "rate 2.0 (the spec plans 2.5)" in _completed_run(v).message
    assert judge(small_spec(mode="open", levels="[2rps]"), ev).outcome == "PASS"


def test_a_deadline_changed_in_the_newer_spec_is_not_taken_as_applied(tmp_path, capsys):
    """The runner applied the run's deadline: a request that took 1 s under a 30 s deadline
    says nothing of a 100 ms one, and `timeouts == 0` passed with a 100 ms deadline."""
    spec = small_spec("require timeouts == 0")
    root = EvidenceBuilder(spec).write(tmp_path / "run")
    newer = tmp_path / "newer.soak"
    newer.write_text(spec.canonical_text.replace("deadline = 30s", "deadline = 100ms"))
    assert "deadline = 100ms" in newer.read_text()
    assert main(["gate", str(root), "--spec", str(newer)]) == 3
    out, err = capsys.readouterr()
    assert "ran with deadline 30s (the spec plans 100ms)" in out, out
    assert "other than the run's" in out and "differs from the spec the run used" in err
    assert main(["gate", str(root)]) == 0


def test_a_longer_duration_in_the_newer_spec_is_named_not_called_a_level_cut_short(tmp_path, capsys):
    """Run for 2m, judged with a spec of 4m: the FAIL is right, but each level ran its full
    duration (the manifest says completed), so "buckets 2-3 of 4 not measured: the level was cut
    short in bucket 1" was false. The level the spec plans is named as another level, as a
    changed concurrency is, both ways (a shorter newer spec too)."""
    spec = small_spec("require completed_run\nrequire failed == 0")
    root = EvidenceBuilder(spec).write(tmp_path / "run")
    for want, ran in (("4m", "2m"), ("1m", "2m")):
        newer = tmp_path / f"newer-{want}.soak"
        newer.write_text(spec.canonical_text.replace("duration = 2m", f"duration = {want}"))
        assert main(["gate", str(root), "--spec", str(newer)]) == 1
        out, _ = capsys.readouterr()
        assert f"FAIL  completed_run — backend a, concurrency 2: level 0 of workload w ran with a planned duration of {ran} " \
               f"(the spec plans {want}): not the level the spec plans" in out, out
        assert "cut short" not in out and "did not run its full duration" not in out, out
    assert main(["gate", str(root)]) == 0


def _with_max_tokens(text: str, n: str) -> str:
    out = text.replace("  deadline = 30s\n", f"  deadline = 30s\n  max_tokens = {n}\n")
    assert out != text
    return out


def test_a_newer_spec_bounds_usage_by_the_max_tokens_the_run_sent(tmp_path):
    """The bound on a response's completion tokens is what the run asked for: a newer spec's
    lower max_tokens flagged every request of the run as reporting more tokens than it asked
    for, and its ITL, TPOT and throughput were then not computed ("no completed gaps")."""
    from soakspec.judge.joined import join
    from soakspec.judge.testing import spec_from_text

    ran = spec_from_text(_with_max_tokens(small_spec("require mean(itl) < 1s").canonical_text, "64"))
    ev = EvidenceBuilder(ran).build()
    assert all((r.get("output_tokens") or 0) > 8 for r in ev.backends[0].records if r.get("bucket", -1) >= 0)
    newer = spec_from_text(_with_max_tokens(small_spec("require mean(itl) < 1s\nrequire mean(tpot) < 1s").canonical_text, "8"))
    run = join(newer, ev)
    flagged = [r for r in run.judged[0].measured if r.get("usage_mismatch")]
    assert flagged == [], flagged[:1]
    v = judge(newer, ev)
    rules = {r.rule: r for r in v.rules}
    assert rules["mean(itl) < 1s"].status == "pass" and rules["mean(tpot) < 1s"].status == "pass", v.to_json()
    # ... and the run's requests are not the newer spec's workload: said, never a silent pass
    cr = _completed_run(v)
    assert v.outcome == "INCONCLUSIVE" and "max_tokens 64 → 8" in cr.message, cr.message


def test_a_newer_spec_with_another_workload_is_not_judged_silently(tmp_path, capsys):
    spec = small_spec()
    root = EvidenceBuilder(spec).write(tmp_path / "run")
    newer = tmp_path / "newer.soak"
    newer.write_text(_with_max_tokens(spec.canonical_text, "512"))
    assert main(["gate", str(root), "--spec", str(newer)]) == 3
    out = capsys.readouterr().out
    assert "workload 'w': max_tokens" in out and "→ 512" in out and "the run sent other requests" in out, out
    # rules edited only: the workload is the run's, nothing said of it
    rules_only = tmp_path / "rules.soak"
    rules_only.write_text(spec.canonical_text.replace("require failed == 0", "require failed == 0\n  require timeouts == 0"))
    assert main(["gate", str(root), "--spec", str(rules_only)]) == 0
    out = capsys.readouterr().out
    assert "other than the run's" in out and "sent other requests" not in out
