"""Server metrics at the edges of the Prometheus text format: a histogram quantile that is
Prometheus' own (`histogram_quantile`, checked against a reference written here from its
rules), and gauge samples of +Inf, -Inf and NaN (all legal in the exposition) read, judged
and reported honestly -- never a silent pass, never a crash."""

from __future__ import annotations

import json
import math

from hypothesis import example, given, settings
from hypothesis import strategies as st

from soakspec.judge.servermetrics import quantile_estimate

# ---------------------------------------------------------------------- histogram_quantile


def reference_histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' `bucketQuantile` (promql/quantile.go) restated from its documented rules:
    q in [0, 1], buckets (upper bound, cumulative count) with +Inf as math.inf; NaN for no
    figure. Sorted by bound; NaN without a +Inf bucket; counts within 1e-12 (relative) of the
    previous one made equal to it, then made monotonic; NaN with fewer than two buckets or no
    observations; the rank q * count(+Inf) found by binary search among the finite buckets; in
    the +Inf bucket the second-highest bound; in a lowest bucket bounded at or below 0 its
    bound; else linear within the bucket, from 0 in the lowest one."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    bs = sorted(buckets, key=lambda b: b[0])
    if not bs or bs[-1][0] != math.inf:
        return math.nan
    merged: list[list[float]] = []
    for le, n in bs:
        if merged and merged[-1][0] == le:
            merged[-1][1] += n
        else:
            merged.append([le, n])
    prev = merged[0][1]
    for b in merged[1:]:
        delta = abs(b[1] - prev)
        if delta == 0:
            continue
        if (delta / b[1] if b[1] else math.inf) <= 1e-12:
            b[1] = prev
        else:
            prev = b[1]
    top = merged[0][1]
    for b in merged[1:]:
        top = b[1] = max(top, b[1])
    if len(merged) < 2:
        return math.nan
    total = merged[-1][1]
    if total == 0:
        return math.nan
    rank = q * total
    lo, hi = 0, len(merged) - 1  # sort.Search over the finite buckets
    while lo < hi:
        mid = (lo + hi) // 2
        if merged[mid][1] >= rank:
            hi = mid
        else:
            lo = mid + 1
    b = lo
    if b == len(merged) - 1:
        return merged[-2][0]
    if b == 0 and merged[0][0] <= 0:
        return merged[0][0]
    start, count = 0.0, merged[b][1]
    if b > 0:
        start = merged[b - 1][0]
        count -= merged[b - 1][1]
        rank -= merged[b - 1][1]
    if count == 0:
        return math.nan  # Go's 0/0
    return start + (merged[b][0] - start) * (rank / count)


def _ours(p: str, buckets: list[tuple[float, float]]) -> float:
    v, _ = quantile_estimate(float(p), [(None if le == math.inf else le, n) for le, n in buckets])
    return math.nan if v is None else v


@st.composite
def histograms(draw, monotone: bool = False):
    """Cumulative bucket counts of a histogram as a server exposes them after a Δ: distinct
    bounds (some at or below 0 now and then), usually a +Inf bucket, counts usually monotone --
    and, where not `monotone`, now and then not (a broken exposition, a reset seen per bucket)."""
    les = sorted(draw(st.sets(st.sampled_from([-1.0, 0.0, 0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0]),
                              min_size=0, max_size=8)))
    if monotone or draw(st.booleans()) or draw(st.booleans()):
        les = [le for le in les if le > 0] + [math.inf]
    per = draw(st.lists(st.integers(0, 50), min_size=len(les), max_size=len(les)))
    cum, acc = [], 0.0
    for k in per:
        acc += k
        cum.append(acc)
    if not monotone and cum and draw(st.booleans()):
        i = draw(st.integers(0, len(cum) - 1))
        cum[i] = float(draw(st.integers(0, 60)))
    return list(zip(les, cum))


# a rule's pNN as written, and the fraction a PromQL query writes for it
PERCENTILES = {"0": 0.0, "1": 0.01, "25": 0.25, "50": 0.5, "90": 0.9, "95": 0.95, "99": 0.99, "99.9": 0.999, "99.99": 0.9999, "100": 1.0}
QS = st.sampled_from(sorted(PERCENTILES, key=float))


