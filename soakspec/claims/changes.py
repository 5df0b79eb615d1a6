"""Check 8: claims of change (CB501-CB505) -- "p99 TTFT fell 12% at 8 rps", "throughput
improved 1.3x", "ITL is unchanged", "no regression in p95 latency" -- against what `soakspec
compare` measured between the two runs (`ChangeFacts`: its rows, each a change and its
confidence interval; `lint-claims --compare BASE NEW` or `--compare compare.json`).

What is read. Prose only (paragraphs and list items; not headings, tables, fenced code,
blockquotes or `code`), a clause at a time: a sentence is cut at `;`, a dash, but / however /
although / whereas / while / because / since / yet / so / therefore, and at "," or "and" where
the part before it has said a change and the part after it says its own ("p99 TTFT fell 12% and
throughput rose 1.3x" is two claims; "p95 and p99 TTFT fell 10%", "TTFT fell 12%, from 410 ms
to 360 ms" and "no regression in TTFT, ITL or latency" one each). A clause is a claim of change
when it holds

- a metric: TTFT, ITL, TPOT, latency / e2e (as `figures` reads them, with a percentile or
  median: "p99 TTFT", "TTFT p95", "median ITL"), sent TTFT / sent latency ("sent TTFT p50",
  "p99 sent latency", sent_ttft: compare's rows from the send, which a capped level has),
  throughput / output tok/s (compare's `mean(throughput)`), QPS / request rate / req/s (`mean(qps)`), error rate / errors /
  failures (`ratio(errors)`), goodput (which compare does not measure). The metrics the
  direction speaks of are the list just before it ("TTFT and ITL fell"), else just after it ("no
  regression in TTFT, ITL or latency"), with only connective words between ("p50 TTFT of the new
  build fell"; `_GAP`) -- each is claimed; a direction with other words between it and any
  metric is another subject's ("TTFT goes as the prompt grows") and no claim;
- exactly one direction: fell, dropped, decreased, declined, reduced, lower, cut, halved (down);
  rose, increased, grew, higher, climbed, jumped, doubled, tripled (up); improved, faster,
  better, sped up, speedup (better); regressed, slower, worse, degraded, slowdown (worse);
  unchanged, unaffected, no (significant) change / regression / difference, did not change /
  regress, stayed the same, flat (unchanged). Two directions in one clause ("lower is better")
  are not a claim;
- optionally a magnitude: N% ("fell 12%", "a 12% improvement", "12% lower"), Nx / N× / N times
  ("1.3x higher throughput", "2x faster TTFT"), N pp / percentage points (errors), "from A
  to B" / "A → B" with units ("from 410 ms to 360 ms", "from 1.2% to 0.4%"), or a change in
  the metric's unit next to its direction word (`_absolute`: "fell by 12 ms", "dropped 900 µs",
  "30 ms lower", "a 12 ms improvement", "rose by 40 tok/s", "QPS rose by 2 req/s"; converted
  by `units.prose_quantity`; "fell to 360 ms" is the new figure, not read); "more than",
  "at least", "over" make it a lower bound, "up to", "at most", "under" an upper bound, and
  "~", "about", "roughly" … widen a round number as `figures` does;
- optionally a level ("at 8 rps", "at concurrency 4", "c=4", the row's label "rate 8 rps") and
  a backend name; a clause that names none takes the sentence's;
- optionally a turn of a multi-turn level ("on turn 3", "turn 2 TTFT p50", "the 2nd turn",
  "turn 21+"): compare's rows per turn, which it makes of TTFT's p50 and p95 only (a claim of
  another metric or percentile on a turn is CB505, listing them); a claim that names no turn is
  about the level's own rows. A turn scopes its own clause ("turn 3 TTFT p50 fell 10%, and ITL
  p99 rose 5%": the level's ITL); a clause that names none takes a turn only from the sentence's
  opening phrase ("On turn 3, p50 TTFT rose and p95 TTFT rose": both turn 3's) -- never
  throughput and QPS, which no turn has (`_TURNLESS`) -- where it takes a level from anywhere
  in the sentence (`_claim_turns` says why the two differ). compare pools the turns past the
  20th into one row, "turn 21+": only "turn 21+" is checked against it; "turn 25" is CB505,
  whose message says how compare pools them and whose hint says to write "turn 21+" (the pool's
  change need not be turn 25's: precision over recall; `_pooled`).

Direction. For ttft, itl, tpot, latency (sent_* too) and errors lower is better: "improved" / "faster" means
the figure fell; for throughput and qps higher is better. "Fell" and "rose" are the figure's own
direction whatever the metric. A percentage with better / worse words on a latency ("12% faster")
is read both ways, as 12% less time and as 12% more speed (1 / 1.12), and holds if either does;
"2x faster" is half the time; "rose 2x" is double (or, as some write it, +200%). A percentage on
errors is ambiguous -- of the share, or points -- and holds if either reading does; a factor on
errors is checked for its direction only. A change in a unit is held against the row's interval
in that unit: compare's relative interval times the base it measured (`Magnitude`).

What is checked (one finding per claim). The claim's rows are compare's rows of that metric (and
percentile: a claim naming none is about any of compare's percentiles of it), at the named
levels (else every level) of the named backend (else every backend). A claim of change holds
when ONE of its rows shows it -- a significant change in the claimed direction whose interval
holds the claimed magnitude (within half a unit of its last digit) -- so that a claim that does
not name a level is not flagged because another level differs. Otherwise:

- CB501 every decided row changed significantly the other way ("p99 TTFT fell" where compare
  measured a regression);
- CB502 the claimed magnitude lies outside the interval of every row that shows the direction
  (or, where none does, of every row): the message states the intervals;
- CB503 the claim outruns the evidence: compare found no significant change (the interval holds
  0) or had too few samples to tell;
- CB504 "unchanged" / "no regression" where ANY of its rows is a significant regression (an
  unchanged claim about an improvement is not flagged: it understates);
- CB505 (a warning) compare has no row for the claim: a metric it does not measure (goodput, a
  mean TTFT), a level or backend it did not pair, or a row with no data; and "unchanged" / "no
  regression" of a row compare could not decide (insufficient samples) -- missing data is never
  a pass, so the claim is not silently accepted. The message lists what compare has.

Not claims of change (precision over recall): how a figure goes with the load ("latency
increases with concurrency", "as prompts get longer"), a clause that is negated, hedged or asked
(`polarity`: "did not improve", "may improve", "Non-goals"), a rule or threshold ("regression
<= 5%", require / budget / limit / target / gate / allow / tolerance), one that calls itself
noise ("not significant", "within noise", "within run-to-run variation") or states a
confidence interval ("95% CI"), a bare signed figure with no direction word ("-12%",
"410 → 360 ms" alone), every sentence of a table, heading, code or quote, and a "sentence" of
more than MAX_SENTENCE characters (the reading stays linear in the document).

A clause about a sweep's own figure ("capacity rose from 20 to 24 rps", "max sustainable rate
is unchanged") is checked against compare's Sweep rows instead (`sweep_changes`, same codes),
and is not read here: its name is blanked before a clause's metrics are read, so "max
sustainable request rate fell" is not a claim about QPS, and "the max sustainable request rate
and p50 TTFT fell" is one of p50 TTFT (and, by `sweep_changes`, one of the figure).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import re
from collections.abc import Sequence

from soakspec.claims.change_common import LIST_JOIN, Magnitude
from soakspec.claims.change_common import half_unit as _half
from soakspec.claims.change_common import named_backends
from soakspec.claims.direction import COMPARATIVE as _COMPARATIVE
from soakspec.claims.direction import DIRECTION as _DIRECTION
from soakspec.claims.direction import TO as _TO
from soakspec.claims.document import BlockKind, Document
from soakspec.claims.evidence_check import named_levels
from soakspec.claims.facts import ChangeFacts, ChangeRow, LevelFacts
from soakspec.claims.figures import _APPROX, _LAT_QUALIFIER, _NUM, _PHRASE, _RULE_CUE, _TIME_UNIT, _aggs, seconds_per
from soakspec.claims.figures import from_the_send, phrase_metric
from soakspec.claims.polarity import NEGATION_CUES, NEGATION_DETERMINERS, Polarity, polarity
from soakspec.claims.scope import _CONCURRENCY, _RATE
from soakspec.claims.sweep_changes import HINTS as _SWEEP_HINTS
from soakspec.claims.sweep_changes import SUBJECT as _SWEEP_SUBJECT
from soakspec.claims.sweep_changes import subjects as sweep_subjects
from soakspec.claims.sweep_changes import sweep_claims, sweep_finding
from soakspec.diagnostics import Diagnostic, Severity
from soakspec.units import prose_quantity

# ---------------------------------------------------------------- vocabulary

# "no TTFT regression": the determiner before the metric makes the noun after it "unchanged"
# "latency increases with concurrency", "TTFT grows as prompts get longer": how a figure depends on
# the load or the request, not a change between two runs
_DEPENDENCE = re.compile(
    r"\s+(?:(?:linearly|steadily|sharply|quickly|slowly)\s+)?(?:with|as|when)\s+(?:the\s+)?(?:higher|larger|longer|bigger|more|fewer|increasing|growing"
    r"|decreasing|rising|load|concurrency|rate|prompts?|batch(?:es)?|batch\s+sizes?|context|inputs?|outputs?|sequences?|length|requests?|users?)\b",
    re.I,
)
_NO_BEFORE = re.compile(r"\bno\s+(?:(?:statistically\s+)?significant\s+|measurable\s+|noticeable\s+|real\s+)?$", re.I)
_SAME_NOUN = re.compile(r"^(?:regressions?|changes?|difference|slowdown|degradation)$", re.I)
# what may stand between a metric and its direction word ("p50 TTFT of the new build fell", "a 12%
# improvement in p99 TTFT"): anything else there is another subject ("TTFT goes as the prompt grows")
_GAP = re.compile(
    r"(?:\s|[,:*_~]|\([^()]*\)|\b(?:is|are|was|were|has|have|had|got|gets|also|further|significantly|substantially"
    r"|markedly|slightly|noticeably|clearly|now|then|overall|both|in|of|on|for|the|its|our|this|new|run|build|branch|version"
    r"|change|pr|patch|by|about|roughly|approximately|nearly|almost|around|values?|figures?|numbers?|times?|a|an|and|to|\d+(?:\.\d+)?\s*(?:%|x|×|pp))\b"
    r"|(?:\d+(?:\.\d+)?\s*(?:%|x|×))|(?:\d+(?:\.\d+)?\s*(?:ms|us|µs|μs|s|tok/s|tokens/s|req/s)(?![\w/])))*",
    re.I,
)
_FACTOR_WORD = {"halved": 2.0, "doubled": 2.0, "tripled": 3.0}

_OTHER_METRICS = (
    (re.compile(r"(?<![\w-])(?:(?:output|generation|decode|token)\s+)?throughput\b"
                r"|\b(?:output\s+)?tok(?:en)?s?\s*(?:/|per)\s*s(?:ec(?:ond)?)?\b", re.I), "throughput"),
    (re.compile(r"\bqps\b|\brequest\s+rate\b|\breq(?:uest)?s?\s*(?:/|per)\s*s(?:ec(?:ond)?)?\b", re.I), "qps"),
    (re.compile(r"\bratio\(errors\)|\berror[\s-]+(?:rate|share|ratio)s?\b|\berrors\b|\bfailure[\s-]+rates?\b"
                r"|\bfailures\b|\bfailed\s+requests\b", re.I), "errors"),
    (re.compile(r"\bgoodput\b", re.I), "goodput"),
)
_AFTER_NUMBER = re.compile(rf"{_NUM}\s*$")  # "405 tok/s", "8 req/s": a figure or a load, not the metric's name
_RATE_QUALIFIED = re.compile(r"\b(?:input|prompt|prefill|total|peak|max(?:imum)?|min(?:imum)?|per[\s-]?(?:user|request|stream|gpu))\s+$", re.I)
_LEVEL_TEXT = [*_CONCURRENCY, _RATE, re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s*(?:rps|req/s)\b", re.I)]

_NOT_A_CLAIM = re.compile(
    r"\b(?:gates?|allow(?:s|ed)?|toleran(?:ce|t)|not\s+(?:statistically\s+)?significant|insignificant|within\s+(?:the\s+)?noise"
    r"|within\s+(?:the\s+)?(?:run[\s-]to[\s-]run|variation|variance|jitter|margin|error)|run[\s-]to[\s-]run"
    r"|noise|confidence|ci)\b|<(?!-)|(?<!-)>|[≤≥]",
    re.I,
)
# a clause no claim of change is read from, of a row or of the sweep's figure: a rule or threshold
# (`figures`' cue words) or what calls itself noise
_NOT_READ = re.compile(f"{_RULE_CUE.pattern}|{_NOT_A_CLAIM.pattern}", re.I)
# the skip of a clause about the sweep's own figure (`sweep_changes.sweep_claims`), narrower than
# `_NOT_READ`: capacity is defined by rules, so a review's capacity claims name them ("capacity rose
# from 20 to 24 rps with every rule passing" is a claim of a rise). A rule's word skips such a clause
# only where it governs a number or the direction -- "a target of 24 rps", "the 24 rps SLO", "rose
# past the threshold", "warn when ...", "fails if ..." -- besides `_NOT_A_CLAIM`'s (gates, tolerance,
# noise, comparators) -- or the figure's own name, a rule's subject ("the SLO on capacity")
_SWEEP_CUE = r"(?:require[sd]?|requiring|thresholds?|budgets?|slos?|targets?|limits?|ceilings?|rules?)"
_SWEEP_NOT_READ = re.compile(
    rf"{_NOT_A_CLAIM.pattern}"
    rf"|\b{_SWEEP_CUE}\s*(?:of|at|is|was|[:=])?\s*(?:~\s*)?{_NUM}"
    rf"|(?<![\w.]){_NUM}\s*(?:rps|req/s|qps|requests?|users?|streams?|concurrent)?\s*{_SWEEP_CUE}\b"
    rf"|\b(?:past|above|below|over|beyond|exceed(?:s|ed|ing)?)\s+(?:(?:the|our|its|a|an|each|every|any)\s+)?(?:[\w-]+\s+)?{_SWEEP_CUE}\b"
    r"|\b(?:fail|warn)(?:s|ed|ing)?\s+(?:if|when|unless|above|below|over|under)\b|\bgat(?:ed|ing)\s+on\b"
    # a rule's word that governs the figure's name: the clause is about the rule ("the SLO on
    # capacity was lowered", "the budget for max sustainable rate", "the target capacity fell")
    rf"|\b{_SWEEP_CUE}\s+(?:(?:on|for|of|in)\s+)?(?:(?:the|our|its|a)\s+)?(?:{_SWEEP_SUBJECT.pattern})",
    re.I,
)
_BREAK = re.compile(r";|\s[—–]\s|\s--\s|—|\b(?:but|however|although|though|whereas|while|because|since|yet|so|therefore|thus|hence)\b", re.I)
_SOFT_BREAK = re.compile(r",\s+(?:and\s+)?|\s+and\s+", re.I)

_MOD = rf"(?:(?P<lower>more\s+than|at\s+least|over|above|upwards\s+of)\s+|(?P<upper>up\s+to|at\s+most|under|below|less\s+than)\s+|(?P<approx>{_APPROX})\s*)?"
_PCT = re.compile(rf"{_MOD}(?P<n>{_NUM})\s*(?:%|\s+percent\b)(?!\s*(?:confidence|ci\b|interval|of\b))", re.I)
_PP = re.compile(rf"{_MOD}(?P<n>{_NUM})\s*(?:pp\b|percentage[\s-]+points?\b|points?\b)", re.I)
_FACTOR = re.compile(rf"{_MOD}(?P<n>{_NUM})\s*(?:x(?![\w])|×|\s+times\b)", re.I)
_UNITS = rf"(?:{_TIME_UNIT}(?![\w/])|%|tok(?:en)?s?\s*/\s*s\b|tok(?:en)?s?\s+per\s+s(?:ec(?:ond)?)?\b|req(?:uest)?s?\s*/\s*s\b|rps\b|qps\b)"
# a change in a unit ("fell by 12 ms", "30ms lower", "rose 40 tok/s", "up by 2 req/s"): `_absolute`
# reads it only next to its direction word, and `units.prose_quantity` converts it
_ABS_UNIT = (rf"(?:{_TIME_UNIT}(?![\w/])|tok(?:en)?s?\s*/\s*s(?:ec(?:ond)?)?\b|tok(?:en)?s?\s+per\s+s(?:ec(?:ond)?)?\b"
             rf"|req(?:uest)?s?\s*/\s*s(?:ec(?:ond)?)?\b|req(?:uest)?s?\s+per\s+s(?:ec(?:ond)?)?\b|rps\b|qps\b)")
_ABS = re.compile(rf"{_MOD}(?P<n>{_NUM})\s*(?P<u>{_ABS_UNIT})", re.I)
_ABS_AFTER = re.compile(r"\s*(?:(?:by|of)\s+)?", re.I)  # "fell by 12 ms", "an improvement of 12 ms"
_LEVEL_MOD = re.compile(r"(?:over|above|under|below)\b", re.I)  # "fell below 100 ms" is the new figure; "fell by over 10 ms" a change
_BY_RATE = re.compile(rf"\bby\s+{_MOD}{_NUM}\s*(?:rps|qps|req(?:uest)?s?\s*(?:/|per)\s*s(?:ec(?:ond)?)?)\b", re.I)  # a change, not a level
_DURATIONS = ("ttft", "itl", "tpot", "latency", "sent_ttft", "sent_latency")
_UNIT_KIND = {**dict.fromkeys(_DURATIONS, "duration"), "throughput": "token_rate", "qps": "rate"}
# a multi-turn level's turn ("turn 2", "on turn 3", "turn 21+", "the 2nd turn"): compare's rows per turn
_TURN = re.compile(r"\b(?:(?:on|in|at|for|of)\s+)?(?:the\s+)?(?:(?:user|conversation)\s+)?turns?\s+(?P<n>\d+)(?P<plus>\+)?(?![\w.]\d)"
                   r"|\b(?:(?:on|in|at|for|of)\s+)?(?:the\s+)?(?P<nth>\d+)(?:st|nd|rd|th)\s+(?:user\s+)?turns?\b", re.I)
_FROM_TO = re.compile(
    rf"\bfrom\s+(?:{_APPROX}\s*)?(?P<a>{_NUM})\s*(?P<ua>{_UNITS})?\s*{_TO}\s*(?P<approx>{_APPROX}\s*)?(?P<b>{_NUM})\s*(?P<ub>{_UNITS})"
    rf"|(?<![\w.])(?P<a2>{_NUM})\s*(?P<ua2>{_UNITS})\s*(?:→|->)\s*(?P<b2>{_NUM})\s*(?P<ub2>{_UNITS})",
    re.I,
)

LABEL = {"ttft": "TTFT", "itl": "ITL", "tpot": "TPOT", "latency": "latency", "sent_ttft": "sent TTFT",
         "sent_latency": "sent latency", "throughput": "throughput", "qps": "QPS", "errors": "error rate", "goodput": "goodput"}
HIGHER_IS_WORSE = {**dict.fromkeys(_DURATIONS, True), "errors": True, "throughput": False, "qps": False, "goodput": False}
_COMPARE_STAT = {"throughput": "mean", "qps": "mean", "errors": "ratio"}  # the one statistic compare has of these


# ---------------------------------------------------------------- what a clause claims

@dataclasses.dataclass(frozen=True, slots=True)
class Claim:
    metric: str  # ttft | itl | tpot | latency | sent_ttft | sent_latency | throughput | qps | errors | goodput
    stats: tuple[str, ...]  # () : any statistic compare has of the metric
    direction: str  # down | up | better | worse | same
    word: str  # the direction as written
    magnitudes: tuple[Magnitude, ...]
    start: int  # in the sentence
    end: int
    scope: str  # the text that may name a level or backend (the clause, else the sentence)
    sentence: str


def _sign(direction: str, metric: str) -> int:
    """The sign of the change of the figure itself that `direction` claims (0: unchanged)."""
    hiw = HIGHER_IS_WORSE[metric]
    return {"down": -1, "up": 1, "better": -1 if hiw else 1, "worse": 1 if hiw else -1, "same": 0}[direction]


def _bounded(m: re.Match[str], lo: float, hi: float) -> tuple[float, float]:
    if m.group("lower"):
        return lo, math.inf
    if m.group("upper"):
        return 0.0, hi
    return lo, hi


def _ratio_ranges(kind: str, lo: float, hi: float, s: int, direction: str, metric: str) -> list[tuple[float, float]]:
    """new / base for a claimed percentage ("pct", lo..hi as fractions) or factor ("x")."""
    out: list[tuple[float, float]] = []
    if kind == "pct":
        out.append((1 + lo, 1 + hi) if s > 0 else (1 - hi, 1 - lo))
        if HIGHER_IS_WORSE[metric] and direction in ("better", "worse"):  # "12% faster": 12% more speed, too
            out.append((1 / (1 + lo), 1 / (1 + hi)) if s < 0 else (1 / (1 - lo), 1 / (1 - hi) if hi < 1 else math.inf))
    elif hi <= 1:  # "0.8x the throughput": the ratio itself
        out.append((lo, hi))
    elif s > 0:
        out += [(lo, hi), (1 + lo, 1 + hi)]  # "rose 2x": double; some write it for +200%
    else:
        out.append((1 / hi, 1 / lo if lo > 0 else math.inf))  # "2x faster TTFT", "fell 2x": half
    return [(min(a, b), max(a, b)) for a, b in out]


def _unit_fits(unit: str | None, metric: str) -> bool:
    if unit is None:
        return False
    u = unit.lower()
    if metric in _DURATIONS:
        return re.fullmatch(_TIME_UNIT, u, re.I) is not None
    if metric == "errors":
        return u == "%"
    if metric == "throughput":
        return u.startswith("tok")
    return metric == "qps" and (u.startswith("req") or u in ("rps", "qps"))


def _from_to(m: re.Match[str], metric: str) -> tuple[float, float] | None:
    """The change that "from A to B" states, as a range (rounding of A and B)."""
    a, b = m.group("a") or m.group("a2"), m.group("b") or m.group("b2")
    ua, ub = m.group("ua") or m.group("ua2"), m.group("ub") or m.group("ub2")
    ua = ua or ub
    if not (_unit_fits(ua, metric) and _unit_fits(ub, metric)):
        return None
    approx = bool(m.group("approx"))
    sa, sb = (seconds_per(ua), seconds_per(ub)) if metric in _DURATIONS else (1.0, 1.0)
    va, ha = float(a.replace(",", "")) * sa, _half(a, approx) * sa
    vb, hb = float(b.replace(",", "")) * sb, _half(b, approx) * sb
    if metric == "errors":  # shares in percent: the change is a difference of points (`Magnitude.differences`)
        return ((vb - hb) - (va + ha)) / 100, ((vb + hb) - (va - ha)) / 100
    if va - ha <= 0:
        return None
    return (vb - hb) / (va + ha) - 1, (vb + hb) / (va - ha) - 1


def _absolute(text: str, metric: str, s: int, d: tuple[int, int], taken: Sequence[tuple[int, int]]) -> Magnitude | None:
    """A change stated in a unit of `metric` next to the direction word at `d` -- after it
    ("fell by 12 ms", "rose 40 tok/s", "an improvement of 12 ms") or, for a comparative, just
    before it ("30ms lower", "a 12 ms improvement") -- converted by `units.prose_quantity`, as a
    range of new - base in the row's base unit; None where there is none, or more than one, or
    its unit is not the metric's ("fell to 360 ms" is the new figure, not the change)."""
    want = _UNIT_KIND.get(metric)
    if want is None:
        return None
    near = [m for m in _ABS.finditer(text) if not any(a <= m.start("n") < b for a, b in taken)
            and ((after := _ABS_AFTER.fullmatch(text, d[1], m.start())) is not None
                 and not (_LEVEL_MOD.match(m.group(0)) and "by" not in after.group(0).lower())
                 or (_COMPARATIVE.fullmatch(text, d[0], d[1]) and text[m.end() : d[0]].strip() in ("", "-")))]
    if len(near) != 1:
        return None
    m = near[0]
    v, h = float(m.group("n").replace(",", "")), _half(m.group("n"), bool(m.group("approx")))
    lo, hi = prose_quantity(v - h, m.group("u")), prose_quantity(v + h, m.group("u"))
    if lo is None or hi is None or lo[0] != want:
        return None
    a, b = _bounded(m, lo[1], hi[1])
    return Magnitude(m.group(0).strip(), (), m.start(), m.end(), ((a, b) if s > 0 else (-b, -a),))


