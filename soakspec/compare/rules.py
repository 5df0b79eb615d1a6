"""`soakspec compare`'s rules: `[require|warn] STAT(METRIC) regression <= N%` from the command
line (`parse_rule`) and a spec's `compare { require regression(p99(ttft)) <= 5% }` block
(`rules_of`), over the metrics compare measures (`soakspec.compare.metrics`). How a rule is
judged over its rows is `soakspec.compare.judging` ("Rules").
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Literal

from soakspec.compare.metrics import BY_NAME, _q


_RULE = re.compile(
    r"^\s*(?:(require|warn)\s+)?(p\d+(?:\.\d+)?|median|mean|ratio)\(\s*([a-z_]+)\s*\)\s+regression\s*(<=|<)\s*"
    r"(-?\d+(?:\.\d+)?)\s*%\s*$"
)
_SPEC_FORM = re.compile(  # the spec's `compare { require regression(p99(ttft)) <= 5% }` form
    r"^\s*(?:(require|warn)\s+)?regression\(\s*(p\d+(?:\.\d+)?|median|mean|ratio)\(\s*([a-z_]+)\s*\)\s*\)\s*(<=|<)\s*"
    r"(-?\d+(?:\.\d+)?)\s*%\s*$"
)


@dataclasses.dataclass(frozen=True)
class CompareRule:
    severity: Literal["require", "warn"]
    stat: str  # p99, p50 (median is written p50), mean, ratio (errors)
    metric: str
    op: str  # "<=" or "<"
    threshold: float  # a fraction: 5% -> 0.05

    def text(self) -> str:
        return f"{self.severity} {self.stat}({self.metric}) regression {self.op} {self.threshold * 100:g}%"


class RuleError(ValueError):
    """A compare rule that does not parse or names what `compare` does not measure."""


def parse_rule(text: str) -> CompareRule:
    """`[require|warn] STAT(METRIC) regression <= N%` (or the spec's form,
    `regression(STAT(METRIC)) <= N%`); raises RuleError with a reason."""
    m = _RULE.match(text) or _SPEC_FORM.match(text)
    if not m:
        raise RuleError(f"{text!r}: expected `require STAT(METRIC) regression <= N%`, e.g. `require p99(ttft) regression <= 5%`")
    sev, stat, name, op, n = m.groups()
    stat = "p50" if stat == "median" else stat
    cm = BY_NAME.get(name)
    if cm is None:
        raise RuleError(f"{text!r}: compare measures {', '.join(BY_NAME)}, not {name!r}")
    q = _q(stat)
    if cm.kind == "proportion" and stat != "ratio":
        raise RuleError(f"{text!r}: {name} is a share of the requests; compare its ratio, e.g. ratio({name})")
    if cm.kind != "proportion" and stat == "ratio":
        raise RuleError(f"{text!r}: ratio() is the share of unsuccessful requests, ratio(errors)")
    if cm.kind == "per_bucket" and stat != "mean":
        raise RuleError(f"{text!r}: {name} is one value per bucket; compare its mean")
    if cm.kind == "distribution" and (q is None or not 0 < q < 100):
        raise RuleError(f"{text!r}: {name} is compared by a percentile p1..p99.9, e.g. p99({name})")
    return CompareRule(sev or "require", stat, name, op, float(n) / 100.0)  # type: ignore[arg-type]


def rules_of(spec: Any) -> tuple[CompareRule, ...]:
    """The rules of a checked spec's `compare { ... }` block (soakspec/lang/check/compare.py)."""
    block = getattr(spec, "compare", None)
    return tuple(CompareRule(r.severity, r.stat, r.metric, r.op, r.threshold) for r in getattr(block, "rules", ()))
