"""A sweep judged by the gate: each probed level re-judged on its own, and the run's verdict.

A sweep workload (`search = bisect`, `soakspec.plan.Sweep`) leaves one manifest level per
probe, in the order they ran, and the runner's account of the search in the backend's entry
(`sweep`: every probe's grid value and judgement, the result, whether the wall-time bound
ended it). The judge never trusts that account: it re-judges every probe from its records.

A probe *holds* when every performance `require` rule of the gate PASSes on that level alone,
at the gate's confidence (percentiles and goodput with their sample-size tests; INCONCLUSIVE --
too few samples -- does not hold). `warn` rules, and the evidence and validity rules, speak
about the whole run, not about a load level: they are not part of the search's predicate.

The figure: `max_sustainable_concurrency` (closed loop) or `max_sustainable_rate` (open
loop, requests/s) is the highest probed level that holds; bisection makes it the highest grid
level that holds next to one that does not (within one `step` of the true boundary, when
passing is monotone in load). `None` when even the lowest level fails. Unless the grid level
next above it was probed and does not hold, it is only a lower bound and reads "at least X"
(`SweepResult.lower_bound` says why: the grid's highest level, an INCONCLUSIVE next level, or
one never probed).

The verdict of a sweep run is the verdict of the found level: the gate is judged as if the run
had been that one level (validity, evidence and every rule over its records; the follow-up and
provenance as recorded), and failing probes above it are expected, not gate failures. Then:
  - the lowest level fails: the run FAILs, with the figure "none" (rule `sweep`); when the lowest
    level was only short of samples (INCONCLUSIVE, e.g. a p99 rule over a short level), the
    sweep is INCONCLUSIVE instead: lengthen the levels; so it is when no probe ran, or the lowest
    was cut short by an interrupt or a failure (not by an abort rule): nothing says it fails;
  - the wall-time bound ended the search early: the result is the best holding level so far,
    marked "bounded by max wall time" (the rule `sweep` says so; it still passes);
  - an abort rule that fires during a probe ends that probe only (the runner goes on searching
    below it; the level entry says `stopped_by`): a probe that did not run its full duration
    never holds, and is not a gate failure either (cut short otherwise -- an interrupt, a dead
    backend -- it is INCONCLUSIVE: it does not hold, and says nothing of the load);
  - a probe whose records are not its seeded schedule's arrivals (an open loop's schedule
    proof, judge/schedproof.py, run on every probe: `schedule` in its results.json entry) is
    INCONCLUSIVE -- the load it offered was not the one declared, the client's failure, so it
    neither holds nor fails -- and the run's client_healthy counts every probe's proof;
  - a probe whose load generator was not healthy (validity.client_healthy on that probe alone:
    saturated -- event-loop lag, CPU, schedule lag, achieved concurrency --, requests never
    sent, off its cap, or a bucket no sample covers) is INCONCLUSIVE likewise (`client` in its
    results.json entry): judged on the found level only, its slow requests were the server
    failing (the search moved down) or its fast ones a hold the client may not have applied.
    The run's client_healthy names every such probe and why, so the run is INCONCLUSIVE; a
    timing abort that stopped a probe while the client was saturated is not a FAIL either;
  - the judge's re-judgement disagrees with the runner's (a probe the runner counted as holding
    does not hold now, e.g. judged with a newer spec): the judge's is used and the note says so.

`probe_judge(spec, ...)` is the predicate the command layer hands the runner (`Deps.sweep_judge`):
it judges one probe from its manifest entry, its request rows and the client.jsonl samples
written while it ran, in memory, with the same code as the gate's re-judgement (`judge_level`:
the schedule proof, the client's health, the rules). Its functions are pure: the runner hands
them what it wrote and reaches into no later stage. Only the bisection's input is binary: an
INCONCLUSIVE probe does not hold for the runner (its `why` says INCONCLUSIVE), and the gate
re-judges it as neither holding nor failing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from soakspec.evidence.record import FOLLOW_UP_BUCKET

from soakspec.judge import schedproof
from soakspec.judge.clientsamples import samples_of
from soakspec.judge.evidence import BackendEvidence, Evidence, Integrity
from soakspec.judge.verdict import Instance, Location, RuleResult
from soakspec.lang.spec import Load, Spec, Workload
from soakspec.plan import workload_sweep

__all__ = ["FIGURES", "SweepResult", "figure_name", "judge_level", "judge_probe", "narrow", "probe_judge", "sweep_rule", "sweep_workload",
           "value_text"]

FIGURES = {"concurrency": "max_sustainable_concurrency", "rate": "max_sustainable_rate"}


def figure_name(axis: str) -> str:
    return FIGURES.get(axis, f"max_sustainable_{axis}")


@dataclasses.dataclass(frozen=True)
class SweepResult:
    """The judge's account of one backend's sweep."""

    backend: str
    workload: str
    axis: str  # concurrency | rate
    probes: tuple[Mapping[str, Any], ...]  # in run order: level, value, passed (re-judged), why
    result: float | None  # the highest probed value that holds; None: none held
    found_level: int | None  # the manifest level index of that probe
    bounded: bool  # the wall-time bound ended the search
    disagrees: bool = False  # the runner's judgement of some probe differs from the judge's
    # why the figure is only a lower bound ("at least X"): the next grid level above it was not
    # shown to fail -- X is the grid's highest level, or the next one was INCONCLUSIVE or never
    # probed (the wall-time bound); None when the next level was probed and failed
    lower_bound: str | None = None

    @property
    def figure(self) -> str:
        return figure_name(self.axis)

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "workload": self.workload, "axis": self.axis, "figure": self.figure,
                "result": self.result, "found_level": self.found_level, "bounded_by_wall_time": self.bounded,
                "runner_disagrees": self.disagrees, "lower_bound": self.lower_bound,
                "probes": [dict(p) for p in self.probes]}  # fmt: skip

    def text(self) -> str:
        unit = " rps" if self.axis == "rate" else ""
        value = value_text(self.result, self.lower_bound, self.probes, unit)
        tried = ", ".join(f"{p['value']:g}{_mark(p)}" for p in self.probes) or "nothing"
        bound = "; bounded by max wall time" if self.bounded else ""
        return f"{self.figure} = {value} (probed {tried}{bound})"

    @property
    def lowest_unsure(self) -> bool:
        """No answer is known: no probe ran, or the lowest probe is INCONCLUSIVE (too few
        samples, or cut short by an interrupt or a failure rather than by an abort rule)."""
        return not self.probes or min(self.probes, key=lambda p: p["value"]).get("status") == "inconclusive"


def value_text(result: float | None, lower_bound: str | None, probes: Sequence[Mapping[str, Any]], unit: str) -> str:
    """The figure as the verdict and the reports state it: "at least X (why)" when X is only a
    lower bound (`SweepResult.lower_bound`), and why "none": no probe ran, the lowest level could
    not be judged (INCONCLUSIVE), or it does not hold. `probes`: results.json's (value, status)."""
    if result is not None:
        return f"at least {result:g}{unit} ({lower_bound})" if lower_bound else f"{result:g}{unit}"
    if not probes:
        return "none (no probe ran)"
    if min(probes, key=lambda p: p["value"]).get("status") == "inconclusive":
        return "none (the lowest level could not be judged)"
    return "none (even the lowest level does not hold)"