def _magnitudes(text: str, metric: str, direction: str, word: str, d: tuple[int, int] = (0, 0)) -> list[Magnitude]:
    """The sizes of change a clause states for `metric` (none where a kind is stated twice);
    `d` is the direction word's span in `text`."""
    s = _sign(direction, metric)
    out: list[Magnitude] = []
    taken: list[tuple[int, int]] = []
    found = [m for m in _FROM_TO.finditer(text)]
    if len(found) == 1 and (r := _from_to(found[0], metric)) is not None:
        if metric == "errors":
            out.append(Magnitude(found[0].group(0).strip(), (), found[0].start(), found[0].end(), (r,)))
        else:
            out.append(Magnitude(found[0].group(0).strip(), (r,), found[0].start(), found[0].end()))
    taken += [(m.start(), m.end()) for m in found]
    if s == 0:
        return []
    if (absolute := _absolute(text, metric, s, d, taken)) is not None:
        out.append(absolute)
    taken += [(m.start(), m.end()) for m in _ABS.finditer(text)]
    for rx, kind in ((_PCT, "pct"), (_FACTOR, "x"), (_PP, "pp")):
        ms = [m for m in rx.finditer(text) if not any(a <= m.start("n") < b for a, b in taken)]
        taken += [(m.start(), m.end()) for m in ms]
        if len(ms) != 1:
            continue
        m = ms[0]
        v, h = float(m.group("n").replace(",", "")), _half(m.group("n"), bool(m.group("approx")))
        if kind == "pp":
            if metric != "errors":
                continue
            lo, hi = _bounded(m, (v - h) / 100, (v + h) / 100)
            out.append(Magnitude(m.group(0).strip(), (), m.start(), m.end(), ((lo, hi) if s > 0 else (-hi, -lo),)))
            continue
        elif metric == "errors":
            if kind != "pct":
                continue  # "errors fell 2x": a factor of a share that is often 0; only the direction is checked
            # "errors fell 50%": of the share (relative), or points (a difference)? Either reading holds it
            lo, hi = _bounded(m, (v - h) / 100, (v + h) / 100)
            band = (lo, hi) if s > 0 else (-hi, -lo)
            out.append(Magnitude(m.group(0).strip(), (band,), m.start(), m.end(), (band,)))
            continue
        elif kind == "pct":
            lo, hi = _bounded(m, (v - h) / 100, (v + h) / 100)
            ranges = [(a - 1, b - 1) for a, b in _ratio_ranges("pct", lo, hi, s, direction, metric)]
        else:
            lo, hi = _bounded(m, v - h, v + h)
            ranges = [(a - 1, b - 1) for a, b in _ratio_ranges("x", max(lo, 1e-9), hi, s, direction, metric)]
        out.append(Magnitude(m.group(0).strip(), tuple(ranges), m.start(), m.end()))
    factor = _FACTOR_WORD.get(word.lower())
    if factor is not None and not any(k.text.lower().endswith(("x", "×", "times")) for k in out):
        # a word, not a figure: "halved" holds from 1.5x to 2.5x less, as "2x" (half a unit) would
        ranges = tuple((a - 1, b - 1) for a, b in _ratio_ranges("x", factor - 0.5, factor + 0.5, s, direction, metric))
        out.append(Magnitude(word, ranges, 0, 0))
    return out


