"""Check 6: claims of a sustainable load, against a sweep's figure.

A sweep (`search = bisect`, `soakspec.judge.sweep`) measures the highest load at which the
gate's `require` rules hold: `max_sustainable_concurrency` or `max_sustainable_rate`
(results.json `figures`). A document may claim it:

  - "sustains 12 req/s", "sustained up to 12 rps", "sustains 12 requests per second",
    "sustains a rate of 12 rps": a rate claim;
  - "sustains concurrency 8", "sustains 8 concurrent requests/users/streams": a concurrency claim;
  - "max sustainable rate (of|:|=) 12 rps", "max_sustainable_concurrency = 8": the figure itself.

Rules (asserted phrases only, see `polarity`):
  - with evidence that has the figure: a sustained load above it is CB201 (the evidence says
    less); the figure stated as a different number is CB201; a figure of "none" (no level held)
    makes any sustain claim CB201. A load at or below the figure is fine: bisection assumes that
    a level holding means every lower one holds, and the figure is the highest that held.
  - a figure that is only a lower bound ("at least X": the sweep's highest level held, or the
    level next above X was INCONCLUSIVE or never probed) stated as the maximum X is CB201: the
    evidence does not say X is the most the server sustains ("sustains X" is fine).
  - without evidence, when the spec has a sweep: a sustained load above the sweep's highest
    level is CB301 (the search never went there).
  - otherwise (no sweep anywhere) the check says nothing: a fixed-level soak's levels are checked
    by the scope rules.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from soakspec.claims.document import Document
from soakspec.claims.facts import Coverage, EvidenceFacts
from soakspec.claims.scope import _asserted
from soakspec.diagnostics import Diagnostic

_N = r"(?P<n>\d+(?:\.\d+)?)"
_RATE_UNIT = r"(?:rps|req/s|requests?\s*(?:per|/)\s*s(?:ec(?:ond)?)?|qps)"
_SUSTAIN = r"\bsustain(?:s|ed|ing)?\s+(?:up\s+to\s+|at\s+least\s+|as\s+much\s+as\s+)?"
_RATE = re.compile(rf"{_SUSTAIN}(?:a\s+rate\s+of\s+|rate\s+)?{_N}\s*{_RATE_UNIT}\b", re.I)
_CONC = [
    re.compile(rf"{_SUSTAIN}(?:a\s+)?concurrency\s+(?:of\s+)?{_N}\b", re.I),
    re.compile(rf"{_SUSTAIN}{_N}\s+(?:concurrent|parallel|simultaneous|in-flight)\s+(?:requests?|users?|streams?|clients?|sessions?)\b", re.I),
]
_FIGURE = re.compile(rf"\bmax(?:imum)?[_\s]+sustainable[_\s]+(?P<axis>rate|concurrency)\s*(?:of|is|was|[:=])?\s*{_N}", re.I)

FIGURES = {"rate": "max_sustainable_rate", "concurrency": "max_sustainable_concurrency"}


def _figure(evidence: Sequence[EvidenceFacts], axis: str) -> tuple[bool, float | None, bool]:
    """(some evidence has the figure, its value -- the highest over the backends that have one,
    whether that value is only a lower bound: "at least X")."""
    name = FIGURES[axis]
    vals = [(ev.sustainable[name], name in ev.sustainable_at_least) for ev in evidence if name in ev.sustainable]
    if not vals:
        return False, None, False
    known = [v for v in vals if v[0] is not None]
    if not known:
        return True, None, False
    top = max(v for v, _ in known)
    return True, top, any(at_least for v, at_least in known if v == top)


def _unit(axis: str, v: float) -> str:
    return f"{v:g} rps" if axis == "rate" else f"concurrency {v:g}"


def check_sustain(doc: Document, path: str, coverage: Coverage, evidence: Sequence[EvidenceFacts],
                  negated_blocks: frozenset[int]) -> list[Diagnostic]:  # fmt: skip
    out: list[Diagnostic] = []
    found = [(axis, s, m, False) for axis, rxs in (("rate", [_RATE]), ("concurrency", _CONC)) for rx in rxs
             for s, m in _asserted(doc, rx, negated_blocks)]  # fmt: skip
    found += [(m.group("axis").lower(), s, m, True) for s, m in _asserted(doc, _FIGURE, negated_blocks)]
    for axis, s, m, exact in found:
        n = float(m.group("n"))
        span = doc.span(s.start + m.start("n"), s.start + m.end("n"))
        has, fig, at_least = _figure(evidence, axis)
        if has:
            if fig is None:
                msg = f"claims it sustains {_unit(axis, n)}, but the sweep found no level where the gate's rules hold ({FIGURES[axis]} = none)"
            elif exact and at_least and abs(n - fig) <= 1e-9:
                msg = (f"claims the figure {_unit(axis, n)} is the maximum; the evidence's {FIGURES[axis]} is at least {fig:g} "
                       "(the sweep found no level just above it that does not hold)")
            elif (exact and abs(n - fig) > 1e-9) or n > fig + 1e-9:
                msg = f"claims {'the figure ' if exact else 'it sustains '}{_unit(axis, n)}; the evidence's {FIGURES[axis]} is {fig:g}"
            else:
                continue
            out.append(Diagnostic("CB201", msg, span, path, hint=f"the sweep's result is in results.json figures.{FIGURES[axis]}"))
        elif coverage.sweep_axis == axis and coverage.sweep_high is not None and n > coverage.sweep_high + 1e-9:
            out.append(Diagnostic("CB301", f"claims it sustains {_unit(axis, n)}, above the highest level the sweep searches "
                                           f"({_unit(axis, coverage.sweep_high)})", span, path))
    return out
