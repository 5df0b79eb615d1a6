"""What every rule module shares: comparisons, value formatting, where an instance is, and
how a rule's instances fold into one `RuleResult`."""

from __future__ import annotations

import dataclasses
import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from soakspec.judge.scope import Scope
from soakspec.judge.verdict import MAX_LISTED, Instance, Location, RuleResult, Status
from soakspec.lang.metrics import METRICS, Kind
from soakspec.lang.spec import Rule
from soakspec.units import format_as, format_duration, format_size

OPS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}


def compare(value: float, op: str, threshold: float) -> bool:
    return OPS[op](value, threshold)


def plural(n: int, word: str) -> str:
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
    if isinstance(value, float) and math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"  # a server gauge's, as its text format writes it
    return format_as(value, kind.value if kind is not None else None)


def abort_observed_text(a: Mapping[str, Any]) -> str:
    """What a fired abort (a manifest `aborts` entry) observed, in its rule's own unit -- a
    ratio as a percentage ("100%", never "1", which read as one request), a time as a duration
    -- as the runner's `Fired.describe` says it; "?" when it records none. A manifest from
    before the entry held its aggregate names it in the rule's text (`abort ratio(errors) ...`)."""
    observed = a.get("observed")
    if not isinstance(observed, (int, float)) or isinstance(observed, bool):
        return "?"
    agg = a.get("agg")
    if not isinstance(agg, str):
        m = re.match(r"\s*(?:abort\s+)?(\w+)\s*\(", str(a.get("rule") or ""))
        agg = None if m is None else "p" if re.fullmatch(r"p\d+(?:\.\d+)?", m.group(1)) else m.group(1)
    metric = METRICS.get(str(a.get("metric")))
    return format_value(float(observed), metric.result_kind(agg) if metric is not None else None)


def signed_pct(v: float) -> str:
    return f"{v * 100:+.3g}%"


def _shown(value: float, kind: Kind | None, digits: int | None, signed: bool) -> tuple[str, float]:
    """(text, the number the text says) of `value` at `digits` significant digits (None: as
    `format_value` / `signed_pct` print it)."""
    if signed:
        s = f"{value * 100:+.{digits or 3}g}"
        return s + "%", float(s) / 100
    if kind is Kind.DURATION:
        a, sign = abs(value), "-" if value < 0 else ""
        if a < 1:
            s = f"{a * 1000:.{digits or 3}g}"
            return f"{sign}{s}ms", float(sign + s) / 1000
        if digits is None and a >= 60:
            return format_duration(value), float(round(value))
        s = f"{a:.{digits or 3}g}"
        return (format_duration(value) if digits is None else f"{sign}{s}s"), float(sign + s)
    if kind is Kind.SIZE:
        if digits is not None:
            return f"{int(value)}B", float(int(value))
        f = 1.0
        while abs(value) >= 1024 * f and f < 1024.0**4:
            f *= 1024
        return format_size(value), (float(int(value)) if f == 1 else float(f"{value / f:.1f}") * f)
    if kind is Kind.COUNT and float(value).is_integer():
        return str(int(value)), float(value)
    scale, unit = (100.0, "%") if kind is Kind.RATIO else (1.0, " rps") if kind is Kind.RATE else (1.0, "")
    s = f"{value * scale:.{digits or 4}g}"
    return s + unit, float(s) / scale


def format_beside(value: float | None, kind: Kind | None, op: str | None, threshold: float | None, *,
                  signed: bool = False) -> str:
    """`format_value` (or `signed_pct`) of a value printed beside its threshold, with as many more
    digits as it takes for the text to sit on the same side of the threshold as the value: a
    failing mean(itl) of 50.04ms reads "50.04ms", never "50ms" beside "threshold < 50ms"."""
    if value is None:
        return "n/a"
    if math.isinf(value):
        return format_value(value, kind)
    text, shown = _shown(value, kind, None, signed)
    if op not in OPS or threshold is None or not math.isfinite(value):
        return text
    want = (compare(value, op, threshold), value == threshold)
    digits = 3 if signed or kind is Kind.DURATION else 4
    while (compare(shown, op, threshold), shown == threshold) != want and digits < 17:
        digits += 1
        text, shown = _shown(value, kind, digits, signed)
    return text


def short(text: str, n: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def describe_request(r: Mapping[str, Any]) -> str:
    """What went wrong with a request, for a reviewer: `error event: engine died`, `HTTP 500:
    "..."`, `connection lost: ...` -- the facts, never a generic label, and each said once
    (`_labelled`): the runner's own message already begins `HTTP 500: <the server's body>`,
    `deadline passed before the response finished`. A request cut short by its deadline or its
    connection after a 200 is said as that, not as `HTTP 200` (which reads as the answer)."""
    err = r.get("error")
    status = r.get("status")
    outcome = r.get("outcome")
    mismatch = r.get("usage_mismatch")
    if outcome == "completed" and isinstance(mismatch, str) and mismatch:
        return f"usage contradicts the stream: {short(mismatch)}"
    if outcome == "failed" and status == 200:
        # the runner's error already says what happened ("error event: ...", "0 completion
        # tokens and no text", "the stream ended without [DONE]"): no generic label before it
        return short(err) if isinstance(err, str) and err else "HTTP 200, but not completed: no error message"
    if outcome == "timeout":
        return _labelled("deadline passed", err)
    if outcome == "disconnected" and status in (None, 200):
        return _labelled("connection lost", err, "connection ")
    if isinstance(status, int):
        return _labelled(f"HTTP {status}", err)
    return f'"{short(err)}"' if isinstance(err, str) and err else "no error message"


def _labelled(label: str, err: Any, own: str | None = None) -> str:
    """`label: "err"`, where `err` does not already say it: an error that begins with `label`
    (or `own`) is the runner's own words -- `HTTP 500: <body>` reads `HTTP 500: "<body>"`,
    `deadline passed before the response finished` as it is -- never `HTTP 500: "HTTP 500: ..."`."""
    if not (isinstance(err, str) and err):
        return f"{label}: no error message"
    if err.startswith(label):
        rest = err[len(label):]
        if rest.startswith(":"):
            body = rest[1:].strip()
            return f'{label}: "{short(body)}"' if body else f"{label}: no error message"
        if not rest or rest[0] == " ":
            return short(err)
    if own is not None and err.startswith(own):
        return short(err)
    return f'{label}: "{short(err)}"'


def loc(sc: Scope) -> Location:
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
        turn=sc.turn,
    )


def backend_here(name: str) -> Location:
    return Location(backend=name, text=f"backend {name}")


def problem(message: str, where: Location | None = None, status: Status = "fail") -> Instance:
    """An instance that did not pass, with no observed value."""
    return Instance(status, where or Location(), None, None, None, message)


def fold(severity: str, statuses: Sequence[str]) -> Status:
    if "fail" in statuses:
        return "warn" if severity == "warn" else "fail"
    if "inconclusive" in statuses:
        return "inconclusive"
    return "pass"


def result(rule: Rule | None, name: str, klass: str, severity: str, insts: Sequence[Instance],
           pass_message: str, n_instances: int, **extra: Any) -> RuleResult:
    """Fold a rule's non-passing instances into its result: the first failure (else the first
    inconclusive instance) is the message, the rest are counted and listed (`details`, the
    first MAX_LISTED; `failures`, every one)."""
    status = fold(severity, [i.status for i in insts])
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
        failures=tuple(bad),
        **extra,
    )


def replace(res: RuleResult, **changes: Any) -> RuleResult:
    return dataclasses.replace(res, **changes)


def not_evaluated(rule: Rule) -> RuleResult:
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
