"""A backend's request records as typed columns: the one place the judge reads a record's fields.

`TableBuilder.add(row)` takes one decoded requests.jsonl row (anything with `row.get(field)`:
a dict, or the evidence layer's typed `Record`), appends its values to typed columns and
drops the row; `add_records(records)` appends a block of typed records a column at a time
(what `load_evidence` does with each block verification decodes); `finish()` returns the
immutable `RequestTable`.
Nothing else in the judge looks inside a record: index, scopes, measures, rules and
results.json read columns (vectorized, numpy) or, for the few messages that name one
request, a `Rec` view (`table.rec(i)`), which answers `rec["field"]` / `rec.get("field")`
exactly as the row did.

Per request, what is kept (bytes per request at most, 64 output tokens; `finish` makes it less:
a column of one repeated value is that value, 8 bytes in all (`compact`: a closed loop's rate,
one backend's name, an error that never happened); a column equal to another is that array
(`share_equal`: a closed loop's intended_start is its start); ttft and latency, when each is
what the record derives, are computed when read (`derived`)):
  times        float64 (NaN: absent)       start, end, intended_start, first_token, first_byte,
                                           ttft, latency, tpot, rate, client_delay,
                                           admitted (one NaN without max_concurrency)  80
               -- each but start held in 4 bytes where every value is a whole number of
               microseconds (what the runner writes) within 35 minutes of the request's
               start, or of 0 (`MicroColumn`): for the runner's records, start 8 and 4 each
               of the others that are not one repeated value
  counts       int32 (MISSING: absent)     bucket, level, status, chunks, output_tokens,
                                           output_chars, prompt_tokens, worker, concurrency,
                                           coalesced, conversation, turn (beyond int32:
                                           kept in extras)                            48
               -- each held in int8 or int16 where every value fits (`_IntCol`, while
               loading too; a column with an absent value is int32): bucket, worker 1-2
  labels       uint8 codes (int32 beyond   backend, workload, outcome, error, finish_reason,
               255) into a list of the     itl_source, tokens_source, empty_text,
               distinct values             usage_mismatch, usage_decreased             10
  request id   `IdColumn` (the id is what traces, follow-ups and messages name): a stem
               code and a number for the runner's ids (`soak-5ca1ab1e-0-0000042`), ~5;
               else UTF-8 text with offsets                                        ~27
  server_id    the request id with a prefix and suffix the server added (`cmpl-{id}-0`):
               a code of (prefix, suffix); any other server id: sparse                1
  itl          counted per cell (`GapCells`: the distinct gaps of each (workload, level,
               bucket, counted or not) and their counts, over the requests `itl` pools as
               recorded), plus per request its cell and its gaps' offset                2 + 4
               -- for a table read from requests.jsonl.gz (`TableBuilder(keep_gaps=False)`).
               A computation the cells cannot answer (a request the judge re-derived, a
               `per window` scope that cuts a bucket, one request's own gaps) reads them
               again from the file, once (`LazyGaps`). A table built in memory keeps them:
               one flat array with per-request offsets, whole microseconds packed in a
               uint16 each (`PackedGaps`; a gap beyond 65.535 ms or below 0 kept exactly
               beside them) when every gap is a whole number of microseconds (what the
               runner writes), else float64                                  2 (8) a gap
Not kept: `output_sha256` (no rule reads it; it stays in requests.jsonl, hashed). A value
that does not fit its column (a string where a number belongs, a non-finite float, an ITL
list with a non-number) or a key outside these is kept as it was, per request, in `extras`
(rare: only hand-edited or foreign evidence has them), and every computation reads those
requests through their view, so a column never changes what the judge sees.

Per-request columns of one table are aligned (index i is one request in every column), and
so are the arrays a `Rows` selection returns (`rows.column("ttft")`, `rows.columns(...)`):
a per-request predicate across metrics (`ttft < X and tpot < Y`) is one vectorized mask.

Derived durations are defined here once (vectorized and per view): `req_time` (intended
start, else start), `ttft` (the field, else first_token - req_time), `latency` (the field,
else end - req_time), `schedule_lag` (start - admitted, else start - intended_start:
`record.schedule_lag`), `cap_wait` (admitted - intended_start), `sent` (first_token or end -
start: sent_ttft, sent_latency, from the send: `record.sent_since`).
"""

from __future__ import annotations

import itertools
import math
import operator
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from soakspec import windows
from soakspec.judge import gapbins, peaks, stats
from soakspec.evidence.io import EvidenceChanged
from soakspec.evidence.ids import U32, IdColumn, IdStore, as_numbers, put_numbers
from soakspec.evidence.record import Record, unpack_block, unpack_gaps

MISSING = -(2**31)  # an int column's "absent"
_INT_LIMIT = 2**31  # an int column holds -(2**31) < v < 2**31; anything else is kept in extras

FLOATS = ("start", "end", "intended_start", "first_token", "first_byte", "ttft", "latency", "tpot", "rate", "client_delay",
          "admitted")
INTS = ("bucket", "level", "status", "chunks", "output_tokens", "output_chars", "prompt_tokens", "worker", "concurrency",
        "coalesced", "conversation", "turn")
LABELS = ("backend", "workload", "outcome", "error", "finish_reason", "itl_source", "tokens_source", "empty_text",
          "usage_mismatch", "usage_decreased")
SPARSE = ("server_id",)
DROPPED = ("output_sha256",)
_KIND: dict[str, str] = {**{k: "f" for k in FLOATS}, **{k: "i" for k in INTS}, **{k: "c" for k in LABELS},
                         **{k: "s" for k in SPARSE}, **{k: "x" for k in DROPPED}, "request_id": "id", "itl": "itl"}


# What the typed record holds of the columns (`ttft` and `latency` are its derived properties,
# computed here vectorized exactly as the properties compute them; `usage_mismatch` is the
# judge's own label, absent from a record).
_RECORD_FLOATS = ("start", "end", "intended_start", "first_token", "first_byte", "tpot", "rate", "client_delay", "admitted")
_RECORD_LABELS = frozenset(("backend", "workload", "outcome", "error", "finish_reason", "itl_source", "tokens_source",
                            "empty_text", "usage_decreased"))
_FIELD = {k: operator.attrgetter(k) for k in (*_RECORD_FLOATS, *INTS, *_RECORD_LABELS)}  # a record's field, by column

GAP_CHUNK = 1 << 18  # gaps buffered before they are checked and stored
BULK_ROWS = 1024  # typed records held before they are appended a column at a time (`add_records`)
# Rows a computation over a scope takes at a time, wherever it would otherwise make full-length
# temporaries (a selection's predicate, counts and sums, derived durations, sorts' neighbour
# checks): what it allocates beyond its result stays a few MiB at any number of requests. Read
# as `table.SCAN_CHUNK` when called (tests set it small to cross chunk edges).
SCAN_CHUNK = 1 << 16
_DERIVED = ("ttft", "latency")  # what a typed record derives (`Record.ttft`, `Record.latency`)


def num(v: Any) -> float | None:
    """A JSON number as a finite float; None for anything else (booleans, an integer beyond
    any float, a non-finite value): what the judge reads a measurement as."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:  # an integer beyond any float: not a measurement
        return None
    return f if math.isfinite(f) else None


def fits(v: Any) -> bool:
    """Can an int column hold Python value `v` (compared against a column, it could match)?"""
    return type(v) is int and -_INT_LIMIT < v < _INT_LIMIT


def _label_key(v: Any) -> Any:
    return (type(v).__name__, v)  # True and 1 are different labels


CELLS_IN_TWO_BYTES = 1 << 16  # cells a table's rows name in 2 bytes each (`_CellCounter`); read when a cell is added
_NARROW = 0xFFFF  # a gap held in the wide list (its slot in the narrow array holds this)


class PackedGaps:
    """Whole-microsecond gaps packed in 2 bytes each: a uint16 per gap for 0 <= gap < 65.535 ms
    (nearly every gap of a serving engine), and the rest -- a stall, a negative gap of foreign
    evidence -- kept exactly beside it as (position, value). Indexed like the int array it
    stands for: `gaps[a:b]` and `gaps[mask]` (a boolean array over every gap) give int64 values."""

    __slots__ = ("narrow", "wide_pos", "wide_val")

    def __init__(self, narrow: np.ndarray, wide_pos: np.ndarray, wide_val: np.ndarray) -> None:
        self.narrow, self.wide_pos, self.wide_val = narrow, wide_pos, wide_val

    def __len__(self) -> int:
        return len(self.narrow)

    @property
    def nbytes(self) -> int:
        return self.narrow.nbytes + self.wide_pos.nbytes + self.wide_val.nbytes

    def __getitem__(self, k) -> np.ndarray:
        if isinstance(k, slice):
            a, b, step = k.indices(len(self.narrow))
            assert step == 1
            out = self.narrow[a:b].astype(np.int64)
            if len(self.wide_pos):
                lo, hi = np.searchsorted(self.wide_pos, (a, b))
                out[self.wide_pos[lo:hi] - a] = self.wide_val[lo:hi]
            return out
        mask = np.asarray(k)
        if mask.dtype != bool:
            raise TypeError("PackedGaps is indexed by a slice or a boolean mask")
        out = self.narrow[mask].astype(np.int64)
        if len(self.wide_pos):
            hit = mask[self.wide_pos]
            if hit.any():
                rank = np.cumsum(mask)[self.wide_pos[hit]] - 1
                out[rank] = self.wide_val[hit]
        return out


class _GapStore:
    """What `PackedGaps` is built from, appended to a run of gaps at a time."""

    def __init__(self) -> None:
        self.narrow = array("H")
        self.wide_pos = array("q")
        self.wide_val = array("i")

    def __len__(self) -> int:
        return len(self.narrow)

    def extend(self, us: np.ndarray) -> None:
        """Append whole-microsecond gaps (int64, each within int32)."""
        fits = (us >= 0) & (us < _NARROW)
        if not fits.all():
            where = np.nonzero(~fits)[0]
            self.wide_pos.frombytes((where + len(self.narrow)).astype(np.int64).tobytes())
            self.wide_val.frombytes(us[where].astype(np.int32).tobytes())
            us = np.where(fits, us, _NARROW)
        self.narrow.frombytes(us.astype(np.uint16).tobytes())

    def values(self) -> np.ndarray:
        return self.finish()[:]

    def finish(self) -> PackedGaps:
        return PackedGaps(np.frombuffer(self.narrow, dtype=np.uint16) if len(self.narrow) else np.zeros(0, dtype=np.uint16),
                          np.frombuffer(self.wide_pos, dtype=np.int64) if len(self.wide_pos) else np.zeros(0, dtype=np.int64),
                          np.frombuffer(self.wide_val, dtype=np.int32) if len(self.wide_val) else np.zeros(0, dtype=np.int32))


class GapCells:
    """The ITL gaps of a table counted by value per *cell* -- the requests of one (workload,
    level, bucket), the unit every bucket, level, phase, backend and run scope is made of --
    over the requests that count toward `itl` as recorded: outcome `completed`, ITL not an
    estimate, no extras. Exact (whole microseconds, counted as the table was built), and small:
    what a cell holds is its distinct gaps, not one entry a gap.

    `counts_of(idx)` answers for rows `idx` when they are exactly the counted rows of whole
    cells -- what a scope's completed requests are unless the judge re-derived some of them
    (a trace saying the server failed one, a usage count that contradicts its stream) or the
    scope cuts through a cell (a `per window` of a length the table was not read with: cells
    are cut at the spec's window edges, `WindowSlots`); then it returns None and the caller
    counts the rows' own gaps (`RequestTable.gap_counts`, which re-reads them from
    requests.jsonl.gz for a table that did not keep them)."""

    __slots__ = ("cell", "cell_ok", "n_ok", "vals", "counts", "edges", "binned")

    def __init__(self, cell: np.ndarray, cell_ok: np.ndarray, n_ok: np.ndarray, vals: Sequence[np.ndarray],
                 counts: Sequence[np.ndarray], edges: np.ndarray | None = None,
                 binned: Mapping[int, CellBins] | None = None) -> None:
        # per request: its cell (uint16 while there are fewer than 65,536 cells, else uint32);
        # per cell: whether its rows count (a cell's rows all do or all do not: `_CellCounter`),
        # how many rows it counted
        self.cell, self.cell_ok, self.n_ok = cell, cell_ok, n_ok
        self.vals, self.counts = tuple(vals), tuple(counts)  # per cell: distinct gaps (µs, ascending), their counts
        # the cells past CELL_EXACT_MAX distinct gaps: their `vals` are bins (`gapbins`), cut at `edges`
        self.edges = edges if edges is not None else np.zeros(0, dtype=np.int64)
        self.binned: dict[int, CellBins] = dict(binned or {})

    @property
    def ok(self) -> np.ndarray:
        """Per request: whether its gaps are counted (computed: a cell's rows all are or all are not)."""
        return self.cell_ok[self.cell]

    @property
    def nbytes(self) -> int:
        return (self.cell.nbytes + self.cell_ok.nbytes + self.n_ok.nbytes
                + sum(v.nbytes + c.nbytes for v, c in zip(self.vals, self.counts)))

    def counts_of(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, CellBins | None] | None:
        """(distinct gaps in µs, ascending; their counts; None) of rows `idx`, or None when
        `idx` is not exactly the counted rows of some cells. Where one of those cells is
        binned: (bins, their counts, what is known besides: `CellBins`)."""
        return self.counts_of_chunks(lambda: slices(idx))

    def counts_of_chunks(self, chunks: Callable[[], Iterable[np.ndarray]]) -> tuple[np.ndarray, np.ndarray, CellBins | None] | None:
        """`counts_of` the rows the arrays `chunks()` yields hold together (a whole run's
        selection, never made at once)."""
        k = np.zeros(len(self.n_ok), dtype=np.int64)
        for part in chunks():  # the rows' cells counted a chunk at a time
            if not len(part):
                continue
            if not self.cell_ok[self.cell[part]].all():
                return None
            k += np.bincount(self.cell[part], minlength=len(self.n_ok))
        if not k.any():
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), None
        cells = np.nonzero(k)[0].tolist()
        if not np.array_equal(k[cells], self.n_ok[cells]):
            return None
        if not any(c in self.binned for c in cells):
            v, n = _merged((self.vals[c], self.counts[c]) for c in cells)
            return v, n, None
        edges = self.edges
        info = CellBins.merge(self.binned[c] if c in self.binned else CellBins.of(self.vals[c], self.counts[c], edges)
                              for c in cells)
        v, n = _merged((self.vals[c], self.counts[c]) if c in self.binned else _binned(self.vals[c], self.counts[c], edges)
                       for c in cells)
        return v, n, info


