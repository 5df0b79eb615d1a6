"""What `soakspec compare` must never call a PASS: a new run whose requests fail (the latency
rows are over completed requests only, so they cannot see it), and a comparison with rows the
new run has no data for."""

from __future__ import annotations

import json
import random

import pytest

from soakspec.cli import main
from soakspec.compare import compare, parse_rule
from soakspec.compare.render import render
from soakspec.judge.testing import EvidenceBuilder, small_spec

SPEC = small_spec(duration="4m", bucket="1m")


def builder(seed: int, *, fail_every: int = 0, per_bucket: int = 100, spec=SPEC, **kw) -> EvidenceBuilder:
    """A clean run with seeded latencies; every `fail_every`-th measured request failed."""
    b = EvidenceBuilder(spec, per_bucket=per_bucket, run_id=f"run{seed}", **kw)
    rng = random.Random(seed)
    for i, r in enumerate(b.measured("a")):
        ttft = rng.lognormvariate(-2.3, 0.35)
        gaps = [rng.lognormvariate(-4.0, 0.25) for _ in range(63)]
        r.update(ttft=ttft, first_token=r["start"] + ttft, itl=gaps, tpot=sum(gaps) / 63,
                 latency=ttft + sum(gaps), end=r["start"] + ttft + sum(gaps))
        if fail_every and i % fail_every == 0:
            b.set_outcome(r, "failed", "HTTP 500", status=500)
    return b


def _row(doc, metric, stat):
    return next(r for r in doc["rows"] if (r["metric"], r["stat"]) == (metric, stat))


# ------------------------------------------------------------------------------ unsuccessful requests