def _blank(text: str, spans: Sequence[tuple[int, int]]) -> str:
    chars = list(text)
    for a, b in spans:
        chars[a:b] = " " * (b - a)
    return "".join(chars)


def _not_levels(text: str) -> str:
    """`text` without the changes in req/s ("QPS rose by 2 req/s"), which would read as a level."""
    return _blank(text, [(m.start(), m.end()) for m in _BY_RATE.finditer(text)])


def _level_spans(text: str) -> list[tuple[int, int]]:
    text = _not_levels(text)
    return [(m.start(), m.end()) for rx in _LEVEL_TEXT for m in rx.finditer(text)]


def _turn_spans(text: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in _TURN.finditer(text)]


def _turns(text: str) -> set[tuple[int, bool]]:
    """The turns `text` names: (number, "and later" -- "turn 21+")."""
    return {(int(m.group("n") or m.group("nth")), bool(m.group("plus"))) for m in _TURN.finditer(text)}


def _metrics(text: str) -> list[tuple[str, tuple[str, ...], int, int]]:
    """(metric, statistics named, start, end) of each metric a clause names."""
    out: list[tuple[str, tuple[str, ...], int, int]] = []
    scan, sent = from_the_send(text)  # "sent TTFT p50": compare's sent_ttft rows, not its ttft rows
    for m in _PHRASE.finditer(scan):
        if _LAT_QUALIFIER.search(scan[max(0, m.start() - 40) : m.start()]):
            continue  # queue / network / client latency: not compare's
        stats = tuple(dict.fromkeys(_aggs(m.group("pre") or m.group("post1") or m.group("post2"))))
        out.append((phrase_metric(m, sent), stats, m.start(), m.end()))
    for rx, key in _OTHER_METRICS:
        for m in rx.finditer(text):
            if any(a < m.end() and m.start() < b for _, _, a, b in out):
                continue
            before = text[max(0, m.start() - 30) : m.start()]
            if key in ("throughput", "qps") and (_RATE_QUALIFIED.search(before) or _AFTER_NUMBER.search(before)):
                continue  # prefill / peak / per-user throughput, or a figure ("405 tok/s"): not the metric
            out.append((key, (), m.start(), m.end()))
    return sorted(out, key=lambda x: x[2])