def _mark(probe: Mapping[str, Any]) -> str:
    return "✓" if probe.get("passed") else "?" if probe.get("status") == "inconclusive" else "✗"


def _lower_bound(grid: Sequence[float], probes: Sequence[Mapping[str, Any]], best: float, unit: str) -> str | None:
    """Why `best` (the highest probe that holds) is only a lower bound of the sustainable load,
    or None when the next grid level above it was probed and does not hold."""
    above = [v for v in grid if v > best + 1e-9]
    if not above:
        return f"{best:g}{unit} is the sweep's highest level: no level it cannot take was found"
    nxt = above[0]
    there = [p for p in probes if abs(float(p["value"]) - nxt) <= 1e-9]
    if any(p.get("status") == "fail" for p in there):
        return None
    if there:
        return f"the next level, {nxt:g}{unit}, could not be judged (INCONCLUSIVE{_client_said(there)})"
    return f"the next level, {nxt:g}{unit}, was not probed"


def _client_said(probes: Sequence[Mapping[str, Any]]) -> str:
    """Why the load generator made these probes INCONCLUSIVE, in a few words for the figure's
    line (client_healthy names the probe and the whole reason), or ""."""
    if any(p.get("schedule") == schedproof.BROKEN for p in probes):
        return ": the load generator did not send on its schedule"
    if any(p.get("client") for p in probes):
        return ": the load generator was not healthy, see client_healthy"
    return ""


