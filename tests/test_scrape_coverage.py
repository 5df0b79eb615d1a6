"""Which buckets the server's /metrics scrapes cover (`servermetrics._uncovered`): a bucket is
covered when none of the family's scrapes around and inside it failed and the successful ones
are no further apart than a scrape interval and its timeout (11.25 s by default: a scrape may
answer at its timeout, the next starts on the slot after). Before, only that distance was
asked, so a 5 s bucket inside a 7 s gap of failed scrapes PASSED every rule on the successes
either side."""

from __future__ import annotations

import pytest

from soakspec.judge.judge import judge
from soakspec.judge.testing import EvidenceBuilder, metrics_rows, small_spec

TTFT = "vllm:time_to_first_token_seconds"
TOKENS = "vllm:generation_tokens_total"
WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"  # 4 in every scrape (`metrics_rows`)


def _run(rules: str, *, fail=(), drop=(), late=(), interval: float | None = 1.25, step: float = 1.25, bare: bool = False):
    """The performance results of `rules` over one 20 s level of 5 s buckets whose /metrics was
    scraped every `step` s (the manifest's interval: `interval`, None: not recorded), from just
    before the level to just after it; scrapes at [a, b) seconds into the level in `fail` failed
    (HTTP 503), those in `drop` were never made, those at the times in `late` started 0.5 s late."""
    spec = small_spec(rules, duration="20s", bucket="5s")
    b = EvidenceBuilder(spec)
    (lv,) = b.manifest["backends"][0]["levels"]
    t0, t1 = lv["buckets"][0]["start"], lv["buckets"][-1]["end"]
    rows = metrics_rows(t0 - 0.1, t1 + 0.1, step=step)
    for row in rows:
        x = row["t"] - t0
        if any(abs(x - y) < 0.01 for y in late):
            row["t"] += 0.5
        if bare:
            row["families"] = {}
        if any(a <= x < b for a, b in fail):
            row.update(ok=False, status=503, error="HTTP 503", families={})
    b.metrics["a"] = [r for r in rows if not any(a <= r["t"] - t0 < b for a, b in drop)]
    entry = b.manifest["backends"][0]["metrics"]
    entry["scrapes"] = len(b.metrics["a"])
    if interval is None:
        entry.pop("interval_s")
    else:
        entry["interval_s"] = interval
    return [r for r in judge(spec, b.build()).rules if r.klass == "performance"]


# every kind of rule: a gauge's max, mean and min, a counter's bare change, rate and per-bucket
# rates, a histogram's observations, mean and quantile -- per bucket and over the level
RULES = [
    f'require max(server("{WAITING}")) < 10',
    f'require mean(server("{WAITING}")) < 10 per bucket',
    f'require min(server("{WAITING}")) > -1',  # what it saw (0) is an upper bound: it cannot decide > -1
    f'require server("{TOKENS}") < 1000000 per bucket',
    f'require server("{TOKENS}") < 1000000',
    f'require rate(server("{TOKENS}")) < 1000000rps',
    f'require mean(server("{TOKENS}")) < 1000000rps',
    f'require max(server("{TOKENS}")) < 1000000rps per bucket',
    f'require mean(server("{TTFT}")) < 1s per bucket',
    f'require p50(server("{TTFT}")) < 1s per level',
    f'require server("{TTFT}") < 1000000 per bucket',
]

GAP = [(4.5, 11.5)]  # the audit's gap2: /metrics answered 503 from 4.5 s to 11.5 s into the level


@pytest.mark.parametrize("rule", RULES)
def test_a_bucket_inside_a_gap_of_failed_scrapes_is_inconclusive_for_every_rule_kind(rule):
    """The audit's gap2: 6 of 18 scrapes failed, bucket 1 (5-10 s) has no successful scrape, and
    every rule PASSED (exit 0) with nothing said of the failed scrapes: the per-bucket change of
    the counter was taken across the gap, the gauge's 5 s bucket read as 'shorter than a scrape
    interval' of 11.25 s."""
    (r,) = _run(rule, fail=GAP)
    assert r.status == "inconclusive", r.message
    assert "covers" in r.message and "failed; first: HTTP 503" in r.message, r.message
    (ok,) = _run(rule)
    assert ok.status == "pass", ok.message