def test_a_new_run_with_a_quarter_of_its_requests_failed_is_a_fail_not_a_pass(tmp_path, capsys):
    """The audit's v2base/v2new: 26 % of the new run's requests failed, the completed ones were
    as fast as before -- and compare said PASS, exit 0."""
    base = builder(1).write(tmp_path / "base")
    new = builder(2, fail_every=4).write(tmp_path / "new")
    assert main(["compare", str(base), str(new), "--resamples", "500"]) == 1
    md = capsys.readouterr().out
    assert "**Comparison: FAIL**" in md and "unsuccessful requests rose significantly" in md
    line = next(x for x in md.splitlines() if "| ratio(errors) |" in x)
    assert "| 0.0% | 25.0% | +25.0 pp |" in line and "**REGRESSION**" in line
    assert main(["compare", str(base), str(new), "--resamples", "500", "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    row = _row(doc, "errors", "ratio")
    assert row["verdict"] == "regression" and row["change_kind"] == "difference"
    assert (row["base"], row["new"], row["n_base"], row["n_new"]) == (0.0, 0.25, 400, 400)
    assert 0 < row["ci_low"] < 0.25 < row["ci_high"]
    assert doc["verdict"] == "FAIL" and any("unsuccessful requests rose" in r for r in doc["reasons"])
    assert main(["compare", str(base), str(new), "--resamples", "500", "--format", "html"]) == 1
    assert "<td>ratio(errors)</td>" in capsys.readouterr().out


def test_a_new_run_whose_every_request_failed_is_a_fail(tmp_path, capsys):
    base = builder(1).write(tmp_path / "base")
    new = builder(2, fail_every=1).write(tmp_path / "new")
    assert main(["compare", str(base), str(new), "--resamples", "500", "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "FAIL" and _row(doc, "errors", "ratio")["new"] == 1.0


def test_the_same_share_of_errors_is_no_change_and_a_fall_is_an_improvement():
    same = compare(builder(1, fail_every=10).build(), builder(2, fail_every=10).build(), resamples=500)
    errors = next(r for r in same.rows if r.metric == "errors")
    assert errors.verdict == "no significant change" and same.outcome == "PASS"
    better = compare(builder(1, fail_every=4).build(), builder(2).build(), resamples=500)
    assert next(r for r in better.rows if r.metric == "errors").verdict == "improvement"
    assert better.outcome == "PASS"


def test_a_rule_on_the_share_of_errors_says_how_much_rise_matters():
    base, new = builder(1).build(), builder(2, fail_every=4).build()
    # a rise of at most 50 points is allowed: the built-in "no significant rise" gives way to the rule
    lax = compare(base, new, rules=[parse_rule("ratio(errors) regression <= 50%")], resamples=500)
    assert lax.outcome == "PASS" and lax.rules[0].status == "pass"
    strict = compare(base, new, rules=[parse_rule("require ratio(errors) regression <= 1%")], resamples=500)
    assert strict.outcome == "FAIL" and strict.rules[0].status == "fail" and "(limit 1 pp)" in strict.rules[0].message
    warned = compare(base, new, rules=[parse_rule("warn ratio(errors) regression <= 1%")], resamples=500)
    assert warned.outcome == "PASS" and warned.rules[0].status == "warn"


def test_the_spec_form_of_a_rule_on_errors_checks():
    from soakspec.judge.testing import spec_from_text

    spec = spec_from_text(SPEC.canonical_text + "compare {\n  require regression(ratio(errors)) <= 2%\n}\n")
    assert [(r.stat, r.metric, r.threshold) for r in spec.compare.rules] == [("ratio", "errors", 0.02)]
    for bad in ("require regression(ratio(ttft)) <= 2%", "require regression(p99(errors)) <= 2%"):
        with pytest.raises(ValueError, match="E303"):
            spec_from_text(SPEC.canonical_text + "compare {\n  " + bad + "\n}\n")


def test_newcombe_interval_matches_the_published_example():
    """Newcombe (1998), Statistics in Medicine 17:873, table II, method 10: 56/70 - 48/80 is
    0.0524 .. 0.3339; 0/10 - 0/20 is -0.1611 .. 0.2775 (a share of 0 on both sides)."""
    from soakspec.compare import proportion_difference

    d, lo, hi = proportion_difference(48, 80, 56, 70, 0.95)
    assert d == pytest.approx(0.2)
    assert (lo, hi) == (pytest.approx(0.0524, abs=1e-4), pytest.approx(0.3339, abs=1e-4))
    d, lo, hi = proportion_difference(0, 20, 0, 10, 0.95)
    assert (d, lo, hi) == (0.0, pytest.approx(-0.1611, abs=1e-4), pytest.approx(0.2775, abs=1e-4))


def test_equal_error_rates_are_rarely_called_a_change():
    """Two runs with the same 2 % error rate: a 95 % interval of the difference excludes 0 in
    at most about 5 % of repetitions (the score interval keeps its coverage near 0)."""
    from soakspec.compare import proportion_difference

    rng = random.Random(7)
    wrong = 0
    for _ in range(2000):
        kb = sum(rng.random() < 0.02 for _ in range(300))
        kn = sum(rng.random() < 0.02 for _ in range(300))
        _, lo, hi = proportion_difference(kb, 300, kn, 300, 0.95)
        wrong += lo > 0 or hi < 0
    assert wrong <= 0.06 * 2000


# ------------------------------------------------------------------------------ missing data


def test_rows_the_new_run_has_no_data_for_are_never_a_pass(tmp_path, capsys):
    """The audit's v2base/allfail with the rise of errors allowed by a rule: every latency row is
    missing on the new side. Before, that compared PASS (and a rule on a missing row said
    'missing (needs 299)')."""
    base = builder(1).write(tmp_path / "base")
    new = builder(2, fail_every=1).write(tmp_path / "new")
    args = ["compare", str(base), str(new), "--resamples", "500", "--require", "ratio(errors) regression <= 100%"]
    assert main(args) == 3
    md = capsys.readouterr().out
    assert "**Comparison: INCONCLUSIVE**" in md and "the new run has no data for 12 rows" in md
    assert "missing data is never a pass" in md
    assert main([*args, "--format", "json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "INCONCLUSIVE" and doc["exit_code"] == 3
    assert any("p50(ttft)" in r and "no data" in r for r in doc["reasons"])
    # a rule on a missing row is inconclusive, and says which run lacks the data
    assert main([*args, "--require", "p50(ttft) regression <= 5%", "--format", "json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    ttft = next(o for o in doc["rules"] if o["rule"] == "require p50(ttft) regression <= 5%")
    assert ttft["status"] == "inconclusive" and "the new run has no data (n=400/0)" in ttft["message"]
    # a warn rule on errors lets the rise through, not the missing data
    assert main(["compare", str(base), str(new), "--resamples", "500", "--require", "warn ratio(errors) regression <= 1%"]) == 3


def test_rows_the_base_run_has_no_data_for_are_inconclusive_too():
    c = compare(builder(1, fail_every=1).build(), builder(2).build(), resamples=500)
    assert next(r for r in c.rows if r.metric == "errors").verdict == "improvement"
    assert c.outcome == "INCONCLUSIVE" and any(r.startswith("the base run has no data for 12 rows") for r in c.reasons)


def test_a_metric_neither_run_has_decides_nothing():
    """Rows missing on both sides (a metric the workload does not produce) are not missing data
    of one run: they leave the outcome alone."""
    def no_tpot(seed):
        b = builder(seed)
        for r in b.measured("a"):
            r.update(tpot=None, itl=[])
        return b.build()

    c = compare(no_tpot(1), no_tpot(2), resamples=500)
    both = [r for r in c.rows if r.verdict == "missing"]
    assert both and all(r.base is None and r.new is None for r in both)
    assert not any("no data" in r for r in c.reasons)


# ------------------------------------------------------------------------------ comparable runs


def test_a_rehearsal_on_either_side_is_inconclusive_never_a_pass(tmp_path, capsys):
    """The audit's v2base/v2reh: a `--rehearse --time-scale 0.5` run compared PASS with a real one."""
    base = builder(1).write(tmp_path / "base")
    reh = builder(2, rehearsal=True, time_scale=0.5).write(tmp_path / "reh")
    for a, b in ((base, reh), (reh, base)):
        assert main(["compare", str(a), str(b), "--resamples", "500"]) == 3
        md = capsys.readouterr().out
        assert "**Comparison: INCONCLUSIVE**" in md
        assert "is a rehearsal against the simulator and time-scaled by 0.5" in md
        assert "a scaled run never passes a real gate" in md
    assert main(["compare", str(base), str(reh), "--resamples", "500", "--format", "json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert (doc["new"]["rehearsal"], doc["new"]["time_scale"]) == (True, 0.5)
    assert (doc["base"]["rehearsal"], doc["base"]["time_scale"]) == (False, 1.0)
    assert any(r.startswith("the new run is a rehearsal") for r in doc["reasons"])


def test_a_time_scaled_run_is_inconclusive_too():
    c = compare(builder(1).build(), builder(2, time_scale=0.5).build(), resamples=500)
    assert c.outcome == "INCONCLUSIVE"
    assert c.reasons == ("the new run is time-scaled by 0.5: it says nothing about the real backends at full duration, "
                         "and a scaled run never passes a real gate (with gate { allow_rehearsal = true }, two runs "
                         "scaled alike compare)",)


def test_allow_rehearsal_compares_two_rehearsals_alike_and_never_a_rehearsal_with_a_real_run():
    r1, r2 = builder(1, rehearsal=True).build(), builder(2, rehearsal=True).build()
    ok = compare(r1, r2, resamples=500, allow_rehearsal=True)
    assert ok.outcome == "PASS" and not ok.reasons and any("allow_rehearsal" in n for n in ok.notes)
    assert compare(r1, r2, resamples=500).outcome == "INCONCLUSIVE"
    mixed = compare(builder(1).build(), r2, resamples=500, allow_rehearsal=True)
    assert mixed.outcome == "INCONCLUSIVE" and "not scaled alike" in mixed.reasons[0]


def _longer_requests(extra: str = "  prompt_words = 512\n  max_tokens = 256\n"):
    from soakspec.judge.testing import spec_from_text

    return spec_from_text(SPEC.canonical_text.replace('workload "w" {\n', 'workload "w" {\n' + extra))


def test_runs_that_sent_different_requests_say_so_and_are_inconclusive(tmp_path, capsys):
    """The audit's v2base/v2tok: 512-word prompts and max_tokens 64 against 16 and 16 compared
    PASS without a word about it."""
    base = builder(1).write(tmp_path / "base")
    new = builder(2, spec=_longer_requests()).write(tmp_path / "new")
    assert main(["compare", str(base), str(new), "--resamples", "500"]) == 3
    md = capsys.readouterr().out
    assert "**Comparison: INCONCLUSIVE**" in md
    assert "workload 'w': prompt 64 words → 512 words; max_tokens 64 → 256" in md
    assert "--allow-workload-change" in md
    assert main(["compare", str(base), str(new), "--resamples", "500", "--format", "json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert doc["workload_differences"] == ["workload 'w': prompt 64 words → 512 words; max_tokens 64 → 256"]
    # --spec judges both with one spec; the workloads are still those the runs ran
    spec_file = tmp_path / "base.soak"
    spec_file.write_text(SPEC.canonical_text)
    assert main(["compare", str(base), str(new), "--resamples", "500", "--spec", str(spec_file), "--format", "json"]) == 3
    assert json.loads(capsys.readouterr().out)["workload_differences"] == doc["workload_differences"]


def test_allow_workload_change_compares_them_with_a_note(tmp_path, capsys):
    base = builder(1).write(tmp_path / "base")
    new = builder(2, spec=_longer_requests()).write(tmp_path / "new")
    assert main(["compare", str(base), str(new), "--resamples", "500", "--allow-workload-change", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "PASS" and doc["workload_differences"]
    assert any("compared as asked (--allow-workload-change)" in n for n in doc["notes"])
    assert main(["compare", str(base), str(new), "--resamples", "500", "--allow-workload-change"]) == 0
    assert "note: the runs sent different requests" in capsys.readouterr().out


@pytest.mark.parametrize("extra, said", [
    ("  endpoint = chat\n", "endpoint completions → chat"),
    ("  stream = false\n", "stream yes → no"),
    ("  sampling {\n    temperature = 0.7\n    top_p = 0.9\n    seed = 1\n  }\n",
     "sampling greedy → temperature 0.7, top_p 0.9, seed 1"),
    ("  ignore_eos = false\n", "ignore_eos yes → no"),
])
def test_each_aspect_of_the_requests_is_compared(extra, said):
    c = compare(builder(1).build(), builder(2, spec=_longer_requests(extra)).build(), resamples=200)
    assert c.outcome == "INCONCLUSIVE" and said in c.workload_differences[0], c.workload_differences


def test_a_different_model_is_a_different_workload():
    from soakspec.judge.testing import spec_from_text

    def with_model(m):
        return spec_from_text(SPEC.canonical_text.replace("\nbackend", f'\nmodel {{\n  id = "{m}"\n}}\n\nbackend', 1))

    c = compare(builder(1, spec=with_model("llama-8b")).build(), builder(2, spec=with_model("llama-70b")).build(),
                resamples=200)
    assert c.outcome == "INCONCLUSIVE" and "model llama-8b → llama-70b" in c.workload_differences[0]


def test_the_same_spec_has_no_workload_difference():
    c = compare(builder(1).build(), builder(2).build(), resamples=200)
    assert c.workload_differences == () and c.outcome == "PASS"


# ------------------------------------------------------------------------------ resamples


def test_too_few_resamples_are_raised_to_what_the_rows_tails_need(tmp_path, capsys):
    """15 rows at 95 %: each end of a row's interval is the 0.17 % tail of its draws, which 100
    draws do not reach. The count is raised to 6000 (10 draws beyond each end), with a note."""
    base = builder(1).write(tmp_path / "base")
    new = builder(2).write(tmp_path / "new")
    assert main(["compare", str(base), str(new), "--resamples", "100", "--format", "json"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert (doc["method"]["resamples"], doc["method"].get("resamples_requested")) == (6000, 100)
    assert "--resamples 100 raised to 6000" in err
    assert any(n.startswith("resamples raised from 100 to 6000") for n in doc["notes"])
    # the default (4000) is raised without a word on stderr; the method line says how many
    assert main(["compare", str(base), str(new)]) == 0
    out, err = capsys.readouterr()
    assert "seeded bootstrap (6000 draws" in out and "raised" not in err
    from soakspec.compare.intervals import min_resamples

    assert (min_resamples(15, 0.95), min_resamples(56, 0.95), min_resamples(1, 0.5)) == (6000, 22400, 100)


def test_intervals_from_too_few_draws_were_too_narrow():
    """The user-visible effect: with 100 draws a row's family-wise interval is the draws'
    extremes, up to 30 % narrower than the interval itself (false regressions between two runs
    of one configuration). Asked for 100, every row is now within 15 % of a 30 000-draw interval."""
    a, b = builder(1).build(), builder(2).build()
    ref = {(r.metric, r.stat): r for r in compare(a, b, resamples=30000).rows}
    few = compare(a, b, resamples=100)
    ratios = [(r.high - r.low) / (x.high - x.low) for r in few.rows
              if r.low is not None and (x := ref[(r.metric, r.stat)]).high - x.low > 0]
    assert len(ratios) >= 12 and min(ratios) > 0.85, ratios


# ------------------------------------------------------------------------------ exit codes, the same run twice


@pytest.mark.parametrize("which", ["base", "new"])
def test_a_manifest_that_does_not_parse_is_inconclusive_as_gate_says(tmp_path, capsys, which):
    """Evidence that cannot be read at all has no hashes to verify: exit 3 (as `gate`), not the
    1 of an artifact that does not match its hash. The README and the command say so."""
    dirs = {"base": builder(1).write(tmp_path / "base"), "new": builder(2).write(tmp_path / "new")}
    (dirs[which] / "manifest.json").write_text("{bad")
    assert main(["compare", str(dirs["base"]), str(dirs["new"]), "--resamples", "100"]) == 3
    assert "the evidence cannot be judged" in capsys.readouterr().err
    assert main(["gate", str(dirs[which])]) == 3


def test_a_run_compared_with_itself_says_so(tmp_path, capsys):
    run = builder(1).write(tmp_path / "run")
    assert main(["compare", str(run), str(run), "--resamples", "100", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert any(n.startswith("the base and new runs are the same run") for n in doc["notes"])
    c = compare(builder(1).build(), builder(2).build(), resamples=100)
    assert not any("same run" in n for n in c.notes)


# ------------------------------------------------------------------------------ an interrupted run


def _interrupted(tmp_path, name: str, error: str):
    """A run stopped by an interrupt in its last bucket: status aborted, the last 16 requests in
    flight recorded as disconnected with `error` (the runner's own words for what it cancelled,
    or a server's dropped connection)."""
    b = builder(2)
    b.manifest.update(status="aborted", incomplete_reason="interrupted by SIGINT")
    last = list(b.measured("a"))[-16:]
    for r in last:
        r.update(outcome="disconnected", error=error, ttft=None, first_token=None, itl=[], tpot=None, latency=None)
    return b.write(tmp_path / name)


@pytest.mark.parametrize("by_abort", [True, False])
def test_requests_an_interrupt_cancelled_are_no_rise_of_the_servers_errors(tmp_path, capsys, by_abort):
    """compare of an unchanged server with a run interrupted by Ctrl-C said FAIL "unsuccessful
    requests rose significantly: 0.0% → 3.4%" (exit 1): the requests in flight at the interrupt,
    which the runner itself cancelled, counted as the server's errors. The run is incomplete:
    INCONCLUSIVE, saying why; a server that dropped those connections itself still FAILs."""
    from soakspec.evidence.record import CANCELLED_BY_ABORT

    base = builder(1).write(tmp_path / "base")
    new = _interrupted(tmp_path, "new", CANCELLED_BY_ABORT if by_abort else "connection closed before the response finished")
    code = main(["compare", str(base), str(new), "--format", "json", "--resamples", "200"])
    doc = json.loads(capsys.readouterr().out)
    assert _row(doc, "errors", "ratio")["new"] == pytest.approx(16 / 400)  # the row is the gate's share, as ever
    if by_abort:
        assert code == 3 and doc["verdict"] == "INCONCLUSIVE", doc["reasons"]
        assert not any("rose significantly" in r for r in doc["reasons"]), doc["reasons"]
        assert any("16 requests" in r and "cancelled" in r for r in doc["reasons"]), doc["reasons"]
    else:
        assert code == 1 and any("rose significantly" in r for r in doc["reasons"]), doc["reasons"]


# ------------------------------------------------------------------------------ the gate's numbers


def test_each_row_is_the_number_results_json_holds_where_the_judge_re_derives_requests(tmp_path, capsys):
    """compare read the stored records as they are; the gate first re-derives them (a completed
    request whose usage contradicts its stream keeps its outcome but is left out of ITL and TPOT,
    and counts its chunks in throughput). A server over-reporting usage on a quarter of its
    requests read as an improvement of TPOT and throughput (41 746 tok/s against the 106 of
    results.json): each side is now re-derived with the spec it is judged with."""
    from soakspec.judge.cli_support import judge_and_write
    from soakspec.lang import load_text

    base = builder(1).write(tmp_path / "base")
    b = builder(2)
    for i, r in enumerate(b.measured("a")):
        if i % 4 == 0:
            r.update(output_tokens=100_000)  # beyond any max_tokens: usage_mismatch
    new = b.write(tmp_path / "new")
    assert main(["compare", str(base), str(new), "--format", "json", "--resamples", "200"]) == 0
    doc = json.loads(capsys.readouterr().out)
    manifest = json.loads((new / "manifest.json").read_text())
    spec = load_text(manifest["spec"]["text"], "x")[0]
    _, results = judge_and_write(new, spec)
    lv = results["backends"][0]["levels"][0]
    assert lv["excluded"]["tpot"], lv["excluded"]  # the judge left them out
    for stat in ("p50", "p95", "p99"):
        for metric in ("tpot", "itl"):
            assert _row(doc, metric, stat)["new"] == pytest.approx(lv[metric][stat], rel=1e-9), (metric, stat)
    buckets = [w["output_tokens_per_s"] for w in results["backends"][0]["buckets"] if w.get("level") == 0]
    assert _row(doc, "throughput", "mean")["new"] == pytest.approx(sum(buckets) / len(buckets), rel=1e-9)
    assert all(r["verdict"] == "no significant change" for r in doc["rows"] if r["metric"] in ("tpot", "throughput"))


def test_requests_the_servers_traces_say_failed_are_errors_in_compare_as_in_the_gate(tmp_path, capsys):
    """A fifth of the new run's requests streamed to the end but the server's traces say they
    ended in an error: results.json counts them failed (80 of 400); compare said errors 0.0% →
    0.0% and PASS (exit 0)."""
    base = builder(1).write(tmp_path / "base")
    b = builder(2)
    ids = {r["request_id"] for i, r in enumerate(b.measured("a")) if i % 5 == 0}
    for t in b.traces["a"]:
        if t["request_id"] in ids:
            t["payload"].update(terminal_reason="error")
    new = b.write(tmp_path / "new")
    assert json.loads((new / "results.json").read_text())["backends"][0]["levels"][0]["requests"]["failed"] == 80
    assert main(["compare", str(base), str(new), "--format", "json", "--resamples", "200"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert _row(doc, "errors", "ratio")["new"] == pytest.approx(0.2)
    assert any("rose significantly" in r for r in doc["reasons"]), doc["reasons"]


# ------------------------------------------------------------------------------ the load generator's health


def _slower(seed: int, factor: float) -> EvidenceBuilder:
    b = builder(seed)
    for r in b.measured("a"):
        ttft = r["ttft"] * factor
        r.update(ttft=ttft, first_token=r["start"] + ttft, latency=ttft + sum(r["itl"]), end=r["start"] + ttft + sum(r["itl"]))
    return b


@pytest.mark.parametrize("lag", [0.002, 2.0])
def test_a_timing_rule_that_fails_while_a_load_generator_was_saturated_is_inconclusive(lag):
    """The new run's load generator lagged 2 s (its own gate: client_healthy INCONCLUSIVE, a
    timing FAIL "may be the client's"): compare still FAILed `p50(ttft) regression <= 5%` on
    the server (exit 1). As the gate does, such a FAIL is INCONCLUSIVE, saying why; with a
    healthy load generator the same rise FAILs."""
    base = builder(1).with_client().build()
    new = _slower(2, 1.5).with_client(lag=lag).build()
    rules = [parse_rule("require p50(ttft) regression <= 5%"), parse_rule("require ratio(errors) regression <= 50%")]
    c = compare(base, new, rules=rules, resamples=200, judged_with=(SPEC, SPEC))
    ttft, errors = c.rules
    assert errors.status == "pass"  # not a timing figure
    if lag < 1:
        assert ttft.status == "fail" and c.outcome == "FAIL"
    else:
        assert ttft.status == "inconclusive" and c.outcome == "INCONCLUSIVE", ttft
        assert "load generator was saturated in the new run" in ttft.message and "regression" in ttft.message, ttft.message


def _lagging_in_level(b: EvidenceBuilder, level: int, lag: float) -> EvidenceBuilder:
    """The builder's client.jsonl: a load process that kept up, but `lag` late while `level` ran."""
    from soakspec.judge.testing import client_rows

    b.with_client()
    lv = b.manifest["backends"][0]["levels"][level]
    slow = client_rows("a", lv["started_at"], lv["drained_at"], lag=lag)
    a, z = slow[0]["start"], slow[-1]["t"]
    b.client["a"] = sorted([r for r in b.client["a"] if r["t"] <= a or r["start"] >= z] + slow, key=lambda r: r["t"])
    return b


@pytest.mark.parametrize("slow_level", [0, 1])
def test_a_saturated_level_blocks_only_its_own_rows_of_a_timing_rule(slow_level):
    """The new run's load generator lagged 2 s while its level `rate 2 rps` ran, and kept up
    while `rate 4 rps` ran. compare made `p50(ttft) regression <= 5%` INCONCLUSIVE whatever
    level regressed: a real +50 % at the healthy level was lost (exit 3, not 1). Now a row of
    the saturated level is not judged, and the other level's FAIL stands."""
    spec = small_spec(duration="4m", bucket="1m", mode="open", levels="[2rps, 4rps]")
    base = builder(1, spec=spec).with_client().build()
    nb = builder(2, spec=spec)
    for r in nb.measured("a", level=slow_level):  # the regression sits at the level the client lagged in
        ttft = r["ttft"] * 1.5
        r.update(ttft=ttft, first_token=r["start"] + ttft, latency=ttft + sum(r["itl"]), end=r["start"] + ttft + sum(r["itl"]))
    new = _lagging_in_level(nb, 0, 2.0).build()
    c = compare(base, new, rules=[parse_rule("require p50(ttft) regression <= 5%")], resamples=200, judged_with=(spec, spec))
    (ttft,) = c.rules
    if slow_level == 0:  # the regression where the client lagged: it may be the client's
        assert ttft.status == "inconclusive" and c.outcome == "INCONCLUSIVE", ttft
        assert "load generator was saturated in the new run" in ttft.message and "rate 2 rps" in ttft.message, ttft.message
    else:  # the regression at the level where it kept up: the server's, whatever happened before
        assert ttft.status == "fail" and c.outcome == "FAIL", ttft
        assert "rate 4 rps" in ttft.message and "saturated" not in ttft.message, ttft.message
