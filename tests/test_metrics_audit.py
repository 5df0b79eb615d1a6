"""Audit of rules over a server's Prometheus metrics against Prometheus' own semantics: a
histogram quantile in the +Inf bucket, counters summed over label sets that come and go, and
the scraper against the /metrics answers real servers give."""

from __future__ import annotations

import pytest

from soakspec.judge.judge import judge
from soakspec.judge.testing import EvidenceBuilder, metrics_rows, small_spec
from tests.test_server_metrics import INPROC  # a url backend's one-level spec, its metrics block given

TTFT = "vllm:time_to_first_token_seconds"


def _judged(rule: str, mutate, *, per_bucket: int = 8, ttft_per_s: float = 2.0):
    """The performance rules' results of `rule` over a 3-minute level of `per_bucket` requests a
    bucket and a steady server's scrapes (`metrics_rows`, its TTFT histogram gaining
    `ttft_per_s` observations a second), each scrape's row changed by `mutate(i, row)`."""
    spec = small_spec(rule, duration="3m")
    b = EvidenceBuilder(spec, per_bucket=per_bucket)
    (lv,) = b.manifest["backends"][0]["levels"]
    b.metrics["a"] = metrics_rows(lv["buckets"][0]["start"] - 5, lv["buckets"][-1]["end"] + 5, ttft_per_s=ttft_per_s)
    for i, row in enumerate(b.metrics["a"]):
        mutate(i, row)
    return [r for r in judge(spec, b.build()).rules if r.klass == "performance"]


def _beyond_the_buckets(i, row):
    """Every TTFT observation took 30 s: beyond the histogram's largest finite bound (2.5 s)."""
    h = row["families"][TTFT]
    h["buckets"] = [[le, 0.0] for le, _ in h["buckets"][:-1]] + [[None, h["count"]]]
    h["sum"] = 30.0 * h["count"]


@pytest.mark.parametrize("rule, status", [
    (f'require p99(server("{TTFT}")) < 10s', "inconclusive"),  # was PASS with p99 = 2.5
    (f'require p50(server("{TTFT}")) <= 60s per bucket', "inconclusive"),
    (f'require p99(server("{TTFT}")) < 2s', "fail"),  # at least 2.5: certainly not < 2
    (f'require p50(server("{TTFT}")) > 1s', "pass"),  # at least 2.5: certainly > 1
])
def test_a_quantile_in_the_inf_bucket_is_a_lower_bound_never_a_pass_it_cannot_prove(rule, status):
    """histogram_quantile answers the largest finite bound for a quantile in the +Inf bucket:
    judged as a value, `p99 < 10s` passed with p99 = 2.5 for a server whose every TTFT took 30 s
    (vLLM's older TTFT buckets end at 10 s, its e2e latency's at 60 s)."""
    rules = _judged(rule, _beyond_the_buckets)
    assert rules and {r.status for r in rules} == {status}, [r.message for r in rules]
    assert all("+Inf bucket" in r.message and "2.5 or more" in r.message for r in rules), [r.message for r in rules]


def test_a_drift_of_a_quantile_in_the_inf_bucket_is_not_judged_on_its_bound():
    (r,) = _judged(f'require drift(p50(server("{TTFT}"))) <= 10% per level', _beyond_the_buckets)
    assert r.status == "inconclusive", r.message


def _in_a_lowest_bucket_at_zero(i, row):
    """A histogram whose lowest bucket is bounded at 0 (SGLang's queue time has le="0.0"): 80% of
    the observations in it, 95% at or below 0.1 s, all at or below 0.2 s."""
    h = row["families"][TTFT]
    n = h["count"]
    h["buckets"] = [[0.0, 0.8 * n], [0.1, 0.95 * n], [0.2, n], [None, n]]
    h["sum"] = 0.02 * n


@pytest.mark.parametrize("rule, status", [
    (f'require p50(server("{TTFT}")) < 100ms', "pass"),  # was INCONCLUSIVE: at most 0, certainly < 100 ms
    (f'require p50(server("{TTFT}")) <= 0ms per bucket', "pass"),  # a threshold at the bound is decided
    (f'require p50(server("{TTFT}")) > 100ms', "fail"),  # at most 0: certainly not > 100 ms
    (f'require p50(server("{TTFT}")) >= 0ms', "inconclusive"),  # 0 or below it: the histogram cannot say
])
def test_a_quantile_in_a_lowest_bucket_bounded_at_zero_is_an_upper_bound(rule, status):
    """histogram_quantile answers the bound of a lowest bucket bounded at or below 0: the
    quantile is at most it, how far below unknown -- it decides a threshold every value up to
    it is on one side of, as the +Inf bucket's bound does from above."""
    rules = _judged(rule, _in_a_lowest_bucket_at_zero)
    assert rules and {r.status for r in rules} == {status}, [r.message for r in rules]
    assert all("lowest bucket" in r.message and "0 or less" in r.message for r in rules), [r.message for r in rules]


