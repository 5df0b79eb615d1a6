"""Claims of change about a sweep's own figure -- "max sustainable rate is unchanged", "capacity
rose from 20 to 24 rps", "the sweep found 24 rps, up from 20" -- against compare's sweep row
(`SweepChangeRow`, compare's JSON `sweep`; `soakspec.compare.sweep`). Called by `changes`, whose
codes it reuses: a claim about the figure is a claim of change like any other.

What names the figure (`SUBJECT`; precision over recall: a false finding in a review is worse
than a missed one): "max(imum) sustainable rate / load / concurrency / request rate" (and
`max_sustainable_*`), "sustainable capacity", "capacity" where no word before it names another
resource or a place ("KV cache capacity", "memory capacity", "at capacity", "spare capacity" are
not the sweep's; `_OTHER_RESOURCE`) and the clause names no other metric of compare's ("TTFT
rose in capacity tests"),
"saturation point", and "the sweep found / measured / reported". Nothing else: "throughput
rose" is compare's throughput row (`changes`), "sustains 24 rps" a figure of one run
(`sustain`). A name listed with compare's other metrics under one direction ("the max
sustainable request rate and p50 TTFT fell", "no regression in p99 TTFT or capacity") is a claim
of the figure, and `changes` reads the others' (its stated figures are not read: whose they
are is not said); a clause naming another metric anywhere else is that metric's (`_listed`).

A claim is a clause (cut as `changes` cuts them) that names the figure and has exactly one
direction (`direction.DIRECTION`), with nothing but connective words (`changes._GAP`), the
figure's own numbers and "found" between them -- or "N, up from M" / "N (down from M)"; a
direction before the name ("no change in capacity") only where the clause ends after it, but for
its figures or a backend (`_TAIL`: "increased capacity planning" is another noun's). The
figure is a capacity: higher is better, so "improved" is a rise and "regressed" a fall. Against
the rows of the backend it names (else every row), one finding per claim:

- CB501 a claimed rise or fall where every decided row moved the other way;
- CB502 stated figures -- "from 20 to 24 rps", "20 → 24", "24 rps, up from 20" -- that are not
  the rows' base / new figures (within half a unit of the last digit; a row with no level held
  has no figure to state) on any row that shows the direction; or a stated size of the change
  outside the changes both searches allow on every such row (below);
- CB503 a claimed rise or fall where compare found no significant change (the two searches are
  within one step of the grid) or its row is inconclusive;
- CB504 "unchanged" / "no regression" where a row is a regression (an unchanged claim of an
  improvement understates, and is not flagged);
- CB505 (a warning) "unchanged" of a row compare could not decide, or a claim naming the figure
  explicitly ("max sustainable rate", "the sweep found") where compare has no sweep row.
  "capacity" and "saturation point" with no sweep row say nothing: a fixed-level comparison's
  review may use the words of something else.

The size of a change. A bisection knows each figure only to within its grid: a run's true limit
lies in [X, F], X the level it held, F the next level above that failed (compare's JSON
`base_sweep` / `new_sweep` `first_failing`; `SweepChangeRow.base_failing` / `new_failing`). So
the changes both searches allow are new - base in [X_new - F_base, F_new - X_base] and new /
base - 1 in [X_new / F_base - 1, F_new / X_base - 1] (`_allowed`) -- 20 [24] -> 28 [32] rps
allows +4 .. +12 rps, +16.7% .. +60%: "capacity rose 70%" is CB502, naming that interval, and so
is "rose 10%" (the grid shows more). A run with nothing above its figure known to fail (a lower
bound: the grid's top, or the next level never probed; or a compare JSON that predates
`first_failing`) leaves its end open ("+16.7% .. no upper bound"); a run that held no level has
no figure to size a change by, and its row's size is not checked. The size is read by `changes`'
own reader (`changes._magnitudes`, handed in as `sizes`: one reader for a row's size and the
figure's), as a rate whose higher is better: "rose 20%", "a 20% higher capacity", "1.2x",
"doubled", "by 4 rps" / "is up 4 rps" (a difference, held only against a rate's row: a
concurrency has no unit a review writes after it), with its hedges -- "~" / "about" widen a round
number ("~60%": 55..65%), "at least" / "more than" bound it below, "up to" above -- each held
within half a unit of its last digit. Only a size next to the direction word (`_SIZE_AFTER`,
`_SIZE_BEFORE`: "rose by 20%", "a 20% higher", "rose from 20 to 24 rps (+20%)") is read: "capacity
rose with p99 under 5%" states no size of it; nor is a size after a list of metrics ("the max
sustainable rate and p50 TTFT rose 20%": whose?). Stated figures are not read again as a size.

Not read: a negated, hedged or asked clause (`polarity`), a rule or threshold, noise, a clause
with two directions; a size of a concurrency in its own words ("by 4 concurrent requests").
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from soakspec.claims.change_common import LIST_JOIN, Magnitude, half_unit, named_backends
from soakspec.claims.direction import APPROX, DIRECTION, TO
from soakspec.claims.facts import ChangeFacts, SweepChangeRow
from soakspec.claims.polarity import Polarity, polarity

_NUM = r"\d+(?:\.\d+)?"
_UNIT = (r"(?:rps\b|qps\b|req(?:uest)?s?\s*(?:/|per)\s*s(?:ec(?:ond)?)?\b|(?:concurrent|parallel|in-flight)\s+"
         r"(?:requests?|users?|streams?|sessions?)\b)")
# "KV cache capacity", "at capacity", "spare capacity": another resource's, or a place, not the sweep's figure
_OTHER_RESOURCE = re.compile(r"\b(?:cache|kv|memory|mem|vram|hbm|gpu|disk|storage|queue|buffer|batch|context|token|slot|pool"
                             r"|network|bandwidth|link|cpu|compute|battery|tank|seating|file|block|page|prefix|at|to|over|near"
                             r"|under|full|spare|free|extra|headroom|of)[\s-]+(?:the\s+)?$", re.I)
SUBJECT = re.compile(
    r"\bmax(?:imum)?[_\s]+sustain(?:able|ed)[_\s]+(?:request[_\s]+)?(?:rate|load|concurrency)\b"
    r"|\bsustainable\s+capacity\b"
    r"|(?<![\w-])capacity\b"
    r"|\bsaturation\s+point\b"
    r"|\b(?:the|our|this|each)\s+(?:(?:new|base|rate|concurrency|capacity)\s+)?sweeps?\s+(?:now\s+)?(?:found|finds|measured|reported)\b",
    re.I,
)
# the explicit names: a claim of these with no sweep row is CB505 (missing data is never a pass)
_EXPLICIT = re.compile(r"max(?:imum)?[_\s]+sustain|sweep", re.I)
_SIGN = {"same": 0, "down": -1, "up": 1, "better": 1, "worse": -1}
# "24 rps, up from 20", "24 (down from 28)": the new figure, a direction, the base figure
_UP_FROM = re.compile(rf"(?P<b>{_NUM})\s*(?:{_UNIT})?\s*[,(]?\s*(?P<dir>up|down)\s+from\s+(?:{APPROX}\s*)?(?P<a>{_NUM})\s*(?:{_UNIT})?", re.I)
_FROM_TO = re.compile(rf"\bfrom\s+(?:{APPROX}\s*)?(?P<a>{_NUM})\s*(?:{_UNIT})?\s*{TO}\s*(?:{APPROX}\s*)?(?P<b>{_NUM})"
                      rf"(?![\d.])(?!\s*(?:%|ms|s\b|µs|us|tok))"
                      rf"|(?<![\w.])(?P<a2>{_NUM})\s*(?:{_UNIT})?\s*(?:→|->)\s*(?P<b2>{_NUM})(?![\d.])(?!\s*(?:%|ms|s\b|µs|us|tok))", re.I)
# what may follow the figure's name where the direction comes first ("no change in capacity.",
# "raised the max sustainable rate from 20 to 24 rps on b0"): nothing else -- "increased capacity
# planning" is another noun's direction
_TAIL = re.compile(rf"(?:\s+(?:from\s+(?:{APPROX}\s*)?{_NUM}\s*(?:{_UNIT})?\s*{TO}\s*(?:{APPROX}\s*)?{_NUM}\s*(?:{_UNIT})?"
                   r"|(?:on|for|of|in)\s+[\w.-]+))*\s*(?:[.,:;!?)]|$)", re.I)
# what may stand between the figure's name and its direction besides `changes._GAP`'s words
_EXTRA_GAP = rf"(?:{_NUM}\s*(?:{_UNIT})?|found|level|figure|result|value)"


@dataclasses.dataclass(frozen=True, slots=True)
class SweepClaim:
    sign: int  # +1 rose, -1 fell, 0 unchanged
    word: str
    figures: tuple[tuple[str, str], ...]  # (base, new) as written
    start: int  # in the sentence
    end: int
    scope: str
    sentence: str
    explicit: bool
    figure: str | None  # max_sustainable_rate | max_sustainable_concurrency where the name says which
    sizes: tuple[Magnitude, ...] = ()  # a stated size of the change ("rose 20%", "by 4 rps"; `_sizes`)


def subjects(text: str) -> list[re.Match[str]]:
    """The names of the sweep's figure in `text` (`SUBJECT`, less another resource's capacity)."""
    return [m for m in SUBJECT.finditer(text)
            if not (m.group(0).lower() == "capacity" and _OTHER_RESOURCE.search(text, max(0, m.start() - 40), m.start()))]


def _direction(blanked: str, gap: re.Pattern[str]) -> tuple[str, str, int, int, tuple[str, str] | None] | None:
    """(direction kind, word, start, end, stated (base, new) of "N, up from M") of the clause's one
    direction next to its `SUBJECT`, or None."""
    subj = subjects(blanked)
    ups = list(_UP_FROM.finditer(blanked))
    dirs = [d for d in DIRECTION.finditer(blanked) if not any(u.start() <= d.start() < u.end() for u in ups)]
    if len(subj) != 1 or len(dirs) + len(ups) != 1:
        return None
    s = subj[0]
    if ups:
        u = ups[0]
        if u.start() < s.end() or not gap.fullmatch(blanked, s.end(), u.start()):
            return None
        return ("up" if u.group("dir").lower() == "up" else "down"), u.group("dir"), u.start("dir"), u.end(), (u.group("a"), u.group("b"))
    d = dirs[0]
    kind = next(k for k in _SIGN if d.group(k))
    if d.start() >= s.end() and gap.fullmatch(blanked, s.end(), d.start()):
        return kind, d.group(0), d.start(), d.end(), None
    if d.end() <= s.start() and gap.fullmatch(blanked, d.end(), s.start()) and _TAIL.match(blanked, s.end()):
        return kind, d.group(0), d.start(), d.end(), None  # "no change in capacity", "raised capacity from 20 to 24 rps"
    return None


# what may stand between a stated size and the direction word it sizes: after it "rose 20%",
# "rose by ~4 rps", "rose from 20 to 24 rps (+20%)" (the figures blanked), before it "a 20%
# higher capacity", "20%-higher". Anything else ("capacity rose with p99 under 5%") is another
# thing's number: not read (precision over recall)
_SIZE_AFTER = re.compile(r"[\s,(+\-]*(?:(?:by|of)\s+)?", re.I)
_SIZE_BEFORE = re.compile(r"[\s\-]*")
_UNIT_AFTER = re.compile(rf"\s*{_UNIT}", re.I)
Sizes = Callable[[str, str, str, tuple[int, int]], list[Magnitude]]
# a size of something per unit ("2 rps per GPU", "10% per step", "0.5 rps a user"): not the
# figure's whole change, not read
_PER = re.compile(r"\s*(?:per|/|each|a|an)\b(?!\s*(?:gain|rise|increase|drop|fall|change|improvement|jump)\b)", re.I)


def _sizes(read: str, kind: str, word: str, d: tuple[int, int], sizes: Sizes) -> tuple[Magnitude, ...]:
    """The sizes of the change a claim's clause states next to its direction word, read by
    `changes`' own reader (`sizes`: `changes._magnitudes` of a capacity, higher is better, in
    req/s) with the stated figures blanked -- "from 20 to 24 rps", "24 rps, up from 20" are held
    against the row's figures (CB502), not read again as a size."""
    chars = list(read)
    for m in [*_FROM_TO.finditer(read), *_UP_FROM.finditer(read)]:
        unit = _UNIT_AFTER.match(read, m.end())  # "from 20 to 24 rps": the second figure's unit
        for i in range(m.start(), unit.end() if unit else m.end()):
            if not d[0] <= i < d[1]:
                chars[i] = " "
    text = "".join(chars)
    return tuple(m for m in sizes(text, kind, word, d)
                 if m.start == m.end  # the word's own ("doubled")
                 or ((_SIZE_AFTER.fullmatch(text, d[1], m.start) or _SIZE_BEFORE.fullmatch(text, m.end, d[0]))
                     and not _PER.match(text, m.end)))


