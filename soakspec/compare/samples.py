"""What `soakspec compare` reads of each run (`RunSamples`): its side (`Side`: verified, complete,
scaled), the spec it ran, each backend's levels and their samples per compared metric (and per
user turn), how the load reached each backend (`network_path`), the requests an interrupted
run's runner cancelled itself, and whether its load generator kept up (`ClientHealth`). A run's
records are joined and re-derived as the gate does it; nothing here pairs or judges.

Samples. A draw only ever reads the sample's j-th smallest value, so a level's sample is held
as a `Sorted` (n, at(j), vectorised take(js)), never as a list of Python floats: itl's gaps in
the gate's counted form (`Distribution.counted`: distinct values ascending and cumulative
counts, j-th smallest = the first value whose cumulative count exceeds j), which is O(distinct
gaps) -- a few thousand microsecond values for the ~10^9 gaps of a day-long soak that one float
each would hold in tens of GB; a per-request metric as one sorted float64 array (8 bytes a
request, where a list of Python floats took ~32) -- 4 where a run read up front holds it
(`Sorted.compact`: uint32 offsets of a power of two, where every value is one exactly). itl's values() are asked for only when its gaps
cannot be counted (not whole microseconds). A (level pair, metric)'s two samples are built once
for all its statistics and dropped before the next pair's -- but the command's base run, whose
samples are all read up front (`RunSamples.read(keep=False)`) so that its table is let go
before the new run is read: two day-long runs' tables do not fit together (10^7 requests a
side: 1.2 GiB), one table and the other run's samples do. The Beta variates are drawn one at a
time in the same order as ever and only the look-ups are vectorised, so the figures are those
the sorted list gave, bit for bit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from soakspec.evidence import netpath
from soakspec.evidence.record import CANCELLED_BY_ABORT
from soakspec.judge import stats
from soakspec.judge.evidence import Evidence
from soakspec.judge.index import BackendIndex, LevelIndex, capped, index
from soakspec.judge.joined import _time_scale, join
from soakspec.judge.measures import Distribution, PerBucket, PerToken, mask
from soakspec.judge.measures import Outcome as OutcomeCount
from soakspec.judge.performance import FROM_SEND, LagFigure, lag_figure
from soakspec.judge.registry import metric
from soakspec.judge.scope import rows_by_turn
from soakspec.judge.sweep import sweep_workload
from soakspec.compare.sweep import SweepFigure, figures
from soakspec.judge.table import Rows
from soakspec.judge.workload import ran_spec
from soakspec.compare.metrics import BY_NAME, CompareMetric, MAX_TURNS, METRICS, TURN_METRICS
from soakspec.compare.intervals import DesignEffects, Sorted, batch_effect


@dataclasses.dataclass(frozen=True)
class Side:
    dir: str
    run_id: str | None
    manifest_sha256: str | None
    spec_sha256: str | None
    verified: bool  # every artifact re-hashed and matched, every file parsed
    problems: tuple[str, ...]  # what did not verify (tampered, malformed)
    incomplete: tuple[str, ...] = ()  # the run says it did not finish
    rehearsal: bool = False  # `run --rehearse`: every backend was the simulator (manifest "rehearsal")
    time_scale: float = 1.0  # `run --time-scale`: every duration shrunk (manifest "time_scale")
    bad_time_scale: bool = False  # the manifest's time_scale is not in (0, 1]

    def scaled(self) -> str | None:
        """What makes this run not a full-scale run of its real backends, in words; None if nothing."""
        what = []
        if self.rehearsal:
            what.append("a rehearsal against the simulator")
        if self.bad_time_scale:
            what.append("of an unreadable time scale")
        elif self.time_scale != 1:
            what.append(f"time-scaled by {self.time_scale:g}")
        return " and ".join(what) or None

    def to_json(self) -> dict[str, Any]:
        return {"dir": self.dir, "run_id": self.run_id, "manifest_sha256": self.manifest_sha256,
                "spec_sha256": self.spec_sha256, "verified": self.verified, "problems": list(self.problems),
                "incomplete": list(self.incomplete), "rehearsal": self.rehearsal, "time_scale": self.time_scale}


def _side(dir: str, ev: Evidence) -> Side:
    integ = ev.integrity
    problems = tuple(f"{f.path}: {f.message}" for f in (*integ.tampered, *integ.malformed))
    incomplete = tuple(f"{f.path}: {f.message}" for f in integ.incomplete)
    scale, bad = _time_scale(ev.manifest)
    return Side(dir, ev.run_id, ev.manifest_sha256, ev.spec_sha256, bool(integ.verified) and not problems, problems, incomplete,
                ev.manifest.get("rehearsal") is True, scale, bad)


def network_path(entry: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """How the load generator reached a backend, from its manifest entry: (where -- "this
    machine's loopback" or "host H", from its url (`netpath.is_loopback`, the runner's own test)
    -- and the hop in between -- "the launched server's own socket" or "a port forward", from a
    launched server's `port_listener`: its `via`, or in evidence from before `via` its reason
    text, `netpath.hop`), each None where the manifest does not say (no url; a `url` backend's
    listener is never checked; one /proc could not read). A port forward (docker-proxy,
    rootlessport; no listener in this network namespace) or another host adds latency of its
    own to every TTFT and latency (AIPerf PR #850)."""
    url = entry.get("url")
    where = None
    if isinstance(url, str):
        try:
            host = urlsplit(url).hostname
        except ValueError:
            host = None
        if host:
            where = "this machine's loopback" if netpath.is_loopback(host) else f"host {host}"
    pl = entry.get("port_listener")
    return where, netpath.hop(pl) if isinstance(pl, Mapping) else None


Samples = tuple[Any, ...]  # (a Sorted sample, or a list of bucket values; the independent samples among them[; itl: the requests][; per-request metrics: their DesignEffects])


def _samples(bi: BackendIndex, lv: LevelIndex, cm: CompareMetric) -> Samples:
    """(the values, the number of independent samples among them). A distribution's values
    are a `Sorted` (module doc, "Samples"): the gate's counted form where the metric has one
    (itl's gaps, `Distribution.counted`), its values() array otherwise -- itl's values() only
    where its gaps cannot be counted (not whole microseconds)."""
    impl = metric(cm.name)
    if cm.kind == "proportion":  # (how many of the level's measured requests it counts, how many there are,
        #                           the design effect of their 0/1 outcomes in start order: failures come in bursts)
        assert isinstance(impl, OutcomeCount)
        hits = _outcomes(lv.records, impl)
        return int(np.count_nonzero(hits)), len(hits), batch_effect(hits) or 1.0
    if cm.kind == "distribution":
        return _distribution(lv.records, cm)
    assert isinstance(impl, PerBucket)
    vals = [v for w in lv.buckets if (v := impl.of(bi, w)) is not None]
    return vals, len(vals)


def _outcomes(records: Any, impl: OutcomeCount) -> np.ndarray:
    """Whether each of `records` is counted by `impl`, in the order the requests started (the
    judge's order of a level's rows): a chunk of the table at a time, or row by row."""
    if isinstance(records, Rows):
        parts = [mask(Rows.of(t, sub), impl.counts) for t, sub in records.chunks()]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)
    return np.fromiter((bool(impl.counts(r)) for r in records), dtype=bool)


