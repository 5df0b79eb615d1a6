"""`soakspec compare`: before/after with seeded bootstrap intervals (soakspec.compare)."""

from __future__ import annotations

import gzip
import html
import json
import random

import pytest
from hypothesis import given, settings, strategies as st

from soakspec.cli import main
from soakspec.compare import compare, parse_rule, percentile_draws, RuleError
from soakspec.compare.render import render
from soakspec.judge import stats
from soakspec.evidence.testing import edit_requests
from soakspec.judge.testing import EvidenceBuilder, small_spec

SPEC = small_spec(duration="4m", bucket="1m")


def builder(seed: int, ttft_factor: float = 1.0, per_bucket: int = 100) -> EvidenceBuilder:
    """A clean run whose latencies are seeded random draws (lognormal TTFT and TPOT)."""
    b = EvidenceBuilder(SPEC, per_bucket=per_bucket, run_id=f"run{seed}")
    rng = random.Random(seed)
    for r in b.measured("a"):
        ttft = rng.lognormvariate(-2.3, 0.35) * ttft_factor
        gaps = [rng.lognormvariate(-4.0, 0.25) for _ in range(63)]
        r.update(ttft=ttft, first_token=r["start"] + ttft, itl=gaps, tpot=sum(gaps) / 63,
                 latency=ttft + sum(gaps), end=r["start"] + ttft + sum(gaps))
    return b


def test_a_20_percent_ttft_increase_is_a_regression_at_95_percent():
    c = compare(builder(1).build(), builder(2, ttft_factor=1.2).build(), confidence=0.95, resamples=2000)
    by = {(r.metric, r.stat): r for r in c.rows}
    assert by[("ttft", "p50")].verdict == "regression"
    assert 0.1 < by[("ttft", "p50")].change < 0.3
    assert by[("ttft", "p50")].low > 0
    # what did not change is not called a regression (latency includes the TTFT, so it may)
    assert all(r.verdict != "regression" for r in c.rows if r.metric in ("itl", "tpot", "qps", "throughput"))
    # and the other way round it is an improvement
    back = compare(builder(2, ttft_factor=1.2).build(), builder(1).build(), resamples=2000)
    assert {(r.metric, r.stat): r for r in back.rows}[("ttft", "p50")].verdict == "improvement"


def test_same_configuration_reports_no_significant_change_in_at_least_19_of_20_repetitions():
    quiet = 0
    for i in range(20):
        c = compare(builder(100 + 2 * i).build(), builder(101 + 2 * i).build(), confidence=0.95, resamples=2000, seed=i)
        assert c.rows
        if all(r.verdict == "no significant change" for r in c.rows):
            quiet += 1
    assert quiet >= 19


def test_a_rule_gates_the_comparison():
    base, new = builder(1).build(), builder(2, ttft_factor=1.2).build()
    # the change is +14%, its family-wise interval about +5% .. +25%: a 2% limit is below all of it
    fail = compare(base, new, rules=[parse_rule("require p50(ttft) regression <= 2%")], resamples=2000)
    assert fail.outcome == "FAIL" and int(fail.exit_code) == 1
    assert fail.rules[0].status == "fail" and "limit 2%" in fail.rules[0].message
    ok = compare(base, new, rules=[parse_rule("require p50(ttft) regression <= 60%")], resamples=2000)
    assert ok.outcome == "PASS" and int(ok.exit_code) == 0
    # p99 with 400 samples per side: enough for a claim; a 19% limit sits inside the interval
    unsure = compare(base, new, rules=[parse_rule("require p99(ttft) regression <= 19%")], resamples=2000)
    assert unsure.rules[0].status == "inconclusive" and unsure.outcome == "INCONCLUSIVE"
    # a warn rule never decides: one that does not hold is WARN, as the gate writes it
    warned = compare(base, new, rules=[parse_rule("warn p50(ttft) regression <= 2%")], resamples=2000)
    assert warned.outcome == "PASS" and warned.rules[0].status == "warn"


