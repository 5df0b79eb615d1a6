"""The words that say a figure changed -- one vocabulary for the two readers that must agree on
it: `changes` reads a claim of change with it ("p99 TTFT fell 12%", "30 ms lower"), and `figures`
uses it to leave a change alone ("p50 TTFT is 25 ms lower" states no TTFT of 25 ms, and "TTFT
fell by 12 ms" none of 12 ms), so that one sentence is never both a change and a figure.

- `DIRECTION`: a direction, one named group per kind (same, down, up, better, worse);
- `COMPARATIVE`: the direction words a quantity may come just before ("30 ms lower", "a 12 ms
  improvement"); before a verb the quantity is the level, not the change ("TTFT 410 ms fell 12%":
  410 ms is a figure);
- `change_after(text, end)` / `change_before(text, start)`: is the quantity that ends / starts
  there a change? After: a `COMPARATIVE` word, or one that is a change only next to a quantity
  ("25 ms less", "shorter", "longer", "down", "a 3 ms drift"), with at most emphasis, a
  parenthesis or ", or 12%," between ("25 ms (20%) lower", "25 ms **lower**"). Before: a
  direction other than "unchanged", then nothing or "by" / "of" and a modifier ("fell by 12 ms",
  "rose 40 tok/s", "is up 40 tok/s", "an improvement of 40 tok/s", "grew by more than 40 tok/s").
  A quantity after "to" is the new figure ("dropped to 40 tok/s"), and one after "above" / "below"
  without "by" a bound on it ("rose above 2 req/s"): neither is a change (as `changes._absolute`
  reads them). After, too: "below" / "under" / "above" / "over" a baseline (`_BASELINE`: "25 ms
  below baseline", "30 tok/s above main", "25 ms under the base run") says how far from it, as
  "25 ms less than before" does; against anything else it is no change ("41 ms over the run",
  "41 ms under load" state the figure);
- `change_base(text, start, end)`: is the quantity there the first of a change stated by its two
  figures, "from 410 ms to 360 ms" or "410 ms → 360 ms" (`TO` joins them)? That one is the base
  run's figure; the second is the new one's, a figure of this run (as `changes._FROM_TO` reads
  the pair for the change's size). "from 30 ms at 2 rps to 45 ms at 8 rps" is not such a pair:
  something stands between the first figure and "to" (there, two levels of one run);
- `TO`, `FROM_VERB`, `APPROX`: the words around such a pair ("went from", "fell 12%, from"; "to",
  "→"; "~", "about"), for `figures` to read the second figure and `changes` the pair.
"""

from __future__ import annotations

import re

DIRECTION = re.compile(
    r"(?P<same>\bunchanged\b|\bunaffected\b"
    r"|\bno\s+(?:(?:statistically\s+)?significant\s+|measurable\s+|noticeable\s+|real\s+)?(?:change|regression|difference|slowdown|degradation)s?\b"
    r"|\b(?:did\s+not|didn['’]t|does\s+not|doesn['’]t|has\s+not|hasn['’]t)\s+(?:change|regress|degrade|get\s+worse|move)\b"
    r"|\b(?:did\s+not|didn['’]t|do\s+not|don['’]t)\s+(?:see|observe|find|measure)\s+(?:any\s+)?(?:(?:statistically\s+)?significant\s+|measurable\s+)?"
    r"(?:change|regression|difference|slowdown|degradation)s?\b"
    r"|\b(?:stayed|remained|stays|remains|is|was|are|were)\s+(?:the\s+)?same\b|\b(?:stayed|remained|stays|remains|is|was)\s+flat\b)"
    r"|(?P<down>\b(?:fell|falls?|falling|dropped|drops?|dropping|decreased|decreases?|decreasing|declined|declines?|reduced|reduces?"
    r"|reduction|shrank|shrinks?|went\s+down|(?:is|was|are|were)\s+down|lower|lowered|lowers|cut|cuts|halved)\b)"
    r"|(?P<up>\b(?:rose|rises?|rising|increased|increases?|increasing|grew|grows?|growing|went\s+up|(?:is|was|are|were)\s+up"
    r"|higher|raised|climbed|climbs?|jumped|jumps?|doubled|tripled)\b)"
    r"|(?P<better>\b(?:improved|improves?|improving|improvements?|faster|better|sped\s+up|speed[\s-]?ups?)\b)"
    r"|(?P<worse>\b(?:regressed|regress(?:es|ing)?|regressions?|slower|worse|degraded|degrades?|degradation|slowed(?:\s+down)?|slowdown)\b)",
    re.I,
)
COMPARATIVE = re.compile(r"(?:lower|higher|faster|slower|better|worse|improvements?|reduction|regressions?|slowdown|degradation"
                         r"|speed[\s-]?ups?|cut|cuts|drops?|increases?|decreases?)", re.I)

