"""`judge(spec, evidence) -> Verdict`: pure and deterministic.

Rules are judged in three classes, in order:

validity     Is this a run the gate can speak about? Built in, always run:
               completed_run   manifest status complete; no cut-off, malformed or unusable row;
                               every planned backend and level present and `completed`; as many
                               records as requests the level counted as sent, no duplicate id,
                               no request outside the manifest's levels and buckets; no backend
                               aborted; each level of the load and deadline the plan gives it,
                               each workload of the requests the run sent (judged with a spec
                               other than the run's: `gate --spec`). The planned backends are the spec's, narrowed by the
                               manifest's `only` list when the run was restricted.
               full_scale_run  not a rehearsal nor time-scaled, unless `allow_rehearsal`;
               min_samples     every level has at least max(gate min_samples, the plan's minimum)
                               completed requests, and every planned bucket at least one;
               client_healthy  the load generator kept up in every bucket (event-loop lag,
                               CPU, schedule lag, achieved concurrency: judge/validity.py);
                               a saturated one makes the run INCONCLUSIVE, and a timing rule
                               (ttft, itl, tpot, latency, ...) whose failing instances all
                               overlap such a bucket in time is INCONCLUSIVE too: the failure
                               may be the client's (a failing instance at another time still
                               FAILs the rule: `validity.client_blocks`); so is an open
                               loop's ttft or latency instance (no max_concurrency) that
                               fails only by the client's schedule lag -- the same figure
                               from the send passes (`validity.CLIENT_LAG`). `client_healthy =
                               false` in the gate turns it off;
               abort_fired     only when the manifest records an abort rule that fired
                               (`abort ... per bucket|window`, or the built-in one): FAIL,
                               naming the rule, where, when and the value it saw;
                               INCONCLUSIVE where a timing abort fired on the client's
                               lag (a saturated bucket, or an open loop's ttft/latency
                               whose same figure from the send would not have fired:
                               `validity.abort_on_client`).
             A failing built-in is INCONCLUSIVE (the evidence cannot support a verdict); the
             spec's own `require completed_run` replaces the built-in and FAILs instead.
evidence     Is the evidence whole and trustworthy? artifacts_verified is built in and FAILs
             on any artifact changed, missing or unlisted since the run (never only
             inconclusive); the spec's bucket_coverage, duration_coverage, trace_coverage,
             follow_up, provenance_consistent and runtime_boundary_specific are judged when the
             spec writes them; a bucket_coverage FAIL beside a saturated client is
             INCONCLUSIVE, as a timing rule's is (`validity.CLIENT_COVERAGE`).
performance  The spec's comparisons, each over every instance of its scope (run, backend,
             level, bucket, window); the worst instance is reported, and a count rule that
             fails at a coarse scope names the buckets holding the offending requests. When a
             `require` rule of the first two classes FAILs, performance rules are
             `not_evaluated` (an inconclusive one -- a rehearsal, too few samples -- does not
             block them: a failure seen is a failure).

Facts, not labels: `join` re-derives every stored conclusion (outcomes, trace matches, the
follow-up's pass, the runtime boundary's status) from the raw fields it retains
(`soakspec.judge.rederive`); a label the facts contradict is malformed evidence.

A restricted run (`only` in the manifest: `soakspec run --backend`) is judged for what it
covered, and every verdict says so in its notes ("restricted to backends a; not run: b"); a
rule naming a backend it did not run (`on "b"`) is INCONCLUSIVE, never a pass -- unless the
gate itself is judged for the same backends (`soakspec gate --backend a`), which drops the rules
naming the others and says so.

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

Order: in each of the first two classes, a built-in check the spec does not write as `require`
comes first, then the spec's rules of that class in spec order, then the built-ins a spec cannot
write (full_scale_run, min_samples); performance rules follow in spec order.

`warn` rules report `warn` instead of `fail` and never decide the verdict. Verdict: FAIL if a
require rule failed; else INCONCLUSIVE if a require rule is inconclusive or not evaluated; else
PASS.

Where things are: `joined.join` re-plans the run and indexes its evidence once (`JudgedRun`);
`registry.RULES` names every check and metric with its function; the rules live in
`validity.py`, `evidence_rules.py` and `performance.py`; metrics are computed in `measures.py`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from soakspec.judge import performance
from soakspec.judge.common import not_evaluated, problem, result
from soakspec.judge.evidence import Evidence
from soakspec.judge.joined import JudgedRun, join
from soakspec.judge.registry import BY_NAME, RuleClass, builtins, impl_for
from soakspec.judge.sweep import sweep_rule
from soakspec.judge.validity import CLIENT_COVERAGE, client_blocks
from soakspec.judge.verdict import RuleResult, Verdict, decide
from soakspec.lang.spec import Rule, Spec


def _unrun(run: JudgedRun, rule: Rule) -> RuleResult | None:
    """A rule naming a backend the run did not run (a restricted run): never a pass."""
    why = run.unrun(rule)
    if why is None:
        return None
    return result(rule, rule.expr.text, rule.klass, rule.severity, [problem(why, status="inconclusive")], "", 0)


def _judge_class(run: JudgedRun, klass: RuleClass, rules: Sequence[Rule], before: Sequence[RuleResult] = ()) -> list[RuleResult]:
    """The validity or evidence rules, built in and written, in their order (see above). An
    evidence check a saturated client can fail by itself (`validity.CLIENT_COVERAGE`: a bucket
    the client sent late or not at all measured nothing) goes through `client_blocks` with the
    validity results `before` it, as a timing rule does."""
    written = {r.expr.metric for r in rules if r.klass == klass and r.severity == "require"}
    out = [e.check(run, None) for e in builtins(klass) if e.in_spec and e.name not in written and e.check]
    out += [_client_blocked(run, before, r, _unrun(run, r) or BY_NAME[r.expr.metric].check(run, r))  # type: ignore[arg-type]
            for r in rules if r.klass == klass]
    out += [e.check(run, None) for e in builtins(klass) if not e.in_spec and e.check]
    return [x for x in out if x is not None]  # a built-in with nothing to judge (abort_fired) gives none


def _client_blocked(run: JudgedRun, before: Sequence[RuleResult], r: Rule, res: RuleResult | None) -> RuleResult | None:
    if res is None or r.expr.metric not in CLIENT_COVERAGE:
        return res
    return client_blocks(run, list(before), r, res)


def restriction_note(run: JudgedRun) -> str | None:
    """`restricted to backends a, b; not run: c` for a restricted run (`--backend`), else None."""
    if not run.restricted:
        return None
    names = ", ".join(run.restricted)
    s = "s" if len(run.restricted) != 1 else ""
    if run.gate_only:
        rest = f"; not judged: {', '.join(run.not_run)} and the rules naming them" if run.not_run else ""
        return f"gate restricted to backend{s} {names} (--backend){rest}"
    rest = f"; not run: {', '.join(run.not_run)}" if run.not_run else ""
    return f"restricted to backend{s} {names}{rest} (judged for what it covered)"


def _notes(run: JudgedRun) -> tuple[str, ...]:
    out = []
    note = restriction_note(run)
    if note is not None:
        out.append(note)
    if run.evidence.manifest.get("preflight") is False:  # `run --no-preflight`
        out.append("pre-flight skipped (--no-preflight): no request of each workload's shape was checked before the first level")
    ev_sha = run.evidence.spec_sha256
    if ev_sha is not None and run.spec.sha256 not in _run_spec_hashes(run.evidence):
        out.append(f"judged with a spec (sha256 {run.spec.sha256[:12]}) other than the run's (sha256 {ev_sha[:12]})")
    return tuple(out) + _short_warmups(run.evidence.manifest)


def _short_warmups(manifest: Mapping) -> tuple[str, ...]:
    """A counted warmup that sent fewer than its N requests (`warmup_sent` < `warmup_requests`:
    its wall bound -- a hung server's rounds of the deadline --, an abort, or arrivals a backoff
    held back ended it first): said, never silent, with whether the level was measured at all
    (its `measure_start`: null where it ended within its warmup). A note, not INCONCLUSIVE: the warmup's requests are in no bucket, so no measured
    data is missing; the measured window ran with a server warmed by fewer requests (README:
    A warmup by count)."""
    out = []
    for b in manifest.get("backends") or ():
        for lv in (b.get("levels") or ()) if isinstance(b, Mapping) else ():
            n, sent = (lv.get("warmup_requests"), lv.get("warmup_sent")) if isinstance(lv, Mapping) else (None, None)
            if isinstance(n, int) and isinstance(sent, int) and sent < n:
                after = (f"the level was measured after {sent}" if lv.get("measure_start") is not None else
                         "the level ended within its warmup, nothing measured")
                out.append(f"backend {b.get('name')} workload {lv.get('workload')} level {lv.get('index')}: its warmup sent {sent} "
                           f"of its {n} requests (its wall bound, an abort or a backoff ended it first); {after}")
    return tuple(out)


def _run_spec_hashes(evidence: Evidence) -> frozenset[str]:
    """The hashes a spec of the run's own has: the real spec's (`sha256`: the file it ran, as
    `run` and a `--spec` of that file judge with), and -- when its embedded text was stored
    redacted -- the stored text's own (`text_sha256`: what `gate` and `report` re-parse; the
    rule `cli_support.spec_for` checks the embedded text by)."""
    from soakspec.evidence.manifest import stored_spec_sha256

    spec = evidence.manifest.get("spec")
    hashes = {evidence.spec_sha256, stored_spec_sha256(spec) if isinstance(spec, Mapping) else None}
    return frozenset(h for h in hashes if isinstance(h, str))


def judge_performance(run: JudgedRun, r: Rule) -> RuleResult:
    """One performance rule: a metric measured per scope (`performance.judge`), or a rule that
    needs more of the spec's rule than a metric name (goodput's SLO set: its registry row's check)."""
    entry = BY_NAME[r.expr.metric]
    if entry.check is not None:
        return entry.check(run, r)  # type: ignore[return-value]
    return performance.judge(run, r, impl_for(r.expr))


