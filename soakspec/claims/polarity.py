"""Does a sentence *assert* the phrase found at a position, or negate, hedge or quote it?

`polarity(sentence, start, end, inherited_negation)` looks only at the sentence's masked text
(quoted material is already blanked, so it never matches). Rules, in order:

1. A sentence ending in `?` asks; it does not assert (QUESTION).
2. NEGATED (`inherited_negation`): a list item governed by a negated introducer ("It does not
   claim:", "**Not claimed:**") or heading, and everything in a section headed "Non-goals",
   "Out of scope", "Limitations", "Not claimed", "Future work", "Next steps", "Follow-ups",
   "Roadmap", "TODO", "Open questions" (see `boundary.unasserted_blocks`).
3. The *clause* around the phrase is the sentence cut at breakers: `;`, a dash between spaces,
   but / however / although / though / whereas / yet / while / because / since / so / therefore,
   ", which", "and"/"," followed by a new subject (it, this, we, the X is …), and "and"
   followed by a verb (is, makes, shows, proves, …). "or"/"nor" never break: "does not claim
   A, B, or C" negates all three; "is not slow and is production-ready" asserts the second.
4. NEGATED if the clause before the phrase holds a negation cue (not, n't, no, never, neither,
   nor, none, nothing, without, cannot, lacks, excludes, except, beyond, rather than, instead
   of, out of scope, non-, un-claimed/-proven/-verified/-tested); a determiner "no"/"zero"
   governs only up to the next "and". NEGATED also if the phrase is followed in its clause by
   "is/are/remains … not …", "(is) not claimed/covered/shown/…", "is excluded", "out of scope",
   ": not claimed", "(not claimed)".
   Not a negation of the phrase: an outcome negated just before it ("no errors at concurrency
   64", "zero failures on vLLM", "without timeouts during a 24-hour soak", "never failed on
   H100") -- the phrase is asserted as what was run. NEGATED also by a dash that says so:
   "Production readiness — not claimed".
5. HEDGED if the clause before the phrase holds a hedge (may, might, could, would, should,
   possibly, perhaps, potentially, probably, likely, hopefully, eventually, if, once, unless,
   until, whether, aim, plan, hope, intend, goal, expect, future, follow-up, TODO, TBD, later,
   roadmap, "needs to", "to be shown"), or the phrase is followed closely by one (may, might,
   could, would, needs, requires, depends, "is future work", "is left …", "is planned").
6. Otherwise ASSERTED.

A clause reaches at most `CLAUSE_REACH` (1,000) characters on each side of the phrase, so the
work per phrase is bounded and linting stays linear in the document.

The phrase itself is never scanned for cues: "no drift" is an assertion, "does not claim no
drift" is not.
"""

from __future__ import annotations

import enum
import re


class Polarity(enum.StrEnum):
    ASSERTED = "asserted"
    NEGATED = "negated"
    HEDGED = "hedged"
    QUESTION = "question"


_VERBS = (
    r"is|are|was|were|makes?|made|shows?|showed|shown|proves?|proved|demonstrates?|demonstrated|"
    r"provides?|provided|delivers?|delivered|achieves?|achieved|gives?|gave|reaches?|reached|"
    r"passes|passed|survives?|survived|matches|matched|recovers?|recovered|runs?|ran|scales?|"
    r"scaled|handles?|handled|has|have|had|will|can|establishes?|established|confirms?|"
    r"confirmed|supports?|offers?|guarantees?|ensures?|enables?|brings?|stays?|remains?|works?"
)
_SUBJECT = r"it|this|that|these|those|they|we|he|she|its|our|their|there"

_BREAK = re.compile(
    r";|\s[—–]\s|\s--\s|—"
    r"|\b(?:but|however|although|though|whereas|yet|while|because|since|so|therefore|thus|hence)\b"
    r"|,\s*(?:which|who)\b"
    rf"|(?:\band|,)\s+(?:{_SUBJECT})\b"
    rf"|(?:\band|,)\s+(?:the|a|an|our|its|this)\s+[\w/-]+(?:\s+[\w/-]+)?\s+(?:{_VERBS})\b"
    rf"|\band\s+(?:also\s+)?(?:{_VERBS})\b",
    re.IGNORECASE,
)

NEGATION_CUES = re.compile(
    r"\b(?:not|never|neither|nor|none|nothing|nobody|without|cannot|lacks?|lacking|excludes?|"
    r"excluding|except|beyond|non|unclaimed|unproven|unverified|untested|unsupported)\b"
    r"|n['’]t\b|\brather\s+than\b|\binstead\s+of\b|\bout\s+of\s+scope\b|\bstops?\s+short\s+of\b",
    re.IGNORECASE,
)
NEGATION_DETERMINERS = re.compile(r"\b(?:no|zero)\b", re.IGNORECASE)

_HEDGE = re.compile(
    r"\b(?:may|might|could|would|should|possibly|perhaps|potentially|probably|likely|hopefully|"
    r"eventually|if|once|unless|until|whether|aims?|plans?|planned|hopes?|intends?|intended|goal|"
    r"expects?|expected|future|follow[-\s]?ups?|todo|tbd|later|roadmap|needs?\s+to|"
    r"to\s+be\s+(?:shown|proven|determined|measured|verified|demonstrated))\b",
    re.IGNORECASE,
)