def sweep_claims(masked: str, clauses: Sequence[tuple[int, int]], skip: re.Pattern[str], gap: re.Pattern[str],
                 metrics: Callable[[str], list[Any]], negated: bool, sizes: Sizes | None = None) -> list[SweepClaim]:
    """The claims of change about the sweep's figure one sentence (masked text) makes; `skip`
    marks a clause that is a rule, threshold or noise, `metrics` finds compare's other metrics
    (`changes`): a clause that names one too ("TTFT rose in capacity tests") is not read.
    `sizes` reads a stated size of the change (`_sizes`); without it none is read."""
    extra = re.compile(rf"(?:{gap.pattern}|{_EXTRA_GAP}|,)*", re.I)
    out: list[SweepClaim] = []
    for a, b in clauses:
        clause = masked[a:b]
        if skip.search(clause):
            continue
        named = subjects(clause)
        if len(named) != 1:
            continue
        subj = named[0]
        others = metrics(clause[: subj.start()] + " " * (subj.end() - subj.start()) + clause[subj.end() :])
        read = _listed(clause, subj, others) if others else clause
        if read is None:
            continue  # another metric's clause ("TTFT rose in capacity tests")
        found = _direction(read, extra)
        if found is None:
            continue
        kind, word, ds, de, stated = found
        start, end = min(subj.start(), ds), max(subj.end(), de)
        if polarity(masked, a + start, a + end, negated) is not Polarity.ASSERTED:
            continue
        figures = [] if others else [stated] if stated else [(m.group("a") or m.group("a2"), m.group("b") or m.group("b2"))
                                                             for m in _FROM_TO.finditer(clause)]
        # a size only of the figure alone: listed with other metrics, whose would it be?
        sized = _sizes(read, kind, word, (ds, de), sizes) if sizes is not None and _SIGN[kind] and not others else ()
        spans = [(m.start, m.end) for m in sized if m.start != m.end]  # the claim's span covers its size, as a row's does
        start, end = min([start, *(x for x, _ in spans)]), max([end, *(y for _, y in spans)])
        out.append(SweepClaim(_SIGN[kind], " ".join(word.split()), tuple(figures) if len(figures) == 1 else (),
                              a + start, a + end, clause, masked, bool(_EXPLICIT.search(subj.group(0))), _figure(subj.group(0)),
                              sized))
    return out


