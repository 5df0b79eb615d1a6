"""Validity rules: is this a run the gate can speak about? (see `soakspec.judge.judge`)

    completed_run   the run is whole: manifest complete, nothing cut off or unusable, every
                    planned backend and level present and completed, every sent request
                    recorded once, nothing outside the manifest's levels and buckets
    full_scale_run  not a rehearsal nor time-scaled, unless the gate allows it
    min_samples     enough completed requests in every level, one in every planned bucket

Each is `rule(run, spec_rule) -> RuleResult`; `spec_rule` is None for the built-in check.
"""

from __future__ import annotations

from soakspec.judge.common import backend_here, loc, plural, problem, result
from soakspec.judge.index import BackendIndex, LevelIndex
from soakspec.judge.joined import JudgedRun
from soakspec.judge.measures import completed
from soakspec.judge.scope import bucket_scope, level_scope
from soakspec.judge.verdict import Instance, Location, RuleResult
from soakspec.lang.spec import Rule
from soakspec.plan import BackendPlan, Level

MAX_SHOWN = 5  # malformed or unusable rows named one by one


def _run_problems(run: JudgedRun) -> list[Instance]:
    """What is wrong with the run as a whole: its status, its files, its manifest."""
    out: list[Instance] = []
    ev = run.evidence
    m = ev.manifest
    status = m.get("status")
    if status != "complete":
        reason = m.get("incomplete_reason")
        out.append(problem(f"the run's status is {status or 'unknown'}" + (f": {reason}" if reason else "")))
    for f in ev.integrity.incomplete:
        # V201 repeats the status; V205 (no results.json yet) does not matter: the judge
        # recomputes every number from the raw evidence
        if f.code not in ("V201", "V205"):
            out.append(problem(f.text()))
    for f in ev.integrity.malformed[:MAX_SHOWN]:
        out.append(problem(f"malformed evidence: {f.text()}"))
    if len(ev.integrity.malformed) > MAX_SHOWN:
        out.append(problem(f"... and {len(ev.integrity.malformed) - MAX_SHOWN} more malformed records"))
    if run.bad_time_scale:
        out.append(problem(f"the manifest's time_scale {m.get('time_scale')!r} is not in (0, 1]"))
    for be in ev.backends:
        if be.name not in run.planned:
            out.append(problem(f"backend {be.name} is in the evidence but not planned by the spec"))
    return out


def _backend_problems(bi: BackendIndex) -> list[Instance]:
    """What is wrong with one backend's evidence, before its levels."""
    out: list[Instance] = []
    be = bi.evidence
    here = backend_here(bi.name)
    for rel in be.partial_tail:
        out.append(problem(f"{rel} ends in a cut-off line (the writer was killed)", here))
    for p in be.problems[:MAX_SHOWN]:
        out.append(problem(f"unusable evidence: {p}", here))
    if len(be.problems) > MAX_SHOWN:
        out.append(problem(f"... and {len(be.problems) - MAX_SHOWN} more unusable rows", here))
    for note in be.mislabeled:
        out.append(problem(f"malformed evidence: {note}", here))
    aborted = be.entry.get("aborted_reason")
    if aborted:
        out.append(problem(f"backend {bi.name} was aborted: {aborted}", here))
    if bi.orphans:
        out.append(problem(f"{plural(len(bi.orphans), 'measured request')} belong to no level the manifest lists", here))
    seen: set[str] = set()
    dups = sorted({rid for r in bi.all_records if (rid := str(r["request_id"])) in seen or seen.add(rid)})  # type: ignore[func-returns-value]
    if dups:
        out.append(problem(f"{plural(len(dups), 'request id')} recorded more than once (first: {dups[0]})", here))
    return out


def _missing_level(run: JudgedRun, name: str, plv: Level) -> Location:
    label = run.plan_label(plv)
    return Location(name, plv.workload, plv.index, label, text=f"backend {name}, {label}")


def _level_problems(bi: BackendIndex, lv: LevelIndex) -> list[Instance]:
    """What is wrong with one planned level that ran."""
    out: list[Instance] = []
    lloc = loc(level_scope(bi, lv))
    if lv.entry.get("completed") is not True:
        out.append(problem("the level did not run its full duration (completed = false)", lloc))
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


def _planned_backend_problems(run: JudgedRun, name: str, bp: BackendPlan) -> list[Instance]:
    bi = run.backends.get(name)
    if bi is None:
        return [problem(f"backend {name} did not run (no evidence for it)", backend_here(name))]
    out = _backend_problems(bi)
    for plv in bp.levels:
        lv = run.level(name, plv)
        if lv is None:
            out.append(problem(f"{run.plan_label(plv)} did not run", _missing_level(run, name, plv)))
        else:
            out.extend(_level_problems(bi, lv))
    return out


def completed_run_problems(run: JudgedRun) -> list[Instance]:
    out = _run_problems(run)
    for name, bp in run.planned.items():
        out.extend(_planned_backend_problems(run, name, bp))
    return out


def completed_run(run: JudgedRun, rule: Rule | None) -> RuleResult:
    insts = completed_run_problems(run)
    n_req = sum(len(bi.measured) for bi in run.judged)
    n_lv = sum(len(bp.levels) for bp in run.planned.values())
    msg = f"run complete: {plural(len(run.planned), 'backend')}, {plural(n_lv, 'level')}, {plural(n_req, 'measured request')}"
    if rule is None:
        # built in: a broken run cannot support a verdict either way
        insts = [Instance("inconclusive", i.where, None, None, None, i.message) for i in insts]
        return result(None, "completed_run", "validity", "require", insts, msg, 1)
    return result(rule, "completed_run", "validity", rule.severity, insts, msg, 1)


def full_scale_run(run: JudgedRun, rule: Rule | None = None) -> RuleResult:
    what = []
    if run.rehearsal:
        what.append("a rehearsal against the simulator")
    if run.time_scale != 1:
        what.append(f"time-scaled by {run.time_scale:g}")
    if not what:
        return result(None, "full_scale_run", "validity", "require", [], "a full-scale run against the declared backends", 1)
    desc = " and ".join(what)
    if run.gate.allow_rehearsal:
        return result(None, "full_scale_run", "validity", "require", [], f"{desc}; the gate allows rehearsals (allow_rehearsal)", 1)
    inst = problem(f"the run is {desc}: it says nothing about the real backends at full duration (the gate would need allow_rehearsal = true)",
                   status="inconclusive")
    return result(None, "full_scale_run", "validity", "require", [inst], "", 1)


def _level_samples(run: JudgedRun, bi: BackendIndex, plv: Level, lv: LevelIndex) -> list[Instance]:
    """Too few completed requests in a level, or a planned bucket with none."""
    out: list[Instance] = []
    need = max(run.gate.min_samples, 1 if plv.mode == "open" else plv.min_requests)
    have = len(completed(lv.records))
    where = loc(level_scope(bi, lv))
    if have < need:
        out.append(Instance("inconclusive", where, float(have), None, have,
                            f"{plural(have, 'completed request')}; needs {need - have} more (at least {need})", need - have))
    planned = {pb.index for pb in plv.buckets}
    for w in lv.buckets:
        if w.index in planned and not completed(w.records):
            out.append(Instance("inconclusive", loc(bucket_scope(bi, lv, w)), 0.0, None, 0,
                                "no completed request in the bucket: it measured nothing", 1))
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
    msg = "every level has enough completed requests, every bucket at least one" + (f" (fewest: {fewest[0]} in {fewest[1]})" if fewest else "")
    return result(None, "min_samples", "validity", "require", insts, msg, count)
