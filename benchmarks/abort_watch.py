"""What the live abort rules cost the load loop late in a day-long level.

    python benchmarks/abort_watch.py

The runner's `AbortWatch` is told of every batch of finished records (`observe`, on the event
loop that schedules the sends; at 100 req/s, ~100 calls a second) and evaluates each `per
window` rule on each window as it ends. This times 1,000 observe calls (100 req/s, one record
a call, 10 s of load) at hour 1 and at hour 24 of one level, with the builtin bucket rule and a
`failed.ratio > 0.5 per window 1s` rule; the hour-1 figure is the reference: a watch whose
work per call does not grow with the level's age gives a ratio near 1.
"""

from __future__ import annotations

import time

from soakspec.plan import AbortRule
from soakspec.runner.abort import AbortWatch, Row

BUCKET_S = 60.0
DAY_S = 86_400.0


def _rule(**kw) -> AbortRule:
    base = dict(text="failed.ratio > 0.5 per window 1s", metric="failed", agg="ratio", op=">", threshold=0.5,
                percentile=None, scope="window", window_s=1.0, min_requests=1, builtin=False)  # fmt: skip
    return AbortRule(**(base | kw))


def _per_call_us(hour: float) -> float:
    watch = AbortWatch("b", [_rule(), _rule(text="builtin", scope="bucket", window_s=None, min_requests=20, builtin=True)])
    watch.level_started("w", 0, "rate 100 rps", 0.0, DAY_S, BUCKET_S)
    t = hour * 3600.0
    watch.observe([Row(int(t // BUCKET_S), t, "completed", {})], now=t)  # the level so far: every window up to here
    t0 = time.perf_counter()
    for k in range(1000):
        at = t + 0.01 * (k + 1)
        watch.observe([Row(int(at // BUCKET_S), at - 0.2, "completed", {})], now=at)
        if int(at // BUCKET_S) != int((at - 0.01) // BUCKET_S):
            watch.bucket_done(int((at - 0.01) // BUCKET_S), now=at)
    assert watch.fired is None
    return (time.perf_counter() - t0) / 1000 * 1e6


def main() -> None:
    early, late = _per_call_us(1.0), _per_call_us(24.0 - 0.01)
    print("| hour of the level | µs per observe call |")
    print("| ---: | ---: |")
    print(f"| 1 | {early:,.1f} |")
    print(f"| 24 | {late:,.1f} |")
    print(f"late / early: {late / early:,.1f}x")


if __name__ == "__main__":
    main()