@pytest.mark.parametrize("rule, status", [
    (f'require min(server("{WAITING}")) < 10', "pass"),  # it saw 0: the unseen buckets can only lower the min
    (f'require min(server("{WAITING}")) > 5', "fail"),   # at most 0: certainly not above 5
    (f'require min(server("{WAITING}")) >= 0', "inconclusive"),  # at most 0: the gap may hold less
    (f'require min(server("{RUNNING}")) != 0', "inconclusive"),  # at most 4: the gap may hold 0
    (f'require min(server("{RUNNING}")) == 0', "inconclusive"),
    (f'require min(server("{RUNNING}")) != 5', "pass"),  # at most 4: never 5
    (f'require min(server("{RUNNING}")) == 5', "fail"),
    (f'require max(server("{RUNNING}")) != 3', "pass"),  # at least 4: never 3
    (f'require max(server("{RUNNING}")) == 3', "fail"),
    (f'require max(server("{RUNNING}")) == 5', "inconclusive"),  # at least 4: the gap may hold 5
])
def test_a_gauges_min_over_a_gap_is_decided_where_what_it_saw_decides_it(rule, status):
    """A min over buckets some of which no scrape covers is an upper bound, the mirror of a
    max's lower bound: the buckets it did not see could only lower it. It was INCONCLUSIVE
    whatever it saw, though `min < 10` had seen 0; a bound that cannot decide stays so. `==`
    and `!=` are decided only by a threshold no value the bound allows can equal (a review
    found `min != 0` PASSed at "4 or less", and `max == 3` FAILed at "4 or more" before)."""
    (r,) = _run(rule, fail=GAP)
    assert r.status == status, r.message
    assert "covers" in r.message and "failed; first: HTTP 503" in r.message, r.message


@pytest.mark.parametrize("rule", RULES)
def test_one_failed_scrape_inside_a_bucket_leaves_it_uncovered(rule):
    """The successes either side of a failed scrape are 2.5 s apart: longer than a scrape
    interval allows (a counter's change across it may hide a restart, a gauge's peak be in it)."""
    (r,) = _run(rule, fail=[(7.4, 7.6)])
    assert r.status == "inconclusive" and "1 of 18 scrapes failed" in r.message, r.message


@pytest.mark.parametrize("rule", RULES)
def test_a_late_scrape_still_covers_its_buckets(rule):
    """A scrape that starts 0.5 s late (a busy host) is no missing one."""
    (r,) = _run(rule, late=[7.4, 12.4])
    assert r.status == "pass", r.message


@pytest.mark.parametrize("rule", RULES)
def test_a_scrape_never_made_leaves_a_gap_as_a_failed_one_does(rule):
    """No failed scrape recorded, but the successful ones ~14 s apart around a bucket where they
    are every 1.25 s -- longer than any answer within the 10 s timeout explains: what happened
    in between was not sampled."""
    (r,) = _run(rule, drop=[(3, 16)])
    assert r.status == "inconclusive" and "apart" in r.message and "1.25 s scrape interval and its timeout" in r.message, r.message


@pytest.mark.parametrize("rule", RULES)
def test_a_scraper_that_skipped_slots_without_a_failure_still_covers_its_buckets(rule):
    """A CPU vLLM under load answers /metrics in 2 s, asked every 1.25 s: the scraper starts
    each scrape on the first slot after the last answer, every 2.5 s; on the real-server lane
    the scraper's own machine made it miss one slot in 25 (readings 4.8 s apart every 2.5 s
    asked). Nothing failed: decided, not INCONCLUSIVE (the audit's fix, holding readings to 1.5
    intervals apart, made that soak INCONCLUSIVE)."""
    (r,) = _run(rule, step=2.5)
    assert r.status == "pass", r.message
    (r,) = _run(rule, drop=[(7.4, 9.9)])  # one slot of 1.25 s missed twice over: 3.75 s apart
    assert r.status == "pass", r.message


