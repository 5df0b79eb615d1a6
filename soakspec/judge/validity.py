"""Validity rules: is this a run the gate can speak about? (see `soakspec.judge.judge`)

    completed_run   the run is whole: manifest complete, nothing cut off or unusable, every
                    planned backend and level present and completed, every sent request
                    recorded once, nothing outside the manifest's levels and buckets
    full_scale_run  not a rehearsal nor time-scaled, unless the gate allows it
    min_samples     enough completed requests in every level, one in every planned bucket
    client_healthy  the load generator kept up in every bucket (see "client health" below)

Each is `rule(run, spec_rule) -> RuleResult`; `spec_rule` is None for the built-in check.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from soakspec import draws
from soakspec.evidence import layout
from soakspec.evidence.ids import IdColumn, IdIndex
from soakspec.evidence.record import HELD_BACK, WARMUP_BUCKET, outcomes_text
from soakspec.evidence.record import schedule_lag as record_lag
from soakspec.judge import schedproof
from soakspec.judge.capproof import Breach, breaches
from soakspec.judge.common import OPS, abort_observed_text, backend_here, loc, plural, problem, result
from soakspec.judge.index import BackendIndex, LevelIndex, capped, req_time, scheduled_in
from soakspec.judge.joined import JudgedRun
from soakspec.judge.index import num as num_
from soakspec.judge.measures import Columnar, bucket_in_flight, cap_wait, completed, timed_out
from soakspec.judge.stats import percentile
from soakspec.judge import table as table_module
from soakspec.judge.table import MISSING, Rows
from soakspec.judge.scope import bucket_scope, clock, level_scope
from soakspec.judge.verdict import MAX_LISTED, Instance, Location, RuleResult
from soakspec.lang.spec import Expr, Rule
from soakspec.plan import BackendPlan, Level, ramp_of, shape_identity
from soakspec.units import format_duration

MAX_SHOWN = 5  # malformed or unusable rows named one by one
WINDOW_TOLERANCE_S = 1e-3  # a bucket window may differ this much from the plan's (float rounding)
RECORD_TOLERANCE_S = 0.5  # a request may start this far outside its bucket's window (clock reads)


def _run_problems(run: JudgedRun) -> list[Instance]:
    """What is wrong with the run as a whole: its status, its files, its manifest."""
    out: list[Instance] = []
    ev = run.evidence
    m = ev.manifest
    status = m.get("status")
    if status != "complete":
        reason = m.get("incomplete_reason")
        if run.partial:  # judged up to its last closed bucket: not finished is what it is, not a fault
            out.append(problem(f"the run's status is {status or 'unknown'}: not finished (still going, or killed), "
                               "judged up to its last closed bucket", status="inconclusive"))
        else:
            out.append(problem(f"the run's status is {status or 'unknown'}" + (f": {reason}" if reason else "")))
    for f in ev.integrity.incomplete:
        if run.partial:  # no final hashes, a cut-off last write, a held lock: what a run not finished has
            if f.code != "V201":
                out.append(problem(f.text(), status="inconclusive"))
            continue
        # V201 repeats the status; right after the run (`soakspec run`), V205/V206 (no
        # results.json / verdict.json yet) do not matter: the judge recomputes every number
        # from the raw evidence and writes them. Judged after the fact (`gate`), the run's own
        # results and verdict are part of its evidence: missing, the evidence is incomplete.
        if f.code == "V201" or (f.code in ("V205", "V206") and not run.retained):
            continue
        if f.code in ("V205", "V206"):  # the run may be fine; what is retained of it is not whole
            out.append(problem(f"incomplete evidence: {f.text()}", status="inconclusive"))
        else:
            out.append(problem(f.text()))
    for f in ev.integrity.malformed[:MAX_SHOWN]:
        out.append(problem(f"malformed evidence: {f.text()}"))
    if len(ev.integrity.malformed) > MAX_SHOWN:
        out.append(problem(f"... and {len(ev.integrity.malformed) - MAX_SHOWN} more malformed records"))
    if run.bad_time_scale:
        out.append(problem(f"the manifest's time_scale {m.get('time_scale')!r} is not in (0, 1]"))
    for be in ev.backends:
        if be.name in run.not_run and run.gate_only:
            continue  # the gate was asked about the others only (`gate --backend`)
        if be.name not in run.planned:
            out.append(problem(f"backend {be.name} is in the evidence but not planned by the spec"
                               + (f" (the manifest restricts the run to {', '.join(run.restricted)})" if be.name in run.not_run else "")))
    out.extend(problem(m) for m in kind_problems(run))
    out.extend(problem(m) for m in workload_problems(run))
    return out


def workload_problems(run: JudgedRun) -> list[str]:
    """Workloads whose requests, as the run sent them (its embedded spec), are not the ones the
    spec judging it (`gate --spec`) plans -- prompt, max_tokens, endpoint, model, sampling
    (`judge.workload.workload_shape`, what `compare` compares): the evidence is not of that
    workload, whatever its rules would say of it."""
    from soakspec.judge.workload import workload_differences

    if run.ran_spec is None:
        return []
    stored = run.evidence.manifest.get("spec")
    # a body field the run's embedded text holds redacted cannot be compared with the spec file's
    redacted = isinstance(stored, dict) and "text_sha256" in stored
    names = [w.name for w in run.spec.workloads]
    return [f"{d}: the run sent other requests than the spec judging it plans, so its evidence is not of that workload"
            for d in workload_differences(run.ran_spec, run.spec, names, hidden=("body",), skip=("body",) if redacted else ())]


def kind_problems(run: JudgedRun) -> list[str]:
    """Backends whose recorded kind disagrees with the manifest's `rehearsal` flag: a
    rehearsal runs every backend as the simulator (kind `sim`), a full run as the spec says."""
    out = []
    declared = {b.name: b.kind for b in run.spec.backends}
    for bi in run.judged:
        kind = bi.evidence.entry.get("kind")
        want = "sim" if run.rehearsal else declared.get(bi.name)
        if kind is not None and want is not None and kind != want:
            flag = "true" if run.rehearsal else "false"
            out.append(f"backend {bi.name} is recorded as kind {kind} but the manifest says rehearsal = {flag}"
                       f" (the spec declares kind {declared.get(bi.name)}): the run's record contradicts itself")
    return out


def _still_writing(run: JudgedRun) -> bool:
    """Whether a run holds the directory's lock (verify's V203): its writer is alive."""
    return any(f.code == "V203" for f in run.evidence.integrity.incomplete)


def _backend_problems(bi: BackendIndex, run: JudgedRun) -> list[Instance]:
    """What is wrong with one backend's evidence, before its levels."""
    out: list[Instance] = []
    be = bi.evidence
    here = backend_here(bi.name)
    for rel in be.partial_tail:
        if not run.partial:
            out.append(problem(f"{rel} ends in a cut-off line (the writer was killed)", here))
        elif _still_writing(run):  # the last write of a file still being written: its whole lines are judged
            out.append(problem(f"{rel} ends in a line still being written (the run holds the .lock)", here, "inconclusive"))
        else:
            out.append(problem(f"{rel} ends in a cut-off line (no process holds the .lock: the writer was killed)",
                               here, "inconclusive"))
    for p in be.problems[:MAX_SHOWN]:
        out.append(problem(f"unusable evidence: {p}", here))
    if be.problem_count > MAX_SHOWN:
        out.append(problem(f"... and {be.problem_count - MAX_SHOWN} more unusable rows", here))
    for note in be.mislabeled:
        out.append(problem(f"malformed evidence: {note}", here))
    aborted = be.entry.get("aborted_reason")
    if aborted:
        out.append(problem(f"backend {bi.name} was aborted: {aborted}", here))
    if bi.orphans:
        out.append(problem(f"{plural(len(bi.orphans), 'measured request')} belong to no level the manifest lists", here))
    dups = duplicate_ids(bi.all_records)
    if dups:
        out.append(problem(f"{plural(len(dups), 'request id')} recorded more than once (first: {dups[0]})", here))
    return out


def duplicate_ids(rows: Rows) -> list[str]:
    """The request ids of `rows` recorded more than once, sorted. For one whole table, the
    groups trace matching found (`aux["repeated"]`), else its `IdIndex`'s; otherwise through
    their hashes (8 bytes a request, sorted), not a set of every id: only ids whose hash
    repeats are compared as text."""
    if len(rows.parts) == 1 and len(rows.parts[0][1]) == rows.parts[0][0].n:
        t = rows.parts[0][0]  # one whole table (the usual case): its index's repeated ids
        groups = t.aux.get("repeated")  # found by trace matching (`rederive`), where the index was at hand
        if groups is None and isinstance(t.ids, IdColumn):
            groups = IdIndex(t.ids).repeated()
        if groups is not None:
            return sorted({str(t.ids[g[0]]) for g in groups})
    hashes = []
    for t, idx in rows.parts:
        ids = t.ids if len(idx) == t.n else [t.ids[i] for i in idx.tolist()]  # a whole table: in any order
        hashes.append(np.fromiter(map(hash, ids), dtype=np.int64, count=len(ids)))
    if not hashes:
        return []
    h = hashes[0] if len(hashes) == 1 else np.concatenate(hashes)
    del hashes
    h.sort()  # in place: no second array of every hash
    suspect: set[int] = set()
    step = table_module.SCAN_CHUNK
    for a in range(0, max(len(h) - 1, 0), step):  # equal neighbours, a slice at a time (overlapping by one)
        part = h[a:a + step + 1]
        suspect.update(part[1:][part[1:] == part[:-1]].tolist())
    if not suspect:
        return []
    seen: set[str] = set()
    dups: set[str] = set()
    for t, idx in rows.parts:
        for rid in (t.ids if len(idx) == t.n else [t.ids[i] for i in idx.tolist()]):
            if hash(rid) in suspect:
                if rid in seen:
                    dups.add(str(rid))
                seen.add(rid)
    return sorted(dups)


def _missing_level(run: JudgedRun, name: str, plv: Level) -> Location:
    label = run.plan_label(plv)
    return Location(name, plv.workload, plv.index, label, text=f"backend {name}, {label}")


def _window_problems(lv: LevelIndex, plv: Level, lloc: Location) -> list[Instance]:
    """Bucket windows that are not the plan's (a bucket is measure_start + its planned start,
    for its planned length) and requests that started outside their bucket's window."""
    out: list[Instance] = []
    planned = {pb.index: pb for pb in plv.buckets}
    ms = lv.measure_start
    stray: list[tuple[str, float, int]] = []
    listed = [w for w in lv.buckets if w.planned]
    # a level cut short (completed = false) ends its last bucket where it stopped: shorter, not wrong
    # and so does a count-bounded level that sent its count: it ended with its last request
    by_count = lv.ended_by_count  # implies completed = true
    cut = listed[-1].index if listed and (lv.entry.get("completed") is not True or by_count) else None
    for w in lv.buckets:
        pb = planned.get(w.index)
        if pb is None or not w.planned or w.start is None or w.end is None:
            continue
        length = w.end - w.start
        # ended by its count, the last bucket ends at the level's drain: longer than planned too
        # where requests queued behind max_concurrency (or a slow last one) were served after it
        cut_here = w.index == cut and 0 <= length and (by_count or length <= pb.length_s + WINDOW_TOLERANCE_S)
        if abs(length - pb.length_s) > WINDOW_TOLERANCE_S and not cut_here:
            out.append(problem(f"bucket {w.index}'s window is {format_duration(length)} long, but the plan's bucket is {format_duration(pb.length_s)}", lloc))
        elif ms is not None and abs(w.start - (ms + pb.start_s)) > WINDOW_TOLERANCE_S:
            out.append(problem(f"bucket {w.index}'s window starts {format_duration(w.start - ms)} after the measured start, "
                               f"but the plan puts it at {format_duration(pb.start_s)}", lloc))
        if w.planned_length_s is not None and abs(w.planned_length_s - pb.length_s) > WINDOW_TOLERANCE_S:
            out.append(problem(f"bucket {w.index} records a planned length of {format_duration(w.planned_length_s)}, "
                               f"but the plan's bucket is {format_duration(pb.length_s)}", lloc))
        lo, hi = w.start - RECORD_TOLERANCE_S, w.end + RECORD_TOLERANCE_S
        outside = w.records.where(lambda t, idx: ~np.isnan(rt := t.req_time(idx)) & ((rt < lo) | (rt > hi)),
                                  lambda r: (t := req_time(r)) is not None and not (lo <= t <= hi))
        stray.extend((str(r.get("request_id")), req_time(r), w.index) for r in outside)
    if stray:
        rid, t, b = stray[0]
        out.append(problem(f"{plural(len(stray), 'request')} started outside the window of the bucket they name "
                           f"(first: {rid} at {clock(t)} UTC, bucket {b})", lloc))
    return out


