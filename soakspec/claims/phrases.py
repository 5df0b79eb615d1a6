"""Normalised phrases: tokens, light stemming, and what an `exclude "…"` line matches.

Normalisation (`tokens`):
- words are runs of letters/digits; `_` keeps a word whole (`prompt_words` is not `prompt`);
  hyphens, slashes and other punctuation separate words;
- case-fold, then a light stemmer (`stem`): a few irregular forms (readiness -> ready,
  recovery -> recover, stability -> stable, coverage -> cover, failure -> fail, leaves -> leaf,
  multinode -> multi node, prod -> production) and suffix rules (-ies, -es, -s, -ed, -ing, -ly,
  -ity, -ness, then a trailing e), so "recovers"/"recovered"/"recovery" all give `recover`;
- a synonym class per stem (`canon`): cover ≈ test ≈ exercise ≈ validate; stable ≈ reliable;
  prompt ≈ context; budget ≈ limit ≈ bound; production ≈ prod.

An exclusion becomes *slots* (`compile_exclusion`): one slot per content word, articles and
qualifiers dropped (`OPTIONAL`: a, an, the, of, for, hard, strict, soak, http, claim, …).
A slash makes alternatives for one slot: "long/mixed-prompt" -> {long | mixed} + {prompt},
"latency/memory" -> {latency | memory}; "long or mixed prompt" normalises to the same slots.

Two thresholds (token windows count content words only, never cross a sentence):
- *stated* (check 1, the claim-boundary section): some window of ``len(slots) + 3`` tokens
  satisfies at least ``STATED_THRESHOLD`` (2/3, rounded up) of the slots, or an assertion
  pattern of the exclusion matches. "production readiness" needs both slots; "multi-node
  recovery" needs 2 of 3; "default-runtime NCCL coverage" 3 of 4.
- *mentioned* (check 2, before polarity is decided): every slot within a window of
  ``len(slots) + 1`` tokens, or one of the exclusion's assertion patterns (`Exclusion.patterns`).

Assertion patterns are derived from the exclusion's words by rules keyed on its head stem
(ready, parity, recover, drift, stable, cover); see `_derive_patterns`. Example: "vLLM parity"
gives "parity with vLLM", "matches vLLM", "on par with vLLM", "as fast as vLLM", "faster than
vLLM", …; "production readiness" gives "production-ready", "ready for production",
"production-grade", …; "multi-node recovery" gives "recovers across nodes", "survives
multi-node failure", …; "a hard latency/memory drift budget" gives "no drift", "drift within
5%", "memory stays flat", "drift budget", ….
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Iterator, Sequence

STATED_THRESHOLD = 2 / 3
STATED_SLACK = 3
MENTION_SLACK = 1

_WORD = re.compile(r"[A-Za-z0-9_]+(?:['’]t)?")

OPTIONAL = frozenset(
    """a an the of for to in on at by with and or any all its this that these those
    hard strict full complete soak http sustained claim claimed claims evidence""".split()
)

_IRREGULAR = {
    "readiness": "ready",
    "recovery": "recover",
    "recoveries": "recover",
    "stability": "stable",
    "stably": "stable",
    "reliability": "reliable",
    "coverage": "cover",
    "failure": "fail",
    "failures": "fail",
    "leaves": "leaf",
    "leafs": "leaf",
    "prod": "production",
    "mixed": "mix",
    "longer": "long",
    "latencies": "latency",
    "par": "parity",
    "nodes": "node",
    "data": "data",
    "this": "this",
    "its": "its",
    "is": "is",
    "was": "was",
    "has": "has",
    "does": "does",
}

# stem -> synonym class (the canonical stem)
_SYNONYMS = {
    "test": "cover",
    "exercis": "cover",
    "validat": "cover",
    "verifi": "cover",
    "reliabl": "stabl",
    "context": "prompt",
    "limit": "budget",
    "bound": "budget",
    "multinod": "multi",
}


@functools.lru_cache(maxsize=8192)
def stem(word: str) -> str:
    """Light, consistent stemming: equal stems for the inflections this linter cares about."""
    w = word.lower().replace("’", "'")
    if w in _IRREGULAR:
        w = _IRREGULAR[w]
    elif len(w) > 4 and "_" not in w and not any(c.isdigit() for c in w):
        for suffix, repl in (
            ("iness", "y"),
            ("ility", "le"),
            ("ities", "ity"),
            ("ness", ""),
            ("ies", "y"),
            ("sses", "ss"),
            ("ches", "ch"),
            ("shes", "sh"),
            ("xes", "x"),
            ("ses", "se"),
            ("ing", ""),
            ("ed", ""),
            ("ly", ""),
            ("s", ""),
        ):
            if w.endswith(suffix) and len(w) - len(suffix) >= 3 and not w.endswith("ss"):
                w = w[: len(w) - len(suffix)] + repl
                break
    if len(w) > 3 and w.endswith("e") and "_" not in w:
        w = w[:-1]
    return w


def canon(word: str) -> str:
    s = stem(word)
    return _SYNONYMS.get(s, s)


@dataclasses.dataclass(frozen=True, slots=True)
class Token:
    text: str
    canon: str
    start: int  # offset in the text it came from
    end: int


def tokens(text: str, base: int = 0) -> list[Token]:
    """Words of `text` with their canonical stems and absolute offsets (`base` + index)."""
    out: list[Token] = []
    for m in _WORD.finditer(text):
        w = m.group(0)
        if w.lower() == "multinode":
            out.append(Token(w, "multi", base + m.start(), base + m.end()))
            out.append(Token(w, "node", base + m.start(), base + m.end()))
            continue
        out.append(Token(w, canon(w), base + m.start(), base + m.end()))
    return out


def content_tokens(text: str, base: int = 0) -> list[Token]:
    """`tokens` without articles and qualifiers (`OPTIONAL`): window widths count these only."""
    return [t for t in tokens(text, base) if t.text.lower() not in OPTIONAL]


def normalise(text: str) -> str:
    """Canonical, order-preserving form of a phrase (for messages and equality tests)."""
    return " ".join(t.canon for t in tokens(text) if t.text.lower() not in OPTIONAL)


@dataclasses.dataclass(frozen=True)
class Exclusion:
    """One `exclude "…"` line, ready to match."""

    text: str
    slots: tuple[frozenset[str], ...]
    patterns: tuple[re.Pattern[str], ...]

    @property
    def stated_needed(self) -> int:
        return max(1, math.ceil(STATED_THRESHOLD * len(self.slots) - 1e-9))


def _slots(text: str) -> tuple[frozenset[str], ...]:
    slots: list[frozenset[str]] = []
    for chunk in re.split(r"\s+", text.strip()):
        parts = [p for p in chunk.split("/") if p]
        if len(parts) > 1:  # "long/mixed-prompt": {long | mixed} + {prompt}
            words = [[t.canon for t in tokens(p) if t.text.lower() not in OPTIONAL] for p in parts]
            words = [w for w in words if w]
            if words:
                slots.append(frozenset(w[0] for w in words))
                slots.extend(frozenset([c]) for c in words[-1][1:])
            continue
        for t in tokens(chunk):
            if t.text.lower() not in OPTIONAL:
                slots.append(frozenset([t.canon]))
    # a repeated slot adds nothing
    seen: list[frozenset[str]] = []
    for s in slots:
        if s not in seen:
            seen.append(s)
    return tuple(seen)


def _words_rx(words: Sequence[str]) -> str:
    """A regex for a phrase: words joined by hyphen/space/slash, plurals allowed."""
    return r"[-\s/]*".join(re.escape(w) + r"s?" for w in words)


def _alt(words: Sequence[str]) -> str:
    return "(?:" + "|".join(re.escape(w) for w in words) + ")"


_FAILURE = r"(?:failures?|faults?|loss(?:es)?|outages?|crash(?:es)?|partitions?)"


def _derive_patterns(text: str, slots: tuple[frozenset[str], ...]) -> list[str]:
    """Assertion patterns for an exclusion, derived from its head word."""
    raw_words = [w for w in re.findall(r"[A-Za-z0-9_.]+", text) if w.lower() not in OPTIONAL]
    heads = {next(iter(s)) for s in slots if len(s) == 1}
    others = [w for w in raw_words if canon(w) not in {"ready", "parity", "recover", "drift", "budget", "stabl", "cover"}]
    pats: list[str] = []
    # the phrase itself, hyphen/space/slash-insensitive
    content = [w for w in re.split(r"[\s/-]+", text.strip()) if w and w.lower() not in OPTIONAL]
    if content:
        pats.append(r"\b" + _words_rx(content) + r"\b")
    if "ready" in heads:
        q = _alt(others) if others else None
        if q:
            pats += [
                rf"\b{q}[-\s]?ready\b",
                rf"\bready\s+(?:for|in)\s+{q}\b",
                rf"\b{q}\s+readiness\b",
                rf"\b{q}[-\s](?:grade|quality|worthy|safe)\b",
                rf"\b(?:fit|safe|suitable)\s+(?:for|in)\s+{q}\b",
            ]
        if any(canon(w) == "production" for w in others):
            pats += [
                r"\bprod[-\s]?ready\b",
                r"\bready\s+(?:for\s+prod|to\s+(?:ship|deploy))\b",
                r"\bsafe\s+to\s+deploy\b",
                r"\bship[-\s]ready\b",
                r"\bbattle[-\s]tested\b",
                r"\bprime[-\s]time\b",
            ]
    if "parity" in heads and others:
        x = _alt(others)
        pats += [
            rf"\b{x}\s+parity\b",
            rf"\bparity\s+(?:with|to|against|versus|vs\.?)\s+{x}\b",
            rf"\bmatch(?:es|ed|ing)?\s+{x}\b",
            rf"\bon\s+par\s+with\s+{x}\b",
            rf"\bas\s+(?:fast|good|quick|efficient|stable|reliable)\s+as\s+{x}\b",
            rf"\b(?:equivalent|comparable|equal|identical|similar)\s+to\s+{x}\b",
            rf"\b(?:faster|better|quicker|more\s+\w+)\s+than\s+{x}\b",
            rf"\b(?:outperform|beat|rival)(?:s|ed|ing)?\s+{x}\b",
            rf"\bkeeps?\s+up\s+with\s+{x}\b",
            rf"\b{x}[-\s](?:level|class|equivalent)\b",
        ]
    if "recover" in heads:
        q = _words_rx(others) if others else r"multi[-\s]?node"
        pats += [
            rf"\b{q}[-\s]+(?:recovery|failover|fault[-\s]toleran(?:ce|t)|resilien(?:ce|t))\b",
            rf"\brecover(?:s|ed|ing|y)?\s+(?:from|across|after)\s+(?:a\s+|the\s+|any\s+)?(?:{q}|nodes?)(?:\s+{_FAILURE})?",
            rf"\bsurviv(?:e|es|ed|ing)\s+(?:a\s+|the\s+|any\s+)?(?:{q}\s+|node\s+){_FAILURE}",
            rf"\btolerat(?:e|es|ed|ing)\s+(?:a\s+|the\s+|any\s+)?(?:{q}\s+|node\s+){_FAILURE}",
            rf"\b(?:{q}|node)\s+failover\b",
        ]
    if "drift" in heads:
        qs = [w for w in others]
        q = _alt(qs + ["latency", "memory"]) if qs else _alt(["latency", "memory"])
        pats += [
            rf"\b(?:no|zero|negligible|minimal|bounded|little)\s+(?:{q}\s+)?drift\b(?!\s+(?:budget|gate|limit|bound))",
            r"\bdrift[-\s]free\b",
            rf"\b(?:{q}\s+)?drift\s+(?:is\s+|was\s+|stays?\s+|stayed\s+|remains?\s+|remained\s+)?(?:within|below|under|bounded|capped|less\s+than|at\s+most)\b",
            rf"\b(?:{q}\s+)?drift\s+budget\b",
            rf"\b{q}\s+(?:does\s+not|doesn't|did\s+not|didn't|never)\s+(?:drift|grow|increase|degrade)\b",
            rf"\b{q}\s+(?:stays?|stayed|remains?|remained|is|was)\s+(?:flat|stable|constant|bounded)\b",
            r"\bno\s+memory\s+(?:leaks?|growth)\b",
            rf"\bstable\s+{q}\b",
        ]
    if "stabl" in heads:
        # "long/mixed-prompt soak stability": the shape words become one alternation
        shape = [w for w in raw_words if canon(w) not in {"stabl", "prompt", "soak"}]
        if shape and any("prompt" in s for s in slots):
            a = "(?:" + "|".join(re.escape(canon(w)) + r"\w*" for w in shape) + ")"
            a2 = rf"{a}(?:\s*(?:/|or|and)\s*{a})?"
            pats += [
                rf"\b{a2}[-\s]+(?:prompts?|context)\s+(?:soak\s+)?stab(?:le|ility)\b",
                rf"\b(?:soak[-\s])?stab(?:le|ility|ly)\s+(?:with|under|for|on|across|at)\s+{a2}[-\s]+(?:prompts?|context)\b",
                rf"\b{a2}[-\s]+(?:prompts?|context)\s+(?:are|is|were|was|run|runs|remain|remains|stay|stays)\s+stable\b",
            ]
    if "cover" in heads and others:
        q = _words_rx(others)
        pats += [
            rf"\b(?:cover|test|exercis|validat)(?:e|es|s|ed|ing)?\s+(?:the\s+)?{q}\b",
        ]
    return pats


def compile_exclusion(text: str) -> Exclusion:
    slots = _slots(text)
    pats = tuple(re.compile(p, re.IGNORECASE) for p in _derive_patterns(text, slots))
    return Exclusion(text=text, slots=slots, patterns=pats)


def windows(toks: Sequence[Token], slots: Sequence[frozenset[str]], width: int, need: int) -> Iterator[tuple[int, int]]:
    """Token index ranges [i, j) of at most `width` tokens satisfying at least `need` slots.

    Each yielded window starts and ends on a slot-satisfying token; windows are minimal in the
    sense that they start at each satisfying token and stop as soon as `need` is reached.
    """
    if not slots:
        return
    for i, t in enumerate(toks):
        if not any(t.canon in s for s in slots):
            continue
        hit: set[int] = set()
        for j in range(i, min(len(toks), i + width)):
            for k, s in enumerate(slots):
                if toks[j].canon in s:
                    hit.add(k)
            if len(hit) >= need:
                yield i, j + 1
                break