def test_a_counter_whose_last_scrapes_failed_is_a_lower_bound_not_the_runs_total():
    """The audit's vanish2: /metrics answered 404 from 8 s on; `server(...) < 100` PASSED at the
    change up to the last success (75, where the server counted ~150) while mean(...) over the
    same run said a bucket was uncovered. Now both say so: the bare change is only at least
    what was seen."""
    count, mean = _run(f'require server("{TOKENS}") < 1000000\nrequire mean(server("{TOKENS}")) < 1000000rps',
                       fail=[(8, 30)])
    assert count.status == "inconclusive" and "or more" in count.message and "3 of 4 buckets" in count.message, count.message
    assert mean.status == "inconclusive" and "3 of 4 buckets" in mean.message, mean.message


def test_a_change_taken_across_a_gap_is_no_lower_bound_of_the_bucket():
    """Bucket 0's change reaches the first success after the gap (11.4 s in): it counts bucket 1's
    and 2's tokens too, so '= N or more' of bucket 0 would be a false bound (a `== 0 per bucket`
    FAILED in a bucket for what the next one counted): not computed, as buckets 1 and 2."""
    (r,) = _run(f'require server("{TOKENS}") < 1000000 per bucket', fail=GAP)
    assert r.status == "inconclusive" and r.failing == 3, r.message
    for d in r.details:
        assert d.status == "inconclusive" and "cannot be computed" in d.message and "or more" not in d.message, d.message
    assert sorted(d.where.bucket for d in r.details) == [0, 1, 2]


def test_without_a_recorded_interval_the_scrapes_own_cadence_is_the_resolution():
    """Evidence from before the manifest recorded `interval_s`: the median time between scrapes."""
    (ok,) = _run(f'require max(server("{WAITING}")) < 10', interval=None)
    assert ok.status == "pass", ok.message
    (r,) = _run(f'require max(server("{WAITING}")) < 10', interval=None, fail=GAP)
    assert r.status == "inconclusive", r.message


# ---------------------------------------------------------------------------- a family /metrics never had


def test_a_family_the_answering_server_never_had_says_so_not_that_no_scrape_succeeded():
    """The audit's missing.soak: all 12 scrapes succeeded, the named families absent, and the
    rule said "no successful scrape of /metrics (0 failed; first: None)"."""
    (r,) = _run(f'require max(server("{WAITING}")) < 10', bare=True)  # as the audit's: no kept family at all
    assert r.status == "inconclusive", r.message
    assert f"has no '{WAITING}': it answered 18 scrapes, none with it" in r.message, r.message
    assert "no successful scrape" not in r.message, r.message
    (r,) = _run('require max(server("vllm:no_such_gauge")) < 10')  # others there
    assert r.status == "inconclusive", r.message
    assert "has no 'vllm:no_such_gauge': it answered 18 scrapes, none with it" in r.message, r.message
    assert "no successful scrape" not in r.message, r.message
    (r,) = _run('require max(server("vllm:no_such_gauge")) < 10', fail=GAP)
    assert "it answered 12 scrapes (6 more failed; first: HTTP 503), none with it" in r.message, r.message


def test_a_server_whose_every_scrape_failed_says_how_many():
    (r,) = _run(f'require max(server("{WAITING}")) < 10', fail=[(-1, 30)])
    assert r.status == "inconclusive", r.message
    assert "no successful scrape of /metrics (18 of 18 scrapes failed; first: HTTP 503)" in r.message, r.message