LEVEL_KEYS = ("mode", "concurrency", "rate", "batch_requests", "phase", "shape", "deadline_s")  # what a level ran


def _plain(v):
    """`v` as the manifest's JSON holds it (tuples as lists), a replay's trace by its content
    (`plan.shape_identity`: its `source` path depends on where the spec was read from)."""
    return shape_identity(json.loads(json.dumps(v)))


def _same(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        nums = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b))
        return nums and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def _show(key: str, v) -> str:
    if key == "deadline_s" and isinstance(v, (int, float)) and not isinstance(v, bool):
        return format_duration(v)
    return json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else str(v)


def _load_problems(lv: LevelIndex, plv: Level, lloc: Location) -> list[Instance]:
    """A level of the evidence that is not the planned level of its index: the run sent another
    load (concurrency, rate, phase, shape) or applied another deadline than the spec judged
    with plans (`gate --spec` with a level list, load or deadline edited). Judged as the planned
    level, it would speak of a load that never ran. A field the manifest does not record (older
    evidence) is not compared."""
    want = plv.to_json()
    differ = [f"{k.removesuffix('_s')} {_show(k, lv.entry[k])} (the spec plans {_show(k, want.get(k))})"
              for k in LEVEL_KEYS if k in lv.entry and not _same(_plain(lv.entry[k]), _plain(want.get(k)))]
    cap, planned_cap = lv.entry.get("max_concurrency"), want.get("max_concurrency")
    if cap != planned_cap:  # absent: no cap (evidence from before the key had none either)
        differ.append(f"max_concurrency {cap or 'none'} (the spec plans {planned_cap or 'none'})")
    think, planned_think = [lv.entry.get(k) for k in ("think_time", "think_seed")], [want.get(k) for k in ("think_time", "think_seed")]
    if not _same(_plain(think), _plain(planned_think)):  # absent: no think time (as every run before the key)
        differ.append(f"think_time {_show('think_time', think[0]) if think[0] else 'none'} seed {think[1] or 0} (the spec plans "
                      f"{_show('think_time', planned_think[0]) if planned_think[0] else 'none'} seed {planned_think[1] or 0})")
    count, planned_count = lv.entry.get("requests_per_level"), want.get("requests_per_level")
    if count != planned_count:  # absent: the level ran for its duration (as all did before the key)
        differ.append(f"requests_per_level {count or 'none (timed)'} (the spec plans {planned_count or 'none (timed)'})")
    least, planned_least = lv.entry.get("min_duration_s"), want.get("min_duration_s")
    if not _same(_plain(least), _plain(planned_least)):  # absent: it ended at its count (as every run before the key)
        said = [format_duration(x) if isinstance(x, int | float) and not isinstance(x, bool) else "none" for x in (least, planned_least)]
        differ.append(f"min_duration {said[0]} (the spec plans {said[1]})")
    warm, planned_warm = lv.entry.get("warmup_requests"), want.get("warmup_requests")
    if warm != planned_warm:  # absent: a timed warmup (as every run before the key)
        differ.append(f"a warmup of {f'{warm} requests' if warm else 'a duration'} (the spec plans "
                      f"{f'{planned_warm} requests' if planned_warm else 'a duration'})")
    ran_on, planned_on = _arrivals(lv.entry.get("schedule")), _arrivals(want.get("schedule"))
    if ran_on is not None and planned_on is not None and ran_on != planned_on:  # absent: evidence from before the key
        differ.append(f"arrival {_arrivals_text(ran_on)} (the spec plans {_arrivals_text(planned_on)})")
    ran_for = _ran_duration(lv, plv)
    if ran_for is not None:
        differ.append(f"a planned duration of {format_duration(ran_for)} (the spec plans {format_duration(plv.duration_s)})")
    if not differ:
        return []
    return [problem(f"level {lv.index} of workload {lv.workload} ran with {', '.join(differ)}: not the level the spec "
                    f"plans ({plv.label}), so its evidence cannot be judged as that level", lloc)]


def _arrivals(s: Any) -> tuple | None:
    """What an open loop's `schedule` entry (rate aside: LEVEL_KEYS compares it) fixes of its
    arrivals: (arrival, seed, burstiness) -- constant arrivals use neither seed nor burstiness
    (`arrivals.schedule`), so they are left out of its identity; None for a level without the
    entry (a closed loop, evidence from before the schedule proof), which is not compared."""
    if not isinstance(s, Mapping):
        return None
    if s.get("arrival") != "poisson":
        return (s.get("arrival"), None, None)
    b = s.get("burstiness")
    return ("poisson", s.get("seed"), float(b) if isinstance(b, (int, float)) and not isinstance(b, bool) else b)


def _arrivals_text(a: tuple) -> str:
    """`constant`, `poisson seed 7`, `poisson seed 7 burstiness 0.5`."""
    arrival, seed, b = a
    if arrival != "poisson":
        return str(arrival)
    return f"poisson seed {seed}" + (f" burstiness {b:g}" if isinstance(b, float) and b != 1.0 else "")


def _ran_duration(lv: LevelIndex, plv: Level) -> float | None:
    """The duration the run planned a level for (its manifest's `planned_duration_s`) where it is
    not the one the spec judging it plans (`gate --spec` with a longer or shorter level); None
    when they agree or the manifest does not record it."""
    d = lv.entry.get("planned_duration_s")
    if not isinstance(d, (int, float)) or isinstance(d, bool) or _same(float(d), float(plv.duration_s)):
        return None
    return float(d)


def _bucket_span(indexes: list[int]) -> str:
    """`bucket 5`, `buckets 3-5`, `buckets 1, 4` (indexes ascending)."""
    if len(indexes) == 1:
        return f"bucket {indexes[0]}"
    if indexes == list(range(indexes[0], indexes[-1] + 1)):
        return f"buckets {indexes[0]}-{indexes[-1]}"
    return "buckets " + ", ".join(map(str, indexes))


def _level_problems(bi: BackendIndex, lv: LevelIndex, plv: Level | None = None, partial: bool = False,
                    client_cut: str | None = None) -> list[Instance]:
    """What is wrong with one planned level that ran (`partial`: judged up to its last closed
    bucket, so buckets not closed yet are not a fault; `client_cut`: why a timing abort on the
    client's own lag cut it (`ClientCut`), so being cut short is inconclusive, not a fault)."""
    out: list[Instance] = []
    lloc = loc(level_scope(bi, lv))
    if plv is not None:
        out.extend(_load_problems(lv, plv, lloc))
        out.extend(_window_problems(lv, plv, lloc))
    if lv.entry.get("completed") is not True and not partial:
        out.append(problem("the level did not run its full duration (completed = false)" + (f": {client_cut}" if client_cut else ""),
                           lloc, "inconclusive" if client_cut else "fail"))
    if plv is not None:
        listed = {w.index for w in lv.buckets if w.planned}
        missing = [pb.index for pb in plv.buckets if pb.index not in listed]
        if missing and partial:
            out.append(problem(f"{_bucket_span(missing)} of {len(plv.buckets)} not closed yet (the run is still going, "
                               "or was killed)", lloc, "inconclusive"))
        elif missing and _ran_duration(lv, plv) is None and not lv.ended_by_count:  # (a run that planned it shorter: `_load_problems` says so)
            out.append(problem(f"{_bucket_span(missing)} of {len(plv.buckets)} not measured: the level was cut short"
                               + (f" in bucket {max(listed)}" if listed else " before its first bucket")
                               + (f": {client_cut}" if client_cut else ""), lloc, "inconclusive" if client_cut else "fail"))
    out.extend(_count_problems(lv, lloc, partial))
    out.extend(_admitted_problems(lv, lloc))
    if not partial or lv.entry.get("completed") is True:  # (a level still going may not have written its count yet)
        out.extend(_warmup_problems(bi, lv, lloc))
    sent = lv.entry.get("sent")
    if isinstance(sent, int) and not isinstance(sent, bool):
        have = bi.recorded.get((lv.workload, lv.index), 0)
        if have < sent:
            out.append(problem(f"{sent} requests were sent but only {have} recorded: {sent - have} records are lost", lloc))
        elif have > sent:
            out.append(problem(f"{have} requests recorded but the run counted {sent} sent", lloc))
    for w in lv.buckets:
        if not w.planned and w.records:
            out.append(problem(f"{plural(len(w.records), 'request')} name bucket {w.index}, which the manifest does not list", lloc))
    return out


def _count_problems(lv: LevelIndex, lloc: Location, partial: bool = False) -> list[Instance]:
    """A count-bounded level (`requests_per_level`) that did not record its count: its duration
    (the bound) ended it first, or it was cut short -- not the level the spec asked for, however
    its requests went -- or one that recorded more than it asked."""
    c = lv.count_sent
    if c is None or (partial and lv.entry.get("completed") is not True):
        return []
    sent, n = c
    unsent = lv.not_sent
    if sent < n and lv.ended_by_count:  # n recorded, some never sent (an open loop's arrivals)
        return [problem(f"the level sent {sent} of its {n} requests (requests_per_level): the load generator could not "
                        f"send {unsent} (see client_healthy), so it is not complete", lloc)]
    if sent < n:
        bound = num_(lv.entry.get("planned_duration_s"))
        by = f"its duration bound ({format_duration(bound)})" if bound is not None and lv.entry.get("completed") is True else "being cut short"
        also = f" ({unsent} more the load generator could not send)" if unsent else ""
        return [problem(f"the level ended by {by} with {sent} of its {n} requests sent (requests_per_level){also}: "
                        "not complete", lloc)]
    least = num_(lv.entry.get("min_duration_s"))
    if sent > n and least is None:  # a min_duration sends on past N until it has passed
        return [problem(f"{sent} measured requests recorded, more than the level's requests_per_level of {n}", lloc)]
    ms, me = lv.measure_start, lv.measure_end
    if least is not None and sent == n and ms is not None and me is not None and me - ms < least - 1e-6 \
            and not _schedule_ends_at_count(lv.entry, n):
        # exactly N sent, and its window ended before its minimum: a level that runs on to its minimum
        # sends past N while it is not over (closed loop: a free worker takes another; open loop: the
        # next arrival due before it), and one whose N-th came after it ends after it -- so this one
        # stopped short, unless its schedule holds no arrival after the N-th before the minimum's end
        return [problem(f"the level ended {format_duration(me - ms)} into its measured window, before its min_duration "
                        f"({format_duration(least)}), with its {n} requests sent: not complete", lloc)]
    return []


def _schedule_ends_at_count(entry: Mapping[str, Any], n: int) -> bool:
    """Whether an open loop that sent exactly its `n` and drained before its min_duration sent
    every arrival its schedule holds: the runner sends the arrivals due before measure_start + D
    (`Quota.first`), so where the schedule's (n+1)-th measured arrival is due at or after it --
    constant arrivals with n = rate x D (the next is due exactly at m + D), a Poisson or gamma
    count that drew exactly n there -- the level is complete with n, and drains inside D.
    Rebuilt from the manifest's schedule (`schedproof.measured_arrivals`, the runner's own
    function). An open loop whose manifest does not determine its schedule (no `schedule`
    entry, a ramp) leaves its next arrival unrecorded -- an arrival never sent has no record --
    so the records cannot show it was due before D: not called short (its schedule proof says
    why it is unproven, in client_healthy). A closed loop always can: a worker free before D
    takes another place (`Quota.take`), so one that stopped at n before D stopped short."""
    if entry.get("mode") != "open":
        return False
    k = schedproof.measured_arrivals(entry)
    return k is None or k <= n