def test_a_drift_of_a_quantile_in_a_lowest_bucket_at_zero_is_not_judged_on_its_bound():
    (r,) = _judged(f'require drift(p50(server("{TTFT}"))) <= 10% per level', _in_a_lowest_bucket_at_zero)
    assert r.status == "inconclusive", r.message


# ---------------------------------------------------------------------------- a quantile within its bucket


def _all_at(seconds: float, *, tail: float = 0.0, tail_at: float = 0.4):
    """Every TTFT observation took `seconds` (a share `tail` of them `tail_at` instead): in
    bucket (0.1, 0.25] of TTFT_LE for 0.24 s. The scrapes' cumulative counts as the server
    would expose them."""
    def mutate(i, row):
        h = row["families"][TTFT]
        n = h["count"]
        late = round(n * tail)
        h["buckets"] = [[le, (n - late if le >= seconds else 0.0) + (late if le >= tail_at else 0.0)]
                        for le, _ in h["buckets"][:-1]] + [[None, n]]
        h["sum"] = seconds * (n - late) + tail_at * late
    return mutate


@pytest.mark.parametrize("rule, status", [
    (f'require p50(server("{TTFT}")) < 200ms', "inconclusive"),  # was PASS: ≈ 0.175 interpolated, every TTFT 240 ms
    (f'require p50(server("{TTFT}")) > 200ms', "inconclusive"),
    (f'require p50(server("{TTFT}")) <= 250ms', "pass"),  # a threshold at a bucket bound is decided
    (f'require p50(server("{TTFT}")) < 1s', "pass"),
    (f'require p50(server("{TTFT}")) < 100ms', "fail"),  # the whole bucket is above it
    (f'require p50(server("{TTFT}")) > 100ms', "pass"),
])
def test_a_histogram_quantile_is_only_known_within_its_bucket(rule, status):
    """histogram_quantile interpolates within the bucket a quantile falls in, as if its
    observations spread evenly across it: judged as a value, `p50 < 200ms` PASSED for a server
    whose every TTFT took 240 ms (0.175 interpolated in (0.1, 0.25]). A threshold inside the
    bucket cannot be decided from the histogram; one at or beyond its bounds is."""
    (r,) = _judged(rule, _all_at(0.24))
    assert r.status == status, r.message
    if status == "inconclusive":
        assert "only places it between 0.1 and 0.25" in r.message and "≈ 0.175" in r.message, r.message


def test_a_drift_of_a_histogram_quantile_is_known_only_as_far_as_its_buckets_allow():
    """Each bucket's p50 in the same histogram bucket read as +0% drift -- the interpolation's
    artefact: the true p50 may have gone from 0.11 s to 0.24 s within it."""
    (r,) = _judged(f'require drift(p50(server("{TTFT}"))) <= 10% per level', _all_at(0.24))
    assert r.status == "inconclusive" and "between -60% and +150%" in r.message, r.message
    assert "the client's own ttft is measured exactly" in r.message, r.message
    # a mean is Δsum / Δcount, exact: its drift is decided by its observations' spread, not the
    # buckets' bounds (as many requests as observations: 1,200 a bucket)
    (r,) = _judged(f'require drift(mean(server("{TTFT}"))) <= 10% per level', _all_at(0.24), per_bucket=1200, ttft_per_s=20.0)
    assert r.status == "pass", r.message


def test_a_histogram_quantile_that_passes_needs_the_overage_rule_as_the_clients_does():
    """`p99 < 250ms` with 0.8 % of the observations above 250 ms: the sample p99 is within the
    threshold, but as the client's percentile rules count it (LoadGen's overage rule) 0.8 % of
    a thousand observations beyond it is too many to claim p99 < 250 ms at 95 % -- it PASSED on
    the point estimate. The counts beyond are read from the buckets, exactly at a bound."""
    rule = f'require p99(server("{TTFT}")) < 250ms'
    # more requests than observations (500 a bucket, 300 a minute): each observation one draw
    (r,) = _judged(rule, _all_at(0.24, tail=0.008), per_bucket=500, ttft_per_s=5.0)
    assert r.status == "inconclusive" and "may be above 250ms" in r.message and "allowed at 95% confidence" in r.message, r.message
    (r,) = _judged(rule, _all_at(0.24), per_bucket=500, ttft_per_s=5.0)
    assert r.status == "pass", r.message


