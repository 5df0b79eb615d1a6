"""Evidence rules: is the evidence whole and trustworthy? (see `soakspec.judge.judge`)

    artifacts_verified         built in: every artifact matches the manifest's sha256 (none
                               checked -- a manifest never finalized, or listing none: INCONCLUSIVE)
    bucket_coverage            every planned bucket present, each with a completed request
    duration_coverage          every planned level measured for its planned duration
    trace_coverage             share of completed measured requests with a matched trace (as the
                               judge re-matches them), per scope; an attempt that did not
                               complete neither counts as covered nor needs a trace
    follow_up                  the clean follow-up request after the load passed
    provenance_consistent      one commit and one model across backends, unchanged during the run,
                               from a clean tree (no uncommitted change before or after)
    runtime_boundary_specific  every backend's runtime boundary confirmed or declared

Each is `rule(run, spec_rule) -> RuleResult` (`spec_rule` None: the built-in check).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from soakspec.evidence.layout import FOLLOWUP, FOLLOWUP_NOT_SENT
from soakspec.evidence.manifest import stored_spec_sha256
from soakspec.judge.evidence import embedded_spec_sha256
from soakspec.judge.common import backend_here, compare, describe_request, loc, plural, problem, result
from soakspec.judge.index import BackendIndex, LevelIndex, Row
from soakspec.judge.joined import JudgedRun
from soakspec.judge.measures import completed
from soakspec.judge.scope import Scope, bucket_scope, level_scope, scopes
from soakspec.judge.table import Rows, slices
from soakspec.judge.validity import client_cuts
from soakspec.judge.verdict import Instance, Location, RuleResult
from soakspec.lang.spec import Rule
from soakspec.plan import Level
from soakspec.units import format_duration

DURATION_TOLERANCE_S = 1e-3  # a level measured this much short of its plan still covers it
SPECIFIC_RUNTIME = ("confirmed", "declared")  # runtime boundary statuses that pass


def artifacts_verified(run: JudgedRun, rule: Rule | None) -> RuleResult:
    integ = run.evidence.integrity
    insts: list[Instance] = []
    if not integ.verified:
        insts.append(problem("the evidence was not re-hashed (built in memory, not loaded from a directory)", status="inconclusive"))
    for f in integ.tampered:
        insts.append(problem(f.message, Location(text=f.path)))
    # a directory verified with nothing compared with a sha256 (files never hashed: a run killed
    # before it finalized its manifest; or a manifest listing none) is no pass: missing data
    # never is. (Evidence built in memory -- tests, a sweep's probe -- has no directory to hash.)
    unhashed = [f for f in integ.incomplete if f.code == "V204"]
    if integ.verified and integ.checked == 0 and not integ.tampered and (unhashed or run.evidence.root is not None):
        why = (f"{unhashed[0].message}: no artifact could be checked against a sha256" if unhashed
               else "the manifest lists no artifact: nothing was checked against a sha256")
        insts.append(problem(why, Location(text="manifest.json"), status="inconclusive"))
    spec = run.evidence.manifest.get("spec")
    already = any(f.code == "V109" for f in integ.tampered)
    want = stored_spec_sha256(spec) if isinstance(spec, Mapping) else None
    if not already and isinstance(spec, Mapping) and isinstance(spec.get("text"), str) and isinstance(want, str):
        if embedded_spec_sha256(spec["text"]) not in (None, want):
            insts.append(problem("the spec text embedded in the manifest does not match its recorded sha256", Location(text="manifest.json")))
    msg = f"all {plural(integ.checked, 'artifact')} match the sha256 recorded in the manifest"
    severity = rule.severity if rule else "require"
    return result(rule, "artifacts_verified", "evidence", severity, insts, msg, max(1, integ.checked))


def _missing_level(run: JudgedRun, name: str, plv: Level) -> Location:
    label = run.plan_label(plv)
    return Location(name, plv.workload, plv.index, label, text=f"backend {name}, {label}")


NOT_YET = "not closed yet (the run is still going, or was killed)"  # a partial judge's bucket or level to come


def _bucket_gaps(bi: BackendIndex, plv: Level, lv: LevelIndex, partial: bool = False) -> list[Instance]:
    """The planned buckets of a level that are missing, have no window or measured nothing
    (`partial`: a missing bucket is one not closed yet, inconclusive)."""
    out: list[Instance] = []
    by_index = {w.index: w for w in lv.buckets if w.planned}
    # a count-bounded level that sent its count ended with its last request: the buckets after
    # its last listed one were never to run (one its duration ended first lists them all)
    last = max(by_index) if lv.ended_by_count and by_index else None
    for pb in plv.buckets:
        w = by_index.get(pb.index)
        if w is None and last is not None and pb.index > last:
            continue
        if w is None:
            where = Location(bi.name, lv.workload, lv.index, lv.label, pb.index, text=f"backend {bi.name}, {lv.label}, bucket {pb.index}")
            out.append(Instance("inconclusive", where, None, None, 0, f"bucket {NOT_YET}") if partial
                       else Instance("fail", where, 0.0, None, 0, "bucket missing from the evidence"))
            continue
        sc = bucket_scope(bi, lv, w)
        done = len(completed(w.records))
        if w.start is None or w.end is None:
            out.append(Instance("fail", loc(sc), float(done), None, done, "the bucket has no wall-clock window"))
        elif done == 0:
            what = "no request" if not w.records else f"no completed request (of {len(w.records)} measured)"
            out.append(Instance("fail", loc(sc), 0.0, None, len(w.records), f"{what} in the bucket"))
    return out


def bucket_coverage(run: JudgedRun, rule: Rule) -> RuleResult:
    insts: list[Instance] = []
    n = 0
    for name, bp in run.planned_for(rule):
        bi = run.backends.get(name)
        if bi is None:
            insts.append(Instance("fail", backend_here(name), 0.0, None, 0, "no evidence for this backend"))
            continue
        for plv in bp.levels:
            lv = run.level(name, plv)
            # a count-bounded level that sent its count planned the buckets it ran (it ended early)
            n += len(plv.buckets) if lv is None or not lv.ended_by_count else sum(w.planned for w in lv.buckets)
            if lv is None and run.partial:
                insts.append(Instance("inconclusive", _missing_level(run, name, plv), None, None, 0, f"level {NOT_YET}"))
            elif lv is None:
                insts.append(Instance("fail", _missing_level(run, name, plv), 0.0, None, 0,
                                      f"level missing: none of its {plural(len(plv.buckets), 'bucket')} ran"))
            else:
                insts.extend(_bucket_gaps(bi, plv, lv, run.partial))
    msg = f"all {plural(n, 'planned bucket')} present, each with a completed request"
    return result(rule, "bucket_coverage", "evidence", rule.severity, insts, msg, n)


def _duration_shortfall(run: JudgedRun, name: str, plv: Level, client_cut: str | None = None) -> Instance | None:
    """The failure of one planned level measured for less than its planned duration
    (`client_cut`: why a timing abort on the client's own lag left it short, `ClientCut`: then
    a shortfall is inconclusive, saying so)."""
    inst = _shortfall(run, name, plv)
    if inst is None or client_cut is None or inst.status != "fail" or inst.observed is None:
        return inst  # (no observed value: a level entry without its times, whatever cut it)
    return dataclasses.replace(inst, status="inconclusive", message=f"{inst.message}: {client_cut}")


def _shortfall(run: JudgedRun, name: str, plv: Level) -> Instance | None:
    bi = run.backends.get(name)
    lv = run.level(name, plv) if bi is not None else None
    planned = format_duration(plv.duration_s)
    if run.partial and (lv is None or lv.entry.get("completed") is not True):  # still to come, not short
        return Instance("inconclusive", _missing_level(run, name, plv), None, None, None, f"level {NOT_YET}")
    if lv is None or bi is None:
        return Instance("fail", _missing_level(run, name, plv), 0.0, "0s", 0, f"not measured at all (planned {planned})")
    where = loc(level_scope(bi, lv))
    a, b = lv.measure_start, lv.measure_end
    if a is None or b is None:
        return Instance("fail", where, None, None, None, f"no measured start/end recorded (planned {planned})")
    wall = b - a
    count = lv.count_sent
    if count is not None:  # a count-bounded level covers its plan by its count: its duration is a bound
        if count[0] >= count[1] and lv.entry.get("completed") is True:
            return None
        return Instance("fail", where, float(count[0]), f"{count[0]} of {count[1]} requests", count[0],
                        f"sent {count[0]} of its {count[1]} requests in {format_duration(wall)} "
                        f"(at most {planned}): the count was not covered")
    if wall + DURATION_TOLERANCE_S < plv.duration_s:
        return Instance("fail", where, wall, format_duration(wall), None,
                        f"measured {format_duration(wall)} of {planned} planned (a run cut short never covers its plan)")
    return None


def duration_coverage(run: JudgedRun, rule: Rule) -> RuleResult:
    insts: list[Instance] = []
    n = counted = 0
    cuts = client_cuts(run)
    for name, bp in run.planned_for(rule):
        cut = cuts.get(name)
        for plv in bp.levels:
            n += 1
            counted += plv.requests_per_level is not None
            inst = _duration_shortfall(run, name, plv, cut.why if cut is not None and cut.covers(bp, plv) else None)
            if inst is not None:
                insts.append(inst)
    msg = f"all {plural(n, 'level')} measured for their planned duration"
    if counted == n:  # requests_per_level: such a level is covered by its count, its duration only a bound
        msg = f"all {plural(n, 'level')} sent their requests_per_level (count-bounded: the duration only bounds them)"
    elif counted:
        msg = f"all {plural(n, 'level')} measured for their planned duration or, the {counted} count-bounded, sent their requests_per_level"
    return result(rule, "duration_coverage", "evidence", rule.severity, insts, msg, n)


def _follow_up_problem(run: JudgedRun, name: str, planned: bool, client_cut: str | None = None) -> Instance | None:
    """Why one backend's follow-up does not pass, or None (`client_cut`: why a timing abort on
    the client's own lag stopped its load, `ClientCut`: a follow-up not sent is then inconclusive)."""
    here = backend_here(name)
    bi = run.backends.get(name)
    if bi is None:
        return problem("no evidence for this backend", here)
    f = bi.evidence.followup
    if not planned:
        return None
    if f is None:  # missing, or there and unreadable (its problem says how: not a "missing" file)
        bad = next((p for p in bi.evidence.problems if FOLLOWUP in p), None)
        if bad is None and run.partial:  # sent after the last level: not due yet in a run not finished
            return problem("no follow-up yet: it is sent after the last level, and the run is not finished "
                           "(still going, or killed)", here, "inconclusive")
        return problem(f"no follow-up evidence ({bad})" if bad else "no follow-up evidence (followup.json missing)", here)
    if f.get("required") is False:
        return problem("the spec plans a follow-up request but the run did not require one", here)
    if f.get("passed") is not True:
        rec = f.get("record")
        if client_cut is not None and rec is None and f.get("reason") == FOLLOWUP_NOT_SENT:
            return problem(f"{FOLLOWUP_NOT_SENT}: {client_cut}", here, "inconclusive")
        why = f.get("reason") or (describe_request(rec) if isinstance(rec, Mapping) else "it did not pass")
        return problem(f"the clean follow-up request failed: {why}", here)
    if f.get("server_idle") is False:
        return problem("the follow-up completed but the server still showed active or pending requests", here)
    return None