def _admitted_problems(lv: LevelIndex, lloc: Location) -> list[Instance]:
    """Records that say they waited for a slot under max_concurrency (`admitted`) in a level that
    declares none: the runner never writes that, and `schedule_lag` counts from `admitted`, so
    such records would hide the load generator's own lateness from client_healthy."""
    if capped(lv.entry):
        return []
    n = int(np.count_nonzero(~np.isnan(lv.records.floats("admitted"))))
    if not n:
        return []
    return [problem(f"{plural(n, 'record')} carry admitted (a wait for a slot under max_concurrency), but the level "
                    "declares no max_concurrency: not what the runner writes, and it would hide the load "
                    "generator's schedule lag", lloc)]


def _warmup_problems(bi: BackendIndex, lv: LevelIndex, lloc: Location) -> list[Instance]:
    """A counted warmup whose records disagree with its manifest's `warmup_sent` (the sum over
    the processes under --workers): a fault of the evidence, as `sent` against the records is
    (`_level_problems`), not a note -- the verdict's short-warmup note (judge.py
    `_short_warmups`) trusts that count, so evidence that contradicts it must not pass.
    Counted by the runner's rule (runner/load.py): a record of the level's warmup (bucket -1)
    with a start (sent) that the backoff gate did not hold back."""
    n = lv.entry.get("warmup_sent")
    if type(n) is not int:  # a timed warmup, or evidence from before counted warmups
        return []
    have = _warmup_recorded(bi.all_records, lv.workload, lv.index)
    if have == n:
        return []
    return [problem(f"its counted warmup recorded {plural(have, 'sent request')}, but the manifest says it sent {n} "
                    "(warmup_sent): the evidence and the manifest disagree", lloc)]


def _warmup_recorded(recs: Rows, workload: str, level: int) -> int:
    """The requests of `recs` that a level's counted warmup sent (see `_warmup_problems`)."""
    def held(e: Any) -> bool:
        return isinstance(e, str) and e.startswith(HELD_BACK)

    def col(t, idx) -> np.ndarray:
        return ((t.i["bucket"][idx] == WARMUP_BUCKET) & (t.i["level"][idx] == level) & t.label_is("workload", workload, idx)
                & ~np.isnan(t.f["start"][idx]) & ~t.label_where("error", held, idx))

    def row(r) -> bool:
        return (r.get("bucket") == WARMUP_BUCKET and r.get("level") == level and r.get("workload") == workload
                and r.get("start") is not None and not held(r.get("error")))
    return recs.count(col, row)


def _planned_backend_problems(run: JudgedRun, name: str, bp: BackendPlan, cuts: Mapping[str, ClientCut]) -> list[Instance]:
    bi = run.backends.get(name)
    cut = cuts.get(name)
    if bi is None:
        if run.evidence.manifest.get("status") == "running":  # never finalized: what it recorded is not listed yet
            return [problem("its evidence was not read: the run is incomplete (status running: still going, or killed) "
                            "and its manifest lists no backend yet; `soakspec gate --partial` judges what it recorded",
                            backend_here(name))]
        return [problem(f"backend {name} did not run (no evidence for it)", backend_here(name))]
    out = _backend_problems(bi, run)
    for plv in bp.levels:
        lv = run.level(name, plv)
        if lv is None and run.partial:
            out.append(problem(f"{run.plan_label(plv)} has closed no bucket yet (the run is still going, or was killed)",
                               _missing_level(run, name, plv), "inconclusive"))
        elif lv is None and cut is not None and cut.covers(bp, plv):
            out.append(problem(f"{run.plan_label(plv)} did not run: {cut.why}", _missing_level(run, name, plv), "inconclusive"))
        elif lv is None:
            out.append(problem(f"{run.plan_label(plv)} did not run", _missing_level(run, name, plv)))
        else:
            out.extend(_level_problems(bi, lv, plv, run.partial, cut.why if cut is not None and cut.covers(bp, plv) else None))
    return out


def completed_run_problems(run: JudgedRun) -> list[Instance]:
    out = _run_problems(run)
    cuts = client_cuts(run)
    for name, bp in run.planned.items():
        out.extend(_planned_backend_problems(run, name, bp, cuts))
    return out


def completed_run(run: JudgedRun, rule: Rule | None) -> RuleResult:
    insts = completed_run_problems(run)
    n_req = sum(len(bi.measured) for bi in run.judged)
    n_lv = sum(len(bp.levels) for bp in run.planned.values())
    msg = f"run complete: {plural(len(run.planned), 'backend')}, {plural(n_lv, 'level')}, {plural(n_req, 'measured request')}"
    if run.restricted:
        msg += f" (restricted to {', '.join(run.restricted)}" + (f"; not run: {', '.join(run.not_run)})" if run.not_run else ")")
    if rule is None:
        # built in: a broken run cannot support a verdict either way
        insts = [Instance("inconclusive", i.where, None, None, None, i.message) for i in insts]
        return result(None, "completed_run", "validity", "require", insts, msg, 1)
    return result(rule, "completed_run", "validity", rule.severity, insts, msg, 1)


def full_scale_run(run: JudgedRun, rule: Rule | None = None) -> RuleResult:
    what = []
    if run.rehearsal:
        what.append("a rehearsal against the simulator")
    else:
        declared = {b.name: b.kind for b in run.spec.backends}
        sims = [bi.name for bi in run.judged if bi.evidence.entry.get("kind") == "sim" and declared.get(bi.name) != "sim"]
        if sims:
            what.append(f"a run against the simulator (backend {', '.join(sims)} recorded as kind sim, though the manifest says rehearsal = false)")
    if run.time_scale != 1:
        what.append(f"time-scaled by {run.time_scale:g}")
    if not what:
        scope = "the declared backends"
        if run.restricted:
            scope = f"backend{'s' if len(run.restricted) != 1 else ''} {', '.join(run.restricted)} only" + (
                f" (restricted with --backend; not run: {', '.join(run.not_run)})" if run.not_run else "")
        return result(None, "full_scale_run", "validity", "require", [], f"a full-scale run against {scope}", 1)
    desc = " and ".join(what)
    if run.gate.allow_rehearsal:
        return result(None, "full_scale_run", "validity", "require", [], f"{desc}; the gate allows rehearsals (allow_rehearsal)", 1)
    inst = problem(f"the run is {desc}: it says nothing about the real backends at full duration (the gate would need allow_rehearsal = true)",
                   status="inconclusive")
    return result(None, "full_scale_run", "validity", "require", [inst], "", 1)


def _worker_floor(plv: Level) -> int:
    """The completed requests a closed or batch level needs: its plan's minimum (one a worker,
    one batch) -- a count-bounded closed loop at most one a worker too, though its plan's floor
    is its N (`plan._levels`): that N counts requests sent, and the ones that failed are the
    failure rules' to judge, not too few samples (as the level was judged before the plan's
    floor said N)."""
    n, c = plv.requests_per_level, plv.concurrency
    return plv.min_requests if n is None or c is None else min(plv.min_requests, c, n)


def _level_samples(run: JudgedRun, bi: BackendIndex, plv: Level, lv: LevelIndex) -> list[Instance]:
    """Too few completed requests in a level, or a planned bucket with none."""
    out: list[Instance] = []
    need = max(run.gate.min_samples, 1 if plv.mode == "open" else _worker_floor(plv))
    have = len(completed(lv.records))
    where = loc(level_scope(bi, lv))
    if have < need:
        out.append(Instance("inconclusive", where, float(have), None, have,
                            f"{plural(have, 'completed request')}; needs {need - have} more (at least {need})", need - have))
    planned = {pb.index for pb in plv.buckets}
    for w in lv.buckets:
        if w.index in planned and not completed(w.records):
            # an open loop's bucket that no arrival fell in: its schedule's doing, not a server
            # that failed what it was sent (check's W517 warns of it before the run)
            why = " (no arrival of the open loop's schedule fell in it: lengthen the bucket or raise the rate; see W517)" \
                if plv.mode == "open" and not len(w.records) else ""
            out.append(Instance("inconclusive", loc(bucket_scope(bi, lv, w)), 0.0, None, 0,
                                f"no completed request in the bucket: it measured nothing{why}", 1))
    return out


def min_samples(run: JudgedRun, rule: Rule | None = None) -> RuleResult:
    insts: list[Instance] = []
    fewest: tuple[int, str] | None = None
    count = 0
    for name, bp in run.planned.items():
        bi = run.backends.get(name)
        if bi is None:
            continue
        for plv in bp.levels:
            lv = run.level(name, plv)
            if lv is None:
                continue
            count += 1
            have = len(completed(lv.records))
            if fewest is None or have < fewest[0]:
                fewest = (have, loc(level_scope(bi, lv)).text)
            insts.extend(_level_samples(run, bi, plv, lv))
    if not count:  # no level the spec plans is in the evidence: nothing was sampled, which is no pass
        insts.append(problem("no level the spec plans is in the evidence: nothing was measured", status="inconclusive"))
    msg = "every level has enough completed requests, every bucket at least one" + (f" (fewest: {fewest[0]} in {fewest[1]})" if fewest else "")
    return result(None, "min_samples", "validity", "require", insts, msg, count)


def abort_fired(run: JudgedRun, rule: Rule | None = None) -> RuleResult | None:
    """An abort rule stopped the run's load (the manifest's `aborts`, written by the runner's
    `runner/abort.py`): FAIL, naming the rule, where and when it fired and what it saw. A run
    with no abort has nothing to judge here (None: no result). A malformed `aborts` entry is
    still an abort: a run that says it aborted never passes.

    An abort on a timing metric (CLIENT_SENSITIVE: ttft, latency, tpot, schedule_lag, timeouts)
    whose bucket or window overlaps, on the run clock, a bucket where the load generator was
    saturated (`client_saturation`, by the gate's thresholds; `client_healthy = false` turns this
    off) is INCONCLUSIVE, not a FAIL: the values it fired on hold the client's own lag (a client
    stalled 1.2 s reads a 23 ms server's TTFT p95 as 1.1 s), as a timing rule's FAIL beside a
    saturated bucket is (`client_blocks`). The saturated bucket may be of another level or
    backend (backends that run at once share the client); one at another time does not make the
    abort inconclusive. So is a ttft or latency abort in an open loop whose window's same
    statistic less the client's own lateness -- from the actual send; under max_concurrency,
    with the slot queue replayed on time, the cap's own wait kept -- does not fire
    (`abort_lag_decided`):
    the load generator's own schedule lag, within client_schedule_lag, carried it over, as a
    require rule's CLIENT_LAG instance. The runner cannot tell either live and stops the load
    all the same -- a stopped load never hammers a server -- so the run is never a PASS either."""
    aborts = run.evidence.manifest.get("aborts")
    if not aborts:
        return None
    entries = aborts if isinstance(aborts, list) else [aborts]
    insts = []
    for a in entries:
        if not isinstance(a, dict):
            insts.append(problem(f"the manifest records an abort it cannot describe: {str(a)[:120]}"))
            continue
        level = a.get("level_label") or a.get("level")
        where = Location(backend=a.get("backend") if isinstance(a.get("backend"), str) else None, workload=a.get("workload"),
                         level=a.get("level") if isinstance(a.get("level"), int) else None, level_label=str(level),
                         bucket=a.get("index") if a.get("scope") == "bucket" and isinstance(a.get("index"), int) else None,
                         start=a.get("start"), end=a.get("end"),
                         text=f"backend {a.get('backend')}, {a.get('workload')} / {level}, {a.get('scope')} {a.get('index')}")
        seen = abort_observed_text(a)  # in the rule's unit: a ratio as a percentage
        limit = abort_observed_text({**a, "observed": a.get("threshold")})
        outcomes = a.get("outcomes") if isinstance(a.get("outcomes"), dict) else {}
        saw = outcomes_text(outcomes)  # what its requests were (absent from evidence before it was recorded)
        none = "" if outcomes.get("completed") else ", none completed"
        what = (f"abort rule '{a.get('rule')}' fired: observed {seen} over {a.get('requests')} requests "
                f"(threshold {a.get('op')} {limit})" + (f"; {a.get('requests')} requests{none}: {saw}" if saw else "")
                + "; the rest of the load was not run")
        client = abort_on_client(run, a)
        if client:
            insts.append(problem(f"{what}; not judged a failure: {client}", where, status="inconclusive"))
            continue
        insts.append(problem(what, where))
    return result(None, "abort_fired", "validity", "require", insts, "", len(entries))