def _clauses(masked: str) -> list[tuple[int, int]]:
    cuts = [0]
    for m in _BREAK.finditer(masked):
        cuts += [m.start(), m.end()]
    cuts.append(len(masked))
    out: list[tuple[int, int]] = []
    for a, b in zip(cuts[0::2], cuts[1::2]):
        start = a
        for m in _SOFT_BREAK.finditer(masked, a, b):
            right = masked[m.end() : b]
            if _DIRECTION.search(masked, start, m.start()) and _metrics(masked[start : m.start()]) and _DIRECTION.search(right):
                # "TTFT fell 12%, from 410 to 360 ms" and "no regression in TTFT, ITL or latency" are one claim each
                out.append((start, m.start()))
                start = m.end()
        out.append((start, b))
    return [(a, b) for a, b in out if masked[a:b].strip()]


def _is_list(text: str, metrics: Sequence[tuple[str, tuple[str, ...], int, int]]) -> bool:
    return all(LIST_JOIN.fullmatch(text, x[3], y[2]) for x, y in zip(metrics, metrics[1:]))


def _group(text: str, metrics: Sequence[tuple[str, tuple[str, ...], int, int]], d: re.Match[str]) -> list[tuple[str, tuple[str, ...], int, int]]:
    """The metrics the direction `d` speaks of: the list of them ("TTFT, ITL or latency") just
    before it or, failing that, just after it, with nothing but connective words between
    (`_GAP`); [] when there is none."""
    groups: list[list[tuple[str, tuple[str, ...], int, int]]] = []
    for m in metrics:
        if groups and _is_list(text, [groups[-1][-1], m]):
            groups[-1].append(m)
        else:
            groups.append([m])
    before = [g for g in groups if g[-1][3] <= d.start()]
    if before and _GAP.fullmatch(text[before[-1][-1][3] : d.start()]):
        return before[-1]
    after = [g for g in groups if g[0][2] >= d.end()]
    if after and _GAP.fullmatch(text[d.end() : after[0][0][2]]):
        return after[0]
    return []


