"""buckets.jsonl: one line per closed bucket, written by the run as it goes.

A line is the bucket's identity and window, then its figures over the bucket's requests (a
request belongs to the bucket it started in). The run writes it once they have all finished:
after the window's end plus the level's deadline (every request ends by its deadline; a line
is written at the next bucket end after that, or when the level stops), so its counts are the
judge's -- except a request an overloaded scheduler started more than a second late:

  workload, level, label, bucket      which bucket (level = the level's index)
  start, end, closed_at               its window, and when the line was written (epoch s)
  requests                            {total, completed, failed, timeout, rejected, disconnected}
  output_tokens                       completion tokens of its completed requests
  ttft, itl                           {n, p50, p95} (seconds; nearest-rank, exact) of completed requests

The run writes a bucket's line only after the requests of that bucket so far are durable (the
requests file's gzip member is closed and fsynced first), then fsyncs buckets.jsonl: a line
never names a bucket whose records a crash could still lose. `soakspec gate --partial` judges a
run still going (or killed) up to its last line.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from soakspec.evidence.ids import U32
from soakspec.evidence.record import OUTCOMES, Record, extend_u32, unpack_gaps

BUCKET_KEYS = ("workload", "level", "label", "bucket", "closed_at", "start", "end", "requests", "output_tokens", "ttft", "itl")


class BucketValues:
    """One bucket's aggregates while it is open: counts by outcome, output tokens, and the TTFT
    and per-token ITL values of its completed requests for exact p50/p95. The ITL gaps are held
    as they are stored (whole microseconds) in 4 bytes each while every one fits (8 from the
    first that does not), not as Python numbers: a 60 s bucket of a fast server holds millions."""

    __slots__ = ("counts", "tokens", "ttft", "itl")

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self.tokens = 0
        self.ttft = array("d")
        self.itl = array(U32)

    def add(self, r: Record | Mapping[str, Any]) -> None:
        outcome = str(r["outcome"])
        self.counts[outcome] += 1
        if outcome != "completed":
            return
        self.tokens += r["output_tokens"]
        t = r["ttft"]
        if t is not None:
            self.ttft.append(t)
        gaps, n = r["itl_us"], len(self.itl)
        if extend_u32(self.itl, gaps):  # packed (`Record`'s itl_us), narrow: its bytes are the array's
            return
        if type(gaps) is str:
            gaps = unpack_gaps(gaps).tolist()  # a wide gap
        try:
            self.itl.extend(gaps)
        except OverflowError:  # a gap beyond 4 bytes (or below 0): from here on in 8
            del self.itl[n:]  # what the failed extend appended before the value that did not fit
            self.itl = array("q", self.itl)
            self.itl.extend(gaps)

    def figures(self) -> dict[str, Any]:
        """The bucket's figures. Reorders its value arrays (they are not read again). Numpy
        selects the two ranks (no sort, no Python number a value) and lets go of the GIL while
        it does: the recorder makes a line on a worker thread, beside the running load."""
        c = self.counts
        return {
            "requests": {"total": sum(c.values())} | {o: c.get(o, 0) for o in OUTCOMES},
            "output_tokens": self.tokens,
            "ttft": quantiles(self.ttft, float),
            "itl": quantiles(self.itl, lambda g: int(g) / 1e6),
        }


class BucketTally:
    """The open buckets of one level's records written so far (`BucketValues` each), kept
    until a bucket's line is made: bounded by one bucket's requests, freed by `take`."""

    def __init__(self) -> None:
        self._open: dict[int, BucketValues] = {}

    def add(self, r: Record | Mapping[str, Any]) -> None:
        b = r["bucket"]
        if b < 0:
            return
        v = self._open.get(b)
        if v is None:
            v = self._open[b] = BucketValues()
        v.add(r)

    def take(self, b: int) -> BucketValues:
        """Bucket `b`'s values, no longer held here (empty when it had no record)."""
        return self._open.pop(b, None) or BucketValues()


def quantiles(values: array, read: Any) -> dict[str, float | int | None]:
    """{n, p50, p95} of `values` read by `read` (seconds), by the nearest-rank method (a value
    that occurred), to 1 us: the two ranks selected in place (`values` is reordered)."""
    n = len(values)
    if not n:
        return {"n": 0, "p50": None, "p95": None}
    xs = np.frombuffer(values, dtype=np.dtype(values.typecode))
    at = {p: _rank(p, n) for p in (0.5, 0.95)}
    xs.partition(sorted(set(at.values())))
    return {"n": n, "p50": round(read(xs[at[0.5]]), 6), "p95": round(read(xs[at[0.95]]), 6)}


def _rank(p: float, n: int) -> int:
    """The 0-based index of the nearest-rank p-quantile of n sorted values."""
    k = -(-p * n // 1)  # ceil(p * n)
    return min(n - 1, max(0, int(k) - 1))


def bucket_line(level: Mapping[str, Any], k: int, start: float, length_s: float, closed_at: float,
                values: BucketValues) -> dict[str, Any]:
    """Bucket `k`'s line of the level whose manifest entry (plan fields) is `level`, from its
    values (`BucketTally.take(k)`; reordered by this)."""
    return {"workload": level["workload"], "level": level["index"], "label": level["label"], "bucket": k,
            "closed_at": closed_at, "start": start, "end": start + length_s} | values.figures()  # fmt: skip


def lines_for(levels: Iterable[Mapping[str, Any]], records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The lines a run leaves for finished `levels` (manifest entries) and all their `records`:
    what the test builders write (a finished run's lines count every record of the bucket)."""
    records = list(records)
    out = []
    for lv in levels:
        tally = BucketTally()
        for r in records:
            if r["workload"] == lv["workload"] and r["level"] == lv["index"]:
                tally.add(r)
        for b in lv.get("buckets") or ():
            out.append(bucket_line(lv, b["index"], b["start"], b["end"] - b["start"], b["end"], tally.take(b["index"])))
    return out
