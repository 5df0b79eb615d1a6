"""Per-token gaps counted in bins once a cell holds too many distinct values.

`GapCells` (judge/table.py) counts each cell's ITL gaps (whole microseconds) by value. That is
exact and small while a server's gaps take few values, but a real server's gaps vary by
milliseconds at microsecond resolution: a one-minute bucket of a busy server holds tens of
thousands of distinct gaps, and a day-long soak thousands of cells (benchmarks/README.md,
"Spread gaps": ~2 GB at 10^7 requests). So a cell holds its distinct gaps exactly up to
CELL_EXACT_MAX of them, then *bins* them: a gap below 2**BIN_BITS µs stays exact, a larger one
is counted in a bin of the values sharing its top BIN_BITS bits -- at most 2**(1 - BIN_BITS)
(0.2%) of the value wide, 512 bins an octave, so a cell of gaps between 5 and 100 ms holds at
most ~2,200 bins however many gaps it counts.

The judge's verdicts stay exact. The spec's ITL thresholds are known before the evidence is
read, and every threshold is made a bin edge (`edges_for`): a bin lies wholly on one side of
each, so a count of gaps beyond a threshold is exact, and so is on which side of it any
order statistic lies. Where a percentile interpolates between the two order statistics
either side of a threshold, those two are exactly the largest gap below it and the smallest
at or above it, which each cell keeps (`stats.Bins`). The figures printed (a percentile's
value) are known to within half a bin (0.1%), and carry their bounds (`Measure.bounds`); a
threshold the cells were not cut at is judged from the gaps themselves, read again.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

BIN_BITS = 10  # a binned gap keeps its top BIN_BITS bits: bins at most 2**(1 - BIN_BITS) of their value wide
CELL_EXACT_MAX = 2048  # distinct gaps a cell holds exactly before it bins them


def edges_for(thresholds_s: Iterable[float]) -> np.ndarray:
    """The bin edges (µs, int64, ascending) that keep counts against thresholds (seconds) exact:
    for each threshold t, the least whole µs k with k / 1e6 >= t (a gap below it is `< t`) and
    the least with k / 1e6 > t (`<= t`), tested on the very floats the judge compares."""
    out: set[int] = set()
    for t in thresholds_s:
        if not isinstance(t, (int, float)) or not math.isfinite(t) or not 0 < t < 2**31 / 1e6:
            continue
        for strict in (False, True):
            k = math.floor(t * 1e6)
            while k > 0 and ((k - 1) / 1e6 > t if strict else (k - 1) / 1e6 >= t):
                k -= 1
            while (k / 1e6 <= t) if strict else (k / 1e6 < t):
                k += 1
            out.add(k)
    return np.asarray(sorted(out), dtype=np.int64)


def _shift(v: np.ndarray) -> np.ndarray:
    """How many low bits a gap's bin ignores: 0 for a gap below 2**BIN_BITS (or not above 0)."""
    _, e = np.frexp(np.maximum(v, 0).astype(np.float64))  # the bit length (gaps are below 2**31: exact)
    return np.maximum(e.astype(np.int64) - BIN_BITS, 0)


def bin_of(v: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Each gap's bin (int64 µs: its lowest value): its top BIN_BITS bits, or the edge at or below
    it where an edge cuts that bin. Idempotent: a bin's lowest value is its own bin."""
    v = np.asarray(v, dtype=np.int64)
    s = _shift(v)
    lo = (v >> s) << s
    if len(edges):
        k = np.searchsorted(edges, v, side="right") - 1
        lo = np.maximum(lo, np.where(k >= 0, edges[np.maximum(k, 0)], lo))
    return lo


def bin_last(lo: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The largest gap (µs) in each bin `lo` (as `bin_of` gives them)."""
    lo = np.asarray(lo, dtype=np.int64)
    s = _shift(lo)
    end = ((lo >> s) << s) + (np.int64(1) << s)
    if len(edges):
        k = np.searchsorted(edges, lo, side="right")
        end = np.minimum(end, np.where(k < len(edges), edges[np.minimum(k, len(edges) - 1)], end))
    return end - 1