# a change only next to a quantity ("25 ms less", "40 tok/s up"): not a claim of change by itself
_BESIDE_QUANTITY = (r"less|more|shorter|longer|quicker|smaller|greater|larger|bigger|down|up(?!\s+to\b)"
                    r"|drift|change|delta|gain|win|overhead|penalty|difference|savings?")
# what a quantity "below" / "above" is a change from ("25 ms below baseline", "30 tok/s above the
# base run", "25 ms under that of main"): a run compared with, never a window or a load ("over the
# run", "under load") nor a threshold (a rule, which `figures` leaves alone for its own words).
# "41 ms over the previous run" may also say during which run: not read as that run's figure
# either (precision: a change read as a figure is a false CB201)
_BASELINE = (r"(?:below|under|above|over|beneath|short\s+of|ahead\s+of|behind)\s+(?:(?:that|those)\s+(?:of|on|in)\s+)?(?:the\s+|our\s+)?"
             r"(?:baselines?|base(?:\s+(?:run|build|branch|commit|version|line))?|main(?!\s+(?:phase|window|part|stage|soak|level|load|body))"
             r"|master|trunk|before|previously|(?:previous|prior|old|older|last|parent|reference|control|upstream)\s+"
             r"(?:runs?|builds?|branch|commits?|versions?|releases?)|reference|control|parent|upstream)")
_BETWEEN = r"(?:\s|\*{1,2}|_{1,2}|\([^()]{0,40}\)|,\s*(?:or\s+)?(?:~|about\s+|roughly\s+)?\d+(?:\.\d+)?\s*(?:%|x|×)\s*,?)*"
_AFTER = re.compile(rf"{_BETWEEN}(?:{COMPARATIVE.pattern}|{_BESIDE_QUANTITY}|{_BASELINE})(?![^\W_])", re.I)
_BEFORE = re.compile(
    rf"(?:{DIRECTION.pattern}|\b(?P<bare>up|down)\b)"
    r"(?:\s+(?:by|of)\s+(?:more\s+than|at\s+least|over|above|upwards\s+of|up\s+to|at\s+most|under|below|less\s+than)?"
    r"|\s+(?:more\s+than|at\s+least|upwards\s+of|up\s+to|at\s+most|less\s+than)\s*)?"
    r"\s*(?:(?:~|≈|about|around|approximately|approx\.?|roughly|nearly|almost|circa)\s*)?$",
    re.I,
)
_LOOKBACK = 80

# a round number's approximation words ("~900", "about 40 ms"): `figures` and `changes` read them too
APPROX = r"(?:~|≈|about|around|approximately|approx\.?|roughly|nearly|almost|circa)"
# what joins the two figures of a change: "from 410 ms to 360 ms", "410 ms → 360 ms"
TO = r"(?:to|→|->)"
# a verb that says a figure went from one value to another ("went from", "improved from", "fell 12%, from")
FROM_VERB = r"(?:went|goes|gone|moved|changed|shifted|" + re.sub(r"\(\?P<\w+>", "(?:", DIRECTION.pattern) + ")"
_FROM_BEFORE = re.compile(rf"\bfrom\s+(?:{APPROX}\s*)?$", re.I)
_TO_AFTER = re.compile(rf"\s*{TO}\s*(?:{APPROX}\s*)?\d", re.I)
_ARROW_AFTER = re.compile(rf"\s*(?:→|->)\s*(?:{APPROX}\s*)?\d", re.I)


def change_after(text: str, end: int) -> bool:
    """Is the quantity ending at `end` a change ("25 ms lower", "40 tok/s (5%) higher")?"""
    return _AFTER.match(text, end) is not None


def change_before(text: str, start: int) -> bool:
    """Is the quantity starting at `start` a change ("fell by 12 ms", "rose 40 tok/s")?"""
    m = _BEFORE.search(text, max(0, start - _LOOKBACK), start)
    return m is not None and m.group("same") is None


def change_base(text: str, start: int, end: int) -> bool:
    """Is the quantity at `start`..`end` (its number to its unit) the base run's figure of a change
    stated by its two figures, "from 410 ms to 360 ms" or "410 ms → 360 ms"?"""
    if _ARROW_AFTER.match(text, end):
        return True
    return _TO_AFTER.match(text, end) is not None and _FROM_BEFORE.search(text, max(0, start - _LOOKBACK), start) is not None