def test_too_few_samples_is_inconclusive_never_a_pass():
    small = compare(builder(1, per_bucket=10).build(), builder(2, per_bucket=10).build(),
                    rules=[parse_rule("require p99(ttft) regression <= 50%")], resamples=500)
    row = next(r for r in small.rows if (r.metric, r.stat) == ("ttft", "p99"))
    assert row.verdict == "insufficient samples" and row.need == 299
    assert small.rules[0].status == "inconclusive" and int(small.exit_code) == 3


def test_the_comparison_is_deterministic_for_a_seed():
    a, b = builder(5).build(), builder(6).build()
    assert compare(a, b, resamples=500).to_json() == compare(a, b, resamples=500).to_json()


@pytest.mark.parametrize("text", ["p99(ttft) faster <= 5%", "require p99(bogus) regression <= 5%",
                                  "require p99(qps) regression <= 5%", "require mean(ttft) regression <= 5%"])
def test_bad_rules_are_refused_with_a_reason(text):
    with pytest.raises(RuleError, match="expected|measures|bucket|percentile"):
        parse_rule(text)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 1e3, allow_nan=False), min_size=1, max_size=60), st.floats(0, 100), st.integers(0, 2**32))
def test_percentile_draws_are_percentiles_of_some_resample(xs, q, seed):
    """Every draw lies between the sample's minimum and maximum (it is a percentile of a resample)."""
    xs = sorted(xs)
    for d in percentile_draws(xs, q, random.Random(seed), 20):
        assert xs[0] - 1e-9 <= d <= xs[-1] + 1e-9


def test_exact_order_statistic_draws_match_a_brute_force_bootstrap():
    """The Beta shortcut has the distribution of a full resample's percentile (fixed seeds)."""
    rng = random.Random(3)
    xs = sorted(rng.expovariate(1.0) for _ in range(200))
    exact = percentile_draws(xs, 90, random.Random(4), 4000)
    r = random.Random(5)
    brute = [stats.percentile([xs[r.randrange(200)] for _ in range(200)], 90) for _ in range(2000)]
    for q in (10, 50, 90):
        assert stats.percentile(exact, q) == pytest.approx(stats.percentile(brute, q), rel=0.05)


# ------------------------------------------------------------------------------ the command


