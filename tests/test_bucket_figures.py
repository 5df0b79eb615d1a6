"""A bucket line's figures (buckets.jsonl): counts, output tokens, and nearest-rank p50/p95 of
TTFT and per-token ITL. The runner selects the two ranks with numpy over compact arrays
(`BucketValues`); they must be exactly what sorting every value gives (the reference below,
the definition the line documents)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from soakspec.evidence.buckets import BucketTally
from soakspec.evidence.record import OUTCOMES, pack_gaps


def _reference(records: list[dict]) -> dict:
    """Every value of the bucket sorted, as Python numbers; the value at rank ceil(p * n)."""

    def quantiles(xs: list[float]) -> dict:
        if not xs:
            return {"n": 0, "p50": None, "p95": None}
        n = len(xs)

        def q(p: float) -> float:
            return round(xs[min(n - 1, max(0, math.ceil(p * n) - 1))], 6)

        return {"n": n, "p50": q(0.5), "p95": q(0.95)}

    done = [r for r in records if r["outcome"] == "completed"]
    return {
        "requests": {"total": len(records)} | {o: sum(r["outcome"] == o for r in records) for o in OUTCOMES},
        "output_tokens": sum(r["output_tokens"] for r in done),
        "ttft": quantiles(sorted(r["ttft"] for r in done if r["ttft"] is not None)),
        "itl": quantiles(sorted(g / 1e6 for r in done for g in r["itl_us"])),
    }


gap = st.one_of(st.integers(0, 3000), st.integers(0, 3000), st.integers(2**32 - 2, 2**32 + 2), st.integers(0, 2**62))
record = st.fixed_dictionaries({
    "bucket": st.just(3),
    "outcome": st.sampled_from(OUTCOMES),
    "output_tokens": st.integers(0, 300),
    "ttft": st.none() | st.floats(-1.0, 100.0, allow_nan=False),
    "itl_us": st.lists(gap, max_size=12),
})  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(record, max_size=40), st.data())
def test_bucket_figures_equal_sorting_every_value(records, data) -> None:
    """Gaps beyond 4 bytes (the compact array widened in the middle of a record) included, each
    record's gaps packed as the runner writes them (narrow or wide) or a list (format 2)."""
    tally = BucketTally()
    for r in records:
        packed = data.draw(st.booleans())
        tally.add(r | {"itl_us": pack_gaps(r["itl_us"])} if packed else r)
    got = tally.take(3).figures()
    assert got == _reference(records)
    assert tally.take(3).figures() == _reference([])  # taken: no longer held


def test_a_bucket_of_a_fast_server_holds_its_gaps_in_four_bytes_each() -> None:
    """200 requests of 256 tokens: 50,800 gaps held in ~200 KB, not as Python ints (~1.8 MB)."""
    tally = BucketTally()
    for k in range(200):
        tally.add({"bucket": 0, "outcome": "completed", "output_tokens": 256, "ttft": 0.01, "itl_us": [1000 + k] * 254 + [2000]})
    v = tally.take(0)
    assert v.itl.itemsize == 4 and len(v.itl) == 200 * 255
    assert v.figures()["itl"] == {"n": 51_000, "p50": 0.0011, "p95": 0.00119}