def sweep_workload(spec: Spec) -> Workload | None:
    return next((w for w in spec.workloads if w.load.search is not None), None)


def _fixed_load(load: Load, value: float) -> Load:
    """The sweep's load as one ordinary level of `value`."""
    if load.mode == "open":
        return dataclasses.replace(load, rates=(float(value),), search=None, max_wall_s=None)
    return dataclasses.replace(load, concurrency=(int(value),), search=None, max_wall_s=None)


def level_spec(spec: Spec, value: float) -> Spec:
    """The spec as if its sweep workload had been the one level `value` (its hash kept: the
    evidence was produced by this spec)."""
    workloads = tuple(dataclasses.replace(w, load=_fixed_load(w.load, value)) if w.load.search is not None else w
                      for w in spec.workloads)  # fmt: skip
    return dataclasses.replace(spec, workloads=workloads)


def _level_backend(be: BackendEvidence, workload: str, level: int) -> BackendEvidence:
    """One backend's evidence narrowed to one probe of the sweep, renumbered as level 0."""
    levels = [dict(e) | {"index": 0} for e in be.entry.get("levels") or [] if e.get("workload") == workload and e.get("index") == level]
    records = tuple(dict(r) | {"level": 0} if r.get("level") == level else r
                    for r in _probe_rows(be, level))  # fmt: skip
    traces = be.traces.narrowed(str(r.get("request_id")) for r in records)
    return dataclasses.replace(be, entry=dict(be.entry) | {"levels": levels}, records=records, traces=traces, table=None)


def _probe_rows(be: BackendEvidence, level: int):
    """The records of probe `level` and the follow-up: from `records` when the evidence was
    built in memory, else from the loaded table (`load_evidence` keeps columns, not rows). A
    sweep is one backend's short search, so one probe's rows as dicts are few."""
    if be.records or be.table is None:
        return [r for r in be.records if r.get("level") == level or r.get("bucket") == FOLLOW_UP_BUCKET]
    t = be.table
    idx = np.flatnonzero((t.i["level"] == level) | (t.i["bucket"] == FOLLOW_UP_BUCKET))
    return [dict(t.rec(int(i))) for i in idx]


def level_evidence(evidence: Evidence, workload: str, level: int) -> Evidence:
    backends = tuple(_level_backend(be, workload, level) for be in evidence.backends)
    manifest = dict(evidence.manifest) | {"backends": [dict(be.entry) for be in backends]}
    return dataclasses.replace(evidence, manifest=manifest, backends=backends)


def probe_schedule(evidence: Evidence) -> schedproof.Proof | None:
    """The schedule proof (judge/schedproof.py) of a one-level run (`level_evidence`): its
    records' intended starts -- warmup and measured -- against its manifest's schedule; None for
    a level that is no open loop (no schedule to prove)."""
    be = evidence.backends[0] if evidence.backends else None
    levels = be.entry.get("levels") or [] if be is not None else []
    if len(levels) != 1 or levels[0].get("mode") != "open":
        return None
    starts = [r.get("intended_start") for r in be.records if r.get("level") == 0 and r.get("bucket") != FOLLOW_UP_BUCKET]
    return schedproof.prove(levels[0], np.array([math.nan if t is None else t for t in starts], dtype=np.float64))