def test_a_histograms_observations_of_few_requests_count_as_those_requests():
    """A per-token histogram (vLLM's inter-token latency) observes every token: 3,600
    observations of the scope's 24 requests are not 3,600 independent draws, as the client's
    ITL counts requests -- p99 from them needs 299 requests."""
    (r,) = _judged(f'require p99(server("{TTFT}")) < 1s', lambda i, row: _all_at(0.24)(i, row) or _more(row, 10))
    assert r.status == "inconclusive" and "from only 24 requests (3600 observations)" in r.message, r.message
    # too few for a claim that it holds, but every one of them is surely above 100 ms: a certain violation
    (r,) = _judged(f'require p99(server("{TTFT}")) < 100ms', lambda i, row: _all_at(0.24)(i, row) or _more(row, 10))
    assert r.status == "fail" and "enough samples violate the threshold" in r.message, r.message


def _more(row, k: int) -> None:
    h = row["families"][TTFT]
    h.update(count=h["count"] * k, sum=h["sum"] * k, buckets=[[le, n * k] for le, n in h["buckets"]])


@pytest.mark.parametrize("op, most, least", [("<", 30, 10), ("<=", 30, 10), (">", 90, 70), (">=", 90, 70)])
def test_the_observations_beyond_a_threshold_are_bounded_by_the_buckets(op, most, least):
    from soakspec.judge.servermetrics import beyond

    buckets = ((0.1, 20.0), (0.25, 70.0), (0.5, 90.0), (None, 100.0))  # 20 | 50 | 20 | 10
    assert beyond(buckets, op, 0.3) == most and beyond(buckets, op, 0.3, least=True) == least
    assert beyond(buckets, op, 0.25) == beyond(buckets, op, 0.25, least=True)  # at a bound: exact
    # a broken exposition whose counts fall from one bound to the next: their running maximum,
    # never a negative count or more than the total beyond
    broken = ((0.1, 20.0), (0.25, 15.0), (0.5, 120.0), (None, 100.0))
    assert 0 <= beyond(broken, op, 0.3, least=True) <= beyond(broken, op, 0.3) <= 100


# ---------------------------------------------------------------------------- a family that appears late


def _appears_late(family: str, at: int):
    """`family` absent from the scrapes before the `at`-th (a labelled counter or histogram whose
    first series the server creates at its first event: prometheus_client shows no line of a
    labelled family until then, Rust's metrics exporter (TGI) not even its # TYPE), then there."""
    def mutate(i, row):
        f = row["families"]
        if i < at:
            del f[family]
        elif family == "vllm:num_preemptions_total":
            f[family]["value"] = 3.0  # three preemptions, then no more
    return mutate


def test_a_counter_whose_first_series_appears_mid_scope_counts_its_first_value():
    """`server("vllm:num_preemptions_total") == 0` PASSED for a server that preempted three
    requests in the run: the family's first line (3) came mid-run, and its increase was taken
    from that first scrape on (0). A counter absent from the successful scrapes before its
    first appearance had no series: its sum was 0 there (Prometheus' sum over no series)."""
    (r,) = _judged('require server("vllm:num_preemptions_total") == 0', _appears_late("vllm:num_preemptions_total", 10))
    assert r.status == "fail" and r.observed == 3.0, r.message
    (r,) = _judged('require max(server("vllm:num_preemptions_total")) == 0 per bucket', _appears_late("vllm:num_preemptions_total", 10))
    assert r.status == "fail", r.message


def test_a_histogram_whose_first_series_appears_mid_scope_counts_its_first_observations():
    """As a counter: the observations of a histogram whose first line came mid-scope (20 when
    first seen) were left out of its count, mean and quantiles."""
    def shifted(absent):
        def mutate(i, row):
            h = row["families"][TTFT]
            base = 2.0 * 5 * 9  # its count had it been there: zero until the 10th scrape
            if i < 10:
                if absent:
                    del row["families"][TTFT]
                else:
                    h.update(sum=0.0, count=0.0, buckets=[[le, 0.0] for le, _ in h["buckets"]])
            else:
                h.update(sum=h["sum"] - 0.2 * base, count=h["count"] - base,
                         buckets=[[le, max(0.0, n - base)] for le, n in h["buckets"]])
        return mutate
    zero = _judged(f'require server("{TTFT}") >= 0', shifted(False))
    late = _judged(f'require server("{TTFT}") >= 0', shifted(True))
    assert late[0].observed == zero[0].observed > 0, (late[0].message, zero[0].message)