class CellBins:
    """What a binned cell (or cells) knows besides its bins (µs, int64): the exact sum, least and
    greatest gap, and per edge the largest gap below it (-1: none) and the smallest at or
    above it (`NONE_ABOVE`: none). `stats.Bins` is this in seconds, per entry."""

    NONE_ABOVE = np.iinfo(np.int64).max
    __slots__ = ("total", "least", "most", "below", "above")

    def __init__(self, total: int, least: int, most: int, below: np.ndarray, above: np.ndarray) -> None:
        self.total, self.least, self.most, self.below, self.above = total, least, most, below, above

    @classmethod
    def of(cls, vals: np.ndarray, counts: np.ndarray, edges: np.ndarray) -> CellBins:
        """Of exact gaps (`vals` ascending, distinct; `counts`)."""
        below, above = stats.edge_neighbours(vals, edges, -1, cls.NONE_ABOVE)
        total = int(np.dot(vals.astype(np.int64), counts.astype(np.int64))) if len(vals) else 0
        least = int(vals[0]) if len(vals) else cls.NONE_ABOVE
        most = int(vals[-1]) if len(vals) else -1
        return cls(total, least, most, below.astype(np.int64), above.astype(np.int64))

    def add(self, other: CellBins) -> None:
        self.total += other.total
        self.least = min(self.least, other.least)
        self.most = max(self.most, other.most)
        self.below = np.maximum(self.below, other.below)
        self.above = np.minimum(self.above, other.above)

    @classmethod
    def merge(cls, parts: Iterable[CellBins]) -> CellBins:
        """Of one or more parts (taken one at a time: a day's cells are thousands)."""
        parts = iter(parts)
        first = next(parts)
        out = cls(first.total, first.least, first.most, first.below.copy(), first.above.copy())
        for p in parts:
            out.add(p)
        return out

    def in_seconds(self, vals: np.ndarray, edges: np.ndarray, scale: float = 1e6) -> stats.Bins:
        """`stats.Bins` of the bins `vals` (as `counts_of` gives them): each one's least and
        greatest gap, in seconds."""
        last = gapbins.bin_last(vals, edges)
        return stats.Bins(vals / scale, last / scale, self.total / scale, self.least / scale, self.most / scale, edges / scale,
                          np.where(self.below >= 0, self.below / scale, np.nan),
                          np.where(self.above != self.NONE_ABOVE, self.above / scale, np.nan))


