"""The verdict: what the judge decided, rule by rule, and how to show it.

`Verdict.to_json()` is verdict.json (schema_version 1, validated by verdict.schema.json);
`render_text(verdict)` is the terminal form. Both are deterministic: judging the same evidence
twice gives byte-identical output (no clocks, no hostnames, no absolute paths).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Literal

from soakspec.exitcodes import ExitCode

SCHEMA_VERSION = 1

Status = Literal["pass", "fail", "inconclusive", "not_evaluated", "warn"]
Outcome = Literal["PASS", "FAIL", "INCONCLUSIVE"]
CLASSES = ("validity", "evidence", "performance")
MAX_LISTED = 10


@dataclasses.dataclass(frozen=True)
class Location:
    """Where a rule held or failed: a backend, a level, a bucket (or window) and its times."""

    backend: str | None = None
    workload: str | None = None
    level: int | None = None
    level_label: str | None = None
    bucket: int | None = None
    start: float | None = None  # epoch seconds of the bucket/window
    end: float | None = None
    text: str = ""
    turn: int | None = None  # a `per turn` instance's user turn (multi-turn chat)

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "workload": self.workload,
            "level": self.level,
            "level_label": self.level_label,
            "bucket": self.bucket,
            "start": self.start,
            "end": self.end,
            "text": self.text,
            "turn": self.turn,
        }


def json_observed(v: Any) -> Any:
    """An observed value as verdict.json holds it: null where it is not finite (a server gauge
    at +Inf: JSON has no infinity, and verdict.json is strict), `observed_text` saying what it was."""
    return None if isinstance(v, float) and not math.isfinite(v) else v


@dataclasses.dataclass(frozen=True)
class Instance:
    """One scope instance that did not pass (fail or inconclusive), for the detail list."""

    status: Status
    where: Location
    observed: float | None
    observed_text: str | None
    samples: int | None
    message: str
    needs: int | None = None  # inconclusive for want of samples: how many more
    # why, when a later step acts on it (not in the verdict's JSON): CLIENT_NOT_SENT, the load
    # generator could not send requests; CLIENT_TIMEOUTS, requests timed out in a bucket where it
    # was saturated (judge/validity.py `client_blocks`); CLIENT_LAG, a FAIL of a time from the
    # intended start that the same figure from the actual send does not fail (`lag_note` says so)
    cause: str | None = None
    lag_note: str | None = None  # CLIENT_LAG's reason, for `client_blocks`' message (not in the JSON)

    def to_json(self) -> dict[str, Any]:
        return {
            "needs": self.needs,
            "status": self.status,
            "where": self.where.to_json(),
            "observed": json_observed(self.observed),
            "observed_text": self.observed_text,
            "samples": self.samples,
            "message": self.message,
        }


@dataclasses.dataclass(frozen=True)
class RuleResult:
    """One rule's outcome.

    `message` is the reviewer's sentence after the status, e.g. "backend nccl, concurrency 8,
    bucket 1 [12:01:00-12:02:00 UTC]: 1 failed request (error event: engine died)"; `text()`
    prefixes the rule and the status.
    """

    rule: str  # the rule as written, without its severity ("failed == 0")
    klass: str  # validity | evidence | performance
    severity: str  # require | warn
    status: Status
    message: str
    builtin: bool = False  # a check the judge always runs (not written in the spec)
    line: int | None = None  # the rule's line in the spec
    metric: str | None = None
    op: str | None = None
    threshold: float | None = None
    threshold_text: str | None = None
    scope: str | None = None
    window_s: float | None = None
    observed: float | bool | None = None  # base units; the worst instance's value
    observed_text: str | None = None  # e.g. "p99(ttft) = 1.82s"
    samples: int | None = None
    needs: int | None = None  # more samples needed for a claim (inconclusive rules)
    where: Location | None = None
    instances: int = 0  # scope instances evaluated
    failing: int = 0  # of them, not passing
    details: tuple[Instance, ...] = ()  # up to MAX_LISTED of the failing instances
    # every one of the `failing` instances, `details` the first MAX_LISTED of them (not in the
    # verdict's JSON): where each failed, for a later step that weighs them one by one -- a FAIL
    # beside a saturated load generator is discounted only where it overlaps the saturated
    # bucket's time (judge/validity.py `client_blocks`); () where the result does not hold them
    failures: tuple[Instance, ...] = dataclasses.field(default=(), compare=False, repr=False)

    @property
    def status_word(self) -> str:
        return self.status.upper().replace("_", " ")

    def text(self) -> str:
        return f"{self.rule}: {self.status_word} — {self.message}"

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "class": self.klass,
            "severity": self.severity,
            "status": self.status,
            "builtin": self.builtin,
            "line": self.line,
            "metric": self.metric,
            "op": self.op,
            "threshold": self.threshold,
            "threshold_text": self.threshold_text,
            "scope": self.scope,
            "window_s": self.window_s,
            "observed": json_observed(self.observed),
            "observed_text": self.observed_text,
            "samples": self.samples,
            "needs": self.needs,
            "where": self.where.to_json() if self.where is not None else None,
            "instances": self.instances,
            "failing": self.failing,
            "details": [d.to_json() for d in self.details],
            "message": self.message,
            "text": self.text(),
        }


def decide(rules: tuple[RuleResult, ...] | list[RuleResult]) -> Outcome:
    """FAIL if a require rule failed; else INCONCLUSIVE if a require rule is inconclusive or
    was not evaluated; else PASS. Warn rules never decide."""
    req = [r for r in rules if r.severity == "require"]
    if any(r.status == "fail" for r in req):
        return "FAIL"
    if any(r.status in ("inconclusive", "not_evaluated") for r in req):
        return "INCONCLUSIVE"
    return "PASS"


@dataclasses.dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    rules: tuple[RuleResult, ...]
    soak: str
    spec_sha256: str
    evidence_spec_sha256: str | None = None
    run_id: str | None = None
    manifest_sha256: str | None = None
    run_status: str | None = None
    rehearsal: bool = False
    time_scale: float = 1.0
    notes: tuple[str, ...] = ()

    @property
    def exit_code(self) -> ExitCode:
        return {"PASS": ExitCode.OK, "FAIL": ExitCode.GATE_FAILED, "INCONCLUSIVE": ExitCode.INCONCLUSIVE}[self.outcome]

    @property
    def passed(self) -> bool:
        return self.outcome == "PASS"

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in ("pass", "fail", "inconclusive", "not_evaluated", "warn")}
        for r in self.rules:
            out[r.status] += 1
        return out

    def summary(self) -> str:
        req = [r for r in self.rules if r.severity == "require"]
        failed = [r.rule for r in req if r.status == "fail"]
        unsure = [r.rule for r in req if r.status in ("inconclusive", "not_evaluated")]
        warned = [r.rule for r in self.rules if r.status == "warn"]
        if self.outcome == "FAIL":
            text = f"FAIL: {len(failed)} of {len(req)} required rules failed ({', '.join(failed)})"
        elif self.outcome == "INCONCLUSIVE":
            text = f"INCONCLUSIVE: {len(unsure)} of {len(req)} required rules could not be decided ({', '.join(unsure)})"
            if failed:  # a partial run's (killed before it finished): its verdict is never FAIL, but these failed
                text += f"; {len(failed)} failed on the evidence so far ({', '.join(failed)})"
        else:
            text = f"PASS: all {len(req)} required rules hold"
        if warned:
            text += f"; {len(warned)} warning{'s' if len(warned) != 1 else ''} ({', '.join(warned)})"
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "verdict": self.outcome,
            "exit_code": int(self.exit_code),
            "soak": self.soak,
            "spec_sha256": self.spec_sha256,
            "evidence_spec_sha256": self.evidence_spec_sha256,
            "run_id": self.run_id,
            "manifest_sha256": self.manifest_sha256,
            "run_status": self.run_status,
            "rehearsal": self.rehearsal,
            "time_scale": self.time_scale,
            "summary": self.summary(),
            "counts": self.counts(),
            "notes": list(self.notes),
            "rules": [r.to_json() for r in self.rules],
        }


_MARK = {"pass": "PASS", "fail": "FAIL", "inconclusive": "????", "not_evaluated": "----", "warn": "WARN"}


def _facts(r: RuleResult) -> str:
    """`--verbose`: what a rule looked at, for every rule (passing ones too)."""
    parts = [f"status {r.status}", f"severity {r.severity}"]
    if r.line is not None:
        parts.append(f"spec line {r.line}")
    if r.observed_text is not None:
        parts.append(f"observed {r.observed_text}")
    elif isinstance(r.observed, bool):
        parts.append(f"observed {'yes' if r.observed else 'no'}")
    elif r.observed is not None:
        parts.append(f"observed {r.observed:g}")
    if r.threshold_text is not None:
        parts.append(f"threshold {r.op or ''} {r.threshold_text}".replace("  ", " "))
    if r.samples is not None:
        parts.append(f"{r.samples} samples")
    if r.instances:
        noun = r.scope if r.klass == "performance" and r.scope else "instance"
        parts.append(f"{r.instances} {noun}{'s' if r.instances != 1 else ''} evaluated, {r.failing} not passing")
    if r.where is not None and r.where.text:
        parts.append(f"worst: {r.where.text}")
    return "; ".join(parts)


# what no line on a terminal may carry raw: C0 controls but tab and newline (ESC starts a terminal's escape
# sequences, NUL, BEL, ...), DEL, the C1 controls (U+009B is CSI on its own) and lone surrogates
_TERMINAL_BAD = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def _terminal_safe(line: str) -> str:
    """A line of the terminal form with every character of `_TERMINAL_BAD` shown as `\\xNN` or
    `\\uNNNN`: rule messages quote the server's own text (a failed scrape's answer, an error
    body), which reached the terminal raw -- a /metrics answering ANSI escapes cleared the screen."""
    return _TERMINAL_BAD.sub(lambda m: f"\\x{ord(m.group(0)):02x}" if ord(m.group(0)) < 0x100 else f"\\u{ord(m.group(0)):04x}", line)


def render_text(v: Verdict, *, verbose: bool = False) -> str:
    """The terminal form: one line per rule grouped by class, details under failures, and the
    verdict last. `verbose` adds, under every rule, what it looked at (observed value,
    threshold, samples, instances evaluated, the worst instance)."""
    head = f"soak '{v.soak}'" + (f", run {v.run_id}" if v.run_id else "")
    if v.rehearsal or v.time_scale != 1:
        head += f" (rehearsal: {'yes' if v.rehearsal else 'no'}, time scale {v.time_scale:g})"
    lines = [head]
    for note in v.notes:
        lines.append(f"  note: {note}")
    for klass in CLASSES:
        rs = [r for r in v.rules if r.klass == klass]
        if not rs:
            continue
        lines.append(f"  {klass}")
        for r in rs:
            sev = "" if r.severity == "require" else " (warn)"
            lines.append(f"    {_MARK[r.status]}  {r.rule}{sev} — {r.message}")
            if r.status != "pass" or verbose:
                shown = r.details if r.status in ("fail", "warn", "inconclusive") else ()
                for d in shown[1:] if shown and shown[0].message in r.message else shown:
                    lines.append(f"            {d.where.text}: {d.message}" if d.where.text else f"            {d.message}")
                extra = r.failing - len(r.details)
                if extra > 0:
                    lines.append(f"            ... and {extra} more")
            if verbose:
                lines.append(f"            {_facts(r)}")
    lines.append(v.summary())
    return "\n".join(_terminal_safe(line) for line in lines)
