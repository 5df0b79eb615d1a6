"""`compare { ... }`: the rules `soakspec compare BASE NEW` gates a before/after with.

    compare {
      confidence = 95%
      require regression(p99(ttft)) <= 5%
      warn regression(p50(tpot)) <= 10%
    }

A rule is `require|warn regression(STAT(METRIC)) <= N%` (or `<`): the change of STAT(METRIC)
from the base run to the new one, towards worse, may be at most N % (see `soakspec.compare`
for how the interval decides pass, fail or inconclusive). STAT is a percentile `pNN` (or
`median`) for the per-request metrics, `mean` for the per-bucket ones and `ratio` for `errors`,
the share of unsuccessful requests, whose regression is a rise in percentage points
(`require regression(ratio(errors)) <= 1%`) (`COMPARE_METRICS`).
No `per` scope and no `on "backend"`: a compare rule speaks about every matched backend and
level. `confidence` (default 95 %, at least 50 % and below 100 %) is the comparison's
family-wise confidence.

Codes (declared in soakspec/lang/codes.py, shared with the gate's rules): E303 a function
other than regression or a statistic, E302 a metric compare does not measure, E304 a
percentile outside (0, 100), E305 a missing or wrong comparison / threshold, E306 a scope or
target, E204 a confidence out of range.
"""

from __future__ import annotations

from soakspec.lang import ast as A
from soakspec.lang import spec as S
from soakspec.lang.check.core import Bad, Ctx, Key, Table, quantity_value, suggest
from soakspec.lang.check.walk import walk_settings
from soakspec.lang.fmt import rule_text
from soakspec.units import Dimension

# metric -> how it is compared: "percentile" (per request), "mean" (per bucket) or "ratio" (a share
# of the requests). soakspec.compare.METRICS lists the same names (tests/test_compare.py pins that they agree).
COMPARE_METRICS = {"errors": "ratio", "ttft": "percentile", "itl": "percentile", "tpot": "percentile", "latency": "percentile",
                   "sent_ttft": "percentile", "sent_latency": "percentile", "qps": "mean", "throughput": "mean"}

COMPARE = Table(
    cls=S.Compare,
    keys=(Key("confidence", "quantity", "confidence", Dimension.RATIO),),
    statements=(A.Rule,),
)


def compare(ctx: Ctx, blk: A.Block | None) -> S.Compare:
    if blk is None:
        return S.Compare()
    b, fields = walk_settings(ctx, blk, COMPARE, "compare")
    rules = []
    for stmt in b.statements:
        try:
            rules.append(_rule(ctx, stmt))
        except Bad:
            continue
    return S.Compare(rules=tuple(rules), **fields)


def _stat(ctx: Ctx, call: A.Call, metric: str) -> str:
    kind = COMPARE_METRICS[metric]
    name = "p50" if call.func == "median" else call.func
    if kind == "ratio" or name == "ratio":
        if kind != "ratio" or name != "ratio":
            fix = f"regression(ratio({metric}))" if kind == "ratio" else "regression(ratio(errors))"
            ctx.error("E303", f"ratio() is the share of unsuccessful requests: compare {fix}", call.span)
            raise Bad
        return "ratio"
    if kind == "mean":
        if name != "mean":
            ctx.error("E303", f"'{metric}' is one value per bucket: compare its mean, e.g. regression(mean({metric}))", call.span)
            raise Bad
        return "mean"
    if not (name.startswith("p") and name[1:].replace(".", "", 1).isdigit()):
        ctx.error("E303", f"'{call.func}' is not a percentile: compare e.g. regression(p99({metric}))", call.span,
                  suggest(call.func, ("p50", "p95", "p99", "median")))
        raise Bad
    q = float(name[1:])
    if not 0 < q < 100:
        ctx.error("E304", f"percentile {name} is outside (0, 100)", call.span)
        raise Bad
    return name


def _rule(ctx: Ctx, r: A.Rule) -> S.CompareRequirement:
    e = r.expr
    shape = "regression(p99(ttft)) <= 5%"
    if r.severity == "abort":
        ctx.error("E422", "abort rules stop a run while it runs: they belong in the gate block", r.span, "write require or warn here")
        raise Bad
    if not (isinstance(e, A.Call) and e.func == "regression" and isinstance(e.arg, A.Call) and isinstance(e.arg.arg, A.MetricRef)):
        ctx.error("E303", f"a compare rule is {r.severity} {shape}", e.span, "e.g. require regression(p99(ttft)) <= 5%")
        raise Bad
    metric = e.arg.arg.name
    if metric not in COMPARE_METRICS:
        ctx.error("E302", f"compare does not measure '{metric}' (one of {', '.join(COMPARE_METRICS)})", e.arg.arg.span,
                  suggest(metric, COMPARE_METRICS))
        raise Bad
    stat = _stat(ctx, e.arg, metric)
    if r.scope is not None or r.target is not None:
        span = r.scope.span if r.scope is not None else r.target.span  # type: ignore[union-attr]
        ctx.error("E306", "a compare rule applies to every matched backend and level: no 'per' and no 'on'", span)
        raise Bad
    if r.op not in ("<=", "<") or r.threshold is None:
        ctx.error("E305", f"a compare rule bounds the regression from above: {shape}", r.span)
        raise Bad
    threshold = quantity_value(ctx, "regression", r.threshold, Dimension.RATIO)
    return S.CompareRequirement(r.severity, stat, metric, r.op, threshold, rule_text(r), r.span)  # type: ignore[arg-type]