def _listed(clause: str, subj: re.Match[str], others: Sequence[tuple[Any, ...]]) -> str | None:
    """`clause` with the metrics listed beside the figure's name blanked ("the max sustainable rate
    and p50 TTFT fell" reads as "the max sustainable rate fell": the direction is each one's), or
    None where another metric stands anywhere else -- then the clause is that metric's. `others`
    are (metric, statistics, start, end) as `changes._metrics` gives them."""
    spans = sorted([subj.span(), *((o[2], o[3]) for o in others)])
    if not all(LIST_JOIN.fullmatch(clause, x[1], y[0]) for x, y in zip(spans, spans[1:])):
        return None
    chars = list(clause)
    for i in range(spans[0][0], spans[-1][1]):
        if not subj.start() <= i < subj.end():
            chars[i] = " "
    return "".join(chars)


def _figure(name: str) -> str | None:
    axis = re.search(r"(rate|concurrency)\s*$", name, re.I)
    return f"max_sustainable_{axis.group(1).lower()}" if axis else None


def _near(text: str, v: float | None) -> bool:
    return v is not None and abs(float(text) - v) <= half_unit(text) + 1e-9


def _v(v: float | None, unit: str) -> str:
    return "none" if v is None else f"{v:g}{' ' + unit if unit else ''}"