def _merge_counts(vals: Sequence[np.ndarray], counts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Counted values (each pair ascending, distinct) merged into one such pair."""
    vals = [v for v in vals if len(v)]
    counts = [c for c in counts if len(c)]
    if not vals:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if len(vals) == 1:
        return vals[0], counts[0]
    u, inv = np.unique(np.concatenate(vals), return_inverse=True)
    return u, np.bincount(inv, weights=np.concatenate(counts), minlength=len(u)).astype(np.int64)


MERGE_PENDING = 1 << 16  # counted entries gathered, at least, before `_merged` folds them in


def _merged(pairs: Iterable[tuple[np.ndarray, np.ndarray]], pending_max: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """`_merge_counts` of pairs taken one at a time, holding the running result and about as
    many entries again, not every pair: a whole run's ITL over a day's cells is thousands of
    cells of thousands of bins (gathering them all first held ~40 bytes an entry, ~330 MB at
    10^7 requests of a real server's gaps), and a selection's gaps counted a chunk of rows at a
    time (`gap_counts`) as many chunks. Pending entries are folded in once they outnumber both
    `pending_max` and the running result, so each entry is merged O(log) times."""
    pending_max = MERGE_PENDING if pending_max is None else pending_max
    acc_v: list[np.ndarray] = []
    acc_c: list[np.ndarray] = []
    held = pending = 0
    for v, c in pairs:
        if not len(v):
            continue
        acc_v.append(v)
        acc_c.append(c)
        pending += len(v)
        if pending > pending_max and pending > held:
            m_v, m_c = _merge_counts(acc_v, acc_c)
            acc_v, acc_c = [m_v], [m_c]
            held, pending = len(m_v), 0
    return _merge_counts(acc_v, acc_c)


def _binned(vals: np.ndarray, counts: np.ndarray, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Counted gaps (distinct, ascending) counted by their bins instead (`gapbins.bin_of`)."""
    b = gapbins.bin_of(vals, edges)  # ascending too (a bin's values are consecutive)
    if not len(b):
        return b, counts
    first = np.flatnonzero(np.r_[True, b[1:] != b[:-1]])
    return b[first], np.add.reduceat(counts, first).astype(np.int64)


def _value_counts(g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Whole-microsecond gaps (int64) counted by value: (distinct, ascending; counts)."""
    lo, hi = int(g.min()), int(g.max())
    if hi - lo < 1 << 22:
        c = np.bincount(g - lo if lo else g)
        nz = np.nonzero(c)[0]
        return nz.astype(np.int64) + lo, c[nz].astype(np.int64)
    v, c = np.unique(g, return_counts=True)
    return v.astype(np.int64), c.astype(np.int64)


MAX_WINDOW_SLOTS = 20_000  # window edges a level is cut at, at most (else its windows read the gaps again)


class WindowSlots:
    """Where a backend's levels are cut for the spec's `per window` rules, so that each window
    is a union of cells and `GapCells` answers its ITL as it does a bucket's: without reading
    the gaps again (`LazyGaps` held every gap of the table, ~2 bytes a token, for the first
    `per window` ITL rule: +126 MB at 10^6 requests of 64 tokens, over a GB at 10^7).

    Per (workload, level): the edges of every window of every length given, the windows'
    starts as `judge.scope.window_scopes` and the runner take them (`soakspec.windows`), so a
    request's slot -- how many edges lie at or before when it counts as started (`req_time`)
    -- puts it in the window that selects it. A request whose float lands otherwise (only
    after the last window's end) only makes that window's `counts_of` decline (it checks that
    a selection is exactly some cells' rows), never a wrong count. A level cut at more than
    MAX_WINDOW_SLOTS edges is not cut (its windows read the gaps again).

    It carries each level's `measure_start` too (`origins`, with or without window lengths):
    where the level's seconds start, the one-second cuts its output tokens are counted in for
    bench serve's peak figure (`peaks.TokenSeconds`). Only the edges make it true."""

    def __init__(self, levels: Iterable[Mapping[str, Any]], lengths: Iterable[float]) -> None:
        levels = list(levels)
        self.origins = peaks.level_origins(levels)
        self.edges: dict[tuple[str, int], np.ndarray] = {}
        lengths = sorted({float(x) for x in lengths if x and x > 0})
        for lv in levels if lengths else ():
            t0, t1 = num(lv.get("measure_start")), num(lv.get("measure_end"))
            wl, ix = lv.get("workload"), lv.get("index")
            if t0 is None or t1 is None or t1 <= t0 or not isinstance(wl, str) or type(ix) is not int:
                continue
            edges: set[float] = set()
            for length in lengths:
                starts = windows.starts(t0, t1 - t0, length)  # as window_scopes
                if len(edges) + len(starts) > MAX_WINDOW_SLOTS:
                    edges = set()
                    break
                edges.update(starts[1:])
            if edges:
                self.edges[(wl, ix)] = np.array(sorted(edges), dtype=np.float64)

    def __bool__(self) -> bool:
        return bool(self.edges)

    def slots(self, workload: Any, level: Any, times: np.ndarray) -> np.ndarray:
        """Each time's slot in its level (0 where the level is not cut)."""
        e = self.edges.get((workload, level)) if isinstance(workload, str) and type(level) is int else None
        if e is None:
            return np.zeros(len(times), dtype=np.int64)
        return np.searchsorted(e, times, side="right").astype(np.int64)


class _CellCounter:
    """What `GapCells` is built from: each request's cell, and the gaps of counted requests
    added as they are stored (a block of rows at a time). A cell is a (workload, level, bucket,
    slot, counted): the slot cuts a bucket at the spec's window edges (`WindowSlots`; 0 without
    them), and the rows that count and those that do not are two cells, so whether a row counts
    is its cell's (`ok`), not a byte a request. A row's cell is held in 2 bytes while there are
    fewer than 65,536 cells (a day of one-minute buckets is 1,440 a level), else 4."""

    MERGE_AT = 4  # pending (values, counts) pairs of a cell merged into one (32 held ~17 MB for a 172k-request soak)

    def __init__(self, edges: np.ndarray | None = None) -> None:
        self.keys: dict[tuple[int, int, int, int, bool], int] = {}
        self.cell = array("H")  # widened to "I" at the 65,536th cell (`key`)
        self.ok: list[bool] = []  # per cell
        self._ok_arr = np.zeros(0, dtype=bool)
        self.n_ok: list[int] = []
        self.pending: list[list[tuple[np.ndarray, np.ndarray]]] = []
        self.counted = 0  # rows whose gaps are counted
        self.active: set[int] = set()  # the cells the last block counted gaps into
        self.edges = edges if edges is not None else np.zeros(0, dtype=np.int64)  # where bins are cut (`gapbins.edges_for`)
        self.binned: dict[int, CellBins] = {}  # the cells past CELL_EXACT_MAX distinct gaps: counted in bins

    def key(self, k: tuple[int, int, int, int], ok: bool) -> int:
        full = (*k, ok)
        c = self.keys.get(full)
        if c is None:
            c = self.keys[full] = len(self.n_ok)
            self.n_ok.append(0)
            self.ok.append(ok)
            self.pending.append([])
            if c > CELLS_IN_TWO_BYTES - 1 and self.cell.typecode == "H":
                self.cell = array("I", self.cell)
        return c

    def _ok_lut(self) -> np.ndarray:
        """`ok` as an array (made again only when a cell was added since)."""
        if len(self._ok_arr) != len(self.ok):
            self._ok_arr = np.asarray(self.ok, dtype=bool)
        return self._ok_arr

    @property
    def _dtype(self) -> type:
        return np.uint16 if self.cell.typecode == "H" else np.uint32

    def add_row(self, k: tuple[int, int, int, int], ok: bool) -> None:
        c = self.key(k, ok)
        self.cell.append(c)
        if ok:
            self.n_ok[c] += 1

    def add_rows(self, wl: np.ndarray, lv: np.ndarray, bk: np.ndarray, ok: np.ndarray, sl: np.ndarray | None = None) -> None:
        m = len(ok)
        if sl is None:
            sl = np.zeros(m, dtype=np.int64)
        if ((wl == wl[0]).all() and (lv == lv[0]).all() and (bk == bk[0]).all() and (sl == sl[0]).all()
                and (ok == ok[0]).all()):  # one cell (nearly every block)
            c = self.key((int(wl[0]), int(lv[0]), int(bk[0]), int(sl[0])), bool(ok[0]))
            cells = np.full(m, c, dtype=np.int64)
            if ok[0]:
                self.n_ok[c] += m
        else:
            five, inv = np.unique(np.stack([wl, lv, bk, sl, ok], axis=1).astype(np.int64), axis=0, return_inverse=True)
            lut = np.array([self.key((a, b, d, e), bool(f)) for a, b, d, e, f in five.tolist()], dtype=np.int64)
            cells = lut[inv.reshape(-1)]
            for c, n in zip(*np.unique(cells[ok], return_counts=True)):
                self.n_ok[int(c)] += int(n)
        self.cell.frombytes(cells.astype(self._dtype).tobytes())

    def count(self, upto: int, off: Sequence[int] | np.ndarray, us: np.ndarray) -> None:
        """Count the gaps `us` (int64 µs) of rows `counted`..`upto` (their offsets `off`, rebased
        so that `off[0]` is the first of `us`)."""
        r0 = self.counted
        self.counted = upto
        if upto == r0 or not len(us):
            return
        cells = np.frombuffer(self.cell[r0:upto], dtype=self._dtype).astype(np.int64)  # copies: no view may pin the growing array
        ok = self._ok_lut()[cells]
        lens = np.diff(np.asarray(off, dtype=np.int64))
        if ok.all() and (cells == cells[0]).all():
            groups = [(int(cells[0]), us)]
        else:
            per_gap = np.repeat(np.where(ok, cells, -1), lens)
            groups = [(int(c), us[per_gap == c]) for c in np.unique(cells[ok]).tolist()]
        edges, binned = self.edges, self.binned
        # a cell the rows have moved past (the next bucket began: rows come in time order) is
        # folded into one pair of 4-byte arrays now, not left as up to MERGE_AT pairs of 8-byte
        # ones until `finish` -- every cell of a day's soak held so was ~20 bytes a request
        # (~190 MiB at 10^7 requests of a real server's gaps, the loading's peak)
        now = {c for c, g in groups if len(g)}
        for c in self.active - now:
            self._fold(c)
        self.active = now
        for c, g in groups:
            if not len(g):
                continue
            p = self.pending[c]
            vc = _value_counts(g)
            if c in binned:  # what the bins keep besides, from the gaps themselves; then the bins
                binned[c].add(CellBins.of(vc[0], vc[1], edges))
                vc = _binned(vc[0], vc[1], edges)
            p.append(vc)
            # merged every MERGE_AT blocks, and as soon as a cell's pending gaps could be too many
            # to hold exactly (a busy cell takes a few blocks: waiting for MERGE_AT of them held
            # ~400 KB of exact gaps a cell for every cell of a real server's soak)
            if len(p) >= self.MERGE_AT or (c not in binned and sum(len(v) for v, _ in p) > gapbins.CELL_EXACT_MAX):
                p[:] = [_merge_counts([v for v, _ in p], [n for _, n in p])]
                if c not in binned and len(p[0][0]) > gapbins.CELL_EXACT_MAX:
                    self._bin(c)

    def _bin(self, c: int) -> None:
        """Cell c holds too many distinct gaps: from here on, bins."""
        v, n = self.pending[c][0]
        self.binned[c] = CellBins.of(v, n, self.edges)
        self.pending[c] = [_binned(v, n, self.edges)]

    def _fold(self, c: int) -> None:
        """Cell c's pending pairs merged into one (binned if it now holds too many distinct
        gaps), held in 4 bytes an entry: a gap or bin is below 2**31 µs (`_flush`), a count
        below 2**32 but for a cell of more gaps (then 8), so 8 bytes an entry rather than 16 (a
        day of a real server's binned cells is ~1,800 entries each)."""
        p = self.pending[c]
        v, n = _merge_counts([v for v, _ in p], [n for _, n in p])
        if c not in self.binned and len(v) > gapbins.CELL_EXACT_MAX:
            self.pending[c] = [(v, n)]
            self._bin(c)
            v, n = self.pending[c][0]
        self.pending[c] = [(v.astype(np.int32) if len(v) else v, n.astype(np.uint32) if len(n) and int(n.max()) < 2**32 else n)]

    def finish(self) -> GapCells:
        vals, counts = [], []
        for c in range(len(self.pending)):
            self._fold(c)
            (v, n), = self.pending[c]
            vals.append(v)
            counts.append(n)
        cell = np.frombuffer(self.cell, dtype=self._dtype) if len(self.cell) else np.zeros(0, dtype=self._dtype)
        return GapCells(cell, np.asarray(self.ok, dtype=bool), np.asarray(self.n_ok, dtype=np.int64), vals, counts,
                        self.edges, self.binned)


def compact(col: np.ndarray) -> np.ndarray:
    """A column as small as it can be held and still read the same: one value repeated (a
    closed loop's `rate`, a backend's name, an error that never happened) becomes a read-only
    view of that one value (8 bytes, not 8 a request); label codes (a handful of distinct
    values) take one byte each. Indexing, comparing and copying it give what the full column
    gives, in its dtype (label codes: small ints, only ever used to index their values)."""
    n = len(col)
    if n > 1 and col.strides != (0,):
        first = col[:1]
        if same_values(col, np.broadcast_to(first, (n,))):  # -0.0 is not 0.0 (`same_values`)
            return np.broadcast_to(first.copy(), (n,))
    return col


def same_values(a: np.ndarray, b: np.ndarray, chunk: int = 1 << 16) -> bool:
    """Every value of `a` is the value of `b` (NaN as NaN, and the sign of a zero too).
    Compared `chunk` values at a time: `array_equal(equal_nan=True)` copies both arrays'
    non-NaN values, 16 bytes a request at once (the peak of building a 10^7-request table),
    and two columns that differ usually differ in their first chunk."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.ndim != 1:
        return _same_values(a, b)
    return all(_same_values(a[k:k + chunk], b[k:k + chunk]) for k in range(0, len(a), chunk))


def _same_values(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype.kind != "f":
        return bool(np.array_equal(a, b))
    return bool(np.array_equal(a, b, equal_nan=True)) and bool((np.signbit(a) == np.signbit(b)).all())


def share_equal(cols: dict[str, np.ndarray]) -> None:
    """A column equal to an earlier one becomes that one (a closed loop's intended_start is its
    start; a stream of one token a chunk has chunks == output_tokens): one array, two names.
    Every column ends read-only, so no name can change what another reads."""
    kept: list[np.ndarray] = []
    for k, v in cols.items():
        if not isinstance(v, np.ndarray):  # a `MicroColumn` (read-only): its values are its own
            continue
        if v.strides != (0,):  # a repeated value (`compact`) costs nothing already
            twin = next((w for w in kept if same_values(w, v)), None)
            if twin is not None:
                cols[k] = v = twin
            else:
                kept.append(v)
        v.flags.writeable = False


def compact_codes(codes: np.ndarray) -> np.ndarray:
    """Label codes in one byte when they fit (and a repeated code as one value: `compact`)."""
    codes = np.asarray(codes)
    if len(codes) and codes.dtype != np.uint8 and int(codes.min()) >= 0 and int(codes.max()) < 256:
        if codes.strides == (0,):
            return np.broadcast_to(codes[:1].astype(np.uint8), codes.shape)
        codes = codes.astype(np.uint8)
    return compact(codes)


def _same_float(a: float, b: float) -> bool:
    """The same float value: NaN as NaN, -0.0 apart from 0.0 (what `same_values` is per array)."""
    return (a == b or (a != a and b != b)) and math.copysign(1.0, a) == math.copysign(1.0, b)


class _Col:
    """A column being built: while every value so far is one value, that value and a count
    (nothing a request); from the first other value on, an `array` of them all. What
    `finish` makes of it is the same column either way (`compact`)."""

    __slots__ = ("typecode", "arr", "value", "n", "_same")  # _same: a float's bits (`_same_float`), else ==

    def __init__(self, typecode: str) -> None:
        self.typecode = typecode
        self.arr: array | None = None
        self.value: Any = None
        self.n = 0
        self._same = _same_float if typecode == "d" else operator.eq

    def __len__(self) -> int:
        return len(self.arr) if self.arr is not None else self.n

    def __getitem__(self, k: int) -> Any:
        assert k == -1, "a column being built answers only its last value"
        return self.arr[-1] if self.arr is not None else self.value

    def _materialize(self) -> array:
        self.arr = array(self.typecode, [self.value]) * self.n if self.n else array(self.typecode)
        return self.arr

    def append(self, v: Any) -> None:
        if self.arr is not None:
            self.arr.append(v)
        elif self.n == 0:
            self.value, self.n = v, 1
        elif self._same(v, self.value):
            self.n += 1
        else:
            self._materialize().append(v)

    def extend(self, a: np.ndarray) -> None:
        """Append a numpy array of this column's type."""
        if not len(a):
            return
        if self.arr is None:
            first = a[0] if self.n == 0 else self.value
            same = same_values(a, np.full(len(a), first, dtype=a.dtype))
            if same:
                if self.n == 0:
                    self.value = first.item()
                self.n += len(a)
                return
            self._materialize()
        self.arr.frombytes(a.tobytes())  # type: ignore[union-attr]

    def last(self, m: int, dtype) -> np.ndarray:
        """The last `m` values, as a new numpy array (no view of the growing array)."""
        if self.arr is not None:
            return np.frombuffer(self.arr[len(self.arr) - m:], dtype=dtype)
        return np.full(m, self.value, dtype=dtype)

    def finish(self, dtype) -> np.ndarray:
        if self.arr is not None:
            return np.frombuffer(self.arr, dtype=dtype) if len(self.arr) else np.zeros(0, dtype=dtype)
        if self.n == 0:
            return np.zeros(0, dtype=dtype)
        return np.broadcast_to(np.full(1, self.value, dtype=dtype), (self.n,))




_INT_CODES = (("b", np.int8), ("h", np.int16), ("i", np.int32))  # an int column's widths, narrowest first


def _int_code(lo: int, hi: int) -> int:
    """The position in _INT_CODES of the narrowest width that holds lo..hi."""
    return 0 if -(2**7) <= lo and hi < 2**7 else 1 if -(2**15) <= lo and hi < 2**15 else 2


class _IntCol(_Col):
    """An int column being built in the narrowest signed width that holds every value so far
    -- int8, then int16, then int32 (an absent value, MISSING, is int32's) -- widened when a
    value does not fit (its values copied: at most twice in all): a request's bucket and load
    worker, a real server's token and character counts take 1 or 2 bytes a request while
    loading and after, not 4. `finish` gives the column in that width (one repeated value: as
    `_Col`, int32)."""

    __slots__ = ("width",)

    def __init__(self) -> None:
        super().__init__("b")
        self.width = 0

    def _fit(self, lo: int, hi: int) -> None:
        w = _int_code(lo, hi)
        if w > self.width:
            self.width = w
            self.typecode = _INT_CODES[w][0]
            if self.arr is not None:
                self.arr = array(self.typecode, self.arr)

    def append(self, v: Any) -> None:
        self._fit(v, v)
        super().append(v)

    def extend(self, a: np.ndarray) -> None:
        if len(a):
            self._fit(int(a.min()), int(a.max()))
            super().extend(a.astype(_INT_CODES[self.width][1], copy=False))

    def last(self, m: int, dtype) -> np.ndarray:
        return super().last(m, _INT_CODES[self.width][1]).astype(dtype)

    def finish(self, dtype) -> np.ndarray:
        return super().finish(_INT_CODES[self.width][1] if self.arr is not None else dtype)


class _Micro:
    """`_MicroCol.finish`'s column before its base is known: `finish` makes the `MicroColumn`
    once the start column is made."""

    __slots__ = ("us", "based")

    def __init__(self, us: np.ndarray, based: bool) -> None:
        self.us, self.based = us, based


class _MicroCol:
    """A float column of whole microseconds being built as int32 microseconds after its row's
    start (`base`, the start column being built), or alone (base None) -- `MicroColumn`'s
    form from the first block on, not float64 until `finish` (at 10^7 requests, end,
    first_token and tpot held as float64 while loading were the gate's peak). Each block is
    checked as `micro_column` checks a column (what it reads back, bits compared); from the
    first value it cannot hold, the column is float64 (the values so far read back into a
    `_Col`, exactly). Appended after its base, row by row and block by block."""

    __slots__ = ("base", "us", "fl")

    def __init__(self, base: _Col | None) -> None:
        self.base, self.us, self.fl = base, _Col("i"), None

    def __len__(self) -> int:
        return len(self.fl) if self.fl is not None else len(self.us)

    def _bases(self, m: int) -> np.ndarray | None:
        return None if self.base is None else self.base.last(m, np.float64)

    def __getitem__(self, k: int) -> Any:
        assert k == -1, "a column being built answers only its last value"
        if self.fl is not None:
            return self.fl[-1]
        us = self.us[-1]
        if us == _NA_US:
            return math.nan
        return us / 1e6 if self.base is None else (float(round(self.base[-1] * 1e6)) + us) / 1e6

    def last(self, m: int, dtype) -> np.ndarray:
        """The last `m` values, as floats (a new array)."""
        if self.fl is not None:
            return self.fl.last(m, dtype)
        return _micro_values(self._bases(m), self.us.last(m, np.int32))

    def _to_float(self) -> _Col:
        """From now on float64: the values so far, read back (exactly), a chunk at a time."""
        fl, n = _Col("d"), len(self.us)
        # views, not copies: the base has this block's rows too (it is appended first), so its
        # first n values are the rows so far
        us, bases = self.us.finish(np.int32), None if self.base is None else self.base.finish(np.float64)
        for a in range(0, n, SCAN_CHUNK):
            b = min(n, a + SCAN_CHUNK)
            fl.extend(_micro_values(None if bases is None else bases[a:b], np.ascontiguousarray(us[a:b])))
        self.fl, self.us = fl, _Col("i")
        return fl

    def extend(self, a: np.ndarray) -> None:
        if not len(a):
            return
        if self.fl is None:
            part = _micro_part(a, self._bases(len(a)))
            if part is not None:
                self.us.extend(part)
                return
            self._to_float()
        self.fl.extend(a)  # type: ignore[union-attr]

    def append(self, v: float) -> None:
        """One row's value (a row added on its own: no numpy call -- a table built row by row,
        as a sweep's probe judging does, was 11x slower through one-element arrays): what
        `extend` of one value holds, computed with Python floats -- `round` is numpy's `rint`
        (half to even), the read back the same float operations as `_micro_values`."""
        if self.fl is None:
            k = _micro_one(v, None if self.base is None else self.base[-1])
            if k is not None:
                self.us.append(k)
                return
            self._to_float()
        self.fl.append(v)  # type: ignore[union-attr]

    def copy_prefix(self, n: int) -> _MicroCol:
        """A column of this one's first n values (a twin that splits from it: `_TwinCol`), held
        as those values allow -- not as this one is held now: a block this one could not hold
        may come after them (so a twin's form is the same whether its rows came one at a time
        or in blocks)."""
        if self.fl is None:
            out = _MicroCol(self.base)
            out.us.extend(self.us.finish(np.int32)[:n])
            return out
        return _MicroCol.of_values(self.fl.finish(np.float64)[:n], self.base)

    @staticmethod
    def of_values(vals: np.ndarray, base: _Col | None) -> _MicroCol:
        """A column of `vals` (the first len(vals) rows; `base` has at least as many), held as
        they allow: int32 microseconds after base (or alone) if every value reads back, else
        float64."""
        out, n = _MicroCol(base), len(vals)
        bases = None if base is None else base.finish(np.float64)
        for a in range(0, n, SCAN_CHUNK):
            b = min(n, a + SCAN_CHUNK)
            part = _micro_part(vals[a:b], None if bases is None else bases[a:b])
            if part is None:
                out.us, out.fl = _Col("i"), _Col("d")
                out.fl.extend(vals)
                return out
            out.us.extend(part)
        return out

    def finish(self, dtype) -> np.ndarray | _Micro:
        if self.fl is not None:
            return self.fl.finish(dtype)
        return _Micro(self.us.finish(np.int32), self.base is not None)


class _TwinCol:
    """A float column that, while every value so far is its twin's in the same row (a closed
    loop's intended start is its start; first_byte is first_token on most streams), holds
    nothing; from the first row that differs, its own `_MicroCol` (`_split`). Appended after
    its twin, row by row and block by block."""

    __slots__ = ("twin", "own", "n")

    def __init__(self, twin: _Col | _MicroCol) -> None:
        self.twin, self.own, self.n = twin, None, 0

    def __len__(self) -> int:
        return len(self.own) if self.own is not None else self.n

    def __getitem__(self, k: int) -> Any:
        return self.own[k] if self.own is not None else self.twin[k]

    def _split(self) -> _MicroCol:
        """Its own column from here on: first_byte's held as first_token's first n values allow;
        an open loop's intended_start held after start (its first n values are start's), as
        end is -- 4 bytes a request while loading, not a float64 copy of start until `finish`."""
        twin = self.twin
        if isinstance(twin, _MicroCol):
            self.own = twin.copy_prefix(self.n)
        else:
            self.own = _MicroCol.of_values(twin.finish(np.float64)[:self.n], twin)
        return self.own

    def append(self, v: Any) -> None:
        if self.own is None:
            if _same_float(v, self.twin[-1]):
                self.n += 1
                return
            self._split()
        self.own.append(v)  # type: ignore[union-attr]

    def extend(self, a: np.ndarray) -> None:
        if not len(a):
            return
        if self.own is None:
            if same_values(a, self.twin.last(len(a), a.dtype)):
                self.n += len(a)
                return
            self._split()
        self.own.extend(a)  # type: ignore[union-attr]

    def finish(self, dtype) -> np.ndarray | None:
        """Its column, or None: the twin's."""
        return self.own.finish(dtype) if self.own is not None else None


_NA_US = np.int32(-(2**31))  # `MicroColumn`: an absent value (NaN)


class MicroColumn:
    """A float64 column every value of which is a whole number of microseconds (what the
    runner writes: `Record` rounds its times to 1 µs), held in 4 bytes a request, not 8: each
    value as int32 microseconds after its row's `base` value rounded to a microsecond (end,
    first_token, intended_start after start: within ±35 minutes of it), or as itself where
    there is no base (tpot, client_delay: up to 35 minutes); NaN as _NA_US. Indexing it (an
    int, a slice, an index array, a mask) gives exactly, bit for bit, the float64 values it was
    made from (`micro_column` checks that before making one): `(rint(base * 1e6) + us) / 1e6`,
    a sum of two whole numbers below 2**53 and one correctly rounded division, which is the
    double nearest the value's decimal microseconds -- the value itself. Read only."""

    __slots__ = ("base", "us")
    dtype = np.dtype(np.float64)

    def __init__(self, base: np.ndarray | None, us: np.ndarray) -> None:
        self.base, self.us = base, us
        us.flags.writeable = False

    def __len__(self) -> int:
        return len(self.us)

    def __getitem__(self, idx: Any) -> Any:
        us = self.us[idx]
        if np.ndim(us) == 0:  # one row
            return _micro_values(None if self.base is None else np.array([self.base[idx]]), np.array([us]))[0]
        return _micro_values(None if self.base is None else self.base[idx], us)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        v = self[:]
        return v if dtype is None else v.astype(dtype)


def _micro_values(base: np.ndarray | None, us: np.ndarray) -> np.ndarray:
    """The values whole microseconds `us` after `base` rounded to a microsecond (or alone)
    stand for, NaN for _NA_US: `(rint(base * 1e6) + us) / 1e6` in one new float64 array (a
    10^7-request selection read at once costs that array, not four temporaries of its size)."""
    if base is None:
        out = us.astype(np.float64)
    else:
        out = np.array(base, dtype=np.float64)  # a copy, worked on in place
        with np.errstate(over="ignore", invalid="ignore"):  # a start near 1e308 holds only absent values (NaN below)
            out *= 1e6
            np.rint(out, out=out)
            out += us
    out /= 1e6
    na = us == _NA_US
    if na.any():
        out[na] = np.nan
    return out


def micro_column(col: np.ndarray, base: np.ndarray | None) -> MicroColumn | None:
    """`col` held as a `MicroColumn` (after `base`, or alone where base is None), or None where
    some value is not one it can hold exactly: not a whole number of microseconds, too far from
    its base (or its base absent), or beyond what 4 bytes hold. Checked a chunk at a time, value
    by value, by computing what the column would read back (bits compared: -0.0 is not 0.0)."""
    n = len(col)
    us = np.empty(n, dtype=np.int32)
    for a in range(0, n, SCAN_CHUNK):
        part = _micro_part(col[a:a + SCAN_CHUNK], None if base is None else base[a:a + SCAN_CHUNK])
        if part is None:
            return None
        us[a:a + len(part)] = part
    return MicroColumn(base, us)


def _micro_one(v: float, b: float | None) -> int | None:
    """`_micro_part` of one value: its int32 microseconds after `b` (or alone), else None."""
    if v != v:
        return int(_NA_US)
    if not math.isfinite(v * 1e6) or (b is not None and not math.isfinite(b * 1e6)):
        return None  # beyond a float (or an absent base: NaN)
    base = 0.0 if b is None else float(round(b * 1e6))
    k = round(v * 1e6) - (0 if b is None else int(base))
    if not abs(k) < 2**31 - 1:
        return None
    back = (k if b is None else base + k) / 1e6
    if back != v or math.copysign(1.0, back) != math.copysign(1.0, v):  # bits: -0.0 is not 0.0
        return None
    return k


def _micro_part(v: np.ndarray, b: np.ndarray | None) -> np.ndarray | None:
    """The int32 microseconds after `b` (or alone) that read back as `v`, bit for bit; None
    where some value cannot be held so (`micro_column`)."""
    absent = np.isnan(v)
    with np.errstate(invalid="ignore", over="ignore"):
        k = np.rint(v * 1e6) if b is None else np.rint(v * 1e6) - np.rint(b * 1e6)
        k[absent] = 0
        if not (np.abs(k) < 2**31 - 1).all():  # beyond int32 (or NaN: an absent base)
            return None
        part = k.astype(np.int32)
        part[absent] = _NA_US
        back = _micro_values(b, part)  # what the column would read
    if not ((back.view(np.uint64) == v.view(np.uint64)) | absent).all():  # bits: -0.0 is not 0.0
        return None
    return part


def _micro_columns(f: dict[str, Any]) -> None:
    """Each float column but `start` that `micro_column` can hold becomes one: after start (the
    times of a request), else alone (durations); a column two names share is made once. 4 bytes
    a request each instead of 8 (end, first_token, first_byte, an open loop's intended_start,
    tpot): the 10^7-request gate's peak 731 -> 625 MiB (benchmarks/README.md)."""
    start = f.get("start")
    made: dict[int, Any] = {}
    for k, v in f.items():
        if v is start or not isinstance(v, np.ndarray) or v.strides == (0,) or not len(v):
            continue  # start itself (a closed loop's intended_start is it: `req_time` reads it as it is)
        if id(v) not in made:
            got = micro_column(v, start) if isinstance(start, np.ndarray) and start.strides != (0,) else None
            made[id(v)] = got if got is not None else (micro_column(v, None) or v)
        f[k] = made[id(v)]


_TWIN_OF = {"intended_start": "start", "first_byte": "first_token"}
_MICRO_AFTER_START = ("end", "first_token")  # built as `_MicroCol`s after start (tpot: alone)


def _peak_gaps_ok(gaps: Any) -> bool:
    """Whether a record's ITL gaps are every one a finite number (the peak's row-by-row path counts them)."""
    return isinstance(gaps, (list, tuple, array)) and all(type(g) in (int, float) and math.isfinite(g) for g in gaps)


def _row_first_chunk(n: Any, ch: Any, gaps: int | None) -> int:
    """A record's first chunk's tokens k1 as the row-by-row path counts them (`peaks.first_chunk_tokens`
    of its count `n`, its `chunks` and how many `gaps` it has; an absent ITL reads as [] (0)); 1
    where the gaps are unusable (`gaps` None: how many the first chunk carried is then not known)."""
    if gaps is None:
        return 1
    n, ch = (v if type(v) is int and abs(v) < _INT_LIMIT else -1 for v in (n, ch))
    return int(peaks.first_chunk_tokens(np.array([n]), np.array([ch]), np.array([gaps]))[0])


class TableBuilder:
    """Typed columns filled one record at a time (see the module doc).

    `keep_gaps=False` (a table read from requests.jsonl.gz): the ITL gaps are counted into the
    table's `GapCells` as they arrive and not kept; `finish(reload=...)` gets the function that
    reads them again from the file, for the rare computation cells cannot answer."""

    def __init__(self, keep_gaps: bool = True, windows: WindowSlots | None = None, gap_edges: np.ndarray | None = None,
                 origins: Mapping[peaks.LevelKey, float] | None = None) -> None:
        self.keep_gaps = keep_gaps
        if origins is None and windows is not None:
            origins = windows.origins
        # each level's output tokens per second from its measure_start (`origins`; else none counted)
        self.peaks = peaks.TokenSeconds(origins) if origins else None
        self.windows = windows if windows else None  # the spec's window edges per level: cells cut there
        # where a cell's gaps are binned, the edges its bins are cut at (the spec's ITL thresholds)
        self.cells: _CellCounter | None = _CellCounter(gap_edges)
        self.lost = False  # gaps neither kept nor counted (not whole microseconds): only a re-read has them
        self.f: dict[str, Any] = {k: _Col("d") for k in FLOATS}
        for k in _MICRO_AFTER_START:  # whole microseconds (the runner's), held so as they arrive
            self.f[k] = _MicroCol(self.f["start"])
        self.f["tpot"] = _MicroCol(None)
        for k, twin in _TWIN_OF.items():
            self.f[k] = _TwinCol(self.f[twin])
        self.i = {k: _IntCol() for k in INTS}
        self.c = {k: _Col("i") for k in LABELS}
        self.derive = {"ttft": True, "latency": True}  # every absent value so far is one the record derives
        self.values: dict[str, list[Any]] = {k: [] for k in LABELS}
        self._codes: dict[str, dict[Any, int]] = {k: {} for k in LABELS}
        self.sparse: dict[str, dict[int, Any]] = {k: {} for k in SPARSE}
        self.ids = IdStore()
        self.extras: dict[int, dict[str, Any]] = {}
        self.itl_us: _GapStore | None = _GapStore()
        self.itl_f: array | None = None
        self.values["server_affix"], self._codes["server_affix"] = [None], {None: 0}
        self._affix = _Col("i")
        self._f = tuple(self.f.items())
        self._i = tuple(self.i.items())
        self._c = tuple((k, col, self._codes[k]) for k, col in self.c.items())
        self.itl_off = array(U32, [0])  # `put_numbers`: 4 bytes an offset while they fit
        self._buf = array("d")  # gaps not yet moved to the store (`_flush`)
        self._stored = 0
        self._gaps = 0
        self.n = 0
        self._held: list[Sequence[Any]] = []  # records `add_records` holds (`_take_held`)
        self._n_held = 0

    def _extra(self, i: int, key: str, v: Any) -> None:
        self.extras.setdefault(i, {})[key] = v

    def code(self, key: str, v: Any) -> int:
        """The code of label value `v` (strings and None by value; other types by type and
        value, so True and 1 stay apart)."""
        codes = self._codes[key]
        k = v if type(v) is str or v is None else _label_key(v)
        c = codes.get(k)
        if c is None:
            c = codes[k] = len(self.values[key])
            self.values[key].append(v)
        return c

    def _itl(self, i: int, gaps: Any) -> None:
        if gaps is None:
            self.itl_off = put_numbers(self.itl_off, self._gaps)
            return
        if type(gaps) is list and self._fast_gaps(gaps):
            self._buf.extend(gaps)
        elif isinstance(gaps, (list, tuple, array)) and all(
                (type(g) is float and math.isfinite(g)) or (type(g) is int and abs(g) < 2**31) for g in gaps):
            self._buf.extend(float(g) for g in gaps)
        else:
            self._extra(i, "itl", gaps)
        self._gaps = self._stored + len(self._buf)
        self.itl_off = put_numbers(self.itl_off, self._gaps)

    @staticmethod
    def _fast_gaps(gaps: list) -> bool:
        """Every gap a finite number, checked at C speed (an element equal to 0 or 1 might be
        a bool: those lists are checked one by one)."""
        try:
            total = sum(gaps)
        except TypeError:
            return False
        if not math.isfinite(total) or True in gaps or False in gaps:
            return all((type(g) is float and math.isfinite(g)) or (type(g) is int and abs(g) < 2**31) for g in gaps)
        return True

    def _flush(self) -> None:
        """Move the buffered gaps to the store: whole microseconds as int32 while every gap
        so far is one (exactly: n / 1e6 reads back as the gap), else float64 from then on;
        counted into the cells while they are whole microseconds."""
        cells = self.cells
        if not len(self._buf):
            if cells is not None:
                cells.count(self.n, (), np.zeros(0, dtype=np.int64))
            return
        f = np.frombuffer(self._buf, dtype=np.float64)
        if self.itl_us is not None:
            us = np.rint(f * 1e6)
            if bool(np.all(np.abs(us) < 2**31)) and bool(np.all(us / 1e6 == f)):
                us = us.astype(np.int64)
                if cells is not None:
                    cells.count(self.n, self.itl_off[cells.counted:self.n + 1], us)
                if self.keep_gaps:
                    self.itl_us.extend(us)
            else:
                if self.keep_gaps:
                    self.itl_f = array("d", (self.itl_us.values() / 1e6).tobytes()) if len(self.itl_us) else array("d")
                else:
                    self.lost = True
                self.itl_us = None
                self.cells = None
        if self.itl_f is not None:
            self.itl_f.frombytes(f.tobytes())
        self._stored += len(f)
        del f
        self._buf = array("d")

    def add(self, row: Mapping[str, Any]) -> None:
        """Append one record (request_problem(row) is None: it has an id and an int bucket)."""
        if self._held:  # records before it, in order
            self._take_held()
        self._add(row)

    def _add(self, row: Mapping[str, Any]) -> None:
        i = self.n
        self.n += 1
        get = row.get
        nan = math.nan
        typed = isinstance(row, Record)
        for k, col in self._f:
            if typed and k in _DERIVED:  # the record's own derived value: computed when read, not held
                col.append(nan)
                continue
            v = get(k)
            if type(v) is float and v - v == 0.0:  # finite
                col.append(v)
            elif v is None:
                col.append(nan)
                if k in _DERIVED:
                    self.derive[k] = False  # an absent ttft reads as absent
            elif type(v) is int and abs(v) <= 2**63:
                col.append(float(v))
            else:
                col.append(nan)
                self._extra(i, k, v)
        for k, col in self._i:
            v = get(k)
            if type(v) is int and -_INT_LIMIT < v < _INT_LIMIT:
                col.append(v)
            elif v is None:
                col.append(MISSING)
            else:
                col.append(MISSING)
                self._extra(i, k, v)
        for k, col, codes in self._c:
            v = get(k)
            if type(v) is not str and isinstance(v, str):
                v = str(v)  # the record type's StrEnum (outcome, tokens_source, itl_source): its value
            if type(v) is str or v is None:
                c = codes.get(v)
                col.append(c if c is not None else self.code(k, v))
            elif isinstance(v, (bool, int, float)):
                col.append(self.code(k, v))
            else:
                col.append(self.code(k, None))
                self._extra(i, k, v)
        rid = row["request_id"]
        self._server_id(i, rid, get("server_id"))
        self.ids.append(rid)
        self._itl(i, get("itl"))
        if type(row) is dict and not row.keys() <= _KIND.keys() and (odd := row.keys() - _KIND.keys()):
            for k in odd:  # keys outside the columns (rare): kept as they were
                if row[k] is not None:
                    self._extra(i, k, row[k])
        if self.peaks is not None:
            self._peak_row(i, get)
        if self.cells is not None:
            c = self.c
            out, src = self.values["outcome"][c["outcome"][-1]], self.values["itl_source"][c["itl_source"][-1]]
            ok = out == "completed" and type(out) is str and not (src == "estimated" and type(src) is str) and i not in self.extras
            self.cells.add_row((c["workload"][-1], self.i["level"][-1], self.i["bucket"][-1], self._slot_of(row)), ok)
        if len(self._buf) >= GAP_CHUNK:
            self._flush()

    def _peak_row(self, i: int, get: Callable[[str], Any]) -> None:
        """Count the tokens of row i (just added) in its level's seconds (`peaks`): a measured
        request that completed, with a first token; its gaps where every one is a number."""
        assert self.peaks is not None
        ft, wl, lv, bk, out = get("first_token"), get("workload"), get("level"), get("bucket"), get("outcome")
        if (out != "completed" or not isinstance(out, str) or type(bk) is not int or bk < 0 or type(lv) is not int
                or not isinstance(wl, str) or type(ft) not in (int, float) or not math.isfinite(ft)):
            return
        gaps = get("itl")
        ok = _peak_gaps_ok(gaps)
        k1 = _row_first_chunk(get("output_tokens"), get("chunks"), len(gaps) if ok else 0 if gaps is None else None)
        self.peaks.add_one((str(wl), lv), float(ft), gaps if ok else (), k1)

    def _server_id(self, i: int, rid: Any, sid: Any) -> None:
        """Row i's server id: the code of the (prefix, suffix) the server put around the
        request id (`cmpl-{id}-0`), else 0 and, when there is one, the id kept as it is."""
        k = sid.find(rid) if type(sid) is str and type(rid) is str and rid else -1
        if k >= 0:
            self._affix.append(self.code("server_affix", (sid[:k], sid[k + len(rid):])))
        else:
            self._affix.append(0)  # code 0: None
            if sid is not None:
                self.sparse["server_id"][i] = sid

    def _server_ids(self, ids: list[Any], sids: list[Any]) -> None:
        """`_server_id` of each row of a batch (rows n, n+1, ...). The usual batch -- every server
        id the request id inside one affix (`cmpl-{id}-0`) -- is found with one comparison
        of two lists, not a search per row."""
        if ids and type(s0 := sids[0]) is str and type(r0 := ids[0]) is str and r0 and (k := s0.find(r0)) >= 0:
            pre, suf = s0[:k], s0[k + len(r0):]
            try:
                same = [pre + r + suf for r in ids] == sids
            except TypeError:  # an id that is not text
                same = False
            # `find` takes the first occurrence: an id could also start inside the prefix (an
            # empty id, or a prefix holding an id's first character) -- those go row by row
            if same and not any(c in pre for c in {r[:1] for r in ids}):
                self._affix.extend(np.full(len(ids), self.code("server_affix", (pre, suf)), dtype=np.int32))
                return
        for i, rid, sid in zip(range(self.n, self.n + len(ids)), ids, sids):
            self._server_id(i, rid, sid)

    def add_records(self, recs: Sequence[Any]) -> None:
        """Append many typed records (`soakspec.evidence.record.Record`: every field already of
        its type, so no per-field checks) a column at a time: the same columns, codes and
        extras as `add` of each. Records are held until BULK_ROWS of them are (or a row is
        added one at a time, or the table finished): the work a batch costs about what its
        records do at a few hundred, the size of a block of evidence. A batch holding a value
        a column cannot take (a string level, an integer beyond int32, a non-finite time)
        goes through `add`, row by row."""
        if not len(recs):
            return
        self._held.append(recs)
        self._n_held += len(recs)
        if self._n_held >= BULK_ROWS:
            self._take_held()

    def _take_held(self) -> None:
        """Append the records `add_records` holds."""
        if not self._held:
            return
        recs = self._held[0] if len(self._held) == 1 else list(itertools.chain.from_iterable(self._held))
        self._held, self._n_held = [], 0
        if not self._bulk(recs, len(recs)):
            for r in recs:
                self._add(r)

    def _bulk(self, recs: Sequence[Any], m: int) -> bool:
        floats: dict[str, np.ndarray] = {}
        for k in _RECORD_FLOATS:
            floats[k] = np.array(list(map(_FIELD[k], recs)), dtype=np.float64)  # None: NaN
        floats["ttft"] = floats["latency"] = np.full(m, np.nan)  # what the record derives: computed when read
        for k, v in floats.items():
            if np.isinf(v).any():
                return False
        ints: dict[str, np.ndarray] = {}
        for k in INTS:
            vals = list(map(_FIELD[k], recs))
            if vals.count(None) == m:  # a field no record of the block has (a multi-turn index, an open loop's concurrency)
                ints[k] = np.full(m, np.nan)
                continue
            if k == "level" and str in set(map(type, vals)):  # a string level: kept in extras
                return False
            v = np.array(vals, dtype=np.float64)  # None: NaN; every int of a record is below 2**53 or refused here
            if not (np.isnan(v) | (np.abs(v) < _INT_LIMIT)).all():
                return False
            ints[k] = v
        itls = [r.itl_us for r in recs]
        packed = unpack_block(itls)  # the usual block: every record's gaps in one call
        if packed is not None:
            lens, flat = packed
        else:  # a wide gap, or evidence before format 3 (arrays)
            gaps = [unpack_gaps(g) for g in itls]
            lens = np.fromiter(map(len, gaps), dtype=np.int64, count=m)
            flat = np.fromiter(itertools.chain.from_iterable(gaps), dtype=np.int64, count=int(lens.sum()))
        total = int(lens.sum())
        if total and int(flat.max()) >= _INT_LIMIT:
            return False
        # every value fits: append
        self._flush()  # gaps of rows added one at a time before this batch
        n0 = self.n
        for k, col in self._f:
            col.extend(floats[k])
        batch: dict[str, np.ndarray] = {}  # the int columns and label codes of this batch
        for k, col in self._i:
            v = ints[k]
            batch[k] = np.where(np.isnan(v), MISSING, v).astype(np.int32)
            col.extend(batch[k])
        for k, col, codes in self._c:
            vals = list(map(_FIELD[k], recs)) if k in _RECORD_LABELS else None
            if vals is None:
                col.extend(np.full(m, self.code(k, None), dtype=np.int32))
                continue
            # codes in order of first appearance, as `add` gives them
            lut = {v: self.code(k, str(v) if type(v) is not str and isinstance(v, str) else v) for v in dict.fromkeys(vals)}
            if len(lut) == 1:  # one value in the batch (a backend, a workload, no error): one code
                batch[k] = np.full(m, next(iter(lut.values())), dtype=np.int32)
            else:
                batch[k] = np.fromiter(map(lut.__getitem__, vals), dtype=np.int32, count=m)
            col.extend(batch[k])
        ids = [r.request_id for r in recs]
        self._server_ids(ids, [r.server_id for r in recs])
        self.ids.extend(ids)
        self.n += m
        off = np.cumsum(lens) + self._stored
        if self.peaks is not None:  # narrow packed gaps (`unpack_block`) are unsigned; a wide one may be below 0
            self._peak_block(floats["first_token"], batch, lens, flat, nonneg=packed is not None)
        if self.itl_us is not None:
            if self.keep_gaps:
                self.itl_us.extend(flat)
            if self.cells is not None:
                done = self.label_lut("outcome", "completed")[batch["outcome"]]
                est = self.label_lut("itl_source", "estimated")[batch["itl_source"]]
                self.cells.add_rows(batch["workload"], batch["level"], batch["bucket"], done & ~est,
                                    self._slots(batch["workload"], batch["level"], floats) if self.windows else None)
                self.cells.count(self.n, np.concatenate(([self._stored], off)), flat)
        elif self.itl_f is not None:
            self.itl_f.frombytes((flat / 1e6).tobytes())
        assert self.cells is None or self.cells.counted == self.n, (self.cells.counted, n0, self.n)
        self._stored += total
        self._gaps = self._stored
        self.itl_off = put_numbers(self.itl_off, off)
        return True

    def _peak_block(self, ft: np.ndarray, batch: Mapping[str, np.ndarray], lens: np.ndarray, flat: np.ndarray,
                    nonneg: bool = False) -> None:
        """Count a block's tokens in its levels' seconds (`peaks.TokenSeconds.add_block`): its
        measured requests that completed, with a first token (the block is nearly always one level)."""
        assert self.peaks is not None
        sel = np.isfinite(ft) & (batch["bucket"] >= 0) & self.label_lut("outcome", "completed")[batch["outcome"]]
        if not sel.any():
            return
        before = np.cumsum(lens) - lens
        first = peaks.first_chunk_tokens(batch["output_tokens"].astype(np.int64), batch["chunks"].astype(np.int64), lens)
        wl, lv = batch["workload"], batch["level"]
        cs = np.cumsum(flat, dtype=np.int64)
        names = self.values["workload"]
        if (wl == wl[0]).all() and (lv == lv[0]).all():
            groups = [((int(wl[0]), int(lv[0])), sel)]
        else:
            pairs = np.unique(np.stack([wl[sel], lv[sel]], axis=1), axis=0).tolist()
            groups = [((a, b), sel & (wl == a) & (lv == b)) for a, b in pairs]
        for (a, b), rows in groups:
            name = names[a]
            if not isinstance(name, str) or b == MISSING:
                continue
            full = rows.all()
            self.peaks.add_block((name, b), ft if full else ft[rows], lens if full else lens[rows], flat,
                                 before if full else before[rows], cs, nonneg, first if full else first[rows])

    def _slot_of(self, row: Mapping[str, Any]) -> int:
        if self.windows is None:
            return 0
        t = num(row.get("intended_start"))
        t = t if t is not None else num(row.get("start"))
        return int(self.windows.slots(row.get("workload"), row.get("level"), np.array([np.nan if t is None else t]))[0])

    def _slots(self, wl: np.ndarray, lv: np.ndarray, floats: Mapping[str, np.ndarray]) -> np.ndarray:
        """The batch's slots (`WindowSlots`) from its rows' `req_time`."""
        assert self.windows is not None
        it, st = floats["intended_start"], floats["start"]
        t = np.where(np.isnan(it), st, it)
        out = np.zeros(len(t), dtype=np.int64)
        names = self.values["workload"]
        for a, b in np.unique(np.stack([wl, lv], axis=1), axis=0).tolist():  # the batch's levels (nearly always one)
            sel = (wl == a) & (lv == b)
            out[sel] = self.windows.slots(names[a], b, t[sel])
        return out

    def label_lut(self, key: str, value: str) -> np.ndarray:
        """Per code of label `key` so far: is it the string `value`."""
        return np.fromiter((type(v) is str and v == value for v in self.values[key]), dtype=bool, count=len(self.values[key]))

    def extend(self, rows: Iterable[Mapping[str, Any]]) -> TableBuilder:
        for r in rows:
            self.add(r)
        return self

    def finish(self, reload: Callable[[], RequestTable] | None = None) -> RequestTable:
        self._take_held()
        self._flush()
        f: dict[str, Any] = {}
        for k, v in self.f.items():  # a twin that never differed: its twin's column
            got = v.finish(np.float64)
            f[k] = got if isinstance(got, _Micro) else compact(got) if got is not None else f[_TWIN_OF[k]]
        del got, v
        start = f["start"]
        made: dict[int, MicroColumn] = {}  # a twin's column is its twin's
        for k, v in f.items():
            if isinstance(v, _Micro):
                if id(v) not in made:
                    made[id(v)] = MicroColumn(start if v.based else None, v.us)
                f[k] = made[id(v)]
        del made
        # the float columns are the table's now, views of the builder's arrays: dropped here, each
        # array goes as soon as `_micro_columns` has made its column (at 10^7 requests, five float64
        # arrays held beside their int32 columns until finish returned were the gate's peak)
        self.f, self._f = {}, ()
        i = {k: compact(v.finish(np.int32)) for k, v in self.i.items()}
        c = {k: compact_codes(v.finish(np.int32)) for k, v in {**self.c, "server_affix": self._affix}.items()}
        derived = {k for k, ok in self.derive.items() if ok}  # NaN there: the value the record derives
        share_equal(f)
        _micro_columns(f)
        share_equal(i)
        share_equal(c)
        scale = 1e6 if self.itl_us is not None else 1.0
        flat: Any
        if not self.keep_gaps:
            if reload is None:
                raise ValueError("a table that does not keep its gaps needs a way to read them again")
            flat = LazyGaps(reload)
        elif self.itl_us is not None:
            flat = self.itl_us.finish()
        else:
            assert self.itl_f is not None
            flat = np.frombuffer(self.itl_f, dtype=np.float64) if len(self.itl_f) else np.zeros(0)
        # built 4 bytes a request (8 from an offset past 2**32: `put_numbers`), held in 2 (`BlockOffsets`)
        off = BlockOffsets.of(as_numbers(self.itl_off))
        if isinstance(off, BlockOffsets):
            self.itl_off = array(U32)
        return RequestTable(self.n, f, i, c, {k: tuple(v) for k, v in self.values.items()}, self.sparse, self.ids.finish(compact_codes),
                            self.extras, flat, off, scale, cells=self.cells.finish() if self.cells is not None else None,
                            derived=frozenset(derived), token_seconds=self.peaks.finish() if self.peaks is not None else None)


class BlockOffsets:
    """A table's gap offsets (`itl_off`: nondecreasing, one more than the rows) held as every
    BLOCK-th offset (int64) and each offset's distance past its block's (uint16): 2 bytes a
    request, not 4. Read like the array it stands for: `off[i]` an int, `off[a:b]`,
    `off[rows]` (an int array) and `np.asarray(off)` int64 arrays (`off[1:] - off[:-1]`, every
    row's gap count, is read only where the gaps themselves are read again)."""

    BLOCK = 64  # 64 rows of up to 1,023 gaps each fit a block's 2-byte distances
    __slots__ = ("fence", "within")
    dtype = np.dtype(np.int64)

    def __init__(self, fence: np.ndarray, within: np.ndarray) -> None:
        self.fence, self.within = fence, within
        fence.flags.writeable = within.flags.writeable = False

    @classmethod
    def of(cls, off: np.ndarray) -> np.ndarray | BlockOffsets:
        """`off` so held, or `off` itself where a block's distances do not fit 2 bytes (or there
        are too few to gain anything); checked a chunk of whole blocks at a time."""
        n, blk = len(off), cls.BLOCK
        if n < 4 * blk:
            return off
        fence = off[::blk].astype(np.int64)
        within = np.empty(n, dtype=np.uint16)
        step = blk * max(1, SCAN_CHUNK // blk)
        for a in range(0, n, step):
            b = min(n, a + step)
            d = off[a:b].astype(np.int64) - np.repeat(fence[a // blk:(b + blk - 1) // blk], blk)[:b - a]
            if len(d) and (int(d.min()) < 0 or int(d.max()) > 0xFFFF):
                return off
            within[a:b] = d
        return cls(fence, within)

    def __len__(self) -> int:
        return len(self.within)

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, (int, np.integer)):
            i = int(k) + (len(self.within) if k < 0 else 0)
            if not 0 <= i < len(self.within):
                raise IndexError(k)
            return int(self.fence[i // self.BLOCK]) + int(self.within[i])
        pos = np.arange(*k.indices(len(self.within))) if isinstance(k, slice) else np.asarray(k)
        if pos.dtype == bool:
            pos = np.flatnonzero(pos)
        return self.fence[pos // self.BLOCK] + self.within[pos]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        v = self[:]
        return v if dtype is None else v.astype(dtype)

    def tolist(self) -> list[int]:
        return self[:].tolist()

    @property
    def nbytes(self) -> int:
        return self.fence.nbytes + self.within.nbytes


class LazyGaps:
    """The ITL gaps of a table that did not keep them: read again from requests.jsonl.gz the
    first time a computation needs one request's gaps (`reload` builds the table again, keeping
    them), then held. Shared by a table and every copy `with_labels` makes. `loads` counts the
    re-reads (a gate on ordinary evidence makes none)."""

    __slots__ = ("reload", "gaps", "loads")

    def __init__(self, reload: Callable[[], RequestTable]) -> None:
        self.reload = reload
        self.gaps: Any = None
        self.loads = 0

    def get(self, table: RequestTable) -> Any:
        if self.gaps is None:
            again = self.reload()
            self.loads += 1
            n = table.n
            if again.n < n or not np.array_equal(again.itl_off[:n + 1], table.itl_off) or again.itl_scale != table.itl_scale:
                raise EvidenceChanged("requests.jsonl.gz changed while it was being judged: its ITL gaps read again differ")
            if table.cells is not None and again.cells is not None and again.n == n and not all(
                    np.array_equal(a, b) for a, b in zip(table.cells.vals + table.cells.counts, again.cells.vals + again.cells.counts)):
                raise EvidenceChanged("requests.jsonl.gz changed while it was being judged: its ITL gaps read again differ")
            self.gaps = again.itl
        return self.gaps


def build_table(rows: Iterable[Mapping[str, Any]], origins: Mapping[peaks.LevelKey, float] | None = None) -> RequestTable:
    return TableBuilder(origins=origins).extend(rows).finish()


class RequestTable:
    """One backend's requests as aligned columns (immutable by convention; `with_labels`
    returns a copy with some label columns replaced, sharing the rest)."""

    def __init__(self, n: int, f: Mapping[str, np.ndarray], i: Mapping[str, np.ndarray], c: Mapping[str, np.ndarray],
                 values: Mapping[str, tuple[Any, ...]], sparse: Mapping[str, Mapping[int, Any]], ids: Sequence[str],
                 extras: Mapping[int, Mapping[str, Any]], itl: np.ndarray, itl_off: np.ndarray, itl_scale: float,
                 aux: Mapping[str, Any] | None = None, *, cells: GapCells | None = None,
                 derived: frozenset[str] = frozenset(),
                 token_seconds: Mapping[peaks.LevelKey, np.ndarray] | None = None) -> None:
        self.n = n
        # per (workload, level): output tokens per second from its measure_start, counted as the
        # records were read (`peaks.TokenSeconds`); None where the builder had no levels' origins
        self.token_seconds = token_seconds
        self.derived = derived  # ttft / latency: not held (NaN), every request's value derived when read
        # what the judge derived beside the columns (`rederive`: trace_multi, the rows of each
        # other row's trace payloads; repeated, the rows of each id recorded more than once)
        self.aux = aux or {}
        self.f, self.i, self.c, self.values, self.sparse = f, i, c, values, sparse
        self.ids = ids
        self.extras = extras
        self._itl, self.itl_off, self.itl_scale = itl, itl_off, itl_scale
        self.cells = cells  # the gaps counted per (workload, level, bucket): what `gap_counts` answers from
        self._odd = np.fromiter(sorted(extras), dtype=np.int64, count=len(extras))

    @property
    def itl(self) -> Any:
        """Every request's ITL gaps end to end (`itl_off` cuts them; whole µs when itl_scale is
        1e6): held, or read again on first use (`LazyGaps`)."""
        return self._itl.get(self) if isinstance(self._itl, LazyGaps) else self._itl

    @property
    def gap_loads(self) -> int:
        """How many times this table's gaps were read again from requests.jsonl.gz."""
        return self._itl.loads if isinstance(self._itl, LazyGaps) else 0

    def __len__(self) -> int:
        return self.n

    def with_labels(self, changes: Mapping[str, tuple[np.ndarray, tuple[Any, ...]]],
                    extras: Mapping[int, Mapping[str, Any]] | None = None, aux: Mapping[str, Any] | None = None) -> RequestTable:
        c = dict(self.c)
        values = dict(self.values)
        kept = {**self.aux, **(aux or {})}
        if "outcome" in changes and "recorded_outcome" not in kept:
            # the outcomes as read, which `token_seconds` were counted by (`recorded_completed`):
            # the same array when nothing was re-derived, else the loaded codes (a byte a row)
            kept["recorded_outcome"] = (self.c["outcome"], self.values["outcome"])
        for k, (codes, vals) in changes.items():
            c[k], values[k] = compact_codes(codes), vals
        return RequestTable(self.n, self.f, self.i, c, values, self.sparse, self.ids,
                            self.extras if extras is None else extras, self._itl, self.itl_off, self.itl_scale,
                            kept, cells=self.cells, derived=self.derived,
                            token_seconds=self.token_seconds)

    def traced(self, idx) -> np.ndarray:
        """Rows (of `idx`) with a trace the judge matched (after `rederive`)."""
        codes = self.c.get("trace")
        if codes is None:
            return np.zeros(len(self.f["start"][idx]), dtype=bool)
        lut = np.fromiter((v is not None for v in self.values["trace"]), dtype=bool, count=len(self.values["trace"]))
        return lut[codes[idx]]

    # ---------------------------------------------------------------- per request (views)

    def rec(self, i: int) -> Rec:
        return Rec(self, i)

    def value(self, i: int, key: str) -> Any:
        ex = self.extras.get(i)
        if ex is not None and key in ex:
            return ex[key]
        kind = _KIND.get(key)
        if kind == "f":
            v = self.f[key][i]
            if v != v and key in self.derived:
                v = (self.ttft if key == "ttft" else self.latency)(np.array([i]))[0]
            return None if v != v else float(v)
        if kind == "i":
            v = int(self.i[key][i])
            return None if v == MISSING else v
        if kind == "c":
            return self.values[key][self.c[key][i]]
        if kind == "id":
            return self.ids[i]
        if kind == "s":
            if key == "server_id" and i not in self.sparse[key]:
                affix = self.values["server_affix"][self.c["server_affix"][i]]
                return None if affix is None else affix[0] + self.ids[i] + affix[1]
            return self.sparse[key].get(i)
        if kind == "itl":
            a, b = int(self.itl_off[i]), int(self.itl_off[i + 1])
            if a == b and self._itl_absent(i):
                return None
            return (self.itl[a:b] / self.itl_scale).tolist()
        return None

    def _itl_absent(self, i: int) -> bool:
        return False  # an absent ITL reads as [] (no gap): the judge treats both alike

    def has(self, i: int, key: str) -> bool:
        return self.value(i, key) is not None

    # ---------------------------------------------------------------- columns

    def label_mask(self, key: str, pred) -> np.ndarray:
        """Per value code: does pred(value) hold (a boolean lookup table)."""
        return np.fromiter((bool(pred(v)) for v in self.values[key]), dtype=bool, count=len(self.values[key]))

    def label_is(self, key: str, value: Any, idx=slice(None)) -> np.ndarray:
        """Rows (of `idx`) whose label `key` equals `value` (a boolean array)."""
        lut = self.label_mask(key, lambda v: type(v) is type(value) and v == value)
        codes = self.c[key][idx]
        return lut[codes] if len(lut) else np.zeros(len(codes), dtype=bool)

    def label_where(self, key: str, pred, idx=slice(None)) -> np.ndarray:
        lut = self.label_mask(key, pred)
        codes = self.c[key][idx]
        return lut[codes] if len(lut) else np.zeros(len(codes), dtype=bool)

    @property
    def odd_rows(self) -> np.ndarray:
        """Every row with extras (read through their views), ascending."""
        return self._odd

    def odd(self, idx: np.ndarray) -> np.ndarray:
        """The rows of `idx` with extras (read through their views)."""
        if not len(self._odd):
            return self._odd
        return idx[np.isin(idx, self._odd)]

    def clean(self, idx: np.ndarray) -> np.ndarray:
        if not len(self._odd):
            return idx
        return idx[~np.isin(idx, self._odd)]

    def req_time(self, idx: np.ndarray | slice = slice(None)) -> np.ndarray:
        it, start = self.f["intended_start"], self.f["start"]
        if it is start:  # a closed loop's intended start is its start: one array (`share_equal`)
            return start[idx]
        out = it[idx]
        if not stats.own_array(out):  # a view of a float64 column: a copy to fill (a `MicroColumn` read is one already)
            out = np.array(out)
        absent = np.isnan(out)
        if absent.any():
            if isinstance(idx, slice):
                out[absent] = start[idx][absent]
            else:
                rows = np.flatnonzero(idx) if idx.dtype == bool else idx
                out[absent] = start[rows[absent]]
        return out

    def ttft(self, idx) -> np.ndarray:
        return self._since_request("ttft", "first_token", idx)

    def latency(self, idx) -> np.ndarray:
        return self._since_request("latency", "end", idx)

    def _since_request(self, key: str, stamp: str, idx) -> np.ndarray:
        """`key` (ttft, latency) of the rows `idx`: the record's own value, else `stamp` -
        req_time. Filled a part at a time (`_filled`), so that what it allocates beyond that
        array stays a few MiB at any scope (a 10^7-request level's ttft made five full-length
        temporaries: ~400 MB at the gate's peak)."""
        held = self.f[key]
        if isinstance(held, np.ndarray) and held.strides == (0,) and len(held) and math.isnan(held[0]):
            held = None  # one NaN for every row (`compact`): every value is derived
        times = self.f[stamp]
        out, parts = self._filled(idx)
        for part, rows in parts:
            np.subtract(times[rows], self.req_time(rows), out=part)
            if held is not None:
                own = held[rows]
                np.copyto(part, own, where=~np.isnan(own))
        return out

    def _filled(self, idx) -> tuple[np.ndarray, Iterator[tuple[np.ndarray, Any]]]:
        """A new float64 array for the rows `idx` (an index array, or a slice of the table) and
        its parts SCAN_CHUNK rows at a time, each with the rows it holds (a slice stays a slice:
        no index array of the scope is made) -- for a column computed a chunk at a time."""
        start = 0
        if isinstance(idx, slice):
            start, b, step = idx.indices(self.n)
            if step != 1:
                idx = np.arange(start, b, step)
        n = len(idx) if not isinstance(idx, slice) else max(0, b - start)
        out = np.empty(n, dtype=np.float64)

        def parts() -> Iterator[tuple[np.ndarray, Any]]:
            for p in range(0, n, SCAN_CHUNK):
                q = min(n, p + SCAN_CHUNK)
                yield out[p:q], (slice(start + p, start + q) if isinstance(idx, slice) else idx[p:q])

        return out, parts()

    def schedule_lag(self, idx) -> np.ndarray:
        """start - admitted where a request waited for a slot under the spec's max_concurrency
        (the wait behind the cap is not the load generator's lateness), else start -
        intended_start (`record.schedule_lag`)."""
        lag = self.f["start"][idx] - self.f["intended_start"][idx]
        adm = self.f["admitted"]
        if isinstance(adm, np.ndarray) and adm.strides == (0,) and (not len(adm) or math.isnan(adm[0])):
            return lag  # no record has one (no cap, or evidence before format 5): one NaN for every row
        own = adm[idx]
        return np.where(np.isnan(own) | np.isnan(lag), lag, self.f["start"][idx] - own)  # no intended start: no lag

    def sent(self, stamp: str, idx) -> np.ndarray:
        """`stamp` (first_token, end) - start of the rows `idx`: sent_ttft, sent_latency, from the
        send (`record.sent_since`). Both columns are kept; nothing new is held."""
        return self.f[stamp][idx] - self.f["start"][idx]

    def cap_wait(self, idx) -> np.ndarray:
        """admitted - intended_start: the wait behind the spec's max_concurrency (NaN: no cap)."""
        return self.f["admitted"][idx] - self.f["intended_start"][idx]

    def number(self, key: str, idx) -> np.ndarray:
        """A numeric field as float64 (NaN: absent)."""
        if key in self.f:
            return self.f[key][idx]
        v = self.i[key][idx]
        return np.where(v == MISSING, np.nan, v.astype(np.float64))

    def counted_number(self, key: str, idx) -> np.ndarray:
        """`number(key, idx)` where the row's usage agrees with its stream (`usage_ok`), else NaN
        (a value computed from a contradicted token count: tpot, output_tokens). Filled a part
        at a time (`_filled`): over a 10^7-request scope the masks, the values and the result
        at once were ~19 bytes a request (report's peak)."""
        out, parts = self._filled(idx)
        for part, rows in parts:
            part[:] = self.number(key, rows)
            part[~self.usage_ok(rows)] = np.nan
        return out

    def recorded_completed(self, idx) -> np.ndarray:
        """Rows (of `idx`) whose record says completed, as it was read -- before `rederive`
        re-derived any outcome (`with_labels` keeps the loaded outcomes as aux
        `recorded_outcome`): the rows the loader counted in `token_seconds`."""
        codes, values = self.aux.get("recorded_outcome", (self.c["outcome"], self.values["outcome"]))
        lut = np.fromiter((type(v) is str and v == "completed" for v in values), dtype=bool, count=len(values))
        return lut[codes[idx]] if len(lut) else np.zeros(len(self.f["start"][idx]), dtype=bool)

    def first_chunks(self, idx: np.ndarray) -> np.ndarray:
        """Each row's (of `idx`) first chunk's tokens k1, as the loader counted them in
        `token_seconds` (`peaks.first_chunk_tokens` of its output_tokens, chunks and gaps; a row
        with extras as the row-by-row path reads its record). int64."""
        idx = np.asarray(idx, dtype=np.int64)
        lens = (self.itl_off[idx + 1] - self.itl_off[idx]).astype(np.int64)
        k1 = peaks.first_chunk_tokens(self.i["output_tokens"][idx].astype(np.int64), self.i["chunks"][idx].astype(np.int64), lens)
        if len(self._odd):
            for j in np.flatnonzero(np.isin(idx, self._odd)).tolist():
                i = int(idx[j])
                ex = self.extras.get(i, {})
                gaps = ex["itl"] if "itl" in ex else None
                n = len(gaps) if _peak_gaps_ok(gaps) else None if gaps is not None else int(lens[j])
                k1[j] = _row_first_chunk(self.value(i, "output_tokens"), self.value(i, "chunks"), n)
        return k1

    def usage_ok(self, idx) -> np.ndarray:
        bad = self.label_mask("usage_mismatch", bool)
        return ~bad[self.c["usage_mismatch"][idx]] if len(bad) else np.ones(len(self.f["start"][idx]), dtype=bool)

    def gaps(self, idx: np.ndarray) -> np.ndarray:
        """The ITL gaps (seconds, float64) of the rows `idx`, concatenated."""
        a, b = self.itl_off[idx], self.itl_off[idx + 1]
        lens = b - a
        total = int(lens.sum())
        if total == 0:
            return np.zeros(0)
        if len(idx) * 8 > self.n:  # much of the table: one boolean mask over the flat array
            rows = np.zeros(self.n, dtype=bool)
            rows[idx] = True
            every = self.itl_off[1:] - self.itl_off[:-1]
            g = self.itl[np.repeat(rows, every)]
        else:
            g = np.concatenate([self.itl[x:y] for x, y in zip(a.tolist(), b.tolist())])
        return g / self.itl_scale if self.itl_scale != 1.0 else g.astype(np.float64, copy=False)


    def gap_counts(self, idx: np.ndarray, rows_at_once: int = 1 << 13) -> stats.Counted | None:
        """The ITL gaps of rows `idx` counted by value (seconds), without ever holding them all:
        from the cells when `idx` is whole cells' counted rows (binned, where a cell is:
        `gapbins`), else a chunk of rows at a time, counted by value. None when the gaps are
        float64 (not whole microseconds)."""
        return self.gap_counts_of_chunks(lambda: slices(idx), rows_at_once)

    def gap_counts_of_chunks(self, chunks: Callable[[], Iterable[np.ndarray]], rows_at_once: int = 1 << 13) -> stats.Counted | None:
        """`gap_counts` of the rows the arrays `chunks()` yields hold together (distinct rows;
        a whole run's selection, never made at once)."""
        if self.itl_scale != 1e6:
            return None
        if self.cells is not None and (got := self.cells.counts_of_chunks(chunks)) is not None:
            v, n, bins = got
            if bins is None:
                return stats.Counted(v / 1e6, n)
            return stats.Counted((v + gapbins.bin_last(v, self.cells.edges)) / 2e6, n, bins.in_seconds(v, self.cells.edges))
        spans = [(int(c.min()), int(c.max()) + 1) for c in chunks() if len(c)]
        if not spans:
            return stats.Counted(np.zeros(0), np.zeros(0, dtype=np.int64))
        first, last = min(a for a, _ in spans), max(b for _, b in spans)  # a bucket's rows: only their span is looked at
        sel = np.zeros(last - first, dtype=bool)
        for c in chunks():
            sel[c - first] = True
        u, counts = _merged(self._chunk_counts(sel, first, rows_at_once))
        return stats.Counted(u / 1e6, counts)

    def _chunk_counts(self, sel: np.ndarray, first: int, rows_at_once: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The gaps of the rows `sel` marks (rows `first`, `first` + 1, ...) counted by value,
        `rows_at_once` rows at a time."""
        last = first + len(sel)
        off = self.itl_off
        for r0 in range(first, last, rows_at_once):
            r1 = min(last, r0 + rows_at_once)
            part = sel[r0 - first:r1 - first]
            if not part.any():
                continue
            g = self.itl[off[r0]:off[r1]]
            if not part.all():
                g = g[np.repeat(part, off[r0 + 1:r1 + 1] - off[r0:r1])]
            if len(g):
                yield _value_counts(g)


class Rec(Mapping):
    """One request of a table, read like its row: `rec["field"]`, `rec.get("field")`."""

    __slots__ = ("table", "i")

    def __init__(self, table: RequestTable, i: int) -> None:
        self.table = table
        self.i = i

    def __getitem__(self, key: str) -> Any:
        v = self.table.value(self.i, key)
        if v is None and key not in _KIND and key not in self.table.extras.get(self.i, {}):
            raise KeyError(key)
        if v is None and key in ("request_id", "bucket"):
            raise KeyError(key)
        return v

    def get(self, key: str, default: Any = None) -> Any:
        v = self.table.value(self.i, key)
        return default if v is None else v

    def __iter__(self) -> Iterator[str]:
        keys = [k for k in _KIND if k not in DROPPED and self.table.value(self.i, k) is not None]
        keys += [k for k in self.table.extras.get(self.i, {}) if k not in _KIND]
        return iter(keys)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.table.value(self.i, key) is not None

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Rec):
            return other.table is self.table and other.i == self.i
        return NotImplemented

    def __hash__(self) -> int:
        return hash((id(self.table), self.i))

    def __repr__(self) -> str:
        return f"Rec({self.table.ids[self.i]!r})"


_EMPTY_IDX = np.zeros(0, dtype=np.int64)


class Rows(Sequence):
    """A selection of requests, in order: parts of (table, row indices). Iterating gives `Rec`
    views; `column(name)` gives the aligned values of every selected request (vectorized)."""

    __slots__ = ("parts", "memo")

    def __init__(self, parts: Sequence[tuple[RequestTable, np.ndarray]] = ()) -> None:
        self.parts = tuple((t, idx) for t, idx in parts if len(idx))
        self.memo: dict[str, Any] = {}  # what measures computed of this selection (it never changes)

    @staticmethod
    def of(table: RequestTable, idx: np.ndarray) -> Rows:
        return Rows(((table, idx),))

    def __len__(self) -> int:
        return sum(len(idx) for _, idx in self.parts)

    def __bool__(self) -> bool:
        return bool(self.parts)

    def __iter__(self) -> Iterator[Rec]:
        if len(self.parts) <= 1:
            for t, idx in self.parts:
                for i in idx.tolist():
                    yield Rec(t, i)
            return
        import heapq

        def keyed(t: RequestTable, idx: np.ndarray):
            times = t.req_time(idx)
            for i, tm in zip(idx.tolist(), times.tolist()):
                yield (math.inf if tm != tm else tm, t.ids[i]), Rec(t, i)

        for _, r in heapq.merge(*(keyed(t, idx) for t, idx in self.parts), key=lambda kv: kv[0]):
            yield r

    def __getitem__(self, k):  # type: ignore[override]
        if isinstance(k, slice):
            return list(self)[k]
        if k < 0:
            k += len(self)
        for t, idx in self.parts:
            if k < len(idx):
                return Rec(t, int(idx[k]))
            k -= len(idx)
        raise IndexError(k)

    def __add__(self, other: Rows) -> Rows:
        return Rows(self.parts + other.parts)

    def chunks(self, size: int | None = None) -> Iterator[tuple[RequestTable, np.ndarray]]:
        """The parts, `size` (SCAN_CHUNK) rows at a time (views, no copy): a vectorized count or
        sum over a scope allocates its temporaries for one chunk, not for every request of it."""
        for t, idx in self.parts:
            for sub in slices(idx, size):
                yield t, sub

    def select(self, mask_of) -> Rows:
        """The rows for which `mask_of(table, idx)` (a boolean array) holds."""
        return Rows(tuple((t, idx[mask_of(t, idx)]) for t, idx in self.parts))

    def floats(self, key: str) -> np.ndarray:
        """Float column `key` of the selected rows (float64), NaN where a row has none."""
        return self.map(lambda t, idx: t.f[key][idx], lambda r: v if (v := num(r.get(key))) is not None else math.nan)

    def ints(self, key: str) -> np.ndarray:
        """Int column `key` of the selected rows (int64), MISSING where a row has none."""
        return self.map(lambda t, idx: t.i[key][idx].astype(np.int64),
                        lambda r: v if type(v := r.get(key)) is int else MISSING, dtype=np.int64)

    def map(self, col_of, row_of, dtype=np.float64) -> np.ndarray:
        """One value per selected row: `col_of(table, idx)` vectorized over ordinary rows,
        `row_of(rec)` for rows with extras. Aligned with the selection (part by part)."""
        outs = []
        for t, idx in self.parts:
            v = np.asarray(col_of(t, idx))
            odd = t.odd(idx)
            if len(odd):
                v = v.astype(dtype if v.dtype != bool else bool, copy=True)
                pos = np.nonzero(np.isin(idx, odd))[0]
                for p in pos.tolist():
                    x = row_of(Rec(t, int(idx[p])))
                    v[p] = (np.nan if x is None else x) if v.dtype != bool else bool(x)
            outs.append(v)
        if not outs:
            return np.zeros(0, dtype=dtype)
        return np.concatenate(outs) if len(outs) > 1 else outs[0]

    def where(self, col_of, row_of) -> Rows:
        """The selected rows for which the predicate holds (`col_of` vectorized, `row_of` for
        rows with extras), in order; the predicate computed SCAN_CHUNK rows at a time, the rows
        kept without a copy where they can be (`kept`: every completed request of a level is
        the level's rows themselves)."""
        return Rows(tuple((t, kept(idx, lambda sub, t=t: Rows.of(t, sub).map(col_of, row_of, bool))) for t, idx in self.parts))

    def count(self, col_of, row_of) -> int:
        return int(self.map(col_of, row_of, bool).sum())

    def ids(self) -> list[str]:
        return [t.ids[i] for t, idx in self.parts for i in idx.tolist()]


def kept(idx: np.ndarray, test: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """The rows of `idx` for which `test` (a boolean array per chunk of rows) holds, in order,
    tested SCAN_CHUNK rows at a time: `idx` itself where every row is kept, a view of the one
    unbroken stretch of it they form, else a new array filled in place -- never the chunks'
    pieces beside their concatenation (a whole level's completed requests were 8 bytes a
    request at once, the 10^7 gate's peak). The tests are held meanwhile, a byte a row."""
    masks = [np.asarray(test(sub), dtype=bool) for sub in slices(idx)]
    n, first, last, at = 0, -1, -1, 0
    for m in masks:
        hit = np.flatnonzero(m)
        if len(hit):
            n += len(hit)
            first = at + int(hit[0]) if first < 0 else first
            last = at + int(hit[-1])
        at += len(m)
    if n == len(idx):
        return idx
    if n and last - first + 1 == n:
        return idx[first:last + 1]
    out = np.empty(n, dtype=idx.dtype)
    pos = 0
    for sub, m in zip(slices(idx), masks):
        got = sub[m]
        out[pos:pos + len(got)] = got
        pos += len(got)
    return out


def slices(idx: np.ndarray, size: int | None = None) -> list[np.ndarray]:
    """`idx` in views of `size` (SCAN_CHUNK) rows (one, maybe empty, for a short one)."""
    size = SCAN_CHUNK if size is None else size
    return [idx[a:a + size] for a in range(0, len(idx), size)] or [idx]


def ordered(table: RequestTable, idx: np.ndarray | None = None) -> np.ndarray:
    """`idx` (None: every row, as int32 row numbers below 2**31 rows) in the judge's request
    order: by req_time (absent last), then request id."""
    if idx is None:
        return _ordered_all(table)
    if not len(idx):
        return idx
    t = order_keys(table, idx)  # a new array: sorted in place below
    o = np.argsort(t, kind="stable")
    idx = idx[o]  # a new array, changed in place below
    del o
    t.sort()  # the times in that order, sorted in place (t[o] was a third full-length array at once)
    _ties_by_id(table, idx, t)
    return idx


def order_keys(table: RequestTable, rows: np.ndarray | slice) -> np.ndarray:
    """req_time of `rows`, absent as inf: what the judge's order sorts by, ascending along it
    (a new array, the absent values set in place)."""
    t = table.req_time(rows)
    if not stats.own_array(t):  # a view of a column (a closed loop's start)
        t = np.array(t)
    t[np.isnan(t)] = np.inf
    return t


def _ordered_all(table: RequestTable) -> np.ndarray:
    """Every row in the judge's order, as `ordered(table, every row number)` gives it, held as
    4-byte row numbers and made without a full-length sort: the rows are dealt a chunk at a
    time into ranges of req_time (cut at every SCAN_CHUNK-th value of a sample of them, so
    each range holds about SCAN_CHUNK rows), in row order, and each range is then sorted on its
    own -- a stable sort of each range of row-ordered rows is the stable sort of them all, and
    equal times always share a range. What it allocates beyond its result stays a few
    SCAN_CHUNK-sized arrays (a range of many equal times: that range); the whole-table stable
    argsort was 12 bytes a request at once, at 10^7 requests the gate's peak (+57 MiB)."""
    n = table.n
    out = np.empty(n, dtype=np.int32 if n < 2**31 else np.int64)
    if not n:
        return out
    chunk = SCAN_CHUNK
    step = max(1, min(256, chunk))  # every step-th row's time sampled: chunk / step samples a range
    sample = np.sort(order_keys(table, slice(0, n, step)))
    cuts = np.unique(sample[max(1, chunk // step)::max(1, chunk // step)])  # range k: cuts[k-1] <= t < cuts[k]
    del sample
    counts = np.zeros(len(cuts) + 1, dtype=np.int64)
    for a in range(0, n, chunk):  # the ranges' sizes
        counts += np.bincount(np.searchsorted(cuts, order_keys(table, slice(a, min(n, a + chunk))), side="right"),
                              minlength=len(counts))
    at = np.concatenate(([0], np.cumsum(counts)))
    pos = at[:-1].copy()
    for a in range(0, n, chunk):  # each row dealt to its range, in row order
        r = np.searchsorted(cuts, order_keys(table, slice(a, min(n, a + chunk))), side="right")
        o = np.argsort(r, kind="stable")
        rs = r[o]
        ks, first, cnt = np.unique(rs, return_index=True, return_counts=True)
        dest = pos[rs] + (np.arange(len(rs)) - np.repeat(first, cnt))
        out[dest] = o + a
        pos[ks] += cnt
    del pos
    for k in np.flatnonzero(counts).tolist():  # each range sorted by time, stably (then ties by id)
        seg = out[at[k]:at[k + 1]]
        t = order_keys(table, seg)
        if not (t == t[0]).all():  # (a range of one time -- a burst's shared intended start -- is in order)
            o = np.argsort(t, kind="stable")
            seg[:] = seg[o]
            t = t[o]
            del o
        _ties_by_id(table, seg, t)
    return out


def _ties_by_id(table: RequestTable, idx: np.ndarray, t: np.ndarray) -> None:
    """Runs of equal times `t` in the sorted rows `idx` put in request-id order, in place (as
    the row order did)."""
    eq = np.empty(max(len(idx) - 1, 0), dtype=bool)
    for a in range(0, len(eq), SCAN_CHUNK):
        b = min(len(eq), a + SCAN_CHUNK)
        ts = t[a:b + 1]
        eq[a:b] = ts[1:] == ts[:-1]
    if eq.any():  # ties in time: by request id, as the row order did
        edge = np.diff(np.concatenate(([False], eq, [False])).astype(np.int8))
        starts, ends = np.nonzero(edge == 1)[0], np.nonzero(edge == -1)[0]
        for a, b in zip(starts.tolist(), ends.tolist()):
            idx[a:b + 1] = sorted(idx[a:b + 1].tolist(), key=lambda i: str(table.ids[i]))