@dataclasses.dataclass(frozen=True)
class ClientCut:
    """A backend's load stopped by a timing abort that fired on the load generator's own lag
    (`abort_fired` judges it INCONCLUSIVE): the level it fired in (`workload`, `level`) was cut,
    the later levels and the follow-up never ran. What the cut left undone is the client's
    doing, not the server's, so the checks that would FAIL the run for it -- completed_run,
    duration_coverage, follow_up, even under the spec's `require` -- are INCONCLUSIVE there,
    saying why (`why`); a count or ratio abort's cut is the server's and still FAILs them."""

    workload: Any
    level: Any
    why: str

    def covers(self, bp: BackendPlan, plv: Level) -> bool:
        """Whether the cut left `plv` undone: the level it fired in, or one after it in `bp`'s order."""
        at = next((i for i, p in enumerate(bp.levels) if (p.workload, p.index) == (self.workload, self.level)), None)
        return at is not None and bp.levels.index(plv) >= at


def client_cuts(run: JudgedRun) -> dict[str, ClientCut]:
    """The backends whose load a timing abort fired on the client's own lag stopped (by name):
    those `abort_fired` judges INCONCLUSIVE, by the same decision (`_abort_blame`)."""
    aborts = run.evidence.manifest.get("aborts")
    out: dict[str, ClientCut] = {}
    for a in (aborts if isinstance(aborts, list) else [aborts] if aborts else []):
        if not isinstance(a, dict) or not isinstance(a.get("backend"), str):
            continue
        blame = _abort_blame(run, a)
        if blame is not None:
            out[a["backend"]] = ClientCut(a.get("workload"), a.get("level"),
                                          f"the load was stopped by abort rule '{a.get('rule')}', which fired on the load "
                                          f"generator's own lag ({blame.how}; see abort_fired), not the server's")
    return out


@dataclasses.dataclass(frozen=True)
class AbortBlame:
    """Why a fired abort is the load generator's (`_abort_blame`): `how` in a few words, for a
    cut's note ("saturated in bucket 1 (...)", "its schedule lag decided it"), and `why`, the
    whole reason, after "not judged a failure: " (`abort_on_client`)."""

    how: str
    why: str


def _abort_blame(run: JudgedRun, a: Mapping[str, Any]) -> AbortBlame | None:
    """The one decision whether a fired abort is the client's: a timing abort
    (CLIENT_SENSITIVE) beside a saturated bucket (`abort_client_saturated`), else a ttft or
    latency abort its schedule lag within the allowance decided (`abort_lag_decided`); None:
    the server's. `abort_on_client` says its `why`, `client_cuts` its `how`."""
    if a.get("metric") not in CLIENT_SENSITIVE:
        return None
    saturated = abort_client_saturated(run, a)
    if saturated:
        return AbortBlame(f"saturated in {saturated}", f"the load generator was saturated in {saturated}, so the "
                                                        f"{a.get('metric')} values it fired on hold the client's own lag")
    lag = abort_lag_decided(run, a)
    return AbortBlame("its schedule lag decided it", lag) if lag else None


def abort_on_client(run: JudgedRun, a: Mapping[str, Any]) -> str | None:
    """Why a fired abort (a manifest `aborts` entry, or a sweep probe's `stopped_by`) is the
    load generator's, not the server's, or None: a timing abort beside a saturated bucket
    (`abort_client_saturated`), or one the schedule lag within its allowance decided
    (`abort_lag_decided`) -- `_abort_blame`, the decision `client_cuts` reads too. The text
    follows "not judged a failure: "."""
    blame = _abort_blame(run, a)
    return blame.why if blame is not None else None


_ABORT_STAT = re.compile(r"\s*(?:abort\s+)?(\w+)\s*\(")


def _abort_stat(a: Mapping[str, Any]) -> tuple[str, float | None] | None:
    """(agg, percentile) of a distribution abort (p with its percentile, mean, min, max), from
    its entry or, before the entry held them, its rule's text; None for any other."""
    agg, q = a.get("agg"), num_(a.get("percentile"))
    if not isinstance(agg, str):
        m = _ABORT_STAT.match(str(a.get("rule") or ""))
        name = m.group(1) if m else ""
        p = re.fullmatch(r"p(\d+(?:\.\d+)?)", name)
        agg, q = ("p", float(p.group(1))) if p else (name, None)
    if agg == "p" and q is not None and 0 <= q <= 100:
        return "p", q
    return (agg, None) if agg in ("mean", "min", "max") else None


def abort_lag_decided(run: JudgedRun, a: Mapping[str, Any]) -> str | None:
    """Why a ttft or latency abort (a manifest `aborts` entry, or a sweep probe's `stopped_by`)
    fired on the load generator's own schedule lag, or None: in an open loop, the same
    statistic of the same requests -- those the runner judged, the ones its window scheduled
    (`scope.window_rows`, by intended start, as `runner/abort.py` cuts them) -- less the
    client's own lateness (`performance.lag_figure`: from the actual send, sent_ttft and
    sent_latency; at a level under max_concurrency with the level's slot queue replayed as an
    on-time client would have driven it, `judge/capreplay.py`: the wait the user's cap itself
    makes kept) does not fire, while the same figure from the intended start
    over them does (the records bear the abort out): what carried them over the threshold was
    the client's lateness, within client_schedule_lag (a saturated bucket is
    `abort_client_saturated`'s). Measured with the judge's own measures, as
    `performance._lag_decided` measures a require rule's failing instance again. None too
    where that figure fires as well (the server's own time, or the cap's wait), where either
    cannot be computed or the records' own figure does not fire (then nothing shows the lag
    made the difference; missing data is never the client's excuse), and where `lag_figure`
    says the lag cannot decide (a closed loop, the gate's `client_healthy = false`). The
    runner's firing is unchanged: it stops the load all the same; only whose fault it was is
    judged here."""
    from soakspec.judge.performance import lag_figure
    from soakspec.judge.registry import metric
    from soakspec.judge.scope import Scope, window_rows

    stat = _abort_stat(a)
    start, end, threshold, op = num_(a.get("start")), num_(a.get("end")), num_(a.get("threshold")), a.get("op")
    if stat is None or op not in OPS or start is None or end is None or threshold is None or end < start:
        return None
    found = next(((bi, lv) for bi in run.judged if bi.name == a.get("backend") for lv in bi.levels
                  if (lv.workload, lv.index) == (a.get("workload"), a.get("level"))), None)
    fig = lag_figure(run.gate.client_healthy, str(a.get("metric")), [found[1]]) if found is not None else None
    if fig is None:
        return None
    bi, lv = found
    sc = Scope("window", (bi,), window_rows(lv.records, [start], end)[0], (), lv, None, start, end)
    agg, q = stat
    mine = metric(str(a.get("metric"))).measure(sc, agg, q, confidence=run.gate.confidence).value
    less = fig.impl.measure(sc, agg, q, confidence=run.gate.confidence).value
    if mine is None or less is None or not OPS[op](mine, threshold) or OPS[op](less, threshold):
        return None
    lag = metric("schedule_lag").measure(sc, agg, q, confidence=run.gate.confidence).value
    name = f"p{q:g}" if q is not None else agg
    lag_text = "" if lag is None else f"; {name}(schedule_lag) = {format_duration(lag)}{fig.lag}"
    return (f"{LAG_DECIDED} ({fig.short} it is {format_duration(less)}: {name}({fig.name}) over the same "
            f"requests does not fire {op} {format_duration(threshold)}{lag_text})")


def abort_client_saturated(run: JudgedRun, a: Mapping[str, Any]) -> str | None:
    """Where and why the load generator was saturated in a bucket that overlaps, on the run
    clock, the window an abort fired on ("bucket 1: event-loop lag p99 1200 ms (limit 50 ms),
    ..."; a bucket of another level or backend -- backends that run at once share the client
    -- names its backend and level), or None: saturated in no bucket of that time, its health
    not judged (`client_healthy = false`, no client.jsonl), or the abort's times not recorded.
    As `client_blocks` weighs a timing rule's FAIL: by time, not by backend name. The abort's
    own level is looked at first."""
    if not run.gate.client_healthy or client_measured(run) != "":
        return None
    start, end = num_(a.get("start")), num_(a.get("end"))
    if start is None or end is None:
        return None
    mine = (a.get("backend"), a.get("workload"), a.get("level"))
    levels = [(bi, lv) for bi in run.judged for lv in bi.levels]
    levels.sort(key=lambda x: (x[0].name, x[1].workload, x[1].index) != mine)  # stable: the abort's own level first
    for bi, lv in levels:
        prev = None
        for w in lv.buckets:
            if w.start is not None and w.end is not None and w.start < end and start < w.end:
                row = client_bucket(bi, lv, w, prev)
                why = client_saturation(row, run.gate) if row is not None and row["samples"] else None
                if why:
                    other = (bi.name, lv.workload, lv.index) != mine
                    return f"bucket {row['bucket']}" + (f" of backend {bi.name}, {lv.label}" if other else "") + f" ({', '.join(why)})"
            prev = w
    return None


# ------------------------------------------------------------------------------ client health
#
# `client_healthy` (built in, on unless the gate says `client_healthy = false`): per bucket, the
# load generator's own health beside the server's numbers. A saturated client reports its own
# lag as the server's latency, so a bucket where it was saturated makes the run INCONCLUSIVE --
# never PASS -- and a timing rule's FAIL there is INCONCLUSIVE instead (`client_blocks`): a
# failing instance that overlaps the bucket in time, whichever backend it is of; one at another
# time stands, and so does the rule.
# Saturated, by the gate's thresholds (lang/spec.py `Gate`; defaults in parentheses):
#   event-loop lag p99 > client_lag (50 ms)   time-weighted over the bucket, pooled from its
#                                             windows (client.jsonl, runner/clienthealth.py)
#   client CPU >= client_cpu (95 %)           a load process's mean CPU over the bucket, of one core
#   schedule lag p99 > client_schedule_lag    open loop: start - intended_start of the bucket's
#     (50 ms)                                 requests
#   achieved concurrency < client_concurrency closed loop: mean requests in flight over the bucket
#     (75 %) of the offered                   (every request running in it, whichever bucket it
#                                             started in: measures.bucket_in_flight) / c
#                                             (a ramp's c: its mean target over the bucket),
#                                             plus the mean workers the backend's backoff held at
#                                             its gate (`held`, the samples' held_s / the bucket's
#                                             length): a server that refused or failed lowers the
#                                             concurrency by its own doing, not the client's;
#                                             a multi-turn level with think_time offers c less
#                                             the mean sessions thinking (`thinking`: each turn
#                                             after a conversation's first waited [start - its
#                                             think time, start), re-derived from the request's
#                                             conversation and turn and the manifest's seed)
# Why lag matters although arrivals carry the kernel's receive stamps: one read takes every
# segment that arrived meanwhile and gets the stamp of the last, so while the loop is L late the
# tokens that arrived in that time are stamped up to L late (and coalesce). A lag p99 of L means
# that for 1 % of the time the client's times may be L late: a p99 claim is no longer the server's.
# Also shown, not judged: the machine's CPU (host_cpu), the coalesced fraction of ITL gaps and,
# open loop, the achieved rate (requests whose actual start fell in the bucket, per second).
# A client late by less than client_schedule_lag is not saturated, but its lateness is in every
# open-loop ttft and latency; where it alone carries a failing instance over the threshold (the
# same figure from the send passes) that instance is the client's too (CLIENT_LAG, `client_blocks`).
# Missing data is never a pass: a run that measured its client (client.jsonl listed in the
# manifest, or there) with no sample for a bucket is INCONCLUSIVE, and so is a missing or empty
# client.jsonl. Evidence from before soakspec wrote client.jsonl is not judged (`client_measured`).

# metrics a saturated client distorts: their FAILs become INCONCLUSIVE (counts are the server's,
# but for `timeouts`: a timeout is a latency past the deadline, on the client's clock from the
# intended start, so an open loop behind its schedule or a loop that reads late times out
# requests the server answered in time)
CLIENT_SENSITIVE = frozenset({"ttft", "itl", "tpot", "latency", "sent_ttft", "sent_latency", "schedule_lag", "throughput",
                              "total_throughput", "qps", "in_flight", "coalesced",
                              "timeouts"})