def judge_run(run: JudgedRun) -> Verdict:
    """Judge a joined run (`join(spec, evidence)`); pure: same inputs, same verdict."""
    rules = run.spec.gate.rules  # (narrowed by `gate --backend`: see `join`)
    results = _judge_class(run, "validity", rules)
    results += _judge_class(run, "evidence", rules, results)
    blocked = any(x.severity == "require" and x.status == "fail" for x in results)
    for r in rules:
        if r.klass == "performance":
            res = not_evaluated(r) if blocked else _unrun(run, r) or judge_performance(run, r)
            results.append(client_blocks(run, results, r, res))  # a timing FAIL beside a saturated client is inconclusive
    if (swept := sweep_rule(run.sweep)) is not None:  # a sweep: its figure, FAIL when no level held
        results.append(swept)
    status = run.evidence.manifest.get("status")
    return Verdict(
        outcome=decide(results),
        rules=tuple(results),
        soak=run.spec.header.name,
        spec_sha256=run.spec.sha256,
        evidence_spec_sha256=run.evidence.spec_sha256,
        run_id=run.evidence.run_id,
        manifest_sha256=run.evidence.manifest_sha256,
        run_status=status if isinstance(status, str) else None,
        rehearsal=run.rehearsal,
        time_scale=run.time_scale,
        notes=_notes(run),
    )


def judge(spec: Spec, evidence: Evidence, *, retained: bool = False, backends: tuple[str, ...] = ()) -> Verdict:
    """Judge `evidence` against `spec`'s gate. Pure: same inputs, same verdict. A caller that
    also summarizes the run joins it once: `run = join(spec, evidence)`, then `judge_run(run)`
    and `summary.summarize_run(run)`. `retained` (`soakspec gate`): judged after the fact, so a
    missing results.json or verdict.json makes the evidence incomplete. `backends` (`gate
    --backend`): judge only those backends, like a `--backend` run of them."""
    return judge_run(join(spec, evidence, retained=retained, backends=backends))