_SUFFIX_NEG = re.compile(
    r"^\W*(?:[\w/-]+\W+){0,8}?(?:is|are|was|were|remains?|remained|stays?|has|have)\s+"
    r"(?:\w+\s+)?(?:not|never|unproven|unverified|untested|unclaimed|excluded|out\s+of\s+scope)\b"
    r"|^\W*(?:(?:is|are)\s+)?(?:not\s+(?:claimed|covered|shown|tested|established|demonstrated|"
    r"proven|measured|part|included|in\s+scope|asserted)|out\s+of\s+scope|excluded|unclaimed|"
    r"unproven|untested|unverified)\b"
    r"|^\s*[:(—–-]\s*(?:not|no|none|excluded|unclaimed|out\s+of\s+scope)\b",
    re.IGNORECASE,
)
_SUFFIX_HEDGE = re.compile(
    r"^\W*(?:(?!(?:and|or)\b)[\w/-]+\s+){0,2}?(?:may|might|could|would|will\s+need|needs?|"
    r"requires?|depends?|remains?\s+(?:future|open|to\s+be)|(?:is|are)\s+(?:future|left|a\s+"
    r"follow|planned|tbd|todo|pending|a\s+goal))\b",
    re.IGNORECASE,
)


# "no errors at", "zero failures on", "without timeouts during", "never failed on": the negation
# is the outcome's, and the phrase after it (a level, a backend, a duration) is asserted as run
_OUTCOME_NEGATION = re.compile(
    r"\b(?:(?:no|zero|without(?:\s+any)?|not\s+(?:a\s+)?single|nor?)\s+(?:[\w-]+\s+)?"
    r"(?:errors?|failures?|failed\s+requests?|timeouts?|crash(?:es)?|issues?|problems?|regressions?|leaks?|ooms?|"
    r"rejections?|drops?|disconnect(?:s|ions?)?|5xx|restarts?|hiccups?)"
    r"|\bnever\s+(?:once\s+)?(?:failed|crashed|errored|timed\s+out|dropped|restarted|stalled))"
    r"(?:\s+(?:at|on|with|under|during|for|over|across|in|through(?:out)?|after|while|when|running))?"
    r"(?:\s+(?:a|an|the))?\s*$",
    re.IGNORECASE,
)
# "Production readiness — not claimed": a dash that only says the item is not claimed
_DASH_NEG = re.compile(
    r"^\s*(?:—|–|--|-)\s*(?:not\s+(?:claimed|covered|shown|tested|established|demonstrated|proven|measured|"
    r"part|included|in\s+scope|asserted)|excluded|unclaimed|out\s+of\s+scope)\b",
    re.IGNORECASE,
)


def _clause_prefix(prefix: str) -> str:
    cut = 0
    for m in _BREAK.finditer(prefix):
        cut = m.end()
    return prefix[cut:]


def _clause_suffix(suffix: str) -> str:
    m = _BREAK.search(suffix)
    return suffix[: m.start()] if m else suffix


_AND = re.compile(r"\band\b", re.IGNORECASE)


def _negated_prefix(clause: str) -> bool:
    if NEGATION_CUES.search(clause):
        return True
    # "no"/"zero" govern their own noun phrase: up to the next "and". So the clause is negated
    # when a determiner comes after the last "and" (one pass each, not one per determiner).
    last_and = max((m.start() for m in _AND.finditer(clause)), default=-1)
    return any(m.end() > last_and for m in NEGATION_DETERMINERS.finditer(clause))


# A clause reaches at most this far on each side of the phrase. Real clauses are far shorter;
# the bound keeps the work per phrase constant, so that linting is linear in the document even
# when it is one enormous "sentence" (a 5 MB line with no full stop).
CLAUSE_REACH = 1000


def _ends_with_question(sentence: str) -> bool:
    i = len(sentence)
    while i > 0 and sentence[i - 1].isspace():  # rstrip without copying the sentence
        i -= 1
    return i > 0 and sentence[i - 1] == "?"


def polarity(sentence: str, start: int, end: int, inherited_negation: bool = False) -> Polarity:
    """Polarity of `sentence[start:end]` within `sentence` (masked text, one sentence).

    Looks at most `CLAUSE_REACH` characters before and after the phrase."""
    if _ends_with_question(sentence):
        return Polarity.QUESTION
    if inherited_negation:
        return Polarity.NEGATED
    before = _clause_prefix(sentence[max(0, start - CLAUSE_REACH) : start].replace("\n", " "))
    raw_after = sentence[end : end + CLAUSE_REACH].replace("\n", " ")
    after = _clause_suffix(raw_after)
    outcome = _OUTCOME_NEGATION.search(before)
    if outcome is not None:
        before = before[: outcome.start()]
    if _negated_prefix(before) or _SUFFIX_NEG.search(after) or _DASH_NEG.match(raw_after):
        return Polarity.NEGATED
    if _HEDGE.search(before) or _SUFFIX_HEDGE.search(after):
        return Polarity.HEDGED
    return Polarity.ASSERTED


# Introducers and headings whose list items are negated.
_NEGATED_HEADING = re.compile(
    r"\b(?:not\s+claimed|does\s+not\s+claim|do\s+not\s+claim|non[-\s]?goals?|out\s+of\s+scope|"
    r"exclu(?:des?|ded|sions?)|limitations?|caveats?|not\s+covered|not\s+shown|unclaimed|"
    r"what\s+(?:this|it)\s+does\s+not)\b",
    re.IGNORECASE,
)


def negates_list(introducer: str, is_heading: bool) -> bool:
    """Whether a list under `introducer` (a heading, or a paragraph ending in ':') is negated."""
    text = introducer.strip()
    if is_heading:
        return bool(_NEGATED_HEADING.search(text)) or bool(NEGATION_CUES.search(text))
    if not text.endswith(":"):
        return False
    last = re.split(r"(?<=[.!?])\s+", text)[-1]
    return bool(_NEGATED_HEADING.search(last) or NEGATION_CUES.search(last) or NEGATION_DETERMINERS.search(last))