def _negated_between(text: str) -> bool:
    return bool(NEGATION_CUES.search(text) or NEGATION_DETERMINERS.search(text))


def claims_in(masked: str, negated: bool = False) -> list[Claim]:
    """The claims of change one sentence (masked text) makes."""
    out: list[Claim] = []
    for a, b in _clauses(masked):
        clause = masked[a:b]
        if _NOT_READ.search(clause):
            continue
        blanked = _blank(clause, _level_spans(clause) + _turn_spans(clause))
        dirs = list(_DIRECTION.finditer(blanked))
        if len(dirs) != 1 or _DEPENDENCE.match(blanked, dirs[0].end()):
            continue  # two directions ("lower is better"), or how a figure goes with the load ("rises with concurrency")
        d = dirs[0]
        # the sweep's figure is no row's metric ("max sustainable request rate" is not QPS): its name is
        # blanked before the metrics are read, and one listed with them ("the max sustainable rate and
        # p50 TTFT fell") is `sweep_changes`' claim, the others' direction theirs
        blanked = _blank(blanked, [m.span() for m in sweep_subjects(blanked)])
        metrics = _group(blanked, _metrics(blanked), d)
        if not metrics:
            continue  # no metric, or its direction is another subject's ("TTFT goes as the prompt grows")
        direction = next(k for k in ("same", "down", "up", "better", "worse") if d.group(k))
        first, last = metrics[0][2], metrics[-1][3]
        start = min(first, d.start())
        if direction == "worse" and d.start() > last and _SAME_NOUN.match(d.group(0)) and (no := _NO_BEFORE.search(blanked, 0, first)):
            direction, start = "same", no.start()  # "no TTFT regression"
        elif direction != "same" and (first < d.start() and _negated_between(blanked[last : d.start()])):
            continue  # "TTFT did not improve"
        end = max(last, d.end())
        if polarity(masked, a + start, a + end, negated) is not Polarity.ASSERTED:
            continue
        for metric, stats, _, _ in metrics:
            mags = tuple(_magnitudes(blanked, metric, direction, d.group(0), d.span()))
            stop = max([end] + [m.end for m in mags])
            for stat in [(x,) for x in stats] or [()]:  # "p95 and p99 TTFT fell 10%": each percentile is claimed
                out.append(Claim(metric, stat, direction, " ".join(d.group(0).split()), mags, a + start, a + stop, clause, masked))
    return out