def describe(r: SweepChangeRow) -> str:
    """`b0: max_sustainable_rate 24 rps → 20 rps (regression: ...)`."""
    return f"{r.backend}: {r.figure} {_v(r.base, r.unit)} → {_v(r.new, r.unit)} ({r.verdict}: {r.message})"


def _allowed(r: SweepChangeRow, difference: bool) -> tuple[float, float] | None:
    """The changes of the figure both searches allow: each run's true limit lies in [figure,
    first failing level] (open above where nothing above is known to fail), so new - base lies in
    [new - base_failing, new_failing - base] and new / base - 1 in [new / base_failing - 1,
    new_failing / base - 1]. None where a run held no level (no figure to size a change by) or,
    for a relative change, the base's figure is not positive."""
    if r.base is None or r.new is None:
        return None
    if difference:
        return (r.new - r.base_failing if r.base_failing is not None else -math.inf,
                r.new_failing - r.base if r.new_failing is not None else math.inf)
    if r.base <= 0:
        return None
    return (r.new / r.base_failing - 1 if r.base_failing else -1.0,
            r.new_failing / r.base - 1 if r.new_failing is not None else math.inf)


def _size_holds(m: Magnitude, r: SweepChangeRow) -> bool:
    """A candidate range of `m` meets the row's allowed changes of its kind (`_allowed`); a
    difference in req/s is held only against a rate's row, and a kind the row cannot size is not
    held against it (precision over recall)."""
    checked = False
    for difference, ranges in ((False, m.ranges), (True, m.differences)):
        if not ranges or (difference and r.unit != "rps"):
            continue
        iv = _allowed(r, difference)
        if iv is None:
            continue
        checked = True
        tol = 1e-9 * max([1.0, *(abs(x) for x in iv if math.isfinite(x))])  # both ends open: 1e-9
        if any(lo <= iv[1] + tol and iv[0] - tol <= hi for lo, hi in ranges):
            return True
    return not checked