def test_a_counter_absent_after_it_appeared_is_a_gap_not_a_reset():
    """Absent from a scrape after its first appearance (a scrape that missed it): no value
    there, the change taken around it -- never a reset counting the whole value again."""
    def mutate(i, row):
        if i in (12, 13):
            del row["families"]["vllm:generation_tokens_total"]
    full = _judged('require server("vllm:generation_tokens_total") >= 0', lambda i, row: None)
    gap = _judged('require server("vllm:generation_tokens_total") >= 0', mutate)
    assert gap[0].observed == full[0].observed


# ---------------------------------------------------------------------------- the scrape's last answer




async def test_the_load_ends_with_a_scrape_so_its_last_bucket_is_counted(tmp_path):
    """The scrape was cancelled with the load: nothing after the last bucket's end, so a
    counter's or histogram's change over it stopped at the last scrape inside -- up to a scrape
    interval (5 s by default, a quarter of the shortest bucket) of the run's end uncounted
    (here, scraping every 5 s over a 1 s load, all of it: no rule could bracket a bucket). A
    scrape now follows the load's end, before the server is stopped."""
    import functools

    import httpx
    import trio

    from soakspec.evidence.layout import RunLayout
    from soakspec.lang import load_spec
    from soakspec.plan import plan
    from soakspec.runner.backend import Deps
    from soakspec.runner.clock import RunClock
    from soakspec.runner.collect import collect
    from soakspec.runner.driver import run_backend
    from soakspec.runner.engine import h11_connect
    from soakspec.runner.ids import IdSequence
    from soakspec.runner.progress import Progress
    from soakspec.runner.prompts import PromptFiles
    from soakspec.runner.recorder import BackendRecorder, RunStatus
    from soakspec.sim.config import SimConfig
    from soakspec.sim.server import serve

    from runner_support import read_jsonl

    async with trio.open_nursery() as nursery, httpx.AsyncClient() as http:
        port = await nursery.start(functools.partial(serve, SimConfig(model="default", ttft=0.005, itl=0.001, trace_log=False)))
        path = tmp_path / "s.soak"
        path.write_text(INPROC.format(url=f"http://127.0.0.1:{port}", metrics="  metrics {\n    every = 5s\n  }\n"))
        spec, diags, _ = load_spec(path)
        assert spec is not None, diags
        p = plan(spec)
        (bp,) = p.backends
        layout = RunLayout(tmp_path / "ev")
        rec = BackendRecorder(bp, layout, RunStatus())
        rec.prepare(0, None)
        deps = Deps(RunClock(), Progress(quiet=True), http, h11_connect(RunClock()), layout, preflight=False)
        with trio.fail_after(30):
            await run_backend(bp, deps, rec, IdSequence("t-0"), PromptFiles(), p.telemetry_interval_s)
        rec.close()
        nursery.cancel_scope.cancel()
    entry = collect(p, rec, Progress(quiet=True))
    rows = read_jsonl(layout.metrics("u"))
    (lv,) = entry["levels"]
    end = lv["buckets"][-1]["end"]
    assert len(rows) == 2 and all(r["ok"] for r in rows), rows
    assert rows[-1]["t"] >= end, (rows[-1]["t"], end)
    done = rows[-1]["families"]["vllm:request_success_total"]["value"]
    assert done == sum(1 for r in read_jsonl(layout.requests("u")) if str(r.get("outcome")).endswith("completed")) > 0


# ---------------------------------------------------------------------------- a ratio over several engines


DP2 = """\
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.9
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.7
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 30.0
vllm:num_requests_running{engine="1",model_name="m"} 20.0
"""


@pytest.mark.parametrize("text", [DP2, DP2.replace("# TYPE vllm:kv_cache_usage_perc gauge\n", "")])
def test_a_ratio_gauge_of_several_engines_is_their_mean_not_their_sum(text):
    """vLLM with --data-parallel-size 2 exposes kv_cache_usage_perc per engine (labels model_name,
    engine): summed, two engines at 90% and 70% read as 160%, and 'max(server(...)) < 95%'
    failed a server no engine of which was full. A ratio (a name ending _perc, _ratio, _usage,
    hit_rate) is the mean over its label sets, Prometheus' avg(); a count stays their sum."""
    from soakspec.runner.scrape import summarize

    f = summarize(text, ["vllm:kv_cache_usage_perc", "vllm:num_requests_running"])
    assert f["vllm:kv_cache_usage_perc"]["value"] == pytest.approx(0.8) and f["vllm:kv_cache_usage_perc"]["series"] == 2
    assert f["vllm:num_requests_running"]["value"] == 50.0