# evidence checks a saturated client can fail by itself: a bucket that measured no completed
# request (`bucket_coverage`) beside a load generator that sent its arrivals late (past their
# deadline, which counts from the intended start), could not send them, or read every answer
# late. The server's own failures there are the count rules' (`failed == 0` still FAILs).
CLIENT_COVERAGE = frozenset({"bucket_coverage"})


def client_sensitive(expr: Expr) -> bool:
    """Whether a saturated client distorts the rule's figure: one of CLIENT_SENSITIVE or
    CLIENT_COVERAGE, or a goodput whose conditions name one (`goodput(ttft < 1s)` counts
    requests by their TTFT)."""
    return expr.metric in CLIENT_SENSITIVE or expr.metric in CLIENT_COVERAGE or any(s.metric in CLIENT_SENSITIVE for s in expr.slo)


# Per-request figures of a bucket, from the table's columns (vectorized; numpy over the
# bucket's rows) with the row form beside each for the rare requests kept as they were
# (`RequestTable.extras`): both give what the record-by-record definition gives, exactly.

def _sched_lag_row(r) -> float | None:
    """`record.schedule_lag`: a wait for a slot under the spec's max_concurrency is not the
    client's lateness (its queueing is the user's declared cap, counted in latency instead)."""
    return record_lag(num_(r.get("start")), num_(r.get("intended_start")), num_(r.get("admitted")))


def _lags(lv: LevelIndex, recs: Rows) -> np.ndarray:
    """An open-loop bucket's schedule lags. `admitted` counts only in a level that declares
    max_concurrency: elsewhere the runner never writes it, and an edited record's would hide the
    load generator's lateness (`_admitted_problems` names such records). Where it counts,
    `cap_kept` proves from the records that the runner kept to the cap, or client_healthy is
    INCONCLUSIVE."""
    if capped(lv.entry):
        return _values(recs, lambda t, idx: t.schedule_lag(idx), _sched_lag_row)
    return _values(recs, lambda t, idx: t.f["start"][idx] - t.f["intended_start"][idx],
                   lambda r: record_lag(num_(r.get("start")), num_(r.get("intended_start"))))


def _delay_row(r) -> float | None:
    return num_(r.get("client_delay"))


def _values(recs: Rows, col, row) -> np.ndarray:
    """One float per request of `recs` (NaN: none), without the NaNs."""
    v = recs.map(col, row)
    return v[~np.isnan(v)]


def _int_sum(recs: Rows, col, row) -> int:
    """sum(row(r) for r in recs), exactly: `col` (int64) over the ordinary rows, `row` over the others."""
    total = 0
    for t, idx in recs.parts:
        odd = t.odd(idx)
        total += int(np.sum(col(t, t.clean(idx) if len(odd) else idx), dtype=np.int64))
        total += sum(row(t.rec(i)) for i in odd.tolist())
    return total


def _gaps_col(t, idx) -> np.ndarray:
    return (t.itl_off[idx + 1] - t.itl_off[idx]).astype(np.int64)


def _gaps_row(r) -> int:
    itl = r.get("itl")
    return len(itl) if itl is not None else 0


def _coal_col(t, idx) -> np.ndarray:
    c = t.i["coalesced"][idx].astype(np.int64)
    return np.where(c == MISSING, 0, c)


def _coal_row(r) -> int:
    c = r.get("coalesced")
    return c if type(c) is int else 0


def _started_in(recs: Rows, start: float, end: float) -> int:
    return recs.count(lambda t, idx: (t.f["start"][idx] >= start) & (t.f["start"][idx] < end),
                      lambda r: (s := num_(r.get("start"))) is not None and start <= s < end)


# a request that reached the server and did not complete (never sent: the client's own failure)
_failed_sent = Columnar(lambda r: r.get("outcome") != "completed" and num_(r.get("start")) is not None,
                        lambda t, idx: ~t.label_is("outcome", "completed", idx) & ~np.isnan(t.f["start"][idx]))


def _offered(lv: LevelIndex, w, level_load: float) -> float:
    """What the level offered in bucket `w`: a ramp's (a phase's `ramp_to`) mean target over the
    bucket -- workers, or arrivals per second -- from the shape the run recorded; any other
    level's concurrency or rate (`level_load`). The level's `concurrency` / `rate` of a ramp is
    its peak: held against it, every bucket before the peak read as a client that fell short."""
    ramp = ramp_of(lv.entry.get("shape"))
    start, length = lv.measure_start, num_(lv.entry.get("planned_duration_s"))
    if ramp is None or start is None or length is None or length <= 0:
        return level_load
    return ramp.mean_between(max(0.0, w.start - start), max(0.0, w.end - start), length)


def think_of(lv: LevelIndex) -> tuple[float, float, int] | None:
    """A multi-turn level's think time as its run recorded it (the manifest's level entry:
    `think_time` [low, high] seconds and `think_seed`, plan.Level.to_json), or None."""
    think, seed = lv.entry.get("think_time"), lv.entry.get("think_seed")
    if not (isinstance(think, list) and len(think) == 2 and all(type(v) in (int, float) and 0 <= v < math.inf for v in think)):
        return None
    return float(think[0]), float(think[1]), seed if type(seed) is int and seed >= 0 else 0


def _think_col(think: tuple[float, float, int]):
    """Each request's think time before it (0: a first turn, or no turn), a `Columnar` pair."""
    low, high, seed = think

    def row(r) -> float:
        turn, conv = r.get("turn"), r.get("conversation")
        ok = type(turn) is int and type(conv) is int and turn >= 2 and conv >= 0
        return draws.think_s(low, high, seed, conv, turn) if ok else 0.0

    def col(t, idx) -> np.ndarray:
        turn, conv = t.i["turn"][idx].astype(np.int64), t.i["conversation"][idx].astype(np.int64)
        later = (turn >= 2) & (conv >= 0)
        drawn = low + (high - low) * draws.think_fraction_array(seed, np.maximum(conv, 0), np.maximum(turn, 0)) if high > low else low
        return np.where(later, drawn, 0.0)

    return col, row


def thinking(lv: LevelIndex, w) -> float | None:
    """The mean number of a multi-turn level's sessions thinking in bucket `w` (None: the level
    has no think time): each turn after a conversation's first waited its think time just before
    it started, [start - think, start), and the requests that can have waited in the bucket are
    those that started in it or up to the longest think time after it."""
    think = think_of(lv)
    if think is None or w.start is None or w.end is None or w.end <= w.start:
        return None
    recs = lv.started_between(w.start, w.end + think[1] + 1e-9)
    col, row = _think_col(think)
    start = recs.floats("start")
    wait = recs.map(col, row)
    ok = ~np.isnan(start) & (wait > 0)
    span = np.minimum(start[ok], w.end) - np.maximum(start[ok] - wait[ok], w.start)
    total = math.fsum(np.maximum(span, 0.0).tolist())
    stop = lv.measure_end
    if stop is not None and w.end > stop - think[1] - 1e-9:  # near the level's end: the waits no turn followed
        total += _tail_thinking(lv, think, stop, w.start, w.end)
    return total / (w.end - w.start)


def _tail_thinking(lv: LevelIndex, think: tuple[float, float, int], stop: float, a: float, b: float) -> float:
    """Session-seconds in [a, b) of the waits that ran into the level's end: a session whose last
    turn ended before the end with a think time that would carry past it sends nothing more (no
    request starts after the level's end), so no record follows to show its wait. Each worker's
    last request of the level: from its end, the think time its conversation's next turn draws,
    up to the end. (A session whose conversation was over would have begun its next at once, and
    that turn's record would be there.)"""
    recs = lv.records
    worker, start, end = recs.ints("worker"), recs.floats("start"), recs.floats("end")
    conv, turn = recs.ints("conversation"), recs.ints("turn")
    ok = (worker != MISSING) & ~np.isnan(start) & ~np.isnan(end) & (turn >= 1) & (conv >= 0)
    if not ok.any():
        return 0.0
    worker, start, end, conv, turn = worker[ok], start[ok], end[ok], conv[ok], turn[ok]
    order = np.lexsort((start, worker))
    last = order[np.r_[worker[order][1:] != worker[order][:-1], True]]  # each worker's latest start
    low, high, seed = think
    waits = low + (high - low) * draws.think_fraction_array(seed, conv[last], turn[last] + 1) if high > low else np.full(len(last), low)
    begin = end[last]
    finish = np.minimum(begin + waits, stop)
    span = np.minimum(finish, b) - np.maximum(begin, a)
    # a wait that ended before the level's end would have sent its turn: that session stopped
    # instead (a ramp's lowered target), and was not thinking
    return math.fsum(np.maximum(span[(begin < stop) & (begin + waits >= stop)], 0.0).tolist())


def client_bucket(bi: BackendIndex, lv: LevelIndex, w, prev=None) -> dict | None:
    """The load generator's health in one bucket (None: the bucket has no window)."""
    if w.start is None or w.end is None or w.end <= w.start:
        return None
    cs = bi.evidence.client  # judge/clientsamples.py
    inside = cs.within(w.start, w.end)
    pooled = cs.pooled_lag_p99(inside)
    lag99 = [pooled] if pooled is not None else cs.values("lag_p99", inside)
    lagmax = cs.values("lag_max", inside)
    hosts = cs.values("host_cpu", inside)
    held_s = [v for v in cs.values("held_s", inside) if 0.0 <= v < math.inf]
    cpus = cs.mean_cpu_by_process(inside)
    recs = w.records
    mode, conc, rate = lv.entry.get("mode"), lv.entry.get("concurrency"), lv.entry.get("rate")
    lags = _lags(lv, recs) if mode == "open" else None
    wall = w.end - w.start
    offered = achieved = held = think = None
    if mode == "closed" and isinstance(conc, int) and conc > 0:
        near = prev.records + recs if prev is not None else recs
        # every request running in the bucket, whichever bucket it started in (one longer than a
        # bucket runs on through the next ones, a warm-up request into bucket 0): the backend's
        # `in_flight` for the window
        offered, achieved = _offered(lv, w, float(conc)), bucket_in_flight(bi, w, wall)
        # a multi-turn session waiting its think time has no request to send: the sessions not
        # thinking are what the client offered (a thinking session is not a request it failed to keep in flight)
        think = thinking(lv, w)
        if think is not None:
            offered -= min(think, offered)
        # credited only beside the server's failures: the gate shuts after a refused connect or a
        # run of failed requests, and while it is shut a scout tries at least every backoff_max_s,
        # so a bucket that held workers has an unsuccessful request in it or the bucket before. A
        # client sample claiming held time without one (an edited client.jsonl) cannot hide a
        # saturated client
        if held_s:
            held = min(offered, math.fsum(held_s) / wall) if near.count(_failed_sent.col, _failed_sent.row) else 0.0
    elif mode == "open" and type(rate) in (int, float) and rate > 0:
        # what the schedule put in the bucket, where it is recorded (`index.scheduled_in`): a
        # random schedule's bucket above its nominal rate is not a client short of its offer
        sched = scheduled_in(lv, w)
        offered = sched if sched is not None else _offered(lv, w, float(rate))
        achieved = _started_in(recs, w.start, w.end) / wall
    delays = _values(recs, lambda t, idx: t.f["client_delay"][idx], _delay_row)
    waited, wait_p99, cap_requests = _cap_waits(lv, recs)
    done = completed(recs)
    gaps = _int_sum(done, _gaps_col, _gaps_row)
    coal = _int_sum(done, _coal_col, _coal_row)
    return {
        "bucket": w.index, "start": w.start, "end": w.end, "samples": len(inside), "mode": mode,
        "lag_p99": max(lag99) if lag99 else None, "lag_max": max(lagmax) if lagmax else None,
        "cpu": max(cpus.values()) if cpus else None, "processes": len(cpus),
        "host_cpu": sum(hosts) / len(hosts) if hosts else None,
        "schedule_lag_p99": percentile(lags, 99.0) if lags is not None and len(lags) else None,
        "offered": offered, "achieved": achieved,
        # closed loop: mean workers held at the backend's backoff gate (None: not tallied)
        "held": held,
        # closed-loop multi-turn: mean sessions waiting their think time, left out of `offered` (None: no think time)
        "thinking": think,
        "coalesced": coal / gaps if gaps else None, "coalesced_gaps": coal, "gaps": gaps,
        # the client's own processing after each response's last bytes (records' client_delay)
        "client_delay_p99": percentile(delays, 99.0) if len(delays) else None,
        # open loop under max_concurrency: of its requests, those that waited for a slot; the
        # wait's p99 over them all (None: no cap)
        "cap_requests": cap_requests, "cap_waited": waited, "cap_wait_p99": wait_p99,
    }  # fmt: skip