def _distribution(records: Any, cm: CompareMetric, impl: Any = None) -> Samples:
    """`_samples` of a distribution over `records` (a level's, or one of its turns'); `impl`
    another implementation of `cm`'s kind to measure with (a `LagFigure`'s, `figure_samples`)."""
    impl = impl if impl is not None else metric(cm.name)
    assert isinstance(impl, Distribution)
    c = impl.counted(records)
    if c is not None:
        xs = Sorted.counted(c)
        effects = DesignEffects.NONE
    else:
        vals = np.asarray(impl.values(records), dtype=np.float64)  # in the order the requests started
        effects = DesignEffects.NONE if cm.per_request_samples else DesignEffects.of(vals)
        xs = Sorted.of(vals, consume=True)
    if cm.per_request_samples:  # (gaps, Kish's effective requests, requests): compare/intervals.py, "Independence"
        assert isinstance(impl, PerToken)
        kish, requests = impl.draws(records)  # as the gate counts them, a chunk of requests at a time
        return xs, kish, requests
    return xs, xs.n, xs.n, effects


class _TurnSamples(Mapping[int, Mapping[str, Samples]]):
    """A multi-turn level's samples per user turn (`samples[turn][name]`), read from the run's
    table when asked; its turns (`rows_by_turn`, the turns past MAX_TURNS as one) grouped on
    first use. A single-turn level has none, found without reading its rows."""

    __slots__ = ("lv", "_turns")

    def __init__(self, lv: LevelIndex) -> None:
        self.lv = lv
        self._turns: dict[int, Any] | None = None

    def _grouped(self) -> dict[int, Any]:
        if self._turns is None:
            self._turns = dict(rows_by_turn(self.lv.records, MAX_TURNS))
        return self._turns

    def __getitem__(self, turn: int) -> Mapping[str, Samples]:
        rows = self._grouped()[turn]
        return _LazyMetrics(lambda name: _distribution(rows, BY_NAME[name]))

    def __iter__(self) -> Iterator[int]:
        return iter(self._grouped())

    def __len__(self) -> int:
        return len(self._grouped())