def _allowed_text(m: Magnitude, rows: Sequence[SweepChangeRow]) -> str:
    """The allowed changes of the kind `m` states, per row: "+0% .. +40%", "+16.7% .. no upper
    bound", "+0 rps .. +8 rps"."""
    difference = not m.ranges
    out = []
    for r in rows:
        iv = _allowed(r, difference)
        if iv is None:
            continue
        unit = f" {r.unit}" if difference and r.unit else ""
        ends = [("no lower bound" if i == 0 else "no upper bound") if not math.isfinite(x)
                else f"{x:+g}{unit}" if difference else f"{x * 100:+.1f}%" for i, x in enumerate(iv)]
        out.append(f"{ends[0]} .. {ends[1]}" + (f" ({r.backend})" if len(rows) > 1 else ""))
    return "; ".join(out)


def _rows(c: SweepClaim, facts: ChangeFacts) -> list[SweepChangeRow]:
    """The rows of the figure the claim names (a rate, a concurrency; "capacity": either), of the
    backend it names (else every backend)."""
    rows = [r for r in facts.sweeps if c.figure is None or r.figure == c.figure]
    said = named_backends({r.backend for r in rows} | {r.new_backend for r in rows}, (c.scope, c.sentence))
    return [r for r in rows if r.backend in said or r.new_backend in said] if said else rows