def _cap_waits(lv: LevelIndex, recs: Rows) -> tuple[int | None, float | None, int | None]:
    """An open loop under the spec's `max_concurrency`: how many of the bucket's requests waited
    for a slot, the p99 of the wait over all of them (0 for one that found a slot free), and how
    many there are. The wait is the declared cap's, counted in latency and TTFT, not the
    client's schedule lag (`record.schedule_lag`). (None, None, None): the level declared no cap."""
    if not capped(lv.entry):
        return None, None, None
    v = recs.map(cap_wait.col, cap_wait.row)
    waited = ~np.isnan(v)
    return int(waited.sum()), percentile(np.where(waited, v, 0.0), 99.0) if len(v) else None, len(v)


def _client_windows(bi: BackendIndex, lv: LevelIndex):
    """(window, its client_bucket row) for each bucket of the level that has a window."""
    prev = None
    for w in lv.buckets:
        row = client_bucket(bi, lv, w, prev)
        if row is not None:
            yield w, row
        prev = w


def client_rows(bi: BackendIndex, lv: LevelIndex) -> list[dict]:
    return [row for _, row in _client_windows(bi, lv)]


def _ms(v: float) -> str:
    return f"{v * 1000:.0f} ms" if v >= 0.01 else f"{v * 1000:.1f} ms"


def client_saturation(row: dict, g) -> list[str]:
    """Why the load generator was saturated in this bucket (empty: it was not), by `g`'s thresholds."""
    why = []
    if row["lag_p99"] is not None and row["lag_p99"] > g.client_lag:
        why.append(f"event-loop lag p99 {_ms(row['lag_p99'])} (limit {_ms(g.client_lag)})")
    if row["cpu"] is not None and row["cpu"] >= g.client_cpu:
        why.append(f"client CPU {row['cpu'] * 100:.0f} % of a core (limit {g.client_cpu * 100:.0f} %)")
    if row["schedule_lag_p99"] is not None and row["schedule_lag_p99"] > g.client_schedule_lag:
        why.append(f"schedule lag p99 {_ms(row['schedule_lag_p99'])} (limit {_ms(g.client_schedule_lag)})")
    if row["mode"] == "closed" and row["offered"] and row["achieved"] is not None:
        held = row.get("held") or 0.0  # the workers the server's refusals held back are not the client's shortfall
        if row["achieved"] + held < g.client_concurrency * row["offered"]:
            also = f"; {held:.3g} more waited at the backend's backoff" if held > 0 else ""
            also += f"; {row['thinking']:.3g} more sessions thinking, not offered" if row.get("thinking") else ""
            why.append(f"achieved concurrency {row['achieved']:.3g} of {row['offered']:g} offered "
                       f"(limit {g.client_concurrency * 100:.0f} %{also})")
    if why and row["host_cpu"] is not None:
        why.append(f"machine CPU {row['host_cpu'] * 100:.0f} % busy")
    return why


def client_measured(run: JudgedRun) -> str | None:
    """Did the run measure its load generator, and if so, why its client.jsonl gives nothing
    to judge: None when the run predates client health (its manifest lists no client.jsonl,
    there is none, and no backend has a sample), "" when it measured and there are samples,
    else the reason naming the file (listed but missing, or empty)."""
    ev = run.evidence
    arts = ev.manifest.get("artifacts")
    listed = isinstance(arts, dict) and layout.CLIENT in arts
    there = ev.root is not None and (Path(ev.root) / layout.CLIENT).is_file()
    if any(be.client for be in ev.backends):
        return ""
    if not listed and not there:
        return None
    if not there and ev.root is not None:
        return f"{layout.CLIENT} is missing (the manifest lists it)"
    if not ev.backends and ev.manifest.get("status") == "running":  # its samples are read per backend: none is listed yet
        return (f"{layout.CLIENT} was not read: the run is incomplete (status running: still going, or killed) and its "
                "manifest lists no backend yet; `soakspec gate --partial` reads its samples")
    return f"{layout.CLIENT} has no client-health samples"


# A sweep's probes are judged one by one with client_healthy (judge/sweep.py `judge_level`):
# `prove_schedule=False` where the caller has proven the probe's schedule already, and
# `tail_pending` for the runner's own judgement right after a probe, when the sample of its last
# second may not be written yet -- a bucket no sample covers is then not held against it (the
# gate's re-judgement, with every sample, holds it).
def client_healthy(run: JudgedRun, rule: Rule | None = None, *, prove_schedule: bool = True,
                   tail_pending: bool = False) -> RuleResult:
    """Built in: the load generator kept up in every bucket (see "client health" above).

    Missing data is never a pass. A run measured its client when its manifest lists
    client.jsonl (every `soakspec run` writes it, from its first second: the runner's
    `finalize_artifacts` hashes it into the manifest), when the file is there, or when any
    backend has a sample. Then a missing or empty client.jsonl is INCONCLUSIVE naming the file,
    and so is every bucket that no sample covers. Evidence written before soakspec measured its
    load generator has none of these: its client health is not judged (the check passes and
    says so, as `client_healthy = false` does), because such a run never claimed it, and the
    record-derived criteria alone (schedule lag, achieved concurrency) are only judged beside
    the samples they were defined with.

    Whatever else makes it INCONCLUSIVE, its message also says which open-loop levels the
    schedule proof could not cover ("; schedule not proven: ..."): the first problem alone
    left a reader to think the schedules were proven."""
    g = run.gate
    if not g.client_healthy:
        return result(None, "client_healthy", "validity", "require", [], "not judged (client_healthy = false in the gate)", 0)
    gap = client_measured(run)
    # the schedule proof needs no samples: it is judged whatever client.jsonl holds
    off_schedule, proven, unproven = schedule_kept(run) if prove_schedule else ([], 0, "")
    # a sweep's probes other than the judged level, as judge/sweep.py judged them: last, as they
    # are of other times (`client_blocks` reads the judged level's causes from the first)
    probes = _sweep_health(run)
    if gap is None:
        return _said_unproven(result(None, "client_healthy", "validity", "require", off_schedule + probes,
                                     f"not judged: the evidence has no {layout.CLIENT} (written before soakspec measured its load generator)"
                                     + _schedule_said(off_schedule, proven, unproven, run), len(off_schedule) + len(probes)), unproven)
    if gap:
        return _said_unproven(result(None, "client_healthy", "validity", "require",
                                     off_schedule + [problem(f"{gap}: the load generator's health is unknown", status="inconclusive")]
                                     + probes, "", 1 + len(off_schedule) + len(probes)), unproven)
    insts: list[Instance] = []
    unsent: list[Instance] = []  # first: the message names the load generator's own failure
    n = sampled = 0
    worst: tuple[float, str] | None = None
    for bi in run.judged:
        for lv in bi.levels:
            for w in lv.buckets:
                if w.planned and (ns := not_sent(w.records)):
                    first = (next(iter(ns)).get("error") or "no connection could be made").removeprefix("not sent: ")
                    unsent.append(Instance("inconclusive", loc(bucket_scope(bi, lv, w)), float(len(ns)), None, len(ns),
                                           f"{plural(len(ns), 'request')} of bucket {w.index} {NOT_SENT_NOTE}: {first}",
                                           cause=CLIENT_NOT_SENT))
            for w, row in _client_windows(bi, lv):
                n += 1
                sampled += 1 if row["samples"] else 0
                if not row["samples"] and not bi.evidence.client.covered(w.start, w.end):  # its health is unknown
                    if tail_pending:  # the runner's judgement of a probe just drained: its last sample may be unwritten
                        continue
                    # the run measured its client: a bucket it did not measure is not a healthy one
                    insts.append(Instance("inconclusive", loc(bucket_scope(bi, lv, w)), None, None, None,
                                          f"no client-health sample in bucket {row['bucket']}: the load generator's health is unknown"))
                    continue
                if not row["samples"]:
                    continue  # shorter than a sample: the sample around it judges its time
                why = client_saturation(row, g)
                if why:
                    late = w.records.count(timed_out.col, timed_out.row)  # timeouts the client's lag may have made
                    insts.append(Instance("inconclusive", loc(bucket_scope(bi, lv, w)), row["lag_p99"], None, None,
                                          f"load generator saturated in bucket {row['bucket']}: {', '.join(why)}"
                                          + (f"; {plural(late, 'request')} timed out in it" if late else ""),
                                          cause=CLIENT_TIMEOUTS if late else None))
                elif row["lag_p99"] is not None and (worst is None or row["lag_p99"] > worst[0]):
                    worst = (row["lag_p99"], loc(bucket_scope(bi, lv, w)).text)
    if not n:  # no bucket of the spec's levels in the evidence: the client kept up in nothing measured
        insts.append(problem("no bucket of the spec's levels is in the evidence: the load generator's health is unknown",
                             status="inconclusive"))
    capped_levels = [(bi, lv) for bi in run.judged for lv in bi.levels if capped(lv.entry)]
    off_cap = [d for bi, lv in capped_levels for d in cap_kept(bi, lv, g.client_schedule_lag)]
    msg = f"the load generator kept up in {plural(sampled, 'bucket')}" + (
        f" (worst event-loop lag p99 {_ms(worst[0])}, {worst[1]})" if worst else "") + (
        f"; it kept to max_concurrency in {plural(len(capped_levels), 'capped level')}" if capped_levels and not off_cap else "") + \
        _schedule_said(off_schedule, proven, unproven, run)
    return _said_unproven(result(None, "client_healthy", "validity", "require", off_schedule + unsent + off_cap + insts + probes,
                                 msg, n), unproven)


def _said_unproven(res: RuleResult, unproven: str) -> RuleResult:
    """An INCONCLUSIVE client_healthy's message -- its first problem -- with the open-loop levels
    the schedule proof could not cover after it (a PASS's message says them already): one
    reason alone read as if every schedule had been proven."""
    if res.status == "pass" or not unproven:
        return res
    return dataclasses.replace(res, message=f"{res.message}; schedule not proven: {unproven}")


# the `cause` of a sweep's probe the load generator's health made INCONCLUSIVE in the search
# (saturated, or its health unknown; judge/sweep.py judges each probe's): a figure read off
# that probe's load is the client's, not the server's
CLIENT_PROBE = "client_probe"


def _sweep_health(run: JudgedRun) -> list[Instance]:
    """An INCONCLUSIVE instance per probe of a sweep, other than the level the run was narrowed
    to (judged above like any level), that the load generator's health made INCONCLUSIVE in the
    search (`judge/sweep.py`: the probe's `client`, why). Judged on the found level alone, a
    probe whose client was saturated was taken for the server failing -- the search moved
    down -- or holding, and nothing said so."""
    out = []
    for sw in run.sweep:
        found = sw.found_level if sw.found_level is not None else (
            min(sw.probes, key=lambda p: p["value"])["level"] if sw.probes else None)
        unit = " rps" if sw.axis == "rate" else ""
        for p in sw.probes:
            if p["level"] != found and p.get("client"):
                out.append(Instance("inconclusive", Location(backend=sw.backend, workload=sw.workload, level=p["level"]), None, None, None,
                                    f"the sweep's probe at {p['value']:g}{unit} is INCONCLUSIVE in the search{_probe_said(p['client'])}",
                                    cause=CLIENT_PROBE))
    return out


_AND_MORE = re.compile(r"(.*) \(and (\d+) more\)", re.S)


def _probe_said(client: str) -> str:
    """A probe's client_healthy message (its first problem, " (and N more)" of its own after it)
    as the run's client_healthy says it: its count folded in front (": backend b0, ... (and 2
    more)" -> " on 3 problems, the first: backend b0, ..."), so that the run's own " (and N
    more)" -- its other probes and buckets, `result` -- is the only one, not a second beside it."""
    m = _AND_MORE.fullmatch(client)
    if m is None:
        return f": {client}"
    return f" on {int(m.group(2)) + 1} problems, the first: {m.group(1)}"