def test_a_speculative_decoding_ratio_of_several_engines_is_their_mean():
    """vLLM's (v0) spec-decode gauges are fractions per engine: two engines accepting 0.7 of
    their drafts read 1.4 summed (an audit), 0.7 averaged; a per-second rate still adds up."""
    from soakspec.runner.scrape import summarize

    text = "".join(f'# TYPE vllm:{name} gauge\n' + "".join(f'vllm:{name}{{engine="{e}"}} {v}\n' for e in (0, 1))
                   for name, v in (("spec_decode_draft_acceptance_rate", 0.7), ("spec_decode_efficiency", 0.5),
                                   ("avg_generation_throughput_toks_per_s", 30.0)))
    names = ["vllm:spec_decode_draft_acceptance_rate", "vllm:spec_decode_efficiency", "vllm:avg_generation_throughput_toks_per_s"]
    f = summarize(text, names)
    assert [f[n]["value"] for n in names] == [pytest.approx(0.7), pytest.approx(0.5), 60.0]


# ---------------------------------------------------------------------------- a counter's label sets


PREEMPT = "vllm:num_preemptions_total"


def _preemptions(series_at):
    """Each scrape's /metrics, summarized as the runner does: `series_at(i)` gives the scrape's
    {engine: value} of vllm:num_preemptions_total."""
    from soakspec.runner.scrape import summarize

    def mutate(i, row):
        lines = [f"# TYPE {PREEMPT[:-6]} counter"]
        lines += [f'{PREEMPT}{{engine="{e}",model_name="m"}} {v}' for e, v in series_at(i).items()]
        row["families"].update(summarize("\n".join(lines) + "\n", [PREEMPT]))
    return mutate


@pytest.mark.parametrize("case, series_at", [
    # engine 1 stops being exposed (its engine core gone) halfway: no preemption anywhere
    ("a label set disappears", lambda i: {"0": 1000.0, "1": 1000.0} if i < 20 else {"0": 1000.0}),
    # engine 1 restarts from 0 halfway while engine 0 keeps its 1000: one preemption after
    ("one label set resets", lambda i: {"0": 1000.0, "1": 500.0} if i < 20 else {"0": 1000.0, "1": 1.0}),
])
def test_a_counters_label_sets_are_each_their_own_counter(case, series_at):
    """The counter was summed over its label sets before its increase was taken: the sum going
    down (a label set gone, or one engine's counter restarting) read as a reset of the whole
    family, whose whole new sum (1000) counted as new preemptions -- 'server(...) == 0' failed
    with 1000 (1001) where Prometheus' sum(increase(...)) gives 0 (1). Each label set's
    increase is now its own, reset by its own going down, then summed."""
    (r,) = _judged(f'require server("{PREEMPT}") <= 1', _preemptions(series_at))
    assert r.status == "pass" and r.observed in (0.0, 1.0), (case, r.message)


def test_a_label_set_born_mid_scope_counts_its_first_value():
    (r,) = _judged(f'require server("{PREEMPT}") == 0',
                   _preemptions(lambda i: {"0": 7.0} if i < 20 else {"0": 7.0, "1": 2.0}))
    assert r.status == "fail" and r.observed == 2.0, r.message


def test_a_counters_label_sets_read_from_hostile_or_unordered_rows():
    """`by` as rows may hold it: out of time order, junk pairs, none in one scrape (its sum then)."""
    from soakspec.judge.scrapes import build_scrapes
    from soakspec.judge.servermetrics import counter_change

    def row(t, by, value):
        return {"t": t, "ok": True, "families": {"c_total": {"type": "counter", "value": value, "by": by}}}

    rows = [row(2.0, [["a", 5.0], ["b", 1.0]], 6.0), row(1.0, [["a", 4.0], ["b", 900.0], 7, ["c"], [3, 1.0], ["d", "x"]], 904.0),
            row(3.0, [["a", 6.0], ["b", 2.0]], 8.0)]
    s = build_scrapes(rows).series["c_total"]
    assert counter_change(s, 1.0, 3.0) == (2.0 + 2.0, 2.0, 3)  # a: 4->6; b: 900 -> reset 1 -> 2
    rows.append(row(4.0, "junk", 9.0))  # a scrape without a readable `by`: the sums
    s = build_scrapes(rows).series["c_total"]
    assert s.by is None and counter_change(s, 1.0, 4.0)[0] == 6.0 + 3.0


# ---------------------------------------------------------------------------- the report of a +Inf quantile