def sweep_finding(c: SweepClaim, facts: ChangeFacts) -> tuple[str, str] | None:
    """(code, message) for a claim about the sweep figure that compare's sweep rows do not bear
    out; None where they do (module doc)."""
    name = c.figure or "the sweep's figure"
    said = (f"says \"{c.word}\" of {name}" if c.sign == 0 else f"states {name} {c.word}")
    if c.sizes:
        said += " " + " ".join(m.text for m in c.sizes if m.start != m.end)
        said = said.rstrip()
    if c.figures:
        said += f" ({c.figures[0][0]} → {c.figures[0][1]})"
    rows = _rows(c, facts)
    if not rows:
        if not c.explicit and not facts.sweeps:
            return None
        has = ", ".join(dict.fromkeys(r.figure for r in facts.sweeps))
        return "CB505", (f"{said}; compare ({facts.source}) has no sweep row for it"
                         f"{f' (its sweep rows: {has})' if has else ' (neither run swept, or only one did)'}")
    text = "; ".join(describe(r) for r in rows[:3]) + (f"; and {len(rows) - 3} more" if len(rows) > 3 else "")
    if c.sign == 0:
        if any(r.verdict == "regression" for r in rows):
            return "CB504", f"{said}; compare measured a regression of it: {text}"
        if any(r.verdict == "inconclusive" for r in rows):
            return "CB505", f"{said}; compare could not tell: {text}"
        return None
    decided = [r for r in rows if r.verdict != "inconclusive"]
    if not decided:
        return "CB503", f"{said}; compare's sweep row is inconclusive: {text}"
    moved = {"improvement": 1, "regression": -1}
    shows = [r for r in decided if moved.get(r.verdict) == c.sign]

    def stated_ok(pool: Sequence[SweepChangeRow]) -> bool:
        return not c.figures or any(_near(c.figures[0][0], r.base) and _near(c.figures[0][1], r.new) for r in pool)

    if shows:
        if not stated_ok(shows):
            return "CB502", f"{said}; those are not compare's figures: {text}"
        missed = [m for m in c.sizes if not any(_size_holds(m, r) for r in shows if stated_ok([r]))]
        if not missed:
            return None
        pool = [r for r in shows if stated_ok([r])]
        return "CB502", (f"{said}; {missed[0].text} is outside the change the two searches allow "
                         f"({_allowed_text(missed[0], pool)}: each run's limit lies between the level it held and the "
                         f"next that failed): {text}")
    if all(moved.get(r.verdict) == -c.sign for r in decided):
        return "CB501", f"{said}; compare measured the opposite: {text}"
    if not stated_ok(decided):
        return "CB502", f"{said}; those are not compare's figures, and it found no significant change: {text}"
    return "CB503", f"{said}; compare found no significant change (within one step of the sweep's grid): {text}"


HINTS = {
    "CB501": "the sweep's figure is what `soakspec compare BASE NEW` found (its Sweep row); correct the direction "
             "(a higher sustainable load is better)",
    "CB502": "state compare's figures: the Sweep row's base and new (max_sustainable_*), and a size of the change "
             "the grid allows (each figure is known only to within one step)",
    "CB503": "a bisection knows its figure only to within one step of its grid: say no significant change was found, "
             "or sweep with a finer step (an inconclusive row: with longer probes)",
}