def _schedule_said(off: list[Instance], proven: int, unproven: str, run: JudgedRun) -> str:
    """What client_healthy's message says of the schedule proof: the levels proven (a sweep's:
    its probes'), and those it could not cover with why."""
    n = sum(len(sw.probes) for sw in run.sweep)
    probes = f" (of the sweep's {plural(n, 'probe')})" if n else ""
    return (f"; it sent on its schedule in {plural(proven, 'open-loop level')}{probes}" if proven and not off else "") + (
        f"; schedule not proven: {unproven}" if unproven else "")


SCHEDULE_BROKEN = "the load generator did not send on its schedule"
# the `cause` of an open-loop level whose records are not its schedule's arrivals
# (judge/schedproof.py): the offered load, every latency from intended_start and every count is
# the client's word, and that word was wrong, so no FAIL of the run is the server's
CLIENT_SCHEDULE = "client_schedule"


def schedule_kept(run: JudgedRun) -> tuple[list[Instance], int, str]:
    """The schedule proof (`judge/schedproof.py`) of every open-loop level judged: one
    INCONCLUSIVE instance (cause CLIENT_SCHEDULE) per level whose records' intended starts are
    not exactly its seeded schedule's arrivals, naming the first mismatching arrival; how many
    were proven; and the open-loop levels the proof could not cover, with why, for the message
    (never a pass by omission: said, not silently passed). Closed loops and batches have no
    schedule to prove and are not listed. It lives in client_healthy, beside the cap's proof,
    because both are the load generator's promises about what it sent: off them, the load was
    not the one declared, which is the client's failure, not the server's -- and a gate that
    sets `client_healthy = false` has said it does not judge its load generator."""
    off: list[Instance] = []
    proven = 0
    why: dict[str, int] = {}
    for bi in run.judged:
        for lv in bi.levels:
            if lv.entry.get("mode") != "open":
                continue
            p = schedproof.prove(lv.entry, np.concatenate([lv.warmup.floats("intended_start"), lv.records.floats("intended_start")]))
            if p.status == schedproof.PROVEN:
                proven += 1
            elif p.status == schedproof.UNPROVEN:
                why[p.reason] = why.get(p.reason, 0) + 1
            else:
                off.append(Instance("inconclusive", loc(level_scope(bi, lv)), None, None, None,
                                    f"{SCHEDULE_BROKEN}: {p.reason}", cause=CLIENT_SCHEDULE))
    for sw in run.sweep:  # a sweep is judged as its found level; its figure rests on every probe's load
        proven += _sweep_schedules(sw, off, why)
    unproven = "; ".join(f"{plural(k, 'open-loop level')} ({reason})" for reason, k in why.items())
    return off, proven, unproven


def _sweep_schedules(sw: Any, off: list[Instance], why: dict[str, int]) -> int:
    """The schedule proofs of a sweep's probes (`judge/sweep.py` proves each: its probes'
    `schedule`) other than the level the run was narrowed to (proven above like any level): how
    many were proven; a broken one an INCONCLUSIVE instance into `off`, an unproven one counted
    into `why`. The found level alone was counted before, and a 2-probe sweep read "in 1
    open-loop level", the other probe -- its load as much the figure's ground -- unsaid."""
    found = sw.found_level if sw.found_level is not None else (
        min(sw.probes, key=lambda p: p["value"])["level"] if sw.probes else None)
    unit = " rps" if sw.axis == "rate" else ""
    proven = 0
    for p in sw.probes:
        if p["level"] == found or "schedule" not in p:
            continue
        if p["schedule"] == schedproof.PROVEN:
            proven += 1
        elif p["schedule"] == schedproof.UNPROVEN:
            reason = p.get("schedule_why", "")
            why[reason] = why.get(reason, 0) + 1
        else:
            off.append(Instance("inconclusive", Location(backend=sw.backend, workload=sw.workload, level=p["level"]), None, None, None,
                                f"{SCHEDULE_BROKEN} in the sweep's probe at {p['value']:g}{unit} (INCONCLUSIVE in the search): "
                                f"{p.get('schedule_why', '')}", cause=CLIENT_SCHEDULE))
    return proven


CAP_BROKEN = "the load generator did not keep to the declared cap"
# a level split over processes whose records cannot show which process sent each (no `worker`):
# its cap is not proven (judge/capproof.py, kind "unplaced"); same cause, CLIENT_CAP
CAP_UNPROVEN = "the records cannot show that the load generator kept to the declared cap"
_CAP_MESSAGE = re.compile(rf"({re.escape(CAP_BROKEN)}|{re.escape(CAP_UNPROVEN)}) \((max_concurrency \d+)\): (.*)", re.S)
# the `cause` of a capped level whose records show the runner off its max_concurrency: every
# figure of the level was made under a load the spec did not declare (more in flight than the
# cap), or its queue waited with a slot free (latency and timeouts the cap did not make), so
# a timing FAIL or a count holding timeouts or errors in its time is not the server's
CLIENT_CAP = "client_cap"


def cap_kept(bi: BackendIndex, lv: LevelIndex, tol: float) -> list[Instance]:
    """A level that declares max_concurrency: its records (warm-up too: they held its slots)
    proven to keep to the cap per load process (`judge/capproof.py`: never more than the
    process's share in flight; no wait longer than `tol` with the share never full during it),
    else one INCONCLUSIVE instance per process off it, naming the level, the process and the
    counts. The cap excuses the wait behind it from schedule lag (`_lags`) only because it is
    proven here."""
    cap = lv.entry["max_concurrency"]
    if cap < 1:
        return []
    recs = lv.warmup + lv.records
    workers = lv.entry.get("workers")
    parts = workers if type(workers) is int and workers >= 1 else 1
    found = breaches(recs.ints("worker"), recs.floats("intended_start"), recs.floats("start"),
                     recs.floats("admitted"), recs.floats("end"), cap, parts, tol)
    where = loc(level_scope(bi, lv))
    return [Instance("inconclusive", where, float(b.peak if b.kind == "over" else b.count), None, b.count,
                     f"{CAP_UNPROVEN if b.kind == 'unplaced' else CAP_BROKEN} (max_concurrency {cap}): {_breach_text(b)}",
                     cause=CLIENT_CAP) for b in found]


def _cap_blocked(d: Instance) -> tuple[str, str]:
    """A CLIENT_CAP instance as `client_blocks` names it: (what -- CAP_BROKEN or CAP_UNPROVEN --,
    where and why), said once: `the load generator did not keep to the declared cap (backend a,
    rate 2 rps, max_concurrency 1: the load process had up to 2 ...)`, not the lead twice."""
    m = _CAP_MESSAGE.fullmatch(d.message)
    if m is None:
        return CAP_BROKEN, _at(d)
    what, cap, why = m.groups()
    place = d.where.text
    if cap not in place:  # a phase's label need not name the cap
        why = f"{cap}: {why}"
    return what, f"{place}: {why}" if place else why


def _breach_text(b: Breach) -> str:
    if b.kind == "unplaced":
        return (f"{plural(b.count, 'record')} {'names' if b.count == 1 else 'name'} no worker, so which of the "
                f"level's {b.parts} load processes (--workers) sent {'it' if b.count == 1 else 'them'} is unknown "
                "and no process's share of the cap can be checked")
    who = f"load process {b.process + 1} of {b.parts} (records whose worker % {b.parts} is {b.process})" if b.parts > 1 \
        else "the load process"
    if b.kind == "over":
        return (f"{who} had up to {b.peak} requests in flight at once, over its share of {b.share}: "
                f"{plural(b.count, 'request')} started with more than {b.share} in flight")
    return (f"{who}: {b.count} of its {plural(b.waited, 'request')} that waited for a slot waited while fewer than "
            f"its share of {b.share} were in flight (a free slot left idle)")


# a request with no `start` was never sent: the load generator could not open a connection (out
# of file descriptors, ...: runner/fdlimit.py). Its record counts as `disconnected`, but it says
# nothing about the server: `client_healthy` is INCONCLUSIVE, and no rule FAILs the server for it.
NOT_SENT_NOTE = "never sent (the load generator's own failure, not the server's)"
CLIENT_NOT_SENT = "client_not_sent"  # the `cause` of such an Instance of client_healthy
# the `cause` of a saturated bucket in which requests timed out: a timeout is a latency past the
# deadline on the client's clock, from the intended start, so the client's lag may have made
# them; every count that holds timeouts (TIMEOUT_COUNTS, and `timeouts` itself, CLIENT_SENSITIVE)
# is then not the server's alone
CLIENT_TIMEOUTS = "client_timeouts"
TIMEOUT_COUNTS = frozenset({"errors", "completed", "goodput"})  # goodput: goodput() and goodput_rate()


def not_sent(recs: Rows) -> Rows:
    """The requests of `recs` that were never sent (no `start`)."""
    return recs.where(lambda t, idx: np.isnan(t.f["start"][idx]), lambda r: r.get("start") is None)


def client_blocks(run: JudgedRun, results: list[RuleResult], r: Rule, res: RuleResult) -> RuleResult:
    """A FAIL the load generator's own lag may have made is INCONCLUSIVE -- but only where it
    could have made it. A timing rule's failing instance (CLIENT_SENSITIVE) that overlaps, on
    the run clock, a bucket where `client_healthy` found the client saturated (or could not
    tell: no sample covers it) is discounted; so is a failing count that holds timeouts
    (TIMEOUT_COUNTS: errors, completed, goodput) that overlaps a saturated bucket in which
    requests timed out (CLIENT_TIMEOUTS): the client's lag may have made those timeouts.
    Overlap is by time, not by backend name: backends that run at once share the client. An
    instance's time is its own window (a bucket, a `per window` slice, a level, a phase, a
    turn); a backend's (`per backend`) is every bucket of it, the run's (`per run`) every bucket
    of the backends the rule speaks about (`_spans`), so any saturated bucket within them blocks
    them.

    The rule still FAILs where at least one failing instance overlaps no such bucket: the
    message is that instance's (the worst of those left), and it names the instances it
    discounted and the buckets beside them. Where every failing instance overlaps one -- or the
    result does not say where it failed -- it is INCONCLUSIVE, naming the saturated buckets.
    When the load generator could not send requests (NOT_SENT_NOTE) every FAIL is: those
    requests count as unsuccessful, and the planned load was not applied. So is every FAIL
    when an open loop's records are not its schedule's arrivals (CLIENT_SCHEDULE,
    `schedule_kept`): the times every figure is measured from are the client's word, and it
    was wrong -- in that level, and so possibly in any (one load generator wrote them all).

    One more client cause needs no unhealthy bucket: an open loop's ttft or latency instance
    that fails only by the load generator's own schedule lag (CLIENT_LAG) is discounted as one
    beside a saturated bucket is (`_lag_blocks`); a warn rule's WARN names them (`_lag_warned`)."""
    if res.status == "warn":
        return _lag_warned(res, r)
    if res.status != "fail":
        return res
    health = next((x for x in results if x.rule == "client_healthy" and x.status == "inconclusive"), None)
    if health is None:
        return _lag_blocks(res, r, [])
    if health.details and health.details[0].cause == CLIENT_SCHEDULE:  # the records' times are not the schedule's: nothing they show is the server's
        return dataclasses.replace(res, status="inconclusive",
                                   message=f"not judged, {_at(health.details[0])}; it measured: {res.message}")
    if health.details and health.details[0].cause == CLIENT_NOT_SENT:
        return dataclasses.replace(res, status="inconclusive",
                                   message="not judged, the load generator did not send every request (client_healthy: "
                                           f"{health.details[0].message}); it measured: {res.message}")
    sensitive = client_sensitive(r.expr)
    if not sensitive and r.expr.metric not in TIMEOUT_COUNTS:
        return res
    # the buckets whose client may have made the failure: for a timing figure, every one where
    # it was saturated or its health is unknown; for a count, those where requests timed out
    # while it was saturated
    # (a sweep's other probe, CLIENT_PROBE, is of another time than the judged level's figures)
    unhealthy = [(d, _merged(_spans(run, d.where, ()))) for d in (health.failures or health.details)
                 if d.cause not in (CLIENT_NOT_SENT, CLIENT_PROBE) and (sensitive or d.cause in (CLIENT_TIMEOUTS, CLIENT_CAP))]
    if not unhealthy:
        return _lag_blocks(res, r, [])
    own = run.backends_for(r)
    # every unhealthy bucket's time as one set of intervals: whether an instance overlaps any is
    # a bisection, not a walk over the buckets (a day-long soak: 10^4 buckets, 10^4 failing ones)
    union = None if any(hs is None for _, hs in unhealthy) else _merged([s for _, hs in unhealthy for s in zip(*hs)])  # type: ignore[misc]
    kept: list[Instance] = []
    gone: list[tuple[Instance, Any]] = []  # a discounted instance, and its time
    for d in (res.failures or res.details):
        if d.status != "fail":
            continue
        mine = _merged(_spans(run, d.where, own))
        if _overlap(mine, union):
            gone.append((d, mine))
        else:
            kept.append(d)
    if kept and not gone:  # no saturated bucket beside any: the schedule lag alone may have decided some
        return _lag_blocks(res, r, kept)

    def beside(mine: Any) -> list[Instance]:  # the unhealthy buckets that overlap `mine`
        return [h for h, hs in unhealthy if _overlap(mine, hs)]

    what = "the load generator was saturated" if sensitive else "requests timed out while the load generator was saturated"
    if all(h.cause == CLIENT_CAP for h, _ in unhealthy):  # the load was not the declared one, saturated or not
        what = CAP_BROKEN if any(h.message.startswith(CAP_BROKEN) for h, _ in unhealthy) else CAP_UNPROVEN
    lagged = [d for d in kept if d.cause == CLIENT_LAG]  # apart from every saturated bucket, but decided by the lag
    kept = [d for d in kept if d.cause != CLIENT_LAG]
    if not kept:  # every failure known overlaps one (or none is known), or the lag decided it: the client may have made it
        times = None if any(m is None for _, m in gone) else _merged([s for _, m in gone for s in zip(*m)])  # type: ignore[misc]
        return _all_blocked(res, r, beside(times) if gone else [h for h, _ in unhealthy], what, lagged)
    return _discounted(res, r, kept, [(d, beside(mine)) for d, mine in gone[:MAX_SHOWN]], len(gone), what, lagged)