def probe_client(run: Any, *, tail_pending: bool = False) -> str | None:
    """Why the load generator's health makes the joined one-level run `run` INCONCLUSIVE as a
    probe (its client_healthy, schedule proof aside: `probe_schedule` proves that first), or
    None: it kept up, or its health is not judged (`client_healthy = false`, evidence from
    before client.jsonl). Saturated -- event-loop lag, CPU, schedule lag, achieved concurrency
    --, unable to send, off its cap, or unmeasured, the load generator's numbers are its own:
    the probe neither holds nor fails. `tail_pending`: the runner's judgement right after the
    probe (validity.client_healthy)."""
    from soakspec.judge.validity import client_healthy

    h = client_healthy(run, prove_schedule=False, tail_pending=tail_pending)
    return None if h.status == "pass" else h.message


def _probe(spec: Spec, evidence: Evidence, *, tail_pending: bool = False) -> tuple[str, str, str | None]:
    """pass | fail | inconclusive of the one-level run `evidence` (of the one-level `spec`), its
    schedule proof aside, why, and why its client made it INCONCLUSIVE (else None): INCONCLUSIVE
    when its load generator was not healthy (`probe_client`), else over every performance
    `require` rule, a failure first, else the first inconclusive; a timing FAIL its client's
    schedule lag alone decided is inconclusive, as the gate judges it (`validity.client_blocks`,
    CLIENT_LAG)."""
    from soakspec.judge.joined import join
    from soakspec.judge.judge import judge_performance

    rules = [r for r in spec.gate.rules if r.klass == "performance" and r.severity == "require"]
    run = join(spec, evidence)
    client = probe_client(run, tail_pending=tail_pending)
    if client is not None:  # the client's failure, not the load's: it neither holds nor fails
        return "inconclusive", f"client_healthy: {client}", client
    if not rules:
        return "pass", "no performance require rule", None
    from soakspec.judge.validity import client_blocks

    # a timing FAIL the probe's own schedule lag decided is INCONCLUSIVE here too (CLIENT_LAG)
    results = [client_blocks(run, [], r, judge_performance(run, r)) for r in rules]
    bad = [x for x in results if x.status == "fail"] or [x for x in results if x.status != "pass"]
    if not bad:
        return "pass", f"all {len(results)} performance rules pass", None
    first = bad[0]
    return ("fail" if first.status == "fail" else "inconclusive"), f"{first.rule}: {first.status.upper()} — {first.message}", None


def _proof_fields(proof: schedproof.Proof | None) -> dict[str, Any]:
    """A probe's schedule proof as its results.json entry holds it: `schedule` (and
    `schedule_why`), nothing where it has no schedule."""
    return {} if proof is None else {"schedule": proof.status} | ({"schedule_why": proof.reason} if proof.reason else {})


def judge_level(spec: Spec, evidence: Evidence, *, tail_pending: bool = False) -> dict[str, Any]:
    """One completed probe, judged as the search reads it -- the gate's re-judgement and the
    runner's own alike: `status` (pass | fail | inconclusive) and `why`; `schedule` (and
    `schedule_why`) for an open loop's schedule proof; `client`, why the load generator's
    health made it INCONCLUSIVE. A probe off its schedule, or whose client was not healthy,
    neither holds nor fails: the load it offered, or the times it measured, were the client's,
    so no figure of it is the server's -- counted as the server's failure, the search moved
    down. `evidence` is the one-level run (`level_evidence`), `spec` the one-level spec."""
    proof = probe_schedule(evidence)
    sched = _proof_fields(proof)
    if proof is not None and proof.status == schedproof.BROKEN:  # the client's failure, not the load's:
        from soakspec.judge.validity import SCHEDULE_BROKEN  # it neither holds nor fails

        return {"status": "inconclusive", "why": f"{SCHEDULE_BROKEN}: {proof.reason}"} | sched
    status, why, client = _probe(spec, evidence, tail_pending=tail_pending)
    return {"status": status, "why": why} | sched | ({"client": client} if client else {})


def _abort_on_client(spec: Spec, evidence: Evidence, stop: Mapping[str, Any]) -> str | None:
    """Why the abort rule that stopped a probe (`stop`, its `stopped_by`) fired on the load
    generator's own lag, or None: the gate's judgement of a run's abort
    (`validity.abort_on_client`: a saturated bucket beside it, or its schedule lag within the
    allowance), on the narrowed run, whose one level is numbered 0. Such a probe did not hold,
    but the server did not fail it either: INCONCLUSIVE."""
    from soakspec.judge.joined import join
    from soakspec.judge.validity import abort_on_client

    return abort_on_client(join(spec, evidence), dict(stop) | {"level": 0})


