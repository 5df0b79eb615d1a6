"""`soakspec compare`'s intervals hold their stated error rates (seeded Monte Carlo on generated
samples, each row computed as `compare` computes it): two runs of one configuration read a
regression no more often than the family-wise confidence allows, and a true regression beyond a
rule's limit does not PASS."""

from __future__ import annotations

import types

import numpy as np

from soakspec import compare as C
from soakspec.compare import intervals, rows as R, samples as S


def _row(metric: str, stat: str, xb, xn, rows: int = 15, confidence: float = 0.95, seed: int = 0, units=None, sides=None):
    """The row `compare` makes of these two samples (or of `compare._samples`' `sides`) in a
    comparison of `rows` rows."""
    cm = C.BY_NAME[metric]
    lv = types.SimpleNamespace(label="concurrency 8", index=0)
    p = types.SimpleNamespace(cm=cm, stat=stat, key=("b", "b", "w", 0, metric, stat), base_lv=lv, new_lv=lv, note=None, turn=None)
    if sides is not None:
        pass
    elif cm.kind == "distribution":
        sb, sn = C.Sorted.of(xb), C.Sorted.of(xn)
        eb, en = units if units is not None else (sb.n, sn.n)
        sides = ((sb, eb), (sn, en))
    else:
        sides = ((list(xb), len(xb)), (list(xn), len(xn)))
    row_conf = 1 - (1 - confidence) / rows
    return R._row(p, confidence, row_conf, max(intervals.DEFAULT_RESAMPLES, intervals.min_resamples(rows, confidence)), seed, sides)


def test_a_mean_over_few_buckets_of_one_configuration_rarely_reads_as_a_change():
    """Per-bucket throughput of two runs of one configuration (4 to 6 one-minute buckets, 5%
    bucket-to-bucket noise): a row of a 15-row comparison at 95% family-wise may call a change
    at most (1 - 95%) / 15 = 0.33% of the time. The bootstrap of a mean over 4 buckets called
    one 7.0% of the time (4.3% improvement, 2.7% regression; 6 buckets: 2.3%): a resample of 4
    values cannot see a t distribution's tails. A Welch/Fieller t interval holds it."""
    rng = np.random.default_rng(4242)
    called = 0
    trials = 300
    for t in range(trials):
        k = 4 + t % 3
        xb = 1000 * (1 + 0.05 * rng.standard_normal(k))
        xn = 1000 * (1 + 0.05 * rng.standard_normal(k))
        called += _row("throughput", "mean", xb, xn, seed=t).verdict != "no significant change"
    assert called / trials <= 0.01, called


def _itl_records(rng, requests: int, slower: float = 1.0) -> list[dict]:
    """Completed requests of very unequal lengths (nine in ten stop after 16 tokens, one in ten
    runs to 1000), each decoding at its own speed (lognormal across requests, 5% within one)."""
    out = []
    for i in range(requests):
        gaps = 16 if rng.random() < 0.9 else 1000
        speed = float(np.exp(rng.normal(np.log(0.02), 0.3))) * slower
        itl = np.round(speed * np.exp(rng.normal(0.0, 0.05, gaps)), 6).tolist()
        out.append({"request_id": f"r{i}", "outcome": "completed", "itl": itl, "itl_source": "exact",
                    "output_tokens": gaps + 1, "chunks": gaps + 1, "tokens_source": "usage"})
    return out


def test_itl_of_requests_of_unequal_lengths_rests_on_their_effective_number():
    """itl's interval is an m-out-of-n bootstrap of the pooled gaps, m the independent draws
    among them. With m = requests, two runs of one configuration whose requests differ in length
    (nine in ten 16 gaps, one in ten 1000) read a p50(itl) change far beyond the 0.33% a row of
    a 15-row comparison may: a long request's gaps are a tenth of the requests and 87% of the
    gaps, and the pooled percentile moves with those few requests. m is now Kish's effective
    number of requests, (sum of gaps)^2 / sum of squared gaps per request (equal lengths: the
    requests), the most perfectly correlated gaps can cost."""
    rng = np.random.default_rng(777)
    cm = C.BY_NAME["itl"]
    called = 0
    trials = 120
    for t in range(trials):
        sides = []
        for _ in range(2):
            lv = types.SimpleNamespace(records=_itl_records(rng, 300))
            sides.append(S._samples(None, lv, cm))
        (xb, eb), (xn, en) = (s[:2] for s in sides)
        assert eb < 100  # ~0.13 x 300 requests
        called += _row("itl", "p50", None, None, seed=t, sides=tuple(sides)).verdict != "no significant change"
    assert called / trials <= 0.02, called


def test_a_change_below_a_tenth_of_a_percent_does_not_print_as_zero():
    """A regression interval whose low end is above 0 printed '+0.0% .. +4.5%' beside
    REGRESSION; it now shows the digits that keep it off 0."""
    from soakspec.compare.rows import signed_percent

    assert signed_percent(0.0004) == "+0.04%" and signed_percent(-0.0004) == "-0.04%"
    assert signed_percent(0.045) == "+4.5%" and signed_percent(0.0) == "+0.0%"
    assert signed_percent(0.0004, " pp") == "+0.04 pp"