@settings(max_examples=500, deadline=None)
@given(histograms(), QS, QS)
@example([(0.1, 4.0), (0.25, 2.0), (0.5, 10.0), (math.inf, 10.0)], "50", "90")  # counts falling: made monotonic
@example([(0.1, 4.0), (0.5, 10.0)], "50", "90")  # no +Inf bucket: NaN
@example([(math.inf, 10.0)], "50", "90")  # +Inf alone: NaN
@example([(-1.0, 3.0), (0.5, 10.0), (math.inf, 10.0)], "1", "90")  # lowest bucket bounded below 0: its bound
@example([(0.1, 0.0), (0.5, 10.0), (math.inf, 10.0)], "0", "90")  # p0 in an empty lowest bucket: NaN
@example([(0.05, 1.0), (0.1, 2.0), (math.inf, 2.0)], "99.9", "100")  # 99.9 / 100 is not 0.999
@example([(0.001, 0.0), (0.01, 1.0), (math.inf, 1.0)], "0", "100")  # 0.001 + 0.009 * 1.0 rounds past 0.01
def test_a_histogram_quantile_is_prometheus_histogram_quantile(buckets, q1, q2):
    """For the same bucket counts, soakspec's quantile is the number histogram_quantile gives
    (and Grafana shows), NaN -- no figure -- exactly where it gives NaN; each lies within the
    bounds of the bucket it is said to fall in; and a higher q never gives a lower one."""
    theirs = [(None if le == math.inf else le, n) for le, n in buckets]
    got = []
    for p in sorted((q1, q2), key=float):
        want, v = reference_histogram_quantile(PERCENTILES[p], buckets), _ours(p, buckets)
        assert (math.isnan(want) and math.isnan(v)) or v == want, (p, want, v)
        est, (lo, hi) = quantile_estimate(float(p), theirs)
        if est is not None:
            # within its bucket, but for the rounding of Prometheus' own arithmetic (start + (le -
            # start) * fraction may land an ulp past le: the number Grafana shows); the judge
            # decides a threshold by the bucket's bounds, never by that last ulp
            assert lo <= est and (hi is None or est <= hi or math.isclose(est, hi, rel_tol=1e-12)), (est, lo, hi)
            got.append(est)
    assert got == sorted(got)


# ---------------------------------------------------------------------- gauges: +Inf, -Inf, NaN

GAUGE = "vllm:num_requests_running"