def judge_probe(spec: Spec, evidence: Evidence, *, tail_pending: bool = False) -> tuple[bool, str]:
    """Does the one-level run hold every performance `require` rule, its schedule proven (where
    it has one) and its client healthy? (the search's predicate: only PASS holds; see the module
    docstring and `judge_level`)"""
    j = judge_level(spec, evidence, tail_pending=tail_pending)
    return j["status"] == "pass", j["why"] if j["status"] != "inconclusive" else f"INCONCLUSIVE: {j['why']}"


def probe_judge(spec: Spec, *, time_scale: float = 1.0,
                rehearsal: bool = False) -> Callable[..., tuple[bool, str]]:
    """The runner's per-level predicate (`Deps.sweep_judge`): (backend, the probe's manifest
    level entry, its request rows, and its client.jsonl samples so far) -> (holds, why), judged
    in memory with the gate's per-probe checks (`judge_level`: the schedule proof, the client's
    health, the rules). The judge's functions are pure; the runner hands them what it wrote.
    The samples of the probe's last second may not be written yet when it is judged: a bucket
    no sample covers is not held against it here (`tail_pending`), the gate's re-judgement is
    what holds it to every bucket; saturation in any sample is."""
    wl = sweep_workload(spec)

    def judge_one(backend: str, entry: dict, rows: list[dict], client: Sequence[Mapping[str, Any]] = ()) -> tuple[bool, str]:
        if wl is None:
            return entry.get("completed") is True, "not a sweep"
        value = entry.get("rate") if wl.load.mode == "open" else entry.get("concurrency")
        one = level_spec(spec, value)
        lv = dict(entry) | {"index": 0}
        records = tuple(dict(r) | {"level": 0} for r in rows)
        samples = samples_of(sorted((r for r in client if r.get("backend") in (None, backend)), key=lambda r: r.get("t") or 0.0))
        be = BackendEvidence(name=backend, safe_name=backend, entry={"name": backend, "levels": [lv]}, records=records,
                             client=samples)
        manifest = {"status": "complete", "time_scale": time_scale, "rehearsal": rehearsal, "backends": [be.entry]}
        return judge_probe(one, Evidence(manifest, (be,), Integrity(checked=0, verified=True)), tail_pending=True)

    return judge_one


def _rejudge(spec: Spec, evidence: Evidence, be: BackendEvidence, wl: Workload) -> SweepResult:
    recorded = be.entry.get("sweep") if isinstance(be.entry.get("sweep"), Mapping) else {}
    axis = "rate" if wl.load.mode == "open" else "concurrency"
    probes: list[dict[str, Any]] = []
    best: tuple[float, int] | None = None
    disagrees = False
    by_level = {p.get("level"): p for p in recorded.get("probes") or [] if isinstance(p, Mapping)}
    for e in be.entry.get("levels") or []:
        if e.get("workload") != wl.name or not isinstance(e.get("index"), int):
            continue
        value = e.get(axis)
        if not isinstance(value, (int, float)):
            continue
        one = dataclasses.replace(evidence, backends=(be,), manifest=dict(evidence.manifest) | {"backends": [be.entry]})
        narrowed = level_evidence(one, wl.name, e["index"])
        stop = e.get("stopped_by") if isinstance(e.get("stopped_by"), Mapping) else {}
        if e.get("completed") is not True or stop:  # cut short, or an abort rule fired on it: it does not hold
            proof = probe_schedule(narrowed)  # every probe's, as the gate's found level's (validity.schedule_kept)
            j = _proof_fields(proof)
            if stop:  # an abort rule: the server could not take this load -- unless it fired on the client's own lag
                j |= {"status": "fail", "why": (f"the probe did not run its full duration{' (stopped by ' + str(stop.get('rule')) + ')' if stop.get('rule') else ''}"
                                                if e.get("completed") is not True else f"abort rule {stop.get('rule')} fired on it")}
                if (client := _abort_on_client(level_spec(spec, value), narrowed, stop)) is not None:
                    j |= {"status": "inconclusive", "why": f"{j['why']}; not judged a failure: {client}", "client": client}
            else:  # an interrupt, a dead backend, a failed run: nothing is known of this load
                j |= {"status": "inconclusive", "why": "the probe did not run its full duration (the run was cut short, not by an abort rule)"}
        else:  # its schedule proof, its client's health, its rules: as the runner's own judgement (`probe_judge`)
            j = judge_level(level_spec(spec, value), narrowed)
        passed = j["status"] == "pass"
        runner = by_level.get(e["index"], {}).get("passed")
        disagrees |= runner is not None and runner != passed
        probes.append({"level": e["index"], "value": value, "passed": passed, "status": j["status"], "why": j["why"],
                       "runner_passed": runner} | {k: v for k, v in j.items() if k not in ("status", "why")})
        if passed and (best is None or value > best[0]):
            best = (value, e["index"])
    unit = " rps" if axis == "rate" else ""
    lower = _lower_bound(workload_sweep(wl).grid, probes, best[0], unit) if best else None
    return SweepResult(be.name, wl.name, axis, tuple(probes), best[0] if best else None, best[1] if best else None,
                       bool(recorded.get("bounded_by_wall_time")), disagrees, lower)