class _LazyMetrics(Mapping[str, Samples]):
    """Samples a metric at a time, computed when asked (`get(name)`)."""

    __slots__ = ("get",)

    def __init__(self, get: Callable[[str], Samples]) -> None:
        self.get = get

    def __getitem__(self, name: str) -> Samples:
        return self.get(name)

    def __iter__(self) -> Iterator[str]:
        return iter(cm.name for cm, _ in TURN_METRICS)

    def __len__(self) -> int:
        return len(TURN_METRICS)


def _turn_samples(lv: LevelIndex) -> dict[int, dict[str, Samples]]:
    """`_TurnSamples` read up front (`RunSamples.read(keep=False)`)."""
    wanted = [cm for cm, _ in TURN_METRICS if not cm.capped_only or capped(lv.entry)]
    return {k: {cm.name: _compact(_distribution(rows, cm)) for cm in wanted} for k, rows in rows_by_turn(lv.records, MAX_TURNS)}


def _compact(samples: Samples) -> Samples:
    """`samples` with its sorted values held in 4 bytes a value where that is exact
    (`Sorted.compact`): what a run read up front holds until the rows are made."""
    if samples and isinstance(samples[0], Sorted):
        return (samples[0].compact(),) + tuple(samples[1:])
    return samples


_RAN = object()  # `RunSamples.read`'s default judge: the spec the run ran


class _LevelSamples:
    """A level's samples, a metric at a time (`samples[name]`): read from the run's table when
    asked (`RunSamples.read(..., keep=True)`: the table stays), or read once, up front, into a
    dict (`keep=False`: the table can go)."""

    __slots__ = ("bi", "lv")

    def __init__(self, bi: BackendIndex, lv: LevelIndex) -> None:
        self.bi, self.lv = bi, lv

    def __getitem__(self, name: str) -> Samples:
        return _samples(self.bi, self.lv, BY_NAME[name])

    def lag_p50(self) -> float | None:
        return _lag_p50(self.lv)

    def figure(self, fig: LagFigure) -> Samples:
        return _distribution(self.lv.records, BY_NAME[fig.metric], fig.impl)


@dataclasses.dataclass(frozen=True, eq=False)
class LevelSamples:
    """A level of one run as compare reads it: what pairs it (`_identity`: its workload and
    manifest entry), its label, every metric's samples, the measured requests its runner
    cancelled itself when the run was interrupted (`_cancelled_by_abort`), and a multi-turn
    level's samples per user turn (`TURN_METRICS`; empty for any other level)."""

    backend: str
    workload: str
    index: int
    label: str
    entry: Mapping[str, Any]
    samples: Mapping[str, Samples] | _LevelSamples
    cancelled_by_abort: int
    turns: Mapping[int, Mapping[str, Samples]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, eq=False)
