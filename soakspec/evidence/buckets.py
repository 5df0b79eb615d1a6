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

from soakspec.evidence.record import OUTCOMES, Record

BUCKET_KEYS = ("workload", "level", "label", "bucket", "closed_at", "start", "end", "requests", "output_tokens", "ttft", "itl")


class BucketTally:
    """Per-bucket aggregates of one level's records written so far, kept until the bucket's
    line is made: counts by outcome, output tokens, and the TTFT and per-token ITL values for
    exact p50/p95 (bounded by one bucket's requests, freed when its line is made)."""

    def __init__(self) -> None:
        self._counts: dict[int, Counter] = {}
        self._tokens: dict[int, int] = {}
        self._ttft: dict[int, array] = {}
        self._itl: dict[int, array] = {}

    def add(self, r: Record | Mapping[str, Any]) -> None:
        b = r["bucket"]
        if b < 0:
            return
        c = self._counts.get(b)
        if c is None:
            c = self._counts[b] = Counter()
            self._tokens[b] = 0
            self._ttft[b] = array("d")
            self._itl[b] = array("q")  # integer microseconds, as stored
        outcome = str(r["outcome"])
        c[outcome] += 1
        if outcome == "completed":
            self._tokens[b] += r["output_tokens"]
            t = r["ttft"]
            if t is not None:
                self._ttft[b].append(t)
            self._itl[b].extend(r["itl_us"])

    def figures(self, b: int) -> dict[str, Any]:
        """The bucket's figures (and forget them)."""
        c = self._counts.pop(b, Counter())
        return {
            "requests": {"total": sum(c.values())} | {o: c.get(o, 0) for o in OUTCOMES},
            "output_tokens": self._tokens.pop(b, 0),
            "ttft": quantiles(sorted(self._ttft.pop(b, ()))),
            "itl": quantiles([g / 1e6 for g in sorted(self._itl.pop(b, ()))]),
        }


def quantiles(xs: list[float]) -> dict[str, float | int | None]:
    """{n, p50, p95} of sorted `xs` by the nearest-rank method (a value that occurred), to 1 us."""
    if not xs:
        return {"n": 0, "p50": None, "p95": None}
    n = len(xs)

    def q(p: float) -> float:
        k = -(-p * n // 1)  # ceil(p * n)
        return round(xs[min(n - 1, max(0, int(k) - 1))], 6)

    return {"n": n, "p50": q(0.5), "p95": q(0.95)}


def bucket_line(level: Mapping[str, Any], k: int, start: float, length_s: float, closed_at: float,
                tally: BucketTally) -> dict[str, Any]:
    """Bucket `k`'s line of the level whose manifest entry (plan fields) is `level`."""
    return {"workload": level["workload"], "level": level["index"], "label": level["label"], "bucket": k,
            "closed_at": closed_at, "start": start, "end": start + length_s} | tally.figures(k)  # fmt: skip


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
            out.append(bucket_line(lv, b["index"], b["start"], b["end"] - b["start"], b["end"], tally))
    return out