# ---------------------------------------------------------------- against compare's rows

def _pct(v: float, unit: str = "%") -> str:
    x = v * 100
    text = f"{x:+.1f}"
    if x != 0 and float(text) == 0:
        text = f"{x:+.2g}"
    return text + unit


def _value(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "s":
        return f"{v * 1000:.1f} ms" if abs(v) < 1 else f"{v:.3f} s"
    if unit == "ratio":
        return f"{v * 100:.1f}%"
    return f"{v:.2f} {'req/s' if unit == '/s' else unit}"


def _where(r: ChangeRow) -> str:
    """The row's level, and its turn for a multi-turn level's row per turn: `concurrency 4 · turn 2`."""
    return r.label if r.turn is None else f"{r.label} · turn {r.turn}{'+' if r.later_turns else ''}"


def describe(r: ChangeRow) -> str:
    """A row as compare's table shows it: `sim · rate 8 rps: p99(ttft) 410.0 ms → 452.0 ms, +10.2% (+4.1% .. +16.0%, regression)`."""
    unit = " pp" if r.absolute else "%"
    iv = "" if r.low is None or r.high is None else f"{_pct(r.low, unit)} .. {_pct(r.high, unit)}, "
    change = "-" if r.change is None else _pct(r.change, unit)
    return f"{r.backend} · {_where(r)}: {r.stat}({r.metric}) {_value(r.base, r.unit)} → {_value(r.new, r.unit)}, {change} ({iv}{r.verdict})"


MAX_SENTENCE = 2000  # characters; a longer "sentence" (a table pasted as one line, a log) is not read
_DECIDED = ("regression", "improvement", "no significant change")
_MAX_ROWS_SHOWN = 3


def _rows_text(rows: Sequence[ChangeRow]) -> str:
    more = len(rows) - _MAX_ROWS_SHOWN
    return "; ".join(describe(r) for r in rows[:_MAX_ROWS_SHOWN]) + (f"; and {more} more" if more > 0 else "")


def _direction_of(r: ChangeRow) -> int:
    assert r.low is not None and r.high is not None
    return 1 if r.low > 0 else -1 if r.high < 0 else 0


def _interval(r: ChangeRow, difference: bool) -> tuple[float, float] | None:
    """The row's interval of the relative change (`difference` False) or of new - base (True):
    compare's own, or that interval scaled by the row's base as measured (`Magnitude`); None
    where there is no base to scale by."""
    assert r.low is not None and r.high is not None
    if difference == r.absolute:
        return r.low, r.high
    if r.base is None or not math.isfinite(r.base) or (not difference and r.base <= 0):
        return None
    return (r.low * r.base, r.high * r.base) if difference else (r.low / r.base, r.high / r.base)


def _holds(m: Magnitude, r: ChangeRow) -> bool:
    """A candidate range of `m` meets the row's interval of its kind (one that cannot be scaled to
    the claim's kind, a row with no base, is not held against it: precision over recall)."""
    eps = 1e-9
    checked = False
    for difference, ranges in ((False, m.ranges), (True, m.differences)):
        iv = _interval(r, difference) if ranges else None
        if iv is None:
            continue
        checked = True
        tol = eps * max(1.0, abs(iv[0]), abs(iv[1]))
        if any(lo <= iv[1] + tol and iv[0] - tol <= hi for lo, hi in ranges):
            return True
    return not checked


def _merged(text: str, spans: Sequence[tuple[int, int]]) -> list[str]:
    """The level phrases `spans` cover, overlaps merged, without a leading "at"."""
    out: list[list[int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return list(dict.fromkeys(re.sub(r"^(?:at|for|on|under|with)\s+", "", text[a:b].strip(), flags=re.I) for a, b in out))


def _differences(m: Magnitude, rows: Sequence[ChangeRow]) -> str:
    """For a change claimed in a unit ("fell by 60 ms") of relative rows, their intervals in that
    unit (`_interval`): " of the difference (-32.8 ms .. -19.0 ms)"."""
    if m.ranges or not m.differences:
        return ""
    shown = []
    for r in rows[:_MAX_ROWS_SHOWN]:
        iv = None if r.absolute else _interval(r, True)
        if iv is not None:
            lo, hi = (_value(v, r.unit) for v in iv)
            shown.append(f"{lo} .. {hi}")
    return f" of the difference ({'; '.join(shown)})" if shown else ""


def _selected(c: Claim, facts: ChangeFacts) -> tuple[list[ChangeRow], str]:
    """The rows a claim is about, and where it said (the level text, for messages)."""
    rows = [r for r in facts.rows if r.metric == c.metric]
    said = named_backends({r.backend for r in facts.rows} | {r.new_backend for r in facts.rows}, (c.scope, c.sentence))
    if said:
        rows = [r for r in rows if r.backend in said or r.new_backend in said]
    levels = {r.label: LevelFacts(r.label, concurrency=r.concurrency, rate=r.rate) for r in facts.rows}
    where = ""
    for text in (c.scope, c.sentence):
        named = {lv.label for lv in named_levels(tuple(levels.values()), _not_levels(text))}
        spans = _level_spans(text)
        if named or spans:
            rows = [r for r in rows if r.label in named]
            where = " at " + (", ".join(sorted(named)) if named else ", ".join(_merged(text, spans)))
            break
    turns = _claim_turns(c)
    if turns:  # "turn 2 TTFT p50 fell": compare's rows of that turn (of a multi-turn level)
        rows = [r for r in rows if r.turn is not None and (r.turn, r.later_turns) in turns]
        where += " on turn " + ", ".join(f"{n}{'+' if plus else ''}" for n, plus in sorted(turns))
    else:  # a claim about a level is about the level's rows, not one turn's
        rows = [r for r in rows if r.turn is None]
    if c.stats:
        rows = [r for r in rows if r.stat in c.stats]
    return rows, where


# Rates of a level's wall time, which no turn has (compare makes no row of them per turn): a turn
# that frames the sentence does not scope them ("On turn 3, TTFT rose and throughput is unchanged"
# says the level's throughput is unchanged). Other metrics take a framing turn ("On turn 3, p50
# TTFT rose and p95 TTFT rose": both turn 3's), and a claim of one compare has no per-turn row of
# is CB505, never the level's row read for the turn.
_TURNLESS = frozenset({"throughput", "qps"})
# what may stand beside a turn (and a level) in a sentence's opening phrase: "On turn 3,", "At
# concurrency 4, on the 2nd turn:", "For turn 21+ at 4 rps,"; after a list item's marker
_FRAME = re.compile(r"(?:\s*(?:[-*+]|\d{1,3}[.)])\s)?(?:\s|[*_(),]|\b(?:on|in|at|for|of|the|and|with|across|during|over)\b)*", re.I)


def _framing_turns(sentence: str) -> set[tuple[int, bool]]:
    """The turns a sentence's opening phrase names -- the words before its first comma or colon,
    nothing there but turns, levels and prepositions ("On turn 3, p50 TTFT rose and p95 TTFT
    rose", "Turn 3: ..."): the frame of every clause, as a level there is."""
    cut = re.search(r"[,:]", sentence)
    if cut is None:
        return set()
    head = sentence[: cut.start()]
    turns = _turns(head)
    return turns if turns and _FRAME.fullmatch(_blank(head, _turn_spans(head) + _level_spans(head))) else set()


def _claim_turns(c: Claim) -> set[tuple[int, bool]]:
    """The turns a claim names: its clause's, else (but for `_TURNLESS` metrics) those framing
    its sentence.

    A turn is scoped more narrowly than a level, which a clause that names none takes from
    anywhere in its sentence. A turn inside a clause modifies that clause's metric ("turn 3 TTFT
    p50 fell 10%", "p50 TTFT on turn 3 rose"), and the sentence's other clauses are about the
    level ("turn 3 TTFT p50 fell 10%, and ITL p99 rose 5%": the level's ITL). The two differ in
    what the other reading costs: a claim of no level is checked against every level and holds
    where one row shows it, so a level taken from the sentence only narrows it; a claim given a
    turn is checked against other rows altogether -- a turn's, of TTFT p50 and p95 only -- so a
    turn leaking from one clause would read an ordinary claim about the level as one about the
    turn (CB505 for ITL, a turn's verdict for the level's TTFT). Only a turn that opens the
    sentence as its frame ("On turn 3, ...", `_framing_turns`) speaks for every clause."""
    return _turns(c.scope) or (set() if c.metric in _TURNLESS else _framing_turns(c.sentence))


def _pool(c: Claim, facts: ChangeFacts) -> tuple[int, int] | None:
    """(the turn named, the first turn of compare's pool that holds it) for a claim of one turn
    that compare pools with later ones ("turn 23": (23, 21), its row "turn 21+"); None otherwise."""
    pools = sorted({r.turn for r in facts.rows if r.later_turns and r.turn is not None})
    named = [n for n, plus in _claim_turns(c) if not plus and any(n >= t for t in pools)]
    if not named:
        return None
    return max(named), max(p for p in pools if p <= max(named))


def _pooled(c: Claim, facts: ChangeFacts) -> str:
    """For a claim of one turn that compare pools with later ones ("turn 25": its row "turn 21+"),
    how compare pools them.

    Such a claim stays CB505 rather than being checked against the pool, with a note that the
    rows are pooled: the pool's change is of every turn from the 21st on, as many requests of
    each as reached it, and need not be turn 25's. Checked against it, a claim about turn 25 would
    pass on other turns' change, or be called wrong (CB501, CB502: errors) about a turn compare
    never measured alone -- a finding its writer could neither confirm nor fix from compare's
    output. A reviewer wants the claim to say what was measured: the warning names the row, and
    "turn 21+" is checked against it (`_pool_hint`)."""
    pool = _pool(c, facts)
    if pool is None:
        return ""
    t = pool[1]
    return f"; compare pools the turns past the {_ordinal(t - 1)} into one row, \"turn {t}+\": claim \"turn {t}+\" to claim them"


def _pool_hint(c: Claim, facts: ChangeFacts) -> str | None:
    """The hint for a claim of a pooled turn whose metric and percentile the pool has a row of
    (`_pooled`): what to write instead."""
    pool = _pool(c, facts)
    if pool is None:
        return None
    n, t = pool
    if not any(r.later_turns and r.turn == t and r.metric == c.metric and (not c.stats or r.stat in c.stats) for r in facts.rows):
        return None
    return (f"compare measured turn {n} only within \"turn {t}+\", one row of the turns from the {_ordinal(t)} on (its change "
            f"need not be turn {n}'s): write \"turn {t}+\" to claim that row, or drop the claim")


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _available(c: Claim, facts: ChangeFacts) -> str:
    """What compare has of the claim's metric, for a claim it has no row for: its statistics and
    levels (and, for a claim that names a turn, its rows per turn: TTFT's p50 and p95 only)."""
    if _claim_turns(c):
        per_turn = [r for r in facts.rows if r.turn is not None]
        if not per_turn:
            return " (it has no rows per turn: the runs have no multi-turn level)"
        what = ", ".join(dict.fromkeys(f"{r.stat}({r.metric})" for r in per_turn))
        where = ", ".join(dict.fromkeys(_where(r) for r in per_turn))
        return f" (its rows per turn: {what} at {where}{_pooled(c, facts)})"
    rows = [r for r in facts.rows if r.metric == c.metric and r.turn is None]
    if not rows:
        return f" (it measures no {LABEL[c.metric]})"
    stats = ", ".join(dict.fromkeys(r.stat for r in rows))
    levels = ", ".join(dict.fromkeys(r.label for r in rows))
    return f" (its {LABEL[c.metric]} rows: {stats} at {levels})"


def _what(c: Claim) -> str:
    stats = "/".join(c.stats)
    return f"{stats + ' ' if stats else ''}{LABEL[c.metric]}"


_HINT = {
    "CB501": "the change is what `soakspec compare BASE NEW` measured; correct the direction (for latencies and errors lower "
             "is better, for throughput and QPS higher)",
    "CB502": "state a change inside the interval, or the interval itself; a magnitude holds within half a unit of its last digit",
    "CB503": "the interval holds 0 (or compare had too few samples): say no significant change was found, or measure more",
    "CB504": "a significant regression is not 'unchanged': state it",
    "CB505": "compare has no row for this metric or level, or too few samples to decide it: compare runs that measured "
             "it (longer ones, for a row with too few samples), or drop the claim",
}


def _diag(code: str, message: str, span: tuple[int, int], doc: Document, path: str, hint: str | None = None) -> Diagnostic:
    """A finding of a claim of change -- of a row or of the sweep's figure -- at `span` (offsets in
    the document): CB505 a warning, the others errors; `hint` else the code's own."""
    severity = Severity.WARNING if code == "CB505" else Severity.ERROR
    return Diagnostic(code, message, doc.span(*span), path, severity, hint or _HINT[code])


def _finding(c: Claim, facts: ChangeFacts) -> tuple[str, str] | None:
    """(code, message) for a claim that compare's rows do not bear out; None where they do."""
    rows, where = _selected(c, facts)
    sizes = " ".join(m.text for m in c.magnitudes if m.start != m.end)  # a word's ("halved") is in the word
    if c.direction == "same":
        claimed = f"says \"{c.word}\" of {_what(c)}{where}"
    else:
        claimed = f"states {_what(c)} {c.word}{' ' + sizes if sizes else ''}{where}"
    have = [r for r in rows if r.verdict != "missing"]
    if not have:
        what = f"no data for it: {_rows_text(rows)}" if rows else f"no row for it{_available(c, facts)}"
        return "CB505", f"{claimed}; compare ({facts.source}) has {what}"
    decided = [r for r in have if r.verdict in _DECIDED and r.low is not None and r.high is not None]
    s = _sign(c.direction, c.metric)
    if s == 0:  # of every row it names: one regression contradicts it, one compare could not decide leaves it unchecked
        bad = [r for r in decided if r.verdict == "regression"]
        if bad:
            return "CB504", f"{claimed}; compare measured a significant regression: {_rows_text(bad)}"
        unsure = [r for r in rows if r not in decided]
        if unsure:
            return "CB505", f"{claimed}; compare could not tell: {_rows_text(unsure)}"
        return None
    if not decided:
        return "CB503", f"{claimed}; compare had too few samples to tell: {_rows_text(have)}"
    shows = [r for r in decided if _direction_of(r) == s]
    if shows:
        missed = [m for m in c.magnitudes if not any(_holds(m, r) for r in shows)]
        if not missed:
            return None
        return "CB502", f"{claimed}; {missed[0].text} is outside compare's interval{_differences(missed[0], shows)}: {_rows_text(shows)}"
    if all(_direction_of(r) == -s for r in decided):
        return "CB501", f"{claimed}; compare measured the opposite: {_rows_text(decided)}"
    missed = [m for m in c.magnitudes if not any(_holds(m, r) for r in decided)]
    if missed:
        return "CB502", (f"{claimed}; {missed[0].text} is outside compare's interval{_differences(missed[0], decided)}, and it found "
                         f"no significant change: {_rows_text(decided)}")
    return "CB503", f"{claimed}; compare found no significant change (the interval holds 0): {_rows_text(decided)}"


def _sweep_sizes(text: str, direction: str, word: str, d: tuple[int, int]) -> list[Magnitude]:
    """A stated size of a change of the sweep's figure, read as a row's is: a capacity is a rate
    whose higher is better, as QPS's (`sweep_changes._sizes`)."""
    return _magnitudes(text, "qps", direction, word, d)


def check_changes(doc: Document, path: str, facts: ChangeFacts | None, negated_blocks: frozenset[int] = frozenset()) -> list[Diagnostic]:
    """CB501-CB505: claims of change against compare's rows (only with `facts`)."""
    if facts is None:
        return []
    out: list[Diagnostic] = []
    starts = doc.line_starts
    for s in doc.sentences:
        block = doc.blocks[s.block]
        line = bisect.bisect_right(starts, s.start)
        if block.kind not in (BlockKind.PARAGRAPH, BlockKind.LIST_ITEM) or line in doc.code_lines or line in doc.quote_lines:
            continue
        if s.end - s.start > MAX_SENTENCE:
            continue  # not a sentence one can read a claim of change from; keeps linting linear
        masked = doc.sentence_text(s)
        negated = s.block in negated_blocks
        clauses = _clauses(masked)
        sweeps = sweep_claims(masked, clauses, _SWEEP_NOT_READ, _GAP, _metrics, negated, _sweep_sizes)
        for sc in sweeps:  # the sweep's own figure ("capacity rose from 20 to 24 rps"): compare's sweep rows
            found = sweep_finding(sc, facts)
            if found is not None:
                out.append(_diag(*found, (s.start + sc.start, s.start + sc.end), doc, path, _SWEEP_HINTS.get(found[0])))
        for c in claims_in(masked, negated):
            found = _finding(c, facts)
            if found is not None:
                out.append(_diag(*found, (s.start + c.start, s.start + c.end), doc, path,
                                 _pool_hint(c, facts) if found[0] == "CB505" else None))
    return out