def test_the_report_does_not_show_a_quantile_in_the_inf_bucket_as_a_value():
    """results.json gives a bucket's p99 in the +Inf bucket as the largest finite bound, its
    bucket [2.5, null]: the Markdown line read 'per-bucket mean 30 to 30' and nothing of it, and
    the HTML chart drew p99 = 2.5 s under a mean of 30 s, as if measured. The chart leaves it
    out and the Markdown line says how many buckets' p99 lay beyond the histogram's bounds."""
    from soakspec.judge.testing import small_spec
    from soakspec.report.serverview import html_charts, md_lines

    spec = small_spec(f'require p99(server("{TTFT}")) < 2s per bucket')
    per = {f"w:0:{i}": {"mean": 30.0, "observations": 50.0, "scrapes": 3, "p50": {"value": 2.5, "bucket": [2.5, None]},
                        "p99": {"value": 2.5, "bucket": [2.5, None]}} for i in range(2)}
    sm = {"status": "scraped", "scrapes": 10, "failed": 0, "path": "/metrics",
          "families": {TTFT: {"type": "histogram", "per_bucket": per}}}
    b = {"name": "a", "server_metrics": sm,
         "buckets": [{"workload": "w", "level": 0, "bucket": i, "started": 60.0 * i, "ended": 60.0 * (i + 1)} for i in range(2)]}
    (chart,) = [c for c in html_charts(b, None, spec) if TTFT in c]
    assert "<title>mean at 30.0s: 30</title>" in chart and "<title>p99 at" not in chart, chart
    (line,) = [x for x in md_lines({"backends": [b]}, spec) if TTFT in x]
    assert "p99 above the histogram's largest finite bound (2.5) in 2 of 2 buckets" in line, line


# ---------------------------------------------------------------------------- scrapes that failed


def _late_scrapes_fail(i, row):
    """Every scrape from the 20th on failed (an overloaded server's /metrics timing out)."""
    if i >= 20:
        row.update(ok=False, status=None, error="no answer within 2s", families={})


@pytest.mark.parametrize("rule", [
    'require max(server("vllm:num_requests_waiting")) < 64',
    'require server("vllm:num_preemptions_total") == 0',
    'require max(server("vllm:generation_tokens_total")) < 1000',  # the per-bucket rates
    f'require mean(server("{TTFT}")) < 1s per level',
    f'require max(server("{TTFT}")) < 1s',
])
def test_a_rule_over_buckets_whose_scrapes_failed_is_inconclusive_not_a_pass(rule):
    """A default scrape (no `metrics { }`: metrics_scraped not judged) whose /metrics stopped
    answering halfway -- as an overloaded server's does -- left the rest of the run unseen, and
    a backend-wide rule PASSED on the first half: the gauge's max over the scrapes there, the
    counter's change up to the last scrape that answered. A scope with a bucket no scrape
    covers is INCONCLUSIVE, saying how many and why."""
    (r,) = _judged(rule, _late_scrapes_fail)
    assert r.status == "inconclusive" and "of 3 buckets" in r.message and "no answer within 2s" in r.message, r.message
    (ok,) = _judged(rule, lambda i, row: None)
    assert ok.status == "pass", ok.message


def test_a_violation_seen_before_the_scrapes_failed_still_fails_a_max_rule():
    def mutate(i, row):
        if i == 5:
            row["families"]["vllm:num_requests_waiting"]["value"] = 100.0
        _late_scrapes_fail(i, row)
    (r,) = _judged('require max(server("vllm:num_requests_waiting")) < 64', mutate)
    assert r.status == "fail" and r.observed == 100.0, r.message


def test_a_last_bucket_shorter_than_a_scrape_interval_is_covered_by_the_scrapes_around_it():
    """A level's last bucket cut short (3m03s in buckets of 1m: a 3 s one, which scrapes every
    5 s may miss) is no bucket whose scrapes failed: those around it cover it."""
    spec = small_spec('require max(server("vllm:num_requests_waiting")) < 64', duration="183s")
    b = EvidenceBuilder(spec)
    (lv,) = b.manifest["backends"][0]["levels"]
    last = lv["buckets"][-1]
    assert last["end"] - last["start"] == 3
    # every 5 s, on a cadence that steps over the 3 s bucket (a scrape 1 s before it, the next 1 s after)
    b.metrics["a"] = metrics_rows(lv["buckets"][0]["start"] - 1, last["end"] + 5)
    assert not [r for r in b.metrics["a"] if last["start"] <= r["t"] < last["end"]]
    (r,) = [r for r in judge(spec, b.build()).rules if r.klass == "performance"]
    assert r.status == "pass", r.message


# ---------------------------------------------------------------------------- a family whose type changed


def _type_changes(i, row):
    """From the 20th scrape on, /metrics types the families otherwise (a server restarted as
    another version, an exporter that typed them wrongly)."""
    f = row["families"]
    if i >= 20:
        f["vllm:num_requests_waiting"] = {"type": "counter", "value": float(i), "series": 1}
        f["vllm:generation_tokens_total"] = {"type": "gauge", "value": 3.0, "series": 1}


