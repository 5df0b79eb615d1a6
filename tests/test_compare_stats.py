"""`soakspec compare`'s intervals hold their stated error rates (seeded Monte Carlo on generated
samples, each row computed as `compare` computes it): two runs of one configuration read a
regression no more often than the family-wise confidence allows, and a true regression beyond a
rule's limit does not PASS."""

from __future__ import annotations

import types

import numpy as np

from soakspec import compare as C


def _row(metric: str, stat: str, xb, xn, rows: int = 15, confidence: float = 0.95, seed: int = 0, units=None):
    """The row `compare` makes of these two samples in a comparison of `rows` rows."""
    cm = C.BY_NAME[metric]
    lv = types.SimpleNamespace(label="concurrency 8", index=0)
    p = types.SimpleNamespace(cm=cm, stat=stat, key=("b", "b", "w", 0, metric, stat), base_lv=lv, new_lv=lv, note=None)
    if cm.kind == "distribution":
        sb, sn = C.Sorted.of(xb), C.Sorted.of(xn)
        eb, en = units if units is not None else (sb.n, sn.n)
        sides = ((sb, eb), (sn, en))
    else:
        sides = ((list(xb), len(xb)), (list(xn), len(xn)))
    row_conf = 1 - (1 - confidence) / rows
    return C._row(p, confidence, row_conf, max(C.DEFAULT_RESAMPLES, C.min_resamples(rows, confidence)), seed, sides)


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
