"""Each backend's own status, from the rules as they apply to THAT backend (pure).

The verdict is one judgment over the run; a report row per backend must not show it as the
backend's result (a backend that passed every rule would read "failed"). Per backend:

  performance rules  re-judged with the rule narrowed to the backend (the same function the
                     gate uses, `judge.performance.judge`); a rule written `for backend "x"`
                     applies to x only. When the run's required validity or evidence checks
                     failed, the run-level rule is `not_evaluated`, and so is the backend's --
                     but the narrowed judgment is still made and kept as `measured`, so a report
                     can show the figure, marked as not evaluated.
  validity, evidence the run-level result; when it did not pass and every failing instance is
                     listed with its backend (or names a file under that backend's
                     `backends/<name>/`), a backend none of them names passes it; a finding
                     about the run as a whole (the manifest) applies to every backend.

Word: failed (a require rule fails for it), inconclusive (a require rule is inconclusive or not
evaluated), passed; `not run` for a planned backend without evidence.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from soakspec.evidence import layout
from soakspec.judge.verdict import RuleResult

_BACKEND_FILE = re.compile(rf"(?:^|[\s:(]){layout.BACKENDS}/([A-Za-z0-9._-]+)/")
_RANK = {"pass": 0, "warn": 1, "not_evaluated": 2, "inconclusive": 3, "fail": 4}


@dataclasses.dataclass(frozen=True)
class RuleStatus:
    rule: str
    severity: str
    klass: str
    status: str  # pass | fail | inconclusive | not_evaluated | warn
    measured: RuleResult | None = None  # a performance rule narrowed to the backend (also when not evaluated)


@dataclasses.dataclass(frozen=True)
class BackendStatus:
    name: str
    word: str  # passed | failed | inconclusive
    rules: tuple[RuleStatus, ...]

    @property
    def failed(self) -> tuple[str, ...]:
        return tuple(r.rule for r in self.rules if r.severity == "require" and r.status == "fail")

    @property
    def unsure(self) -> tuple[str, ...]:
        return tuple(r.rule for r in self.rules if r.severity == "require" and r.status in ("inconclusive", "not_evaluated"))

    def cell(self) -> str:
        """The report cell: `passed (5 rules)`, `failed: failed == 0`, `inconclusive: ...`."""
        n = sum(1 for r in self.rules if r.severity == "require")
        if self.word == "failed":
            return "failed: " + "; ".join(self.failed)
        if self.word == "inconclusive":
            return "inconclusive: " + "; ".join(self.unsure)
        return f"passed ({n} rule{'s' if n != 1 else ''})"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.word, "failed": list(self.failed), "unsure": list(self.unsure),
                "rules": [{"rule": r.rule, "severity": r.severity, "class": r.klass, "status": r.status,
                           "measured": r.measured.observed_text if r.measured is not None else None} for r in self.rules]}


def _named(d: Any) -> str | None:
    """The backend an instance speaks about: its location's backend, or the backend whose
    directory a file finding names (`backends/<safe name>/requests.jsonl: changed ...`)."""
    if d.where.backend:
        return d.where.backend
    for text in (d.where.text, d.message):
        m = _BACKEND_FILE.search(text) if isinstance(text, str) else None
        if m:
            return "\0dir:" + m.group(1)
    return None


def _for_backend(r: RuleResult, name: str) -> str:
    """A validity or evidence result as it applies to backend `name`."""
    if r.status == "pass":
        return "pass"
    listed = r.details
    names = [_named(d) for d in listed]
    if listed and all(names) and r.failing <= len(listed):
        me = (name, "\0dir:" + layout.safe_name(name))
        mine = [d.status for d, n in zip(listed, names) if n in me]
        if not mine:
            return "pass"
        worst = max(mine, key=lambda s: _RANK.get(s, 0))
        return "warn" if r.severity == "warn" and worst == "fail" else worst
    return r.status


def backend_statuses(run: Any, verdict: Any) -> dict[str, BackendStatus]:
    """name -> BackendStatus for every judged backend of a joined run (`judge.joined.join`)."""
    from soakspec.judge import performance
    from soakspec.judge.registry import impl_for

    spec_rules = [r for r in run.spec.gate.rules if r.klass == "performance"]
    perf_results = [r for r in verdict.rules if r.klass == "performance"]
    out: dict[str, BackendStatus] = {}
    for bi in run.judged:
        name = bi.name
        rows: list[RuleStatus] = []
        for r in verdict.rules:
            if r.klass != "performance":
                rows.append(RuleStatus(r.rule, r.severity, r.klass, _for_backend(r, name)))
        for rule, res in zip(spec_rules, perf_results):
            if rule.backend is not None and rule.backend != name:
                continue
            mine = performance.judge(run, dataclasses.replace(rule, backend=name), impl_for(rule.expr))
            status = "not_evaluated" if res.status == "not_evaluated" else mine.status
            rows.append(RuleStatus(res.rule, res.severity, "performance", status, mine))
        req = [x for x in rows if x.severity == "require"]
        if any(x.status == "fail" for x in req):
            word = "failed"
        elif any(x.status in ("inconclusive", "not_evaluated") for x in req):
            word = "inconclusive"
        else:
            word = "passed"
        out[name] = BackendStatus(name, word, tuple(rows))
    return out


def statuses_json(statuses: Mapping[str, BackendStatus]) -> dict[str, Any]:
    return {n: s.to_json() for n, s in statuses.items()}