@pytest.mark.parametrize("rule", ['require max(server("vllm:num_requests_waiting")) < 64',
                                  'require max(server("vllm:generation_tokens_total")) < 64'])
def test_a_family_whose_type_changed_is_not_judged_as_one_series(rule):
    """Its scrapes were read as the type of its latest: a gauge's values as a counter's
    (max of per-bucket 'rates' of a queue length: 0.42, PASS), a counter's as a gauge's
    (max = 9500, its running total: FAIL). Neither is what the server measured."""
    (r,) = _judged(rule, _type_changes)
    assert r.status == "inconclusive" and "changed type" in r.message, r.message


def test_a_quantile_of_a_histogram_without_buckets_says_why():
    """A histogram exposed with its _sum and _count but no _bucket lines: 'p99(...) cannot be
    computed: None'."""
    def no_buckets(i, row):
        row["families"][TTFT]["buckets"] = []
    (r,) = _judged(f'require p99(server("{TTFT}")) < 1s', no_buckets)
    assert r.status == "inconclusive" and "no histogram buckets" in r.message, r.message


# ---------------------------------------------------------------------------- the scraper against real endpoints


async def _serve_once_per_connection(nursery, answer):
    """A loopback HTTP server: `answer(request_line)` gives (status line, headers, body)."""
    import functools

    import trio

    async def handle(stream):
        data = b""
        with trio.move_on_after(5):
            while b"\r\n\r\n" not in data and len(data) < 65536:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    break
                data += chunk
        status, headers, body = answer(data.split(b"\r\n", 1)[0].decode())
        head = f"HTTP/1.1 {status}\r\nConnection: close\r\nContent-Length: {len(body)}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        await stream.send_all(head.encode() + b"\r\n" + body)
        await stream.aclose()

    (listener,) = await nursery.start(functools.partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
    return listener.socket.getsockname()[1]


TEXT = b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n"


async def test_a_metrics_endpoint_that_redirects_to_its_trailing_slash_is_followed():
    """prometheus_client's ASGI app mounted at /metrics (Starlette: older vLLM, many FastAPI
    servers) answers GET /metrics with 307 to /metrics/ (prometheus/client_python#1016), which
    Prometheus follows: every scrape failed 'HTTP 307' -- a declared scrape failed the run, a
    default one left every server rule INCONCLUSIVE. A redirect on the same host is followed
    (a few at most, within the scrape's timeout); one to another host is not."""
    import httpx
    import trio

    from soakspec.plan import MetricsScrape
    from soakspec.runner.scrape import scrape_row

    def answer(line):
        if line.startswith("GET /metrics/ "):
            return "200 OK", {"Content-Type": "text/plain"}, TEXT
        if line.startswith("GET /metrics "):
            return "307 Temporary Redirect", {"Location": "/metrics/"}, b""
        if line.startswith("GET /loop "):
            return "302 Found", {"Location": "/loop"}, b""
        return "302 Found", {"Location": "http://example.invalid/metrics"}, b""

    scrape = MetricsScrape("/metrics", 1.0, 3.0, True, ("vllm:num_requests_running",))
    async with trio.open_nursery() as nursery:
        port = await _serve_once_per_connection(nursery, answer)
        url = f"http://127.0.0.1:{port}"
        with trio.fail_after(20):
            async with httpx.AsyncClient(timeout=5, trust_env=False) as http:
                row = await scrape_row(http, url, scrape, trio.current_time)
                loop = await scrape_row(http, url, MetricsScrape("/loop", 1.0, 3.0, True, ()), trio.current_time)
                away = await scrape_row(http, url, MetricsScrape("/away", 1.0, 3.0, True, ()), trio.current_time)
        nursery.cancel_scope.cancel()
    assert row["ok"] and row["families"]["vllm:num_requests_running"]["value"] == 3.0, row
    assert not loop["ok"] and loop["status"] == 302 and "redirect" in loop["error"], loop
    assert not away["ok"] and away["status"] == 302 and "another host" in away["error"], away


async def test_a_scrape_on_a_connection_the_server_closed_while_idle_is_sent_again_once():
    """The server closes a kept-alive connection as the next scrape is sent on it (uvicorn's 5 s
    keep-alive against a 5 s scrape interval: a real vLLM soak recorded 'Server disconnected
    without sending a response'): the GET goes again on a new connection, as Prometheus's Go
    client sends it, and the scrape is the server's answer. A server that drops every request
    unanswered is asked twice a scrape, no more, and the scrape records its failure."""
    import functools

    import httpx
    import trio

    from soakspec.plan import MetricsScrape
    from soakspec.runner.scrape import scrape_row

    from runner_support import drops_every_request, keep_alive_once

    seen = {"requests": 0}
    scrape = MetricsScrape("/metrics", 1.0, 3.0, True, ("vllm:num_requests_running",))
    async with trio.open_nursery() as nursery:
        (good,) = await nursery.start(functools.partial(trio.serve_tcp, keep_alive_once(seen, TEXT), 0, host="127.0.0.1"))
        (bad,) = await nursery.start(functools.partial(trio.serve_tcp, drops_every_request(seen), 0, host="127.0.0.1"))
        with trio.fail_after(20):
            async with httpx.AsyncClient(timeout=5, trust_env=False) as http:
                url = f"http://127.0.0.1:{good.socket.getsockname()[1]}"
                rows = [await scrape_row(http, url, scrape, trio.current_time) for _ in range(3)]
                assert seen["requests"] == 5  # the first; then each later one dropped once, then sent again
                seen["requests"] = 0
                dead = await scrape_row(http, f"http://127.0.0.1:{bad.socket.getsockname()[1]}", scrape, trio.current_time)
        nursery.cancel_scope.cancel()
    assert all(r["ok"] and r["families"]["vllm:num_requests_running"]["value"] == 3.0 for r in rows), rows
    assert not dead["ok"] and dead["status"] is None and "disconnected" in dead["error"].lower(), dead
    assert seen["requests"] == 2


# ---------------------------------------------------------------------------- a drift of a histogram's mean


def _minutes(spec, b: EvidenceBuilder, per_minute: list[dict[float | None, float]], means: list[float]):
    """metrics.jsonl of a TTFT histogram that gains, in the level's k-th minute, the
    observations `per_minute[k]` (per bucket bound: how many fall in that bucket) with mean
    `means[k]`, scraped every 5 s (counts accrue evenly within a minute)."""
    (lv,) = b.manifest["backends"][0]["levels"]
    t0 = lv["buckets"][0]["start"]
    rows = metrics_rows(t0 - 5, lv["buckets"][-1]["end"] + 5)
    les = [le for le, _ in rows[0]["families"][TTFT]["buckets"]]
    for row in rows:
        done = min(max((row["t"] - t0) / 60.0, 0.0), float(len(per_minute)))
        per = {le: 0.0 for le in les}
        total = 0.0
        for k, counts in enumerate(per_minute):
            share = min(max(done - k, 0.0), 1.0)
            for le, c in counts.items():
                per[le] += c * share
            total += share * sum(counts.values()) * means[k]
        cum, acc = [], 0.0
        for le in les:
            acc += per[le]
            cum.append([le, acc])
        row["families"][TTFT].update(buckets=cum, count=acc, sum=total)
    b.metrics["a"] = rows


def test_a_drift_of_a_histograms_mean_that_sampling_noise_could_carry_is_inconclusive():
    """A histogram's mean per bucket (Δsum / Δcount) is exact, but of how many observations:
    20 TTFTs a minute whose mean went from 200 to 230 ms is a +15 % drift that twenty draws
    of one unchanging server spread between 0.1 and 0.5 s give often -- it FAILED `<= 10%`.
    Each bucket's mean now lies within Student's t standard errors, the spread as the buckets
    give it; 2,000 observations a minute (and as many requests) drifting the same is a FAIL,
    and one observation in the +Inf bucket leaves the spread unbounded."""
    rule = f'require drift(mean(server("{TTFT}"))) <= 10% per level'
    spec = small_spec(rule, duration="3m")
    few = [{0.25: 12.0, 0.5: 8.0}] * 3
    b = EvidenceBuilder(spec)
    _minutes(spec, b, few, [0.2, 0.2, 0.23])
    (r,) = [r for r in judge(spec, b.build()).rules if r.klass == "performance"]
    assert r.status == "inconclusive" and "sampling noise alone could decide it" in r.message, r.message
    assert "as the histogram's buckets give it" in r.message, r.message
    b = EvidenceBuilder(spec, per_bucket=2000)
    _minutes(spec, b, [{0.25: 1200.0, 0.5: 800.0}] * 3, [0.2, 0.2, 0.23])
    (r,) = [r for r in judge(spec, b.build()).rules if r.klass == "performance"]
    assert r.status == "fail" and "+15%" in r.message, r.message
    b = EvidenceBuilder(spec, per_bucket=2000)
    _minutes(spec, b, [{0.25: 1200.0, 0.5: 800.0}] * 2 + [{0.25: 1200.0, 0.5: 799.0, None: 1.0}], [0.2, 0.2, 0.23])
    (r,) = [r for r in judge(spec, b.build()).rules if r.klass == "performance"]
    assert r.status == "inconclusive" and "lies anywhere" in r.message, r.message