def follow_up(run: JudgedRun, rule: Rule) -> RuleResult:
    insts: list[Instance] = []
    planned = run.planned_for(rule)
    unplanned = 0
    cuts = client_cuts(run)
    for name, bp in planned:
        inst = _follow_up_problem(run, name, bp.follow_up, cuts[name].why if name in cuts else None)
        if inst is not None:
            insts.append(inst)
        elif not bp.follow_up:
            unplanned += 1
    msg = "the clean follow-up request passed on every backend"
    if unplanned and unplanned == len(planned):
        msg = "no follow-up request is planned"
    return result(rule, "follow_up", "evidence", rule.severity, insts, msg, len(planned))


def _part(e: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """A manifest entry's sub-object `key` ({} when absent or not an object)."""
    v = e.get(key)
    return v if isinstance(v, Mapping) else {}


def _dirty_allowed(run: JudgedRun) -> bool:
    """Whether the spec accepts a run from a tree with uncommitted changes (`source {
    allow_dirty = true }`); read here and only here. A dirty tree then passes
    provenance_consistent, and the passing message says that it was dirty."""
    return run.spec.source.allow_dirty


def _provenance_of(run: JudgedRun, name: str, e: Mapping[str, Any]) -> tuple[list[Instance], str | None]:
    """One backend's provenance problems, and its commit when it has one, unchanged."""
    out: list[Instance] = []
    commit = None
    here = backend_here(name)
    src = _part(e, "source")
    before, after = src.get("commit_before"), src.get("commit_after")
    if not before or not after:
        if run.spec.source.repo is not None or before or after:
            why = src.get("reason")
            out.append(problem("no source commit recorded" + (f" ({why})" if why else ""), here))
    elif before != after:
        out.append(problem(f"the commit changed during the run ({before[:12]} before, {after[:12]} after)", here))
    else:
        commit = before
    if src.get("dirty_before") != src.get("dirty_after"):
        out.append(problem(f"the working tree changed during the run (dirty before: {src.get('dirty_before')}, after: {src.get('dirty_after')})", here))
    elif src.get("dirty_before") is True and not _dirty_allowed(run):
        out.append(problem("the working tree had uncommitted changes before and after the run (dirty_before = dirty_after = true): "
                           "the commit does not say what ran", here))
    model = _part(e, "model")
    want_rev = run.spec.model.revision
    if want_rev and model.get("revision") != want_rev:
        out.append(problem(f"model revision {model.get('revision')!r} is not the spec's {want_rev!r}", here))
    if run.spec.model.path and not model.get("fingerprint") and not run.rehearsal:
        why = model.get("reason")
        out.append(problem("no model fingerprint recorded" + (f" ({why})" if why else ""), here))
    return out, commit


def _model(e: Mapping[str, Any], key: str) -> Any:
    return _part(e, "model").get(key)


def provenance_consistent(run: JudgedRun, rule: Rule) -> RuleResult:
    insts: list[Instance] = []
    commits: dict[str, str] = {}
    entries = [(n, run.backends[n].evidence.entry) for n, _ in run.planned_for(rule) if n in run.backends]
    for name, e in entries:
        found, commit = _provenance_of(run, name, e)
        insts.extend(found)
        if commit is not None:
            commits[name] = commit
    revisions = {n: _model(e, "revision") for n, e in entries}
    fingerprints = {n: _model(e, "fingerprint") for n, e in entries}
    for label, values in (("commits", commits), ("model revisions", revisions), ("model fingerprints", fingerprints)):
        distinct = sorted({str(v) for v in values.values()})
        if len(distinct) > 1:
            listing = ", ".join(f"{n}: {str(v)[:12]}" for n, v in values.items())
            insts.append(problem(f"backends ran different {label} ({listing})", Location(text="across backends")))
    one = sorted(set(commits.values()))
    dirty = any(_part(e, "source").get("dirty_before") is True for _, e in entries)
    if len(one) == 1:
        msg = f"one commit ({one[0][:12]}) and one model across {plural(len(entries), 'backend')}, unchanged during the run"
        if dirty:
            msg += "; the working tree had uncommitted changes, which the spec allows (allow_dirty = true)"
    else:
        msg = f"one model across {plural(len(entries), 'backend')}; no source repository declared, so no commit to check"
    return result(rule, "provenance_consistent", "evidence", rule.severity, insts, msg, max(1, len(entries)))


def runtime_boundary_specific(run: JudgedRun, rule: Rule) -> RuleResult:
    insts: list[Instance] = []
    shown = []
    planned = run.planned_for(rule)
    for name, _ in planned:
        here = backend_here(name)
        bi = run.backends.get(name)
        if bi is None:
            insts.append(problem("no evidence for this backend", here))
            continue
        rb = _part(bi.evidence.entry, "runtime_boundary")  # re-derived by the judge (`rederive`)
        status = rb.get("status")
        display = rb.get("display") or rb.get("declared") or "none"
        stored = rb.get("stored_status", status)
        if status in SPECIFIC_RUNTIME and stored not in SPECIFIC_RUNTIME:
            # the manifest's own label says it is not specific: never better than what was recorded
            insts.append(problem(f"runtime boundary {display!r} is recorded as {stored or 'not recorded'}", here))
            continue
        if status in SPECIFIC_RUNTIME:
            shown.append(f"{name}: {display} ({status})")
            continue
        details = rb.get("details")
        details = details if isinstance(details, list) else []
        why = "; ".join(str(d) for d in details)
        insts.append(problem(f"runtime boundary {display!r} is {status or 'not recorded'}" + (f": {why}" if why else ""), here))
    msg = "; ".join(shown) or "runtime boundaries specific"
    return result(rule, "runtime_boundary_specific", "evidence", rule.severity, insts, msg, max(1, len(planned)))


def _traced_in(sc: Scope) -> Callable[[Row], bool]:
    """Has a request of scope `sc` a matched trace from its own backend? Only a completed
    request counts: the trace of an attempt that did not complete covers nothing."""
    if len(sc.backends) == 1:
        traced = sc.backends[0].traced
        return lambda r: r.get("outcome") == "completed" and r.get("request_id") in traced
    by_name: dict[str, BackendIndex] = {}
    for bi in sc.backends:
        by_name.setdefault(bi.name, bi)
    return lambda r: (r.get("outcome") == "completed" and (bi := by_name.get(r.get("backend"))) is not None
                      and r.get("request_id") in bi.traced)  # type: ignore[arg-type]


def _traced_count(sc: Scope, done: Rows) -> int:
    """Completed requests of `done` with a matched trace from their own backend (the table's
    backend: `_traced_in` for one request)."""
    if len(sc.backends) != 1:
        return sum(1 for r in done if _traced_in(sc)(r))
    bi = sc.backends[0]
    # a chunk of rows at a time: a whole run's mask was 2 bytes a request at once
    return sum(int(bi.traced_mask(t, part).sum()) for t, idx in done.parts for part in slices(idx))


def _coverage_instance(sc: Scope, rule: Rule) -> tuple[Instance | None, float | None, int, int]:
    """(the instance when it does not pass, coverage, traced, total) of one scope instance."""
    assert rule.op is not None and rule.threshold is not None
    if not sc.records:
        return Instance("inconclusive", loc(sc), None, None, 0, "no measured requests to trace"), None, 0, 0
    done = completed(sc.records)
    total = len(done)
    where = loc(sc)
    if total == 0:
        return Instance("inconclusive", where, None, None, len(sc.records), "no request in it completed: nothing was measured", 1), None, 0, 0
    traced = _traced_count(sc, done) if isinstance(done, Rows) else sum(1 for r in done if _traced_in(sc)(r))
    cov = traced / total
    if compare(cov, rule.op, rule.threshold):
        return None, cov, traced, total
    is_traced = _traced_in(sc)
    first = next((r for r in done if not is_traced(r)), None)
    tail = f"; first untraced: {first.get('request_id')}" if first is not None else ""
    return Instance("fail", where, cov, f"trace coverage = {cov * 100:.4g}%", total,
                    f"trace coverage {cov * 100:.4g}% ({traced} of {total} requests traced; threshold {rule.op} {rule.threshold_text}){tail}"), cov, traced, total


def stepped_note(bi: BackendIndex) -> str | None:
    """What trace matching placed across a wall-clock step that client.jsonl records (the
    server stamps traces by the wall clock; the run's times are the run clock's:
    `soakspec.evidence.traces.wall_steps`), or None."""
    stepped = bi.table.aux.get("wall_stepped") if bi.table is not None else None
    if not stepped:
        return None
    n = sum(stepped.values())
    steps = ", ".join(f"{d:+.3f} s" for d in sorted(stepped, key=lambda d: (-stepped[d], abs(d))))
    return (f"{bi.name}: {plural(n, 'trace')} matched across a step of the machine's wall clock that client.jsonl "
            f"records ({steps}): stamped by the stepped clock, {'their' if n != 1 else 'its'} times less the step "
            "lie in the request's window")


def trace_coverage(run: JudgedRun, rule: Rule) -> RuleResult:
    assert rule.op is not None and rule.threshold is not None
    insts: list[Instance] = []
    bis = run.backends_for(rule)
    traced_bis = []
    for bi in bis:
        if bi.trace_source == "none" and not compare(0.0, rule.op, rule.threshold):
            insts.append(Instance("fail", backend_here(bi.name), 0.0, "0%", len(bi.measured),
                                  f"the backend declares no traces (traces source = none), so no request can be traced (threshold {rule.op} {rule.threshold_text})"))
        else:
            traced_bis.append(bi)
    worst: tuple[float, Location, int, int] | None = None
    instances = scopes(rule.scope, traced_bis, rule.window_s) if traced_bis else []
    for sc in instances:
        inst, cov, traced, total = _coverage_instance(sc, rule)
        if inst is not None:
            insts.append(inst)
        if cov is not None and (worst is None or cov < worst[0]):
            worst = (cov, loc(sc), traced, total)
    if worst is not None:
        msg = f"lowest trace coverage {worst[0] * 100:.4g}% ({worst[2]} of {worst[3]} requests) in {worst[1].text}"
        observed = worst[0]
    else:
        msg = "no traced requests to check"
        observed = None
    stepped = [note for bi in traced_bis if (note := stepped_note(bi)) is not None]
    if stepped:
        msg += "; " + "; ".join(stepped)
    return result(rule, "trace_coverage", "evidence", rule.severity, insts, msg, len(instances) + len(bis) - len(traced_bis),
                  observed=observed if not insts else next((i.observed for i in insts if i.status == "fail"), observed))
