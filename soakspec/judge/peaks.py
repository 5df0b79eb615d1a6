"""bench serve's two peak figures, per level: the most output tokens in one second, and the most
requests in flight at one moment.

vLLM's `bench serve` (vllm/benchmarks/serve.py, `calculate_metrics`) prints `Peak output token
throughput (tok/s)` and `Peak concurrent requests`. Its definitions, over its successful requests:

- each request's token times are its send + ttft, then + each ITL gap in turn; each is counted in
  the one-second bin `int(t - first send)`; the peak is the fullest bin;
- concurrency is an exact sweep over the requests' half-open intervals [send, send + latency), a
  departure before an arrival at the same instant; the peak is its maximum. (Earlier versions
  took the most requests active in any one-second bin instead; bench serve still plots that
  series, and it reads higher: two 200 ms requests in one second count as two.)

soakspec's, per level (results.json `levels[].peak_output_tokens_per_s`,
`levels[].peak_concurrent_requests`), over the level's *measured* requests that completed (those
its `requests.completed` counts: bench serve's successes), where they differ:

- the bins run from the level's `measure_start`, not from its first request's send: a measured
  window's seconds, the same for every backend of the run and known before the evidence is read,
  so the bins are counted as the records stream (below). The first chunk's k1 tokens are at
  `first_token` (k1 = output_tokens - len(itl), the runner's ITL contract, runner/protocol.py
  "ITL"; 1 without usage, `first_chunk_tokens`), then one token at `first_token` plus each gap in
  turn (the record's own times: bench serve's send + ttft is the same instant), to the
  microsecond; every token of a measured request counts, k1 + len(itl) = the output_tokens the
  throughput counts, those it received after `measure_end` too (bench serve counts every token
  of its successes, drain included). A request with no `first_token` (no streaming) adds none; a
  level with no token counted has no figure (null), never 0;
- bench serve counts a chunk event as one token (its ITL is a gap a chunk); soakspec counts
  tokens, each where its ITL places it: a first chunk's k1 at the first token, a later chunk of
  k tokens as k gaps of gap/k, so its tokens are spread over the gap before it rather than all at
  its arrival. With one token a chunk the two agree; with `--stream-interval 32` bench serve's
  peak reads about 1/32 of the tokens, and soakspec's can put some of a chunk's tokens in the
  second before the one it arrived in;
- concurrency is bench serve's sweep, over the same requests' [start, end) -- `start` is the send
  (after any wait for a max_concurrency slot), as bench serve's clock -- and so counts only the
  measured completed requests: the warm-up's, the failed ones' and the next level's are not in
  it, though the server held them too;
- a request whose usage the judge does not believe (`usage_mismatch`: more completion tokens
  than its workload's max_tokens, fewer than its chunks, a count that went down, ...;
  `rederive.usage_problem`) counts one token at its first chunk and one at each ITL gap: one a
  chunk, as the output throughput counts its chunks instead of the claimed count (`measures`).
  The loader, which does not know max_tokens, counts its first chunk's k1 from the claimed
  count (a usage of 10^12 in one chunk would be a 10^12 tok/s peak); the judge takes the k1 - 1
  back when it makes the figure (`less_claimed`, `summary.peak_summary`), reading k1 from the
  table as the loader did (`RequestTable.first_chunks`) for the rows the loader counted (their
  recorded outcome completed: `RequestTable.recorded_completed`). Where the runner split a
  chunk's tokens before the claim passed max_tokens (runner/protocol.py "ITL"), those split
  gaps count a token each, as they are: at most max_tokens plus one a chunk;
- the token seconds are counted by the outcome the record states, as it is read: a request
  whose outcome the judge re-derives from its trace afterwards (`judge/rederive.py`, rare)
  stays in them or out as recorded, where the concurrency, swept from the judged table, follows
  the re-derived outcome.

Cost at scale (issue 14: the gate near 15 µs a request at 10^7 and bounded memory). A level's
bins are one int64 a second from its `measure_start` (a day: 86,400 counters, 675 KiB), grown as
tokens arrive, never beyond MAX_SECONDS. `TokenSeconds.add_block` counts a block of records (the
1024 `TableBuilder._bulk` appends at a time, whose packed gaps are already decoded for the ITL
cells) without a pass a token beyond the one cumulative sum: a request's tokens are ascending,
so how many fall before each second's edge its tokens cross is a `searchsorted` in the block's
cumulative gaps (a request spans a second or two: a few queries a request, not one a token).
Concurrency needs no counter at load time: the table already holds every request's start and
end; `peak_concurrency` sorts a level's (nearly sorted already: `kind="stable"`) when results.json
is made. Measured on a 10^6-request soak: benchmarks/README.md, "Peak figures".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

MAX_SECONDS = 1 << 21  # a level's bins at most (24 days): a token later than that is not counted
_US = 1_000_000


def micros_since(origin: float, t: np.ndarray) -> np.ndarray:
    """Whole microseconds of `t` from `origin` (int64): how every second a peak counts in is
    placed (`TokenSeconds`, `less_claimed`), so a take-back lands where the count was."""
    return np.rint((t - origin) * _US).astype(np.int64)

LevelKey = tuple[str, int]  # (workload, level index), as the manifest's level entries name a level


def level_origins(levels: Iterable[Mapping[str, Any]] | None) -> dict[LevelKey, float]:
    """Per (workload, index) of the manifest's level entries, its `measure_start`: where its
    seconds are counted from (a level without a finite one is absent: no figure)."""
    out: dict[LevelKey, float] = {}
    for lv in levels or ():
        if not isinstance(lv, Mapping):
            continue
        wl, ix, t0 = lv.get("workload"), lv.get("index"), lv.get("measure_start")
        if isinstance(wl, str) and type(ix) is int and type(t0) in (int, float) and math.isfinite(t0):
            out[(wl, ix)] = float(t0)
    return out


class TokenSeconds:
    """Output tokens per second of each level's measured window, counted a block of records at a
    time (`add_block`) or a record at a time (`add_one`: the row-by-row path)."""

    def __init__(self, origins: Mapping[LevelKey, float]) -> None:
        self.origins = dict(origins)
        self.bins: dict[LevelKey, np.ndarray] = {}

    def _add(self, key: LevelKey, sec: np.ndarray, weights: np.ndarray | None = None) -> None:
        """Add `weights` (1 each when None) at seconds `sec` (int64, may be out of range: dropped)."""
        keep = (sec >= 0) & (sec < MAX_SECONDS)
        if not keep.all():
            sec = sec[keep]
            weights = None if weights is None else weights[keep]
        if not len(sec):
            return
        lo = int(sec.min())  # a block's seconds are a few, late in a long level: counted from its first
        got = np.bincount(sec - lo, weights=weights)
        hi = lo + len(got)
        have = self.bins.get(key)
        if have is None or len(have) < hi:
            grown = np.zeros(min(max(hi, 2 * len(have) if have is not None else 0, 64), MAX_SECONDS), dtype=np.int64)
            if have is not None:
                grown[:len(have)] = have
            self.bins[key] = have = grown
        have[lo:hi] += got.astype(np.int64) if weights is not None else got

    def add_block(self, key: LevelKey, first_token: np.ndarray, lens: np.ndarray, flat: np.ndarray,
                  before: np.ndarray, cs: np.ndarray | None = None, nonneg: bool = False,
                  first: np.ndarray | None = None) -> None:
        """Count the tokens of a block's rows of one level: `first_token` (seconds, finite),
        `lens` (their gap counts), `before` (each row's position in `flat` where its gaps begin)
        and `flat`, the block's gaps (whole µs, int64), every row's; `cs`, its cumulative sum
        when the caller has it; `first`, each row's first chunk's tokens k1 (`first_chunk_tokens`;
        None: 1 each). A row's k-th token (k >= 1) is at first_token + (cs[before + k -
        1] - base), base = cs[before - 1] (0 at the block's start). A block with a gap below 0
        (foreign evidence: `cs` would not ascend) is counted a token at a time; `nonneg` says
        there is none (a typed record's gaps are unsigned: no pass to look). The first chunk's
        k1 - 1 tokens beyond its first are one more weighted add at its second (s0 below).

        The bins, without a pass a token: F_r(e), the tokens of row r before edge e (a second's
        start), is 0 at or before its first token's second s0, all N_r past its last's s1, and
        between them 1 + the gaps whose cumulative sum lies before the edge (a searchsorted). A
        second k holds F(k + 1) - F(k) of the row: +F at edge-1, -F at the edge, + N_r at s1."""
        origin = self.origins.get(key)
        if origin is None or not len(first_token):
            return
        lens = lens.astype(np.int64, copy=False)
        before = before.astype(np.int64, copy=False)
        if cs is None:
            cs = np.cumsum(flat, dtype=np.int64)
        ft = micros_since(origin, first_token)
        # the row's cumulative gaps before its first (no copy of cs: one pass over the gaps is the cumsum)
        base = np.where(before > 0, cs[np.maximum(before - 1, 0)], 0) if len(cs) else np.zeros(len(before), dtype=np.int64)
        if not nonneg and len(flat) and int(flat.min()) < 0:
            row = np.repeat(np.arange(len(lens)), lens)
            pos = np.concatenate([np.arange(b, b + k) for b, k in zip(before.tolist(), lens.tolist())]) if len(row) \
                else np.zeros(0, dtype=np.int64)
            t = np.concatenate((ft, ft[row] + cs[pos] - base[row]))
            self._add(key, t // _US)
            self._first(key, ft // _US, first)
            return
        end = before + lens
        last = ft + (np.where(end > 0, cs[np.maximum(end - 1, 0)], 0) - base if len(cs) else 0)  # the row's last token
        s0, s1 = ft // _US, last // _US
        self._first(key, s0, first)
        n = lens + 1
        self._add(key, s1, n.astype(np.float64))
        # the edges a row crosses, s0 + 1 .. s1, held to those that touch a bin (edge 0's -F is
        # bin 0's, edge MAX_SECONDS's +F the last's): one record whose tokens span months (a clock
        # that jumped) costs the level's seconds at most, not an edge for each second it crosses
        lo = np.maximum(s0 + 1, 0)
        span = np.clip(np.minimum(s1, MAX_SECONDS) - lo + 1, 0, MAX_SECONDS + 1)
        crossing = np.flatnonzero(span > 0)
        if not len(crossing):
            return
        per = span[crossing]
        row = np.repeat(crossing, per)
        step = np.arange(len(row), dtype=np.int64) - np.repeat(np.cumsum(per) - per, per)
        edge = lo[row] + step  # each second's start the row's tokens cross, in seconds
        # gaps of the row with cs < edge - ft + base: searchsorted over the ascending cs, held to the row's own
        at = np.searchsorted(cs, edge * _US - ft[row] + base[row], side="left")
        f = 1 + np.clip(at, before[row], before[row] + lens[row]) - before[row]
        fw = f.astype(np.float64)
        self._add(key, edge - 1, fw)
        self._add(key, edge, -fw)

    def _first(self, key: LevelKey, s0: np.ndarray, first: np.ndarray | None) -> None:
        """The first chunks' tokens beyond their first (k1 - 1 each), at their seconds `s0`."""
        if first is None:
            return
        more = first > 1
        if more.any():
            self._add(key, s0[more], (first[more] - 1).astype(np.float64))

    def add_one(self, key: LevelKey, first_token: float, gaps_s: Iterable[float], first: int = 1) -> None:
        """One record's tokens (the row-by-row path: rare, and a record at a time already);
        `first`, its first chunk's tokens k1 (`first_chunk_tokens`)."""
        origin = self.origins.get(key)
        if origin is None:
            return
        g = np.fromiter(gaps_s, dtype=np.float64)
        t = np.rint((first_token - origin) * _US) + np.concatenate(([0.0], np.cumsum(np.rint(g * _US))))
        sec = (t // _US).astype(np.int64)
        self._add(key, sec)
        self._first(key, sec[:1], np.array([first], dtype=np.int64))

    def finish(self) -> dict[LevelKey, np.ndarray]:
        return {k: v for k, v in self.bins.items() if v.any()}


def first_chunk_tokens(output_tokens: np.ndarray, chunks: np.ndarray, gaps: np.ndarray) -> np.ndarray:
    """Each request's first chunk's tokens k1: `output_tokens - gaps` (the runner's ITL contract,
    runner/protocol.py "ITL": len(itl) == output_tokens - k1), at least 1. Without usage the
    runner's count is the chunks, one token each: 1. 1 too where the count is absent (below 0)
    or below the chunks (each chunk carries at least one token: the judge flags such a count
    `usage_mismatch`, and its throughput counts the chunks instead). Arrays of the rows, int64."""
    k1 = output_tokens - gaps
    return np.where((output_tokens >= 0) & (output_tokens >= chunks) & (k1 > 1), k1, 1).astype(np.int64)


def less_claimed(bins: np.ndarray, origin: float, first_token: np.ndarray, k1: np.ndarray) -> np.ndarray:
    """`bins` (a level's, from `origin`) less the first chunks' tokens beyond their first (k1 - 1
    each, at the second of their `first_token`) of requests whose usage the judge does not believe
    (`usage_mismatch`): the loader counted them from the claimed count, before the judge knew the
    workload's max_tokens. Such a request is left with one token at its first chunk and one at
    each ITL gap: one a chunk, as the output throughput counts its chunks (`measures`, "usage
    contradicts the stream"). The seconds as `TokenSeconds` computes them; a copy."""
    more = k1 > 1
    if not more.any():
        return bins
    sec = micros_since(origin, first_token[more]) // _US
    keep = (sec >= 0) & (sec < len(bins))
    out = bins.copy()
    np.subtract.at(out, sec[keep], (k1[more][keep] - 1).astype(np.int64))
    return out


def peak_tokens(bins: np.ndarray | None) -> int | None:
    """The fullest second's tokens (None: no token counted)."""
    if bins is None or not len(bins) or not bins.any():
        return None
    return int(bins.max())


def peak_concurrency(start: np.ndarray, end: np.ndarray) -> int | None:
    """The most [start, end) intervals that hold one instant (a departure before an arrival at the
    same instant: bench serve's sweep), of the pairs where both are finite and end >= start.
    None for no such pair. After an arrival at s, s's own and the earlier arrivals less the ends
    at or before s are in flight: the maximum over the arrivals."""
    ok = np.isfinite(start) & np.isfinite(end) & (end >= start)
    if not ok.all():
        start, end = start[ok], end[ok]
    if not len(start):
        return None
    s = np.sort(start, kind="stable")  # timsort: runs of the time order the records mostly keep
    e = np.sort(end, kind="stable")
    return int((np.arange(1, len(s) + 1) - np.searchsorted(e, s, side="right")).max())