def rejudge(spec: Spec, evidence: Evidence) -> tuple[SweepResult, ...]:
    """Every backend's sweep re-judged from its probes, as the gate does (`narrow`); () for a
    spec with no sweep. compare reads the figures alone (compare/sweep.py)."""
    wl = sweep_workload(spec)
    return () if wl is None else tuple(_rejudge(spec, evidence, be, wl) for be in evidence.backends)


def narrow(spec: Spec, evidence: Evidence) -> tuple[Spec, Evidence, tuple[SweepResult, ...]]:
    """For a sweep spec: every backend's sweep re-judged (`rejudge`), and the spec and evidence
    narrowed to the found level (the lowest probe when none holds), which the gate then judges
    as a one-level run. Anything else is returned as it is, with no sweep."""
    wl = sweep_workload(spec)
    if wl is None:
        return spec, evidence, ()
    results = rejudge(spec, evidence)
    if not results:
        return spec, evidence, ()
    r0 = results[0]  # a sweep spec has one backend (checked)
    levels = [p for p in r0.probes]
    if not levels:
        return spec, evidence, results
    if r0.found_level is not None:
        level, value = r0.found_level, r0.result
    else:
        low = min(levels, key=lambda p: p["value"])
        level, value = low["level"], low["value"]
    return level_spec(spec, value), level_evidence(evidence, wl.name, level), results


def sweep_rule(results: Sequence[SweepResult]) -> RuleResult | None:
    """The sweep's own line in the verdict: PASS with the figure, FAIL when no level held."""
    if not results:
        return None
    failed = [r for r in results if r.result is None]
    # no level held: FAIL -- unless no probe ran, or the lowest was only short of samples or cut
    # short by an interrupt (INCONCLUSIVE: nothing says it does not hold)
    unsure = [r for r in failed if r.lowest_unsure]
    msg = "; ".join(f"backend {r.backend}: {r.text()}" + (" (the runner's own judgement of a probe differs; the judge's is used)"
                                                           if r.disagrees else "") for r in results)  # fmt: skip
    status = "pass" if not failed else "inconclusive" if len(unsure) == len(failed) else "fail"
    r0 = results[0]
    where = Location(backend=r0.backend)
    inst = [Instance(status, where, None, None, len(r0.probes), msg)] if failed else []
    return RuleResult(rule=f"sweep {r0.axis} (bisect)", klass="performance", severity="require", status=status,
                      message=msg, builtin=True, metric=r0.figure, observed=r0.result if not failed else None,
                      observed_text=f"{r0.figure} = {'none' if r0.result is None else ('at least ' if r0.lower_bound else '') + f'{r0.result:g}'}",
                      samples=len(r0.probes), instances=len(results), failing=len(failed), details=tuple(inst))  # fmt: skip