def test_compare_cli_exit_codes_and_formats(tmp_path, capsys):
    base = builder(1).write(tmp_path / "base")
    new = builder(2, ttft_factor=1.2).write(tmp_path / "new")
    assert main(["compare", str(base), str(new), "--resamples", "500"]) == 0
    md = capsys.readouterr().out
    assert "## Comparison" in md and "REGRESSION" in md and "p50(ttft)" in md
    assert main(["compare", str(base), str(new), "--resamples", "500", "--require", "p50(ttft) regression <= 2%"]) == 1
    assert "FAIL" in capsys.readouterr().out
    assert main(["compare", str(base), str(new), "--resamples", "500", "--format", "json", "--confidence", "99%"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "comparison" and doc["confidence"] == 0.99 and doc["base"]["verified"] is True
    assert any(r["metric"] == "ttft" and r["verdict"] == "regression" for r in doc["rows"])
    assert main(["compare", str(base), str(new), "--resamples", "500", "--format", "html"]) == 0
    page = capsys.readouterr().out
    assert 'id="rows"' in page and 'class="regression"' in page
    assert main(["compare", str(base), str(new), "--require", "p99(nope) regression <= 5%"]) == 2


@pytest.mark.parametrize(("given", "said"), [
    ("95", "95%"),  # a percentage without its %: not a confidence of 9500%
    ("10%", "at least 50%"), ("0.05", "at least 50%"),  # an alpha for a confidence: nearly every row would read changed
    ("100%", "below 100%"),
])
def test_compare_takes_the_confidences_a_spec_takes(tmp_path, capsys, given, said):
    """`--confidence` is held to the range the spec's `compare { confidence }` is (at least 50 %,
    below 100 %): 5 % family-wise intervals call two runs of one configuration changed on most
    rows; the message says what to write."""
    base = builder(1).write(tmp_path / "base")
    with pytest.raises(SystemExit) as exited:  # a usage error, as argparse reports one
        main(["compare", str(base), str(base), "--confidence", given])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--confidence" in err and said in err, err


def test_compare_refuses_evidence_changed_after_the_run(tmp_path, capsys):
    base = builder(1).write(tmp_path / "base")
    new = builder(2).write(tmp_path / "new")
    req = new / "backends" / "a" / "requests.jsonl.gz"
    assert b'"completed"' in gzip.decompress(req.read_bytes())
    edit_requests(req, lambda t: t.replace('"completed"', '"failed"', 1))  # one request's outcome, edited
    assert main(["compare", str(base), str(new), "--resamples", "500", "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["new"]["verified"] is False and any("does not verify" in n for n in doc["notes"])


def test_markdown_escapes_evidence_text():
    c = compare(builder(1).build(), builder(2).build(), base_dir="<b>|x", resamples=200)
    assert "<b>" not in render(c, "html")


# ------------------------------------------------------------------------------ real simulator runs

SIM_SPEC = """
soak "cmp" {}
model {
  id = "sim-model"
}
backend "sim" {
  sim {
    ttft = TTFT
    itl = 5ms
    slots = 16
  }
  runtime {
    label = "host-staged"
  }
}
workload "w" {
  endpoint = completions
  prompt_words = 16
  max_tokens = [16]
  sampling = greedy
  ignore_eos = true
  load {
    mode = closed
    concurrency = [8]
  }
  duration = 8s
  bucket = 4s
  deadline = 10s
  follow_up = false
}
gate {
  require failed == 0
}
"""


@pytest.mark.slow
def test_compare_two_real_simulator_runs_finds_a_20_percent_ttft_regression(tmp_path, capsys):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    dirs = []
    for name, ttft in (("base", "50ms"), ("new", "60ms")):
        spec = tmp_path / f"{name}.soak"
        spec.write_text(SIM_SPEC.replace("TTFT", ttft))
        out = tmp_path / name
        p = subprocess.run([sys.executable, "-m", "soakspec", "run", str(spec), "--out", str(out), "--quiet"],
                           cwd=repo, capture_output=True, text=True, timeout=120)
        assert p.returncode in (0, 3), p.stderr[-2000:]
        dirs.append(str(out))
    code = main(["compare", *dirs, "--format", "json", "--require", "p50(ttft) regression <= 5%"])
    doc = json.loads(capsys.readouterr().out)
    row = next(r for r in doc["rows"] if (r["metric"], r["stat"]) == ("ttft", "p50"))
    assert row["verdict"] == "regression" and 0.1 < row["change"] < 0.3, row
    assert code == 1 and doc["rules"][0]["status"] == "fail"


# ------------------------------------------------------------------------------ compare { ... } in a spec

COMPARE_BLOCK = """
compare {
  confidence = 90%
  require regression(p50(ttft)) <= 5%
  warn regression(mean(qps)) <= 10%
}
"""


def _spec_with(block: str):
    from soakspec.judge.testing import spec_from_text

    return spec_from_text(SPEC.canonical_text + block)


def test_a_compare_block_is_checked_into_the_spec():
    spec = _spec_with(COMPARE_BLOCK)
    assert spec.compare.confidence == 0.9
    got = [(r.severity, r.stat, r.metric, r.op, r.threshold) for r in spec.compare.rules]
    assert got == [("require", "p50", "ttft", "<=", 0.05), ("warn", "mean", "qps", "<=", 0.1)]
    from soakspec.compare import rules_of

    assert [r.text() for r in rules_of(spec)] == ["require p50(ttft) regression <= 5%", "warn mean(qps) regression <= 10%"]


@pytest.mark.parametrize("line, code", [
    ("require regression(p99(bogus)) <= 5%", "E302"),
    ("require regression(p99(qps)) <= 5%", "E303"),
    ("require regression(ttft) <= 5%", "E303"),
    ("require regression(p100(ttft)) <= 5%", "E304"),
    ("require regression(p99(ttft)) >= 5%", "E305"),
    ("require regression(p99(ttft)) <= 5% per bucket", "E306"),
])
def test_a_bad_compare_rule_is_a_located_diagnostic(line, code):
    with pytest.raises(ValueError, match=code):
        _spec_with("compare {\n  " + line + "\n}\n")


def test_the_checker_and_compare_agree_on_the_metrics():
    from soakspec.compare import METRICS
    from soakspec.lang.check.compare import COMPARE_METRICS

    how = {"per_bucket": "mean", "distribution": "percentile", "proportion": "ratio"}
    assert {m.name: how[m.kind] for m in METRICS} == COMPARE_METRICS


def test_the_command_gates_with_the_spec_s_compare_block(tmp_path, capsys):
    spec = _spec_with(COMPARE_BLOCK)

    def run(seed, factor):
        b = builder(seed, ttft_factor=factor)
        b.spec = spec
        b.manifest["spec"] = {"path": spec.path, "text": spec.canonical_text, "sha256": spec.sha256}
        return b

    base = run(1, 1.0).write(tmp_path / "base")
    new = run(2, 1.2).write(tmp_path / "new")
    assert main(["compare", str(base), str(new), "--resamples", "500", "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["confidence"] == 0.9
    assert [(r["rule"], r["status"]) for r in doc["rules"]][0] == ("require p50(ttft) regression <= 5%", "fail")
    # the same configuration: no regression seen, but 400 samples cannot bound it within 5%
    same = run(3, 1.0).write(tmp_path / "same")
    assert main(["compare", str(base), str(same), "--resamples", "500", "--format", "json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert doc["rules"][0]["status"] == "inconclusive"
    assert all(r["verdict"] == "no significant change" for r in doc["rows"])


def test_itl_intervals_count_requests_not_gaps():
    """A request's 63 gaps are not 63 independent samples: itl's interval and sample-size rule
    use the number of requests, so its interval is wider than a gap-count bootstrap's."""
    c = compare(builder(1).build(), builder(2).build(), resamples=1000)
    itl = next(r for r in c.rows if (r.metric, r.stat) == ("itl", "p99"))
    assert (itl.n_base, itl.n_new, itl.gaps_base) == (400, 400, 400 * 63)
    assert "from 400 / 400 requests (25200 / 25200 gaps)" in itl.note
    r9 = random.Random(9)
    xs = sorted(r9.expovariate(1.0) for _ in range(6300))
    spread = lambda draws: stats.percentile(draws, 97.5) - stats.percentile(draws, 2.5)
    wide = spread(percentile_draws(xs, 99, random.Random(1), 2000, size=100))
    narrow = spread(percentile_draws(xs, 99, random.Random(1), 2000))
    assert wide > 3 * narrow
    md = render(c, "md")
    assert "one request's gaps are not independent" in md


# ------------------------------------------------------------------------------ audit: warn rules, itl counts


def test_a_warn_rule_that_does_not_hold_is_warn_in_every_format_and_never_decides(tmp_path, capsys):
    base = builder(1).write(tmp_path / "base")
    new = builder(2, ttft_factor=1.2).write(tmp_path / "new")
    rule = "warn p50(ttft) regression <= 2%"
    args = ["compare", str(base), str(new), "--resamples", "500", "--require", rule]
    assert main(args) == 0
    md = capsys.readouterr().out
    shown = rule.replace("<", "\\<")  # as Markdown escapes it
    assert "**Comparison: PASS**" in md and f"| {shown} | WARN |" in md and "| FAIL |" not in md
    assert f"1 warning: {shown}" in md and "rules not passing" not in md
    assert main([*args, "--format", "html"]) == 0
    page = capsys.readouterr().out
    assert f'<tr class="warn"><td>{html.escape(rule)}</td><td>WARN</td>' in page and "<td>FAIL</td>" not in page
    assert main([*args, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "PASS" and doc["exit_code"] == 0
    assert [(r["rule"], r["severity"], r["status"]) for r in doc["rules"]] == [(rule, "warn", "warn")]
    # the same rule as a require still fails the comparison
    assert main(["compare", str(base), str(new), "--resamples", "500", "--require", "require p50(ttft) regression <= 2%"]) == 1
    assert "| require p50(ttft) regression \\<= 2% | FAIL |" in capsys.readouterr().out


def test_itl_rows_show_the_request_counts_the_interval_and_sample_size_rest_on(tmp_path, capsys):
    """itl's n is requests (24 a side here), not its 63 gaps a request (1512): the row's count,
    its 'needs 59' and the rule's message all speak of requests; the gaps are a separate figure."""
    base = builder(1, per_bucket=6).write(tmp_path / "base")
    new = builder(2, per_bucket=6).write(tmp_path / "new")
    args = ["compare", str(base), str(new), "--resamples", "500", "--require", "p95(itl) regression <= 50%"]
    assert main(args) == 3
    md = capsys.readouterr().out
    p95 = next(line for line in md.splitlines() if "| p95(itl) |" in line)
    assert "| 24 / 24 | insufficient samples (needs 59) |" in p95 and "1512" not in p95
    assert "(n=24/24, needs 59)" in md  # the rule's worst row
    assert "from 24 / 24 requests (1512 / 1512 gaps)" in md
    assert main([*args, "--format", "html"]) == 3
    page = capsys.readouterr().out
    row = next(line for line in page.splitlines() if "<td>p95(itl)</td>" in line)
    assert "<td>24 / 24</td><td>insufficient samples (needs 59)</td>" in row
    assert main([*args, "--format", "json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    itl = next(r for r in doc["rows"] if (r["metric"], r["stat"]) == ("itl", "p95"))
    assert (itl["n_base"], itl["n_new"], itl["samples_needed"], itl["verdict"]) == (24, 24, 59, "insufficient samples")
    assert (itl["gaps_base"], itl["gaps_new"]) == (1512, 1512)
    ttft = next(r for r in doc["rows"] if (r["metric"], r["stat"]) == ("ttft", "p95"))
    assert (ttft["n_base"], ttft["gaps_base"]) == (24, None)


def test_a_rule_s_message_names_its_worst_row_among_rows_of_one_status():
    """`--require 'p99(ttft) regression <= 5%'` over two levels that both pass named the first
    level's interval (-8.2% .. +3.7%) where the second's came closer to the limit (+4.5%):
    the message is the worst row's, as the gate reports a rule at its worst instance."""
    spec = small_spec(levels="[2, 4]", duration="4m", bucket="1m")

    def run(seed: int, slower: float) -> EvidenceBuilder:
        b = EvidenceBuilder(spec, per_bucket=100, run_id=f"run{seed}")
        rng = random.Random(seed)
        for r in b.measured("a"):
            ttft = rng.lognormvariate(-2.3, 0.35) * (slower if r["level"] == 1 else 1.0)
            r.update(ttft=ttft, first_token=r["start"] + ttft, latency=ttft + 0.1, end=r["start"] + ttft + 0.1)
        return b

    c = compare(run(1, 1.0).build(), run(2, 1.15).build(), rules=[parse_rule("require p50(ttft) regression <= 60%")],
                resamples=2000)
    rows = [r for r in c.rows if (r.metric, r.stat) == ("ttft", "p50")]
    assert [r.level for r in rows] == [0, 1] and rows[1].high > rows[0].high
    assert c.rules[0].status == "pass" and "concurrency 4" in c.rules[0].message, c.rules[0].message


def _tables_reachable(root) -> int:
    """How many of the judge's request tables `root` reaches (its object graph, walked)."""
    import gc

    from soakspec.judge.table import RequestTable

    seen, todo, found = set(), [root], 0
    while todo:
        o = todo.pop()
        if id(o) in seen or isinstance(o, type):
            continue
        seen.add(id(o))
        if isinstance(o, RequestTable):
            found += 1
            continue
        todo.extend(gc.get_referents(o))
    return found


def test_the_base_run_read_up_front_holds_no_table_and_compares_the_same(tmp_path, capsys, monkeypatch):
    """The command reads the base run's samples before it reads the new run and lets the base
    run's table go meanwhile (two day-long runs' tables were 1.2 GiB together): what it holds
    of the base run is its samples, no table, and the comparison is the one made from both
    runs' tables, byte for byte in every format."""
    from soakspec.compare import RunSamples
    from soakspec.judge.evidence import load_evidence

    base_b, new_b = builder(1), builder(2, ttft_factor=1.2)
    kept = RunSamples.read(base_b.build(), keep=True)
    read = RunSamples.read(base_b.build(), dir="base", keep=False)
    assert _tables_reachable(kept) >= 1
    assert _tables_reachable(read) == 0
    whole = compare(base_b.build(), new_b.build(), resamples=500)
    assert compare(read, new_b.build(), resamples=500).to_json() == whole.to_json()
    base, new = base_b.write(tmp_path / "base"), new_b.write(tmp_path / "new")
    from soakspec.commands import gate
    from soakspec.judge.testing import tables_alive

    load, alive = gate.load_for_judging, []

    def counted(*a, **k):  # the tables alive as each run is read
        alive.append(tables_alive())
        return load(*a, **k)

    del kept, read, whole
    before = tables_alive()  # any that another test left alive
    monkeypatch.setattr(gate, "load_for_judging", counted)
    assert main(["compare", str(base), str(new), "--resamples", "500", "--format", "json"]) == 0
    assert alive == [before, before]  # none more as the new run is read: the base run's table went once its samples were read
    monkeypatch.setattr(gate, "load_for_judging", load)
    capsys.readouterr()
    for fmt in ("json", "md"):
        assert main(["compare", str(base), str(new), "--resamples", "500", "--format", fmt]) == 0
        out = capsys.readouterr().out
        both = compare(load_evidence(base), load_evidence(new), base_dir=str(base), new_dir=str(new), resamples=500)
        assert out == render(both, fmt)


def _reached(b: EvidenceBuilder, url: str, owner: str = "server", reason: str | None = None,
             via: str | None = None) -> EvidenceBuilder:
    """A manifest entry reached at `url`; without `via`, as evidence from before `via` was recorded."""
    listener = {"owner": owner, "pid": 4242, "reason": reason} | ({"via": via} if via is not None else {})
    b.entry("a").update(url=url, port_listener=listener)
    return b


def test_a_backend_reached_by_another_network_path_is_said_beside_its_rows():
    """AIPerf PR #850: a server reached through a port forward (`docker run -p`: docker-proxy)
    or from another host answers a few ms later than one on its own loopback socket, in every
    TTFT and latency, and a before/after across the two read that as the server's change. The
    manifest records how each backend was reached (its url; a launched server's listener); a
    comparison whose paired backend was reached otherwise says so, naming both paths."""
    from soakspec.runner.procs import FORWARDED_REASON, NO_LISTENER

    own = _reached(builder(1), "http://127.0.0.1:8000/")
    proxied = _reached(builder(2), "http://127.0.0.1:8001/", "unknown", FORWARDED_REASON.format(name="docker-proxy"))
    c = compare(own.build(), proxied.build(), resamples=500)
    (note,) = [n for n in c.notes if "network path" in n]
    assert note.startswith("backend 'a' was reached by another network path: base on this machine's loopback, the "
                           "launched server's own socket; new on this machine's loopback, through a port forward"), note
    assert "(AIPerf PR #850)" in note and note in c.to_json()["notes"]
    for fmt in ("md", "html"):
        assert "another network path" in render(c, fmt)
    forwarded = _reached(builder(2), "http://127.0.0.1:8000", "unknown", NO_LISTENER)  # no listener here: forwarded
    (note,) = [n for n in compare(own.build(), forwarded.build(), resamples=500).notes if "network path" in n]
    assert "new on this machine's loopback, through a port forward" in note, note
    remote = builder(2)
    remote.entry("a").update(url="http://10.0.0.7:8000", port_listener=None)  # a `url` backend: no listener checked
    (note,) = [n for n in compare(own.build(), remote.build(), resamples=500).notes if "network path" in n]
    assert "; new on host 10.0.0.7 -- " in note, note
    # the same path (another port, another pid, another loopback address) is no difference
    same = _reached(builder(2), "http://localhost:9000", "server")
    assert not [n for n in compare(own.build(), same.build(), resamples=500).notes if "network path" in n]
    # a path the manifest does not say (no url: evidence the builder made; a listener not checked) is no difference
    assert not [n for n in compare(builder(1).build(), proxied.build(), resamples=500).notes if "network path" in n]
    unread = _reached(builder(2), "http://127.0.0.1:8000", "unknown", "its process is not readable from /proc: another user's?")
    assert not [n for n in compare(own.build(), unread.build(), resamples=500).notes if "network path" in n]


def test_the_network_path_is_read_from_the_recorded_fact_not_the_reason_text():
    """The hop is what the runner recorded (`port_listener.via`), not a phrase of its reason:
    a port forward whose reason says it in other words is still a port forward, and a reason
    that happens to mention one where the runner recorded something else is not. The
    comparison above, of manifests without `via`, is older evidence read as it ran."""
    own = _reached(builder(1), "http://127.0.0.1:8000/", via="server")
    reworded = _reached(builder(2), "http://127.0.0.1:8000/", "unknown", "held by pasta (pid 7)", via="forward")
    (note,) = [n for n in compare(own.build(), reworded.build(), resamples=500).notes if "network path" in n]
    assert "new on this machine's loopback, through a port forward" in note, note
    unseen = _reached(builder(2), "http://127.0.0.1:8000/", "unknown", "nothing listens here", via="unseen")
    assert [n for n in compare(own.build(), unseen.build(), resamples=500).notes if "network path" in n]
    mentions = _reached(builder(2), "http://[::1]:8000/", "unknown",
                        "PID 9 (its command line: a port forward script) runs in another namespace", via="namespace")
    assert not [n for n in compare(own.build(), mentions.build(), resamples=500).notes if "network path" in n]


def test_levels_warmed_up_differently_are_said_in_every_format():
    """Levels pair by their load, not their warmup: a level after `warmup = 20 requests` and the
    same level after a timed warmup (or after another count) were measured on servers warmed
    otherwise, and compare says so -- naming the backend, the level and both warmups -- in md,
    html and json alike. The same warmup on both sides says nothing."""
    counted, timed = builder(1), builder(2)
    for lv in counted.entry("a")["levels"]:
        lv.update(warmup_requests=20, warmup_s=0.0)
    for lv in timed.entry("a")["levels"]:
        lv.update(warmup_s=30.0)
    c = compare(counted.build(), timed.build(), resamples=500)
    (note,) = [n for n in c.notes if "warmed up differently" in n]
    label = c.rows[0].label
    assert note.startswith(f"backend 'a' level {label} warmed up differently: base warmup 20 requests, new warmup 30s"), note
    assert note in c.to_json()["notes"]
    for fmt in ("md", "html", "json"):
        assert "base warmup 20 requests, new warmup 30s" in render(c, fmt), fmt
    other = builder(3)
    for lv in other.entry("a")["levels"]:
        lv.update(warmup_requests=50, warmup_s=0.0)
    (note,) = [n for n in compare(counted.build(), other.build(), resamples=500).notes if "warmed up differently" in n]
    assert "base warmup 20 requests, new warmup 50 requests" in note
    assert not [n for n in compare(counted.build(), counted.build(), resamples=500).notes if "warmed up" in n]
    assert not [n for n in compare(builder(1).build(), builder(2).build(), resamples=500).notes if "warmed up" in n]
