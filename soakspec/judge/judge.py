"""`judge(spec, evidence) -> Verdict`: pure and deterministic.

Rules are judged in three classes, in order:

validity     Is this a run the gate can speak about? Built in, always run:
               completed_run   manifest status complete; no cut-off, malformed or unusable row;
                               every planned backend and level present and `completed`; as many
                               records as requests the level counted as sent, no duplicate id,
                               no request outside the manifest's levels and buckets; no backend
                               aborted. The planned backends are the spec's, narrowed by the
                               manifest's `only` list when the run was restricted.
               full_scale_run  not a rehearsal nor time-scaled, unless `allow_rehearsal`;
               min_samples     every level has at least max(gate min_samples, the plan's minimum)
                               completed requests, and every planned bucket at least one.
             A failing built-in is INCONCLUSIVE (the evidence cannot support a verdict); the
             spec's own `require completed_run` replaces the built-in and FAILs instead.
evidence     Is the evidence whole and trustworthy? artifacts_verified is built in and FAILs
             on any artifact changed, missing or unlisted since the run (never only
             inconclusive); the spec's bucket_coverage, duration_coverage, trace_coverage,
             follow_up, provenance_consistent and runtime_boundary_specific are judged when the
             spec writes them.
performance  The spec's comparisons, each over every instance of its scope (run, backend,
             level, bucket, window); the worst instance is reported, and a count rule that
             fails at a coarse scope names the buckets holding the offending requests. When a
             `require` rule of the first two classes FAILs, performance rules are
             `not_evaluated` (an inconclusive one -- a rehearsal, too few samples -- does not
             block them: a failure seen is a failure).

Missing data is never a pass:
  - a percentile rule passes only with at least max(min_samples_for_percentile(q, confidence),
    gate min_samples) samples in the scope; with fewer it is INCONCLUSIVE ("needs N more
    requests"), except that it FAILs when so many samples violate the threshold that the
    percentile is beyond it at the gate's confidence;
  - other distribution aggregates need gate min_samples samples;
  - count, ratio and rate rules over a scope with no measured request are INCONCLUSIVE; over a
    scope where requests ran but none completed they can FAIL (e.g. `failed == 0`) but not pass;
    so adding a failed request can never turn a rule into PASS;
  - drift() and slope() need every compared bucket to have enough samples itself.
`warn` rules report `warn` instead of `fail` and never decide the verdict. Verdict: FAIL if a
require rule failed; else INCONCLUSIVE if a require rule is inconclusive or not evaluated; else
PASS.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from soakspec.evidence.io import sha256_text
from soakspec.judge import stats
from soakspec.judge import summary as S
from soakspec.judge.evidence import Evidence
from soakspec.judge.verdict import MAX_LISTED, Instance, Location, RuleResult, Status, Verdict, decide
from soakspec.lang.metrics import METRICS, Kind
from soakspec.lang.spec import Rule, Spec
from soakspec.plan import BackendPlan, Level, Plan, plan as make_plan
from soakspec.units import format_duration, format_size

OPS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}
FOLLOW_UP_BUCKET = -2
DURATION_TOLERANCE_S = 1e-3  # a level measured this much short of its plan still covers it
BAD_OUTCOMES = ("failed", "timeouts", "rejected", "disconnected", "errors")
_NOUN = {
    "failed": "failed request",
    "timeouts": "timed-out request",
    "rejected": "rejected request",
    "disconnected": "disconnected request",
    "errors": "unsuccessful request",
}
BUILTIN_VALIDITY = ("completed_run", "full_scale_run", "min_samples")  # always judged
SPECIFIC_RUNTIME = ("confirmed", "declared")  # runtime boundary statuses that pass


def compare(value: float, op: str, threshold: float) -> bool:
    return OPS[op](value, threshold)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def rule_display(rule: Rule) -> str:
    text = rule.text or rule.expr.text
    for sev in ("require ", "warn "):
        if text.startswith(sev):
            return text[len(sev):]
    return text


def format_value(value: float | None, kind: Kind | None) -> str:
    """Human text for a value in base units."""
    if value is None:
        return "n/a"
    if kind is Kind.DURATION:
        return format_duration(value)
    if kind is Kind.SIZE:
        return format_size(value)
    if kind is Kind.RATIO:
        return f"{value * 100:.4g}%"
    if kind is Kind.RATE:
        return f"{value:.4g} rps"
    if kind is Kind.COUNT and float(value).is_integer():
        return str(int(value))
    return f"{value:.4g}"


def _signed_pct(v: float) -> str:
    return f"{v * 100:+.3g}%"


def _short(text: str, n: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def describe_request(r: Mapping[str, Any]) -> str:
    """`HTTP 200 with an in-stream error: "engine died"` -- what went wrong, for a reviewer."""
    err = r.get("error")
    msg = f'"{_short(err)}"' if isinstance(err, str) and err else "no error message"
    status = r.get("status")
    outcome = r.get("outcome")
    if outcome == "failed" and status == 200:
        return f"HTTP 200 with an in-stream error: {msg}"
    if isinstance(status, int):
        return f"HTTP {status}: {msg}"
    if outcome == "timeout":
        return f"deadline passed: {msg}"
    if outcome == "disconnected":
        return f"connection lost: {msg}"
    return msg


def _loc(sc: S.Scope) -> Location:
    lv = sc.level
    return Location(
        backend=sc.backend,
        workload=lv.workload if lv else None,
        level=lv.index if lv else None,
        level_label=lv.label if lv else None,
        bucket=sc.bucket,
        start=sc.start,
        end=sc.end,
        text=sc.where(),
    )


class _Judge:
    def __init__(self, spec: Spec, evidence: Evidence, indexes: Sequence[S.BackendIndex] | None = None):
        self.spec = spec
        self.ev = evidence
        self.gate = spec.gate
        m = evidence.manifest
        ts = m.get("time_scale", 1.0)
        self.time_scale = float(ts) if isinstance(ts, (int, float)) and not isinstance(ts, bool) and 0 < ts <= 1 else 1.0
        self.bad_time_scale = self.time_scale != ts
        self.rehearsal = m.get("rehearsal") is True
        only = m.get("only")
        names = {b.name for b in spec.backends}
        chosen = tuple(n for n in only if n in names) if isinstance(only, list) and only else ()
        self.plan: Plan = make_plan(spec, time_scale=self.time_scale, rehearse=self.rehearsal, only=chosen)
        self.planned: dict[str, BackendPlan] = {bp.name: bp for bp in self.plan.backends}
        self.multi_workload = len(spec.workloads) > 1
        self.index: dict[str, S.BackendIndex] = {}
        built = {id(bi.evidence): bi for bi in indexes or ()}
        for be in evidence.backends:
            if be.name in self.planned and be.name not in self.index:
                self.index[be.name] = built.get(id(be)) or S.index_backend(be)
        self.bis: tuple[S.BackendIndex, ...] = tuple(self.index[n] for n in self.planned if n in self.index)
        self.where_of: dict[tuple[str, str], tuple[S.LevelIndex, S.Window]] = {}
        for bi in self.bis:
            for lv in bi.levels:
                for w in lv.buckets:
                    for r in w.records:
                        self.where_of[(bi.name, str(r["request_id"]))] = (lv, w)

    # ------------------------------------------------------------------ helpers

    def plan_label(self, lv: Level) -> str:
        return f"{lv.workload} / {lv.label}" if self.multi_workload else lv.label

    def level_of(self, bi: S.BackendIndex, lv: Level) -> S.LevelIndex | None:
        for x in bi.levels:
            if x.workload == lv.workload and x.index == lv.index:
                return x
        return None

    def _backends_for(self, rule: Rule) -> tuple[S.BackendIndex, ...]:
        if rule.backend is None:
            return self.bis
        return tuple(bi for bi in self.bis if bi.name == rule.backend)

    @staticmethod
    def _fold(severity: str, statuses: Sequence[str]) -> Status:
        if "fail" in statuses:
            return "warn" if severity == "warn" else "fail"
        if "inconclusive" in statuses:
            return "inconclusive"
        return "pass"

    def _result(self, rule: Rule | None, name: str, klass: str, severity: str, insts: Sequence[Instance],
                pass_message: str, n_instances: int, **extra: Any) -> RuleResult:
        status = self._fold(severity, [i.status for i in insts])
        bad = [i for i in insts if i.status == "fail"] or [i for i in insts if i.status == "inconclusive"]
        if status == "pass":
            message = pass_message
            where = extra.pop("where", None)
        else:
            first = bad[0]
            message = f"{first.where.text}: {first.message}" if first.where.text else first.message
            if len(bad) > 1:
                message += f" (and {len(bad) - 1} more)"
            where = first.where
            extra.pop("where", None)
        observed = extra.pop("observed", status == "pass")
        if "needs" not in extra and status == "inconclusive":
            shorts = [i.needs for i in insts if i.status == "inconclusive" and i.needs is not None]
            extra["needs"] = max(shorts) if shorts else None
        return RuleResult(
            rule=rule_display(rule) if rule else name,
            klass=klass,
            severity=severity,
            status=status,
            message=message,
            builtin=rule is None,
            line=rule.span.line if rule is not None and rule.span.known else None,
            metric=rule.expr.metric if rule else name,
            op=rule.op if rule else None,
            threshold=rule.threshold if rule else None,
            threshold_text=rule.threshold_text if rule else None,
            scope=rule.scope if rule else None,
            window_s=rule.window_s if rule else None,
            observed=observed,
            where=where,
            instances=n_instances,
            failing=len(bad),
            details=tuple(bad[:MAX_LISTED]),
            **extra,
        )

    # ------------------------------------------------------------------ validity

    def completed_run_problems(self) -> list[Instance]:
        out: list[Instance] = []

        def bad(text: str, where: Location | None = None) -> None:
            out.append(Instance("fail", where or Location(), None, None, None, text))

        m = self.ev.manifest
        status = m.get("status")
        if status != "complete":
            reason = m.get("incomplete_reason")
            bad(f"the run's status is {status or 'unknown'}" + (f": {reason}" if reason else ""))
        for f in self.ev.integrity.incomplete:
            # V201 repeats the status; V205 (no results.json yet) does not matter: the judge
            # recomputes every number from the raw evidence
            if f.code not in ("V201", "V205"):
                bad(f.text())
        for f in self.ev.integrity.malformed[:5]:
            bad(f"malformed evidence: {f.text()}")
        if len(self.ev.integrity.malformed) > 5:
            bad(f"... and {len(self.ev.integrity.malformed) - 5} more malformed records")
        if self.bad_time_scale:
            bad(f"the manifest's time_scale {m.get('time_scale')!r} is not in (0, 1]")
        planned = set(self.planned)
        for be in self.ev.backends:
            if be.name not in planned:
                bad(f"backend {be.name} is in the evidence but not planned by the spec")
        for name, bp in self.planned.items():
            bi = self.index.get(name)
            if bi is None:
                bad(f"backend {name} did not run (no evidence for it)", Location(backend=name, text=f"backend {name}"))
                continue
            be = bi.evidence
            here = Location(backend=name, text=f"backend {name}")
            for rel in be.partial_tail:
                bad(f"{rel} ends in a cut-off line (the writer was killed)", here)
            for p in be.problems[:5]:
                bad(f"unusable evidence: {p}", here)
            if len(be.problems) > 5:
                bad(f"... and {len(be.problems) - 5} more unusable rows", here)
            aborted = be.entry.get("aborted_reason")
            if aborted:
                bad(f"backend {name} was aborted: {aborted}", here)
            if bi.orphans:
                bad(f"{_plural(len(bi.orphans), 'measured request')} belong to no level the manifest lists", here)
            seen: set[str] = set()
            dups = sorted({rid for r in bi.all_records if (rid := str(r["request_id"])) in seen or seen.add(rid)})  # type: ignore[func-returns-value]
            if dups:
                bad(f"{_plural(len(dups), 'request id')} recorded more than once (first: {dups[0]})", here)
            for plv in bp.levels:
                lv = self.level_of(bi, plv)
                if lv is None:
                    bad(f"{self.plan_label(plv)} did not run", Location(name, plv.workload, plv.index, self.plan_label(plv), text=f"backend {name}, {self.plan_label(plv)}"))
                    continue
                lloc = _loc(S.level_scope(bi, lv))
                if lv.entry.get("completed") is not True:
                    bad("the level did not run its full duration (completed = false)", lloc)
                sent = lv.entry.get("sent")
                if isinstance(sent, int) and not isinstance(sent, bool):
                    have = sum(1 for r in bi.all_records if r.get("workload") == lv.workload and r.get("level") == lv.index
                               and r.get("bucket") != FOLLOW_UP_BUCKET)
                    if have < sent:
                        bad(f"{sent} requests were sent but only {have} recorded: {sent - have} records are lost", lloc)
                    elif have > sent:
                        bad(f"{have} requests recorded but the run counted {sent} sent", lloc)
                stray = [w for w in lv.buckets if not w.planned and w.records]
                for w in stray:
                    bad(f"{_plural(len(w.records), 'request')} name bucket {w.index}, which the manifest does not list", lloc)
        return out

    def completed_run(self, rule: Rule | None) -> RuleResult:
        insts = self.completed_run_problems()
        n_req = sum(len(bi.measured) for bi in self.bis)
        n_lv = sum(len(bp.levels) for bp in self.planned.values())
        msg = f"run complete: {_plural(len(self.planned), 'backend')}, {_plural(n_lv, 'level')}, {_plural(n_req, 'measured request')}"
        if rule is None:
            insts = [Instance("inconclusive", i.where, None, None, None, i.message) for i in insts]
            return self._result(None, "completed_run", "validity", "require", insts, msg, 1)
        return self._result(rule, "completed_run", "validity", rule.severity, insts, msg, 1)

    def full_scale_run(self) -> RuleResult:
        scaled = self.rehearsal or self.time_scale != 1
        what = []
        if self.rehearsal:
            what.append("a rehearsal against the simulator")
        if self.time_scale != 1:
            what.append(f"time-scaled by {self.time_scale:g}")
        if not scaled:
            return self._result(None, "full_scale_run", "validity", "require", [], "a full-scale run against the declared backends", 1)
        desc = " and ".join(what)
        if self.gate.allow_rehearsal:
            return self._result(None, "full_scale_run", "validity", "require", [], f"{desc}; the gate allows rehearsals (allow_rehearsal)", 1)
        inst = Instance("inconclusive", Location(), None, None, None,
                        f"the run is {desc}: it says nothing about the real backends at full duration (the gate would need allow_rehearsal = true)")
        return self._result(None, "full_scale_run", "validity", "require", [inst], "", 1)

    def min_samples(self) -> RuleResult:
        insts: list[Instance] = []
        fewest: tuple[int, str] | None = None
        count = 0
        for name, bp in self.planned.items():
            bi = self.index.get(name)
            if bi is None:
                continue
            for plv in bp.levels:
                lv = self.level_of(bi, plv)
                if lv is None:
                    continue
                count += 1
                need = max(self.gate.min_samples, 1 if plv.mode == "open" else plv.min_requests)
                have = len(S.completed(lv.records))
                loc = _loc(S.level_scope(bi, lv))
                if fewest is None or have < fewest[0]:
                    fewest = (have, loc.text)
                if have < need:
                    insts.append(Instance("inconclusive", loc, float(have), None, have,
                                          f"{_plural(have, 'completed request')}; needs {need - have} more (at least {need})", need - have))
                planned = {pb.index for pb in plv.buckets}
                for w in lv.buckets:
                    if w.index in planned and not S.completed(w.records):
                        insts.append(Instance("inconclusive", _loc(S.bucket_scope(bi, lv, w)), 0.0, None, 0,
                                              "no completed request in the bucket: it measured nothing", 1))
        msg = "every level has enough completed requests, every bucket at least one" + (f" (fewest: {fewest[0]} in {fewest[1]})" if fewest else "")
        return self._result(None, "min_samples", "validity", "require", insts, msg, count)

    # ------------------------------------------------------------------ evidence

    def artifacts_verified(self, rule: Rule | None) -> RuleResult:
        integ = self.ev.integrity
        insts: list[Instance] = []
        if not integ.verified:
            insts.append(Instance("inconclusive", Location(), None, None, None, "the evidence was not re-hashed (built in memory, not loaded from a directory)"))
        for f in integ.tampered:
            insts.append(Instance("fail", Location(text=f.path), None, None, None, f.message))
        spec = self.ev.manifest.get("spec")
        if isinstance(spec, Mapping) and isinstance(spec.get("text"), str) and isinstance(spec.get("sha256"), str):
            if sha256_text(spec["text"]) != spec["sha256"]:
                insts.append(Instance("fail", Location(text="manifest.json"), None, None, None,
                                      "the spec text embedded in the manifest does not match its recorded sha256"))
        msg = f"all {_plural(integ.checked, 'artifact')} match the sha256 recorded in the manifest"
        severity = rule.severity if rule else "require"
        return self._result(rule, "artifacts_verified", "evidence", severity, insts, msg, max(1, integ.checked))

    def bucket_coverage(self, rule: Rule) -> RuleResult:
        insts: list[Instance] = []
        n = 0
        for name, bp in self._planned_for(rule):
            bi = self.index.get(name)
            if bi is None:
                insts.append(Instance("fail", Location(backend=name, text=f"backend {name}"), 0.0, None, 0, "no evidence for this backend"))
                continue
            for plv in bp.levels:
                lv = self.level_of(bi, plv)
                if lv is None:
                    loc = Location(name, plv.workload, plv.index, self.plan_label(plv), text=f"backend {name}, {self.plan_label(plv)}")
                    insts.append(Instance("fail", loc, 0.0, None, 0, f"level missing: none of its {_plural(len(plv.buckets), 'bucket')} ran"))
                    n += len(plv.buckets)
                    continue
                by_index = {w.index: w for w in lv.buckets if w.planned}
                for pb in plv.buckets:
                    n += 1
                    w = by_index.get(pb.index)
                    if w is None:
                        loc = Location(name, lv.workload, lv.index, lv.label, pb.index, text=f"backend {name}, {lv.label}, bucket {pb.index}")
                        insts.append(Instance("fail", loc, 0.0, None, 0, "bucket missing from the evidence"))
                        continue
                    sc = S.bucket_scope(bi, lv, w)
                    done = len(S.completed(w.records))
                    if w.start is None or w.end is None:
                        insts.append(Instance("fail", _loc(sc), float(done), None, done, "the bucket has no wall-clock window"))
                    elif done == 0:
                        what = "no request" if not w.records else f"no completed request (of {len(w.records)} measured)"
                        insts.append(Instance("fail", _loc(sc), 0.0, None, len(w.records), f"{what} in the bucket"))
        msg = f"all {_plural(n, 'planned bucket')} present, each with a completed request"
        return self._result(rule, "bucket_coverage", "evidence", rule.severity, insts, msg, n)

    def _planned_for(self, rule: Rule) -> list[tuple[str, BackendPlan]]:
        return [(n, bp) for n, bp in self.planned.items() if rule.backend is None or n == rule.backend]

    def duration_coverage(self, rule: Rule) -> RuleResult:
        insts: list[Instance] = []
        n = 0
        shortest: float | None = None
        for name, bp in self._planned_for(rule):
            bi = self.index.get(name)
            for plv in bp.levels:
                n += 1
                lv = self.level_of(bi, plv) if bi is not None else None
                if lv is None:
                    loc = Location(name, plv.workload, plv.index, self.plan_label(plv), text=f"backend {name}, {self.plan_label(plv)}")
                    insts.append(Instance("fail", loc, 0.0, "0s", 0, f"not measured at all (planned {format_duration(plv.duration_s)})"))
                    continue
                loc = _loc(S.level_scope(bi, lv))  # type: ignore[arg-type]
                a, b = lv.measure_start, lv.measure_end
                if a is None or b is None:
                    insts.append(Instance("fail", loc, None, None, None, f"no measured start/end recorded (planned {format_duration(plv.duration_s)})"))
                    continue
                wall = b - a
                shortest = wall - plv.duration_s if shortest is None else min(shortest, wall - plv.duration_s)
                if wall + DURATION_TOLERANCE_S < plv.duration_s:
                    insts.append(Instance("fail", loc, wall, format_duration(wall), None,
                                          f"measured {format_duration(wall)} of {format_duration(plv.duration_s)} planned (a run cut short never covers its plan)"))
        msg = f"all {_plural(n, 'level')} measured for their planned duration"
        return self._result(rule, "duration_coverage", "evidence", rule.severity, insts, msg, n)

    def follow_up(self, rule: Rule) -> RuleResult:
        insts: list[Instance] = []
        n = 0
        notes = []
        for name, bp in self._planned_for(rule):
            n += 1
            here = Location(backend=name, text=f"backend {name}")
            bi = self.index.get(name)
            if bi is None:
                insts.append(Instance("fail", here, None, None, None, "no evidence for this backend"))
                continue
            f = bi.evidence.followup
            if not bp.follow_up:
                notes.append(f"{name}: none planned")
                continue
            if f is None:
                insts.append(Instance("fail", here, None, None, None, "no follow-up evidence (followup.json missing)"))
                continue
            if f.get("required") is False:
                insts.append(Instance("fail", here, None, None, None, "the spec plans a follow-up request but the run did not require one"))
                continue
            if f.get("passed") is not True:
                rec = f.get("record")
                why = f.get("reason") or (describe_request(rec) if isinstance(rec, Mapping) else "it did not pass")
                insts.append(Instance("fail", here, None, None, None, f"the clean follow-up request failed: {why}"))
                continue
            if f.get("server_idle") is False:
                insts.append(Instance("fail", here, None, None, None, "the follow-up completed but the server still showed active or pending requests"))
        msg = "the clean follow-up request passed on every backend"
        if notes and len(notes) == n:
            msg = "no follow-up request is planned"
        return self._result(rule, "follow_up", "evidence", rule.severity, insts, msg, n)

    def provenance_consistent(self, rule: Rule) -> RuleResult:
        insts: list[Instance] = []
        commits: dict[str, str] = {}
        revisions: dict[str, str | None] = {}
        fingerprints: dict[str, str | None] = {}
        entries = [(n, self.index[n].evidence.entry) for n, _ in self._planned_for(rule) if n in self.index]
        for name, e in entries:
            here = Location(backend=name, text=f"backend {name}")
            src = e.get("source") if isinstance(e.get("source"), Mapping) else {}
            before, after = src.get("commit_before"), src.get("commit_after")
            if not before or not after:
                if self.spec.source.repo is not None or before or after:
                    why = src.get("reason")
                    insts.append(Instance("fail", here, None, None, None, "no source commit recorded" + (f" ({why})" if why else "")))
            elif before != after:
                insts.append(Instance("fail", here, None, None, None, f"the commit changed during the run ({before[:12]} before, {after[:12]} after)"))
            else:
                commits[name] = before
            if src.get("dirty_before") != src.get("dirty_after"):
                insts.append(Instance("fail", here, None, None, None,
                                      f"the working tree changed during the run (dirty before: {src.get('dirty_before')}, after: {src.get('dirty_after')})"))
            model = e.get("model") if isinstance(e.get("model"), Mapping) else {}
            revisions[name] = model.get("revision")
            fingerprints[name] = model.get("fingerprint")
            want_rev = self.spec.model.revision
            if want_rev and model.get("revision") != want_rev:
                insts.append(Instance("fail", here, None, None, None, f"model revision {model.get('revision')!r} is not the spec's {want_rev!r}"))
            if self.spec.model.path and not model.get("fingerprint") and not self.rehearsal:
                why = model.get("reason")
                insts.append(Instance("fail", here, None, None, None, "no model fingerprint recorded" + (f" ({why})" if why else "")))
        for label, values in (("commits", commits), ("model revisions", revisions), ("model fingerprints", fingerprints)):
            distinct = sorted({str(v) for v in values.values()})
            if len(distinct) > 1:
                listing = ", ".join(f"{n}: {str(v)[:12]}" for n, v in values.items())
                insts.append(Instance("fail", Location(text="across backends"), None, None, None, f"backends ran different {label} ({listing})"))
        one = sorted(set(commits.values()))
        if len(one) == 1:
            msg = f"one commit ({one[0][:12]}) and one model across {_plural(len(entries), 'backend')}, unchanged during the run"
        else:
            msg = f"one model across {_plural(len(entries), 'backend')}; no source repository declared, so no commit to check"
        return self._result(rule, "provenance_consistent", "evidence", rule.severity, insts, msg, max(1, len(entries)))

    def runtime_boundary_specific(self, rule: Rule) -> RuleResult:
        insts: list[Instance] = []
        shown = []
        planned = self._planned_for(rule)
        for name, _ in planned:
            here = Location(backend=name, text=f"backend {name}")
            bi = self.index.get(name)
            if bi is None:
                insts.append(Instance("fail", here, None, None, None, "no evidence for this backend"))
                continue
            rb = bi.evidence.entry.get("runtime_boundary")
            rb = rb if isinstance(rb, Mapping) else {}
            status = rb.get("status")
            display = rb.get("display") or rb.get("declared") or "none"
            if status in SPECIFIC_RUNTIME:
                shown.append(f"{name}: {display} ({status})")
                continue
            details = rb.get("details") if isinstance(rb.get("details"), list) else []
            why = "; ".join(str(d) for d in details)
            insts.append(Instance("fail", here, None, None, None,
                                  f"runtime boundary {display!r} is {status or 'not recorded'}" + (f": {why}" if why else "")))
        msg = "; ".join(shown) or "runtime boundaries specific"
        return self._result(rule, "runtime_boundary_specific", "evidence", rule.severity, insts, msg, max(1, len(planned)))

    def trace_coverage(self, rule: Rule) -> RuleResult:
        assert rule.op is not None and rule.threshold is not None
        insts: list[Instance] = []
        bis = self._backends_for(rule)
        traced_bis = []
        worst: tuple[float, Location, int, int] | None = None
        for bi in bis:
            if bi.trace_source == "none" and not compare(0.0, rule.op, rule.threshold):
                insts.append(Instance("fail", Location(backend=bi.name, text=f"backend {bi.name}"), 0.0, "0%", len(bi.measured),
                                      f"the backend declares no traces (traces source = none), so no request can be traced (threshold {rule.op} {rule.threshold_text})"))
            else:
                traced_bis.append(bi)
        n = 0
        if traced_bis:
            for sc in S.scopes(rule.scope, traced_bis, rule.window_s):
                n += 1
                total = len(sc.records)
                if total == 0:
                    insts.append(Instance("inconclusive", _loc(sc), None, None, 0, "no measured requests to trace"))
                    continue
                traced = sum(1 for r in sc.records if _traced(sc, r))
                cov = traced / total
                loc = _loc(sc)
                if compare(cov, rule.op, rule.threshold) and not S.completed(sc.records):
                    insts.append(Instance("inconclusive", loc, cov, None, total, "no request in it completed: nothing was measured", 1))
                    continue
                if worst is None or cov < worst[0]:
                    worst = (cov, loc, traced, total)
                if not compare(cov, rule.op, rule.threshold):
                    first = next((r for r in sc.records if not _traced(sc, r)), None)
                    tail = f"; first untraced: {first.get('request_id')}" if first is not None else ""
                    insts.append(Instance("fail", loc, cov, f"trace coverage = {cov * 100:.4g}%", total,
                                          f"trace coverage {cov * 100:.4g}% ({traced} of {total} requests traced; threshold {rule.op} {rule.threshold_text}){tail}"))
        if worst is not None:
            msg = f"lowest trace coverage {worst[0] * 100:.4g}% ({worst[2]} of {worst[3]} requests) in {worst[1].text}"
            observed = worst[0]
        else:
            msg = "no traced requests to check"
            observed = None
        res = self._result(rule, "trace_coverage", "evidence", rule.severity, insts, msg, n + len(bis) - len(traced_bis),
                           observed=observed if not insts else next((i.observed for i in insts if i.status == "fail"), observed))
        return res

    # ------------------------------------------------------------------ performance

    def kind(self, rule: Rule) -> Kind | None:
        if rule.expr.wrapper is not None:
            return Kind.RATIO
        m = METRICS.get(rule.expr.metric)
        return m.result_kind(rule.expr.agg) if m else None

    def _measure(self, sc: S.Scope, rule: Rule) -> S.Measure:
        e = rule.expr
        return S.measure(sc, e.metric, e.agg, e.percentile, confidence=self.gate.confidence, min_samples=self.gate.min_samples)

    def _significant_violation(self, sc: S.Scope, rule: Rule) -> bool:
        """Percentile rules with too few samples: is the violation certain anyway?"""
        q, op, t = rule.expr.percentile, rule.op, rule.threshold
        if q is None or op not in ("<", "<=", ">", ">=") or t is None:
            return False
        vals = S.dist_values(sc.records, rule.expr.metric)
        if op in ("<", "<="):
            over = sum(1 for v in vals if (v > t if op == "<=" else v >= t))
            return stats.exceeds_with_confidence(over, len(vals), q, self.gate.confidence)
        if q >= 100:
            return False
        under = sum(1 for v in vals if (v < t if op == ">=" else v <= t))
        return stats.exceeds_with_confidence(under, len(vals), 100.0 - q, self.gate.confidence)

    def _unit_word(self, unit: str, n: int) -> str:
        word = {"requests": "request", "gaps": "inter-token gap", "buckets": "bucket", "samples": "telemetry sample"}.get(unit, unit)
        return _plural(n, word)

    def _offenders_message(self, sc: S.Scope, rule: Rule, value_text: str) -> tuple[Location, str] | None:
        metric = rule.expr.metric
        if metric not in BAD_OUTCOMES:
            return None
        offenders = [r for r in sc.records if (r.get("outcome") != "completed" if metric == "errors" else r.get("outcome") == S._OUTCOME_OF[metric])]
        if not offenders:
            return None
        groups: dict[tuple[str, str, int, int], list[Mapping[str, Any]]] = {}
        places: dict[tuple[str, str, int, int], Location] = {}
        for r in offenders:
            bname = str(r.get("backend")) if len(sc.backends) > 1 else sc.backends[0].name
            found = self.where_of.get((bname, str(r["request_id"])))
            if found is None:
                continue
            lv, w = found
            key = (bname, lv.workload, lv.index, w.index)
            groups.setdefault(key, []).append(r)
            if key not in places:
                places[key] = _loc(S.Scope("bucket", (self.index[bname],), w.records, ((self.index[bname], w),), lv, w.index, w.start, w.end))
        noun = _NOUN[metric]
        first = offenders[0]
        n = len(offenders)
        distinct = len({S.error_message(r) for r in offenders})
        more = f"; {distinct} distinct errors" if distinct > 1 else ""
        lead = f"{value_text}: " if rule.expr.agg != "count" else ""
        if len(groups) == 1 or sc.kind in ("bucket", "window"):
            where = places[next(iter(groups))] if sc.kind not in ("bucket", "window") and groups else _loc(sc)
            return where, f"{lead}{_plural(n, noun)} ({describe_request(first)}){more}"
        listing = ", ".join(f"{places[k].level_label} bucket {k[3]}" + (f" of {k[0]}" if sc.backend is None else "") + f" ({len(v)})"
                            for k, v in list(groups.items())[:5])
        if len(groups) > 5:
            listing += f", ... {len(groups) - 5} more buckets"
        return _loc(sc), f"{lead}{_plural(n, noun)} in {len(groups)} buckets — {listing}; first: {describe_request(first)}{more}"

    def _instance(self, sc: S.Scope, rule: Rule) -> tuple[Instance, float | None, S.Measure]:
        """Judge one scope instance of a plain (unwrapped) performance rule."""
        assert rule.op is not None and rule.threshold is not None
        m = self._measure(sc, rule)
        kind = self.kind(rule)
        loc = _loc(sc)
        thr = f"threshold {rule.op} {rule.threshold_text}"
        if m.value is None:
            return Instance("inconclusive", loc, None, None, m.samples, f"{rule.expr.text} cannot be computed: {m.reason}"), None, m
        vtext = f"{rule.expr.text} = {format_value(m.value, kind)}"
        ok = compare(m.value, rule.op, rule.threshold)
        if m.samples < m.needed:
            if not ok and self._significant_violation(sc, rule):
                return Instance("fail", loc, m.value, vtext, m.samples,
                                f"{vtext} over {self._unit_word(m.unit, m.samples)} ({thr}); too few for the percentile, but enough samples violate the threshold to be sure at {self.gate.confidence * 100:.3g}% confidence"), m.value, m
            basis = ""
            if rule.expr.percentile is not None:
                need_q = stats.min_samples_for_percentile(rule.expr.percentile, self.gate.confidence)
                basis = f"; {rule.expr.agg} at {self.gate.confidence * 100:.3g}% confidence needs {need_q}"
                if self.gate.min_samples > need_q:
                    basis += f", the gate's min_samples {self.gate.min_samples}"
            return Instance("inconclusive", loc, m.value, vtext, m.samples,
                            f"{vtext} from only {self._unit_word(m.unit, m.samples)}; needs {m.short} more{basis}", m.short), m.value, m
        if ok and rule.expr.metric in S.OUTCOME_METRICS and not S.completed(sc.records):
            # a scope where nothing completed measured nothing: it can fail a rule, never pass one
            return Instance("inconclusive", loc, m.value, vtext, m.samples,
                            f"{vtext}, but no request in it completed: nothing was measured", 1), m.value, m
        if ok:
            return Instance("pass", loc, m.value, vtext, m.samples, f"{vtext} ({thr})"), m.value, m
        if rule.expr.metric in BAD_OUTCOMES:
            narrowed = self._offenders_message(sc, rule, vtext)
            if narrowed is not None:
                where, text = narrowed
                return Instance("fail", where, m.value, vtext, m.samples, text), m.value, m
        return Instance("fail", loc, m.value, vtext, m.samples, f"{vtext} over {self._unit_word(m.unit, m.samples)} ({thr})"), m.value, m

    def _wrapped(self, sc: S.Scope, rule: Rule) -> tuple[Instance, float | None, int]:
        """drift() or slope() over the buckets of a level (or of a backend, in level order)."""
        assert rule.op is not None and rule.threshold is not None
        e = rule.expr
        bi = sc.backends[0]
        levels = [sc.level] if sc.level is not None else list(bi.levels)
        series = S.bucket_series(bi, levels, e.metric, e.agg, e.percentile, confidence=self.gate.confidence, min_samples=self.gate.min_samples)
        loc = _loc(sc)
        n = len(series)
        inner = e.text[len(e.wrapper) + 1 : -1] if e.wrapper and e.text.startswith(e.wrapper + "(") else e.text  # type: ignore[operator]
        if n < 2:
            return Instance("inconclusive", loc, None, None, n, f"{e.wrapper}() needs at least 2 buckets; there {'is' if n == 1 else 'are'} {n}"), None, n
        if e.wrapper == "drift":
            k = S.quarters(n)
            used = series[:k] + series[n - k:]
        else:
            used = series
        short = [(s, m) for s, m in used if m.value is None or m.samples < m.needed]
        if short:
            s0, m0 = short[0]
            b0 = f"bucket {s0.bucket}{S.clock_span(s0.start, s0.end)}"
            if m0.value is None:
                why = f"{b0} has no {inner} ({m0.reason})"
            else:
                why = f"{b0} has {inner} from only {self._unit_word(m0.unit, m0.samples)}, needs {m0.short} more"
            of = f"{len(short)} of the {len(used)} compared buckets are short of samples; " if len(short) > 1 else ""
            shortfall = max((m.short for _, m in short), default=0) or None
            samples = sum(m.samples for _, m in used)
            return Instance("inconclusive", loc, None, None, samples, f"{e.wrapper}({inner}) cannot be judged: {of}{why}", shortfall), None, samples
        vals = [float(m.value) for _, m in used]  # type: ignore[arg-type]
        inner_kind = METRICS[e.metric].result_kind(e.agg) if e.metric in METRICS else None
        if e.wrapper == "drift":
            k = S.quarters(n)
            first, last = stats.median(vals[:k]), stats.median(vals[len(vals) - k:])
            value = S.relative_change(first, last)  # type: ignore[arg-type]
            basis = f"{inner} {format_value(first, inner_kind)} → {format_value(last, inner_kind)}, first vs last {_plural(k, 'bucket')}"
        else:
            times = [((s.start or 0.0) + (s.end or 0.0)) / 2 for s, _ in used]
            value = S.slope(times, vals)
            basis = f"{inner} over {_plural(n, 'bucket')}"
        samples = sum(m.samples for _, m in used)
        if value is None:
            return Instance("inconclusive", loc, None, None, samples, f"{e.wrapper}() is undefined: the baseline {inner} is 0 ({basis})"), None, samples
        vtext = f"{e.text} = {_signed_pct(value)}{'/min' if e.wrapper == 'slope' else ''}"
        thr = f"threshold {rule.op} {rule.threshold_text}"
        status = "pass" if compare(value, rule.op, rule.threshold) else "fail"
        return Instance(status, loc, value, vtext, samples, f"{vtext} ({basis}; {thr})"), value, samples

    def performance(self, rule: Rule) -> RuleResult:
        e = rule.expr
        bis = self._backends_for(rule)
        scope_list = S.scopes(rule.scope, bis, rule.window_s)
        if not scope_list:
            inst = Instance("inconclusive", Location(), None, None, 0, f"no {rule.scope} in the evidence to evaluate")
            return self._result(rule, e.text, "performance", rule.severity, [inst], "", 0, observed=None)
        judged: list[tuple[Instance, float | None, int | None]] = []
        for sc in scope_list:
            if e.wrapper is not None:
                judged.append(self._wrapped(sc, rule))
            else:
                inst, value, m = self._instance(sc, rule)
                judged.append((inst, value, m.samples))
        insts = [j[0] for j in judged]
        # The reported instance: the worst failure, else the one closest to failing.
        failing = [j for j in judged if j[0].status == "fail"]
        passing = [j for j in judged if j[0].status == "pass"]
        unsure = [j for j in judged if j[0].status == "inconclusive"]
        pick: tuple[Instance, float | None, int | None] | None = None
        if failing:
            pick = max(failing, key=lambda j: self._badness(rule, j[1]))
            ordered = [pick[0]] + [i for i in insts if i.status == "fail" and i is not pick[0]]
        elif unsure:
            pick = unsure[0]
            ordered = [i for i in insts if i.status == "inconclusive"]
        else:
            pick = max(passing, key=lambda j: self._badness(rule, j[1])) if passing else None
            ordered = []
        n = len(scope_list)
        if pick is not None and pick[0].status == "pass":
            each = f"all {n} {rule.scope}s pass; worst: " if n > 1 else ""
            msg = f"{each}{pick[0].where.text}: {pick[0].message}" if pick[0].where.text else f"{each}{pick[0].message}"
        else:
            msg = ""
        res = self._result(rule, e.text, "performance", rule.severity, ordered, msg, n,
                           observed=pick[1] if pick else None, where=pick[0].where if pick else None)
        return _replace(res, observed_text=pick[0].observed_text if pick else None, samples=pick[2] if pick else None)

    def _badness(self, rule: Rule, v: float | None) -> float:
        if v is None or rule.threshold is None:
            return -math.inf
        t = rule.threshold
        if rule.op in ("<", "<="):
            return v - t
        if rule.op in (">", ">="):
            return t - v
        if rule.op == "==":
            return abs(v - t)
        return -abs(v - t)

    # ------------------------------------------------------------------ all rules

    def run(self) -> Verdict:
        rules = self.spec.gate.rules
        spec_rule = {r.expr.metric: r for r in rules if r.klass in ("validity", "evidence") and r.severity == "require"}
        results: list[RuleResult] = []
        # validity
        results.append(self.completed_run(spec_rule.get("completed_run")))
        for r in rules:
            if r.klass == "validity" and r is not spec_rule.get("completed_run"):
                results.append(self.completed_run(r))
        results.append(self.full_scale_run())
        results.append(self.min_samples())
        # evidence
        if "artifacts_verified" not in spec_rule:
            results.append(self.artifacts_verified(None))
        for r in rules:
            if r.klass != "evidence":
                continue
            check = getattr(self, r.expr.metric)
            results.append(check(r))
        blocked = any(x.severity == "require" and x.status == "fail" for x in results)
        for r in rules:
            if r.klass == "performance":
                results.append(_not_evaluated(r) if blocked else self.performance(r))
        notes = []
        ev_sha = self.ev.spec_sha256
        if ev_sha is not None and ev_sha != self.spec.sha256:
            notes.append(f"judged with a spec (sha256 {self.spec.sha256[:12]}) other than the run's (sha256 {ev_sha[:12]})")
        status = self.ev.manifest.get("status")
        return Verdict(
            outcome=decide(results),
            rules=tuple(results),
            soak=self.spec.header.name,
            spec_sha256=self.spec.sha256,
            evidence_spec_sha256=ev_sha,
            run_id=self.ev.run_id,
            manifest_sha256=self.ev.manifest_sha256,
            run_status=status if isinstance(status, str) else None,
            rehearsal=self.rehearsal,
            time_scale=self.time_scale,
            notes=tuple(notes),
        )


def _traced(sc: S.Scope, r: Mapping[str, Any]) -> bool:
    """Has request `r` a matched trace from its own backend?"""
    if len(sc.backends) == 1:
        return r.get("request_id") in sc.backends[0].traced
    return any(bi.name == r.get("backend") and r.get("request_id") in bi.traced for bi in sc.backends)


def _replace(res: RuleResult, **changes: Any) -> RuleResult:
    import dataclasses

    return dataclasses.replace(res, **changes)


def _not_evaluated(rule: Rule) -> RuleResult:
    return RuleResult(
        rule=rule_display(rule),
        klass=rule.klass,
        severity=rule.severity,
        status="not_evaluated",
        message="a required validity or evidence check failed, so the evidence cannot support it",
        line=rule.span.line if rule.span.known else None,
        metric=rule.expr.metric,
        op=rule.op,
        threshold=rule.threshold,
        threshold_text=rule.threshold_text,
        scope=rule.scope,
        window_s=rule.window_s,
        observed=None,
    )


def judge(spec: Spec, evidence: Evidence, indexes: Sequence[S.BackendIndex] | None = None) -> Verdict:
    """Judge `evidence` against `spec`'s gate. Pure: same inputs, same verdict. `indexes`:
    `summary.index(evidence)` when the caller also summarizes (indexing a long soak once)."""
    return _Judge(spec, evidence, indexes).run()