def _all_blocked(res: RuleResult, r: Rule, shown: list[Instance], what: str, lagged: list[Instance]) -> RuleResult:
    """`client_blocks`' INCONCLUSIVE where every failing instance is beside an unhealthy bucket
    or was decided by the schedule lag (`lagged`, CLIENT_LAG): named by the first unhealthy
    bucket (`shown`), then the lag-decided ones -- each cause said, not the saturation alone."""
    first = shown[0]
    more = f" (and {len(shown) - 1} more)" if len(shown) > 1 else ""
    said = _at(first)
    if first.cause == CLIENT_CAP and what in (CAP_BROKEN, CAP_UNPROVEN):  # its message leads with what it is: say it once
        what, said = _cap_blocked(first)
    return dataclasses.replace(res, status="inconclusive",
                               message=f"not judged, {what} ({said}{more}){_lag_said(r, lagged)}; it measured: {res.message}")


def _lag_said(r: Rule, lagged: list[Instance]) -> str:
    """"; 1 failing level discounted, the load generator's own schedule lag decided it: backend
    a, rate 4 rps: p50(ttft) = ...": the failing instances the lag decided (CLIENT_LAG), the
    first few with their figures, for a message that names them beside another cause; "" for none."""
    if not lagged:
        return ""
    said = "; ".join(_lag_at(d) for d in lagged[:MAX_SHOWN]) + (
        f"; ... and {len(lagged) - MAX_SHOWN} more" if len(lagged) > MAX_SHOWN else "")
    why = LAG_DECIDED if len(lagged) == 1 else LAG_DECIDED_THEM
    return f"; {plural(len(lagged), 'failing ' + (r.scope or 'instance'))} discounted, {why}: {said}"


# the `cause` of a failing instance of a time from the intended start (ttft, latency) in an open
# loop that the same figure less the client's own lateness (`performance.lag_figure`: from the
# actual send, sent_ttft and sent_latency; under max_concurrency with the slot queue replayed
# on time, the cap's own wait kept) does not fail (`performance._lag_decided`, its `lag_note` the figures): the load
# generator's own schedule lag decided it -- within the gate's client_schedule_lag, so no bucket
# was saturated, yet it was the client's lateness the rule saw over the threshold
CLIENT_LAG = "client_lag"
LAG_DECIDED = "the load generator's own schedule lag decided it"
LAG_DECIDED_THEM = "the load generator's own schedule lag decided them"


def _lag_blocks(res: RuleResult, r: Rule, kept: list[Instance]) -> RuleResult:
    """`client_blocks` where no saturated bucket is beside a failing instance: those the schedule
    lag decided (CLIENT_LAG: a failing ttft or latency instance of an open loop whose same
    statistic less the client's own lateness -- sent_ttft, sent_latency; under max_concurrency
    with the slot queue replayed on time -- does not fail, `performance._lag_decided`) are discounted, within client_schedule_lag or not. Every one: INCONCLUSIVE, its message the lag's
    figures ("not judged, the load generator's own schedule lag decided it: backend a, rate 12
    rps: p50(ttft) = 304ms fails < 250ms, but measured from the actual send (p50(sent_ttft)) it
    is 145ms: ..."); some: the FAIL stands on the rest, naming the discounted ones. `kept`:
    the failing instances (none given: the result's own)."""
    fails = kept or [d for d in (res.failures or res.details) if d.status == "fail"]
    lagged = [d for d in fails if d.cause == CLIENT_LAG]
    if not lagged:
        return res
    rest = [d for d in fails if d.cause != CLIENT_LAG]
    if rest:
        return _discounted(res, r, rest, [], 0, "", lagged)
    if res.failing > len(lagged):  # failing instances the result does not list: they stand
        return res
    more = f" (and {plural(len(lagged) - 1, 'more failing ' + (r.scope or 'instance'))} the same)" if len(lagged) > 1 else ""
    return dataclasses.replace(res, status="inconclusive", message=f"not judged, {LAG_DECIDED}: {_lag_at(lagged[0])}{more}")


def _lag_warned(res: RuleResult, r: Rule) -> RuleResult:
    """A `warn` rule's WARN whose warning instances the schedule lag decided (CLIENT_LAG) says so
    ("...; 1 warning level not the server's own time, the load generator's own schedule lag
    decided it: backend a, rate 2 rps: p50(ttft) = 305ms fails < 250ms, but measured from the
    actual send ..."), as a require rule's discounted instance is named -- but stays WARN, never
    turned into a pass or INCONCLUSIVE: a warn never decides the verdict, so there is no blame to
    take off the server, and the figure from the intended start is still what a user of this
    schedule waited (coordinated omission); hiding it would hide that, the note says whose it is."""
    warned = [d for d in (res.failures or res.details) if d.status == "fail"]
    lagged = [d for d in warned if d.cause == CLIENT_LAG]
    if not lagged:
        return res
    said = "; ".join(_lag_at(d) for d in lagged[:MAX_SHOWN]) + (
        f"; ... and {len(lagged) - MAX_SHOWN} more" if len(lagged) > MAX_SHOWN else "")
    why = LAG_DECIDED if len(lagged) == 1 else LAG_DECIDED_THEM
    note = f"{plural(len(lagged), 'warning ' + (r.scope or 'instance'))} not the server's own time, {why}: {said}"
    return dataclasses.replace(res, message=f"{res.message}; {note}")


def _lag_at(d: Instance) -> str:
    return f"{d.where.text}: {d.lag_note}" if d.where.text else str(d.lag_note)


def _discounted(res: RuleResult, r: Rule, kept: list[Instance], shown: list[tuple[Instance, list[Instance]]], gone: int,
                what: str, lagged: list[Instance] | None = None) -> RuleResult:
    """`client_blocks`' FAIL that stands: on `kept` (the failing instances no unhealthy bucket
    overlaps and the schedule lag did not decide), its message the worst of them, naming the
    `gone` discounted ones (the first few, `shown`, with the buckets beside each) and the
    `lagged` ones (CLIENT_LAG)."""
    from soakspec.judge.performance import _badness  # the worst failure is the one reported (`performance._pick`)

    lagged = lagged or []
    lead = res.details[0] if res.details and any(k is res.details[0] for k in kept) else max(kept, key=lambda k: _badness(r, k.observed))
    kept = [lead] + [k for k in kept if k is not lead]
    unknown = res.failing - len(kept) - gone - len(lagged)  # failing instances the result does not list: they stand
    message = f"{_at(lead)}" + (f" (and {len(kept) + max(unknown, 0) - 1} more)" if len(kept) + max(unknown, 0) > 1 else "")
    scope = r.scope or "instance"
    listed = "; ".join(_where(d) + _beside(d, beside) for d, beside in shown)
    if gone > len(shown):
        listed += f"; ... and {gone - len(shown)} more"
    if gone:
        message += (f"; {plural(gone, 'failing ' + scope)} discounted, {what} in time with "
                    f"{'it' if gone == 1 else 'them'}: {listed}")
    message += _lag_said(r, lagged)
    changes: dict[str, Any] = {}
    if not res.details or lead is not res.details[0]:  # the reported instance was discounted: the worst left is
        changes = {"where": lead.where, "observed": lead.observed, "observed_text": lead.observed_text, "samples": lead.samples}
    return dataclasses.replace(res, message=message, failing=len(kept) + max(unknown, 0), details=tuple(kept[:MAX_LISTED]),
                               failures=tuple(kept), **changes)


def _at(d: Instance) -> str:
    return f"{d.where.text}: {d.message}" if d.where.text else d.message


def _where(d: Instance) -> str:
    return d.where.text or "the whole run"


def _beside(d: Instance, buckets: list[Instance]) -> str:
    """` (saturated: backend a, c=8, bucket 3 [...] and 2 more buckets)`: the unhealthy buckets
    beside a discounted instance, unless it is that one bucket itself."""
    if len(buckets) == 1 and buckets[0].where.text == d.where.text:
        return ""
    capped = [h.cause == CLIENT_CAP for h in buckets]
    # a level off its cap (CLIENT_CAP, `cap_kept`) was not saturated: its load was not the declared one
    label = "saturated" if not capped[0] else "off its cap" if buckets[0].message.startswith(CAP_BROKEN) else "cap not proven"
    rest = len(buckets) - 1
    more = "" if not rest else f" and {plural(rest, 'more level')}" if all(capped[1:]) else \
        f" and {plural(rest, 'more bucket')}" if not any(capped[1:]) else f" and {rest} more"
    return f" ({label}: {_where(buckets[0])}{more})"


def _spans(run: JudgedRun, where: Location, backends: tuple[BackendIndex, ...]) -> list[tuple[float, float]] | None:
    """The times on the run clock (epoch seconds) an instance at `where` covers: its own window
    where it has one (a bucket, a `per window` slice, a level, a phase, a turn); else every
    bucket of its backend (of its level, where it names one: `per backend`), or, naming no
    backend (`per run`), of `backends`. None: unknown, the whole run."""
    if where.start is not None and where.end is not None:
        return [(where.start, where.end)]
    if where.backend is not None:
        bi = run.backends.get(where.backend)
        pool: tuple[BackendIndex, ...] = (bi,) if bi is not None else ()
    else:
        pool = backends
    out = [(w.start, w.end) for bi in pool for lv in bi.levels
           if where.level is None or (lv.index == where.level and where.workload in (None, lv.workload))
           for w in lv.buckets if w.start is not None and w.end is not None]
    return out or None


def _merged(spans: list[tuple[float, float]] | None) -> tuple[list[float], list[float]] | None:
    """`spans` as disjoint intervals, ascending: their starts and their ends (None: the whole run)."""
    if spans is None:
        return None
    starts: list[float] = []
    ends: list[float] = []
    for a, b in sorted(spans):
        if ends and a < ends[-1]:
            ends[-1] = max(ends[-1], b)
        else:
            starts.append(a)
            ends.append(b)
    return starts, ends


def _overlap(a: tuple[list[float], list[float]] | None, b: tuple[list[float], list[float]] | None) -> bool:
    """Whether two sets of intervals (`_merged`) share any time; a bucket that ends where another
    begins shares none. The whole run (None) overlaps everything."""
    if a is None or b is None:
        return True
    if len(a[0]) > len(b[0]):
        a, b = b, a
    starts, ends = b
    for s, e in zip(*a):
        i = bisect.bisect_right(ends, s)  # the first interval of b that ends after s
        if i < len(starts) and starts[i] < e:
            return True
    return False