class BackendSamples:
    name: str
    levels: tuple[LevelSamples, ...]
    sweep: bool = False  # its levels are a sweep's probes (a search's path: they differ run to run)
    path: tuple[str | None, str | None] = (None, None)  # how the load reached it (`network_path`)


@dataclasses.dataclass(frozen=True, eq=False)
class RunSamples:
    """What compare needs of one run: its side (verified, complete, scaled), the spec it ran,
    its levels' samples and whether its load generator kept up. `read(ev, keep=False)` reads
    every level's samples at once and holds none of the run's table, so that the command reads
    the base run, lets its table go, and only then reads the new one: compare of two day-long
    runs held both tables (10^7 requests a side: 1.2 GiB), where one table and the other's
    samples (ttft, tpot, latency: 12 bytes a request held compactly -- 24 where a value is not a
    whole multiple of one power of two, `Sorted.compact` -- 8 more at a level that declares
    max_concurrency for sent_ttft and sent_latency -- and with `from_send` 8 more at an open-loop
    level for each lag figure a row is not made of -- and at a multi-turn level ttft per turn,
    with sent_ttft where capped; itl counted by value) are enough."""

    side: Side
    ran: Any
    backends: tuple[BackendSamples, ...]
    health: ClientHealth | None
    sweeps: tuple[SweepFigure, ...] = ()  # each backend's sweep figure, re-judged as the gate does (compare/sweep.py)
    # whether its gate judges the load generator (`client_healthy`, on by default): where either
    # run's says `client_healthy = false`, a lag-decided FAIL stands as measured (`_lag_decided`)
    client_judged: bool = True

    @classmethod
    def read(cls, ev: Evidence, *, dir: str = "run", judge: Any = _RAN, ran: Any = None, keep: bool = True,
             from_send: bool = False) -> RunSamples:
        """`ev` joined as the gate joins it (re-derived by `judge`, by default `ran`: the spec
        the run ran, read from its manifest when not given; None: read as stored; every sweep
        probe kept). `keep`: the samples are read from the table when a row asks (the table
        stays with them). `from_send` (keep=False only): an open-loop level whose gate judges
        its client keeps the samples of its lag figures (`_lag_figures`: sent_ttft and
        sent_latency, under max_concurrency ttft and latency less schedule_lag) and its schedule
        lag's p50 too, for a failing ttft or latency rule's check (`_lag_decided`); without them
        such a FAIL stands, with a note."""
        side = _side(dir, ev)
        ran = ran if ran is not None else ran_spec(ev)
        judge = ran if judge is _RAN else judge
        run = join(judge, ev, whole=True) if judge is not None else None
        indexes = run.indexes if run is not None else index(ev)
        swept = ran is not None and sweep_workload(ran) is not None  # (a sweep spec has one backend)
        backends = tuple(BackendSamples(bi.name, tuple(LevelSamples(
            bi.name, lv.workload, lv.index, lv.label, lv.entry,
            _LevelSamples(bi, lv) if keep else _read_up_front(bi, lv, _lag_figures(run, lv) if from_send else ()),
            _cancelled_by_abort(lv), _TurnSamples(lv) if keep else _turn_samples(lv)) for lv in bi.levels),
            swept or isinstance(bi.evidence.entry.get("sweep"), Mapping), network_path(bi.evidence.entry)) for bi in indexes)
        sweeps = figures(judge, ev) if judge is not None else ()  # before the table may go: it reads each probe
        return cls(side, ran, backends, _client_health(run), sweeps,
                   client_judged=run is None or bool(getattr(run.gate, "client_healthy", True)))