def test_a_gauges_infinite_or_nan_samples_are_kept_as_the_text_format_writes_them():
    """A gauge's label sets are summed as Prometheus' sum() would: +Inf on one engine makes
    the family +Inf (it was left out: the other engine's 3 read as the whole), NaN or both
    infinities make it NaN; metrics.jsonl holds them as text (JSON has no infinity)."""
    from soakspec.runner.scrape import summarize

    text = (f'# TYPE {GAUGE} gauge\n{GAUGE}{{engine="0"}} +Inf\n{GAUGE}{{engine="1"}} 3\n'
            '# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting NaN\n'
            '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine="0"} +Inf\nvllm:kv_cache_usage_perc{engine="1"} -Inf\n'
            '# TYPE q gauge\nq -Inf\n'
            'untyped{a="1"} 2\nuntyped{a="2"} +Inf\n')
    got = summarize(text, [GAUGE, "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "q", "untyped"])
    assert {k: v["value"] for k, v in got.items()} == {
        GAUGE: "+Inf", "vllm:num_requests_waiting": "NaN", "vllm:kv_cache_usage_perc": "NaN", "q": "-Inf", "untyped": "+Inf"}
    assert got[GAUGE]["series"] == 2
    json.dumps(got, allow_nan=False)  # as metrics.jsonl is written


def _gauge_run(rules: str, second_bucket: str, third_bucket: str = "3"):
    """A steady server's evidence whose gauge GAUGE, on two engines, reads 3 and 1 but
    `second_bucket` (the text format's sample value) and 1 in every scrape of the level's
    second bucket (`third_bucket` and 1 in its third), each scrape summarised from /metrics
    text by the scraper itself."""
    from soakspec.judge.testing import EvidenceBuilder, metrics_rows, small_spec
    from soakspec.runner.scrape import summarize

    spec = small_spec(rules, duration="3m")
    b = EvidenceBuilder(spec)
    (lv,) = b.manifest["backends"][0]["levels"]
    b.metrics["a"] = metrics_rows(lv["buckets"][0]["start"] - 5, lv["buckets"][-1]["end"] + 5)
    second, third = lv["buckets"][1], lv["buckets"][2]
    for row in b.metrics["a"]:
        value = second_bucket if second["start"] <= row["t"] < second["end"] else (
            third_bucket if third["start"] <= row["t"] < third["end"] else "3")
        text = f'# TYPE {GAUGE} gauge\n{GAUGE}{{engine="0"}} {value}\n{GAUGE}{{engine="1"}} 1\n'
        row["families"][GAUGE] = summarize(text, [GAUGE])[GAUGE]
    return spec, b.build()


def _rules(spec, evidence):
    from soakspec.judge.judge import judge

    return {r.rule: r for r in judge(spec, evidence).rules if r.klass == "performance"}


def _strict_json(text: str):
    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_a_gauge_at_plus_inf_fails_a_ceiling_and_every_report_renders_it():
    """+Inf is a value, compared honestly: above any ceiling (it was dropped, and the rule
    passed on the other engine's 1), above any floor; every report format renders the run."""
    import xml.etree.ElementTree as ET

    from soakspec.report import prepare

    rules = (f'require max(server("{GAUGE}")) < 64 per bucket\n  require mean(server("{GAUGE}")) < 64 per bucket\n'
             f'  require min(server("{GAUGE}")) > 0 per bucket')
    spec, ev = _gauge_run(rules, "+Inf")
    r = _rules(spec, ev)
    top, mean, floor = (r[x] for x in (f'max(server("{GAUGE}")) < 64 per bucket', f'mean(server("{GAUGE}")) < 64 per bucket',
                                       f'min(server("{GAUGE}")) > 0 per bucket'))
    assert top.status == "fail" and top.where.bucket == 1 and top.observed == math.inf and "= +Inf" in top.message, top.message
    assert mean.status == "fail" and mean.where.bucket == 1, mean.message
    assert floor.status == "pass", floor.message
    inp = prepare(spec, ev)
    doc = _strict_json(inp.render("json"))
    per = doc["results"]["backends"][0]["server_metrics"]["families"][GAUGE]["per_bucket"]
    assert {e["max"] for e in per.values()} == {4.0, "+Inf"}
    ET.fromstring(inp.render("junit"))
    assert GAUGE in inp.render("md") and GAUGE in inp.render("html")
    # the Markdown range says the +Inf bucket (it was left out: "4 to 4")
    assert f"`{GAUGE}` (gauge): per-bucket mean 4 to +Inf" in inp.render("md")


def test_a_gauge_the_server_answers_nan_for_is_inconclusive_never_passed_on_the_rest():
    """NaN is the server saying it has no value: a rule over scrapes where it answered NaN is
    INCONCLUSIVE, saying so (the rule passed on the other scrapes), but where the rest decides
    it (a max seen above its ceiling only grows)."""
    from soakspec.report import prepare

    spec, ev = _gauge_run(f'require max(server("{GAUGE}")) < 64\n  require mean(server("{GAUGE}")) < 64', "NaN")
    r = _rules(spec, ev)
    # the Markdown range says the NaN scrapes beside it (it left them out)
    assert f"`{GAUGE}` (gauge): per-bucket mean 4 to 4; NaN (the server's no value) in 12 scrapes of 1 bucket" in prepare(spec, ev).render("md")
    for rule in r.values():
        assert rule.status == "inconclusive" and "answered NaN" in rule.message, rule.message
    spec, ev = _gauge_run(f'require max(server("{GAUGE}")) < 2', "NaN")
    (rule,) = _rules(spec, ev).values()
    assert rule.status == "fail" and rule.observed == 4.0, rule.message
    # a min only falls with more values: one already below its floor fails, one above is unknown
    spec, ev = _gauge_run(f'require min(server("{GAUGE}")) > 5', "NaN")
    (rule,) = _rules(spec, ev).values()
    assert rule.status == "fail" and rule.observed == 4.0 and "or less" in rule.message, rule.message
    spec, ev = _gauge_run(f'require min(server("{GAUGE}")) > 3', "NaN")
    (rule,) = _rules(spec, ev).values()
    assert rule.status == "inconclusive" and "answered NaN" in rule.message, rule.message


def test_a_gauge_both_plus_and_minus_inf_has_no_mean_and_nothing_crashes():
    """+Inf in one bucket and -Inf in another: no mean of the level (Prometheus' avg() is
    NaN), INCONCLUSIVE; a drift to +Inf is never a pass; -Inf passes a ceiling honestly."""
    spec, ev = _gauge_run(f'require mean(server("{GAUGE}")) < 64 per level', "+Inf", "-Inf")
    (rule,) = _rules(spec, ev).values()
    assert rule.status == "inconclusive" and "both +Inf and -Inf" in rule.message, rule.message
    spec, ev = _gauge_run(f'require drift(mean(server("{GAUGE}"))) <= 10% per level', "3", "+Inf")
    (rule,) = _rules(spec, ev).values()
    assert rule.status == "inconclusive" and "not finite" in rule.message, rule.message
    spec, ev = _gauge_run(f'require mean(server("{GAUGE}")) < 64 per level', "-Inf")
    (rule,) = _rules(spec, ev).values()
    assert rule.status == "pass" and rule.observed == -math.inf, rule.message


def test_a_scrape_of_a_server_answering_inf_and_nan_is_written_and_read_back(tmp_path):
    """The scraper against a real socket (an in-process /metrics, trio's virtual clock): a
    gauge at +Inf and one at NaN are written to metrics.jsonl -- strict JSON, validated by its
    schema -- and the judge reads back +Inf as the value it is and NaN as no value it was given."""
    import functools

    import httpx
    import trio
    import trio.testing

    from soakspec.evidence.io import JsonlWriter
    from soakspec.judge.scrapes import build_scrapes
    from soakspec.plan import MetricsScrape
    from soakspec.runner.scrape import scrape_row

    body = (f'# TYPE {GAUGE} gauge\n{GAUGE}{{engine="0"}} +Inf\n{GAUGE}{{engine="1"}} 2\n'
            "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting NaN\n").encode()

    async def metrics(stream):
        await stream.receive_some(65536)
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                              b"Content-Length: %d\r\n\r\n" % len(body) + body)
        await stream.aclose()

    rows = []

    async def main():
        async with trio.open_nursery() as nursery:
            (listener,) = await nursery.start(functools.partial(trio.serve_tcp, metrics, 0, host="127.0.0.1"))
            port = listener.socket.getsockname()[1]
            scrape = MetricsScrape("/metrics", 5.0, 2.0, True, (GAUGE, "vllm:num_requests_waiting"))
            async with httpx.AsyncClient(timeout=10) as http:
                rows.append(await scrape_row(http, f"http://127.0.0.1:{port}", scrape, trio.current_time))
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    (row,) = rows
    assert row["ok"], row
    w = JsonlWriter(tmp_path / "metrics.jsonl", schema="metrics")
    w.write(row)
    w.close()
    back = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    series = build_scrapes(back).series
    assert series[GAUGE].value(0) == math.inf
    waiting = series["vllm:num_requests_waiting"]
    assert waiting.value(0) is None and waiting.nan_at == (row["t"],) and waiting.answered(0)


HIST = "vllm:e2e_request_latency_seconds"


def _hist_run(rules: str, inf_from: float):
    """A steady server's evidence whose histogram HIST observes 100 requests between scrapes,
    all within 0.5 s, its _sum +Inf from `inf_from` s into the level on (an observation of
    +Inf), each scrape summarised from /metrics text by the scraper itself."""
    from soakspec.judge.testing import EvidenceBuilder, metrics_rows, small_spec
    from soakspec.runner.scrape import summarize

    spec = small_spec(rules, duration="3m")
    b = EvidenceBuilder(spec)
    (lv,) = b.manifest["backends"][0]["levels"]
    b.metrics["a"] = metrics_rows(lv["buckets"][0]["start"] - 5, lv["buckets"][-1]["end"] + 5)
    for i, row in enumerate(b.metrics["a"]):
        n = 100 * i
        total = "+Inf" if row["t"] >= lv["buckets"][0]["start"] + inf_from else f"{0.2 * n:g}"
        text = (f"# TYPE {HIST} histogram\n{HIST}_bucket{{le=\"0.5\"}} {n}\n{HIST}_bucket{{le=\"+Inf\"}} {n}\n"
                f"{HIST}_sum {total}\n{HIST}_count {n}\n")
        row["families"][HIST] = summarize(text, [HIST])[HIST]
    json.dumps(b.metrics["a"], allow_nan=False)
    return spec, b.build()


def test_a_histograms_infinite_sum_is_an_infinite_mean_then_no_mean():
    """An observation of +Inf makes a histogram's _sum +Inf, and Prometheus keeps it so: the
    bucket where it happened has a mean of +Inf (its _sum was left out, and the mean of the
    others passed), a bucket after it no mean at all (+Inf - +Inf) -- INCONCLUSIVE, never a
    pass; its quantiles, from the buckets, still stand."""
    mean_rule, p50_rule = f'mean(server("{HIST}")) < 1s per bucket', f'p50(server("{HIST}")) < 1s per bucket'
    r = _rules(*_hist_run(f"require {mean_rule}\n  require {p50_rule}", 90))
    assert r[mean_rule].status == "fail" and r[mean_rule].where.bucket == 1 and r[mean_rule].observed == math.inf, r[mean_rule].message
    assert r[p50_rule].status == "pass", r[p50_rule].message
    (mean,) = _rules(*_hist_run(f"require {mean_rule}", -10)).values()  # +Inf before the level began
    assert mean.status == "inconclusive" and "_sum is not finite" in mean.message, mean.message


def test_a_real_runs_ttft_quantiles_are_histogram_quantile_of_its_scrapes(quick_demo):
    """End to end, against the simulator: each bucket's p50 and p99 of
    vllm:time_to_first_token_seconds in results.json is the reference histogram_quantile of the
    bucket counts' change between the scrapes around that bucket in metrics.jsonl (the last at
    or before its start, the first at or after its end), as Grafana would draw it."""
    import bisect

    m = json.loads((quick_demo.run_dir / "manifest.json").read_text())
    results = json.loads((quick_demo.run_dir / "results.json").read_text())
    checked = 0
    for b, rb in zip(m["backends"], results["backends"]):
        rows = [json.loads(line) for line in (quick_demo.run_dir / "backends" / b["safe_name"] / "metrics.jsonl").read_text().splitlines()]
        hist = [(r["t"], r["families"]["vllm:time_to_first_token_seconds"]) for r in rows
                if r["ok"] and "vllm:time_to_first_token_seconds" in r["families"]]
        times = [t for t, _ in hist]
        per = rb["server_metrics"]["families"]["vllm:time_to_first_token_seconds"]["per_bucket"]
        for lv in b["levels"]:
            for bk in lv["buckets"]:
                lo = max(bisect.bisect_right(times, bk["start"]) - 1, 0)
                hi = min(bisect.bisect_left(times, bk["end"]), len(times) - 1)
                first, last = dict(map(tuple, hist[lo][1]["buckets"])), dict(map(tuple, hist[hi][1]["buckets"]))
                delta = [(math.inf if le is None else le, last[le] - first.get(le, 0.0)) for le in last]
                entry = per.get(f"{lv['workload']}:{lv['index']}:{bk['index']}")
                if entry is None or delta[-1][1] <= 0:
                    continue
                for key, q in (("p50", 0.5), ("p99", 0.99)):
                    want = reference_histogram_quantile(q, delta)
                    assert entry[key]["value"] == want, (key, bk, delta, entry[key])
                checked += 1
    assert checked >= 2