def _lag_figures(run: Any, lv: LevelIndex) -> list[LagFigure]:
    """The figures a failing ttft or latency of `lv` is measured again with (the gate's
    `performance.lag_figure`: at an open-loop level whose gate judges its client, the send
    figure where uncapped, the time less the client's own lateness where capped), kept by a
    level read up front with `from_send` (`_lag_decided`); none for a run that was not joined."""
    if run is None:
        return []
    return [f for m in FROM_SEND if (f := lag_figure(bool(run.gate.client_healthy), m, [lv])) is not None]


def figure_samples(lv: LevelSamples, fig: LagFigure) -> Samples | None:
    """`lv`'s samples of a `LagFigure` (`_lag_decided`): from its table, or as read up front --
    None where it was read without them (no `from_send`). Read up front, a level keeps its own
    figure's (`_lag_figures`), which is what `_lag_decided` asks of each side."""
    if isinstance(lv.samples, _LevelSamples):
        return lv.samples.figure(fig)
    got: Samples | None = lv.samples.get(fig.name)
    return got


def _lag_p50(lv: LevelIndex) -> float | None:
    """The p50 of the level's schedule lag (the gate's `schedule_lag`: the client's own lateness,
    from the slot where the request waited for one), None without one."""
    vals = np.asarray(metric("schedule_lag").values(lv.records), dtype=np.float64)
    return float(stats.percentile(vals, 50)) if len(vals) else None  # type: ignore[arg-type]


def _read_up_front(bi: BackendIndex, lv: LevelIndex, figs: Sequence[LagFigure]) -> dict[str, Any]:
    """A level's samples read at once (`RunSamples.read(keep=False)`): every metric's row
    samples, sent_* where the level is capped, and each of `figs` (`_lag_figures`, with
    `from_send`) by its name with the schedule lag's p50 (`_lag_decided`)."""
    out: dict[str, Any] = {cm.name: _compact(_samples(bi, lv, cm)) for cm in METRICS if not cm.capped_only or capped(lv.entry)}
    for f in figs:
        if f.name not in out:
            out[f.name] = _compact(_distribution(lv.records, BY_NAME[f.metric], f.impl))
    if figs:
        out[LAG_P50] = _lag_p50(lv)
    return out


LAG_P50 = "schedule_lag p50"  # a level read up front with its lag figures: its schedule lag's p50 (`_read_up_front`)


@dataclasses.dataclass(frozen=True)
class ClientHealth:
    """Where a run's load generator may have distorted its timing figures (the gate's
    client_healthy INCONCLUSIVE: saturated, or requests it never sent): `why` its message,
    `levels` the (backend, workload, level index) of each bucket it names -- None where it
    cannot say which (no client.jsonl, requests never sent): every level of the run."""

    why: str
    levels: frozenset[tuple[str | None, str | None, int | None]] | None

    def covers(self, backend: str, workload: str, level: int | None) -> bool:
        return self.levels is None or (backend, workload, level) in self.levels


def _client_health(run: Any) -> ClientHealth | None:
    """The run's `ClientHealth`, None when its load generator kept up or the run could not be
    joined."""
    from soakspec.judge.validity import CLIENT_NOT_SENT, client_healthy

    if run is None:
        return None
    res = client_healthy(run)
    if res.status != "inconclusive":
        return None
    found = res.failures or res.details
    whole = not found or any(d.cause == CLIENT_NOT_SENT or d.where.backend is None or d.where.level is None for d in found)
    levels = None if whole else frozenset((d.where.backend, d.where.workload, d.where.level) for d in found)
    return ClientHealth(res.message, levels)


def _cancelled_by_abort(lv: LevelIndex) -> int:
    """The level's measured requests the runner itself cancelled in flight when its run was
    aborted (an interrupt): recorded disconnected, though the server did not end them."""
    return lv.records.count(
        lambda t, idx: t.label_is("outcome", "disconnected", idx) & t.label_is("error", CANCELLED_BY_ABORT, idx),
        lambda r: r.get("outcome") == "disconnected" and r.get("error") == CANCELLED_BY_ABORT)
