"""Check 7: performance figures a document states (CB201) -- latency percentiles and means,
output and total throughput and request rate -- against the evidence's measured figures.

What is read (raw text, like the count checks: values in `code` count; fenced code and
blockquotes are skipped):

- latency: an aggregate and a metric, in either order or as the gate writes it -- "p95 TTFT of
  55 ms", "TTFT p95 = 40.9 ms", "TTFT (p95): 41 ms", "mean ITL 30 ms", "median e2e latency was
  1.2 s", "99th percentile TPOT 12 ms", "p95(ttft) = 100ms", "a 41 ms p95 TTFT", lists "TTFT
  p50/p95/p99 of 10/20/30 ms". Metrics: TTFT (time to first token), ITL (inter-token
  latency), TPOT (time per output token), latency / E2E / end-to-end / request latency; and
  from the send, "sent TTFT", "sent latency", `sent_ttft` ("sent TTFT p50 was 100 ms", "p99
  sent latency", `p95(sent_ttft) = 100ms`): bench serve's TTFT and E2EL, a capped level's
  sent_ttft / sent_latency -- never its ttft / latency, which count the wait for a slot
  (`from_the_send`, the reading `changes` uses for compare's sent_* rows).
  Aggregates: p50/median, p90, p95, p99 (any pNN), mean/average/avg, max, min. Units: µs /
  μs / us, ms, s, min and their spellings (`TIME_UNIT_WORDS`: `soakspec.units`'). The value
  must follow the phrase, joined only by "of", "is", "was", ":", "=", "at",
  Markdown emphasis ("**p95 TTFT:** 41 ms", "*TTFT p95*: 41 ms"),
  "stayed", "remained", … and at most a level or backend ("p95 TTFT at concurrency 4 was 41
  ms"); a metric with no aggregate ("TTFT of 41 ms") is compared with the range of the
  metric's recorded figures, min to max.
- throughput: "N tok/s", "N tokens/s", "N output tokens per second" (output tokens; input,
  prompt, prefill, peak, max, min and per-user figures are not this figure and are left alone);
  total throughput, prompt + output tokens/s ("total throughput was 5000 tok/s", "5000 total
  tok/s", the report's "Total tok/s" column: `_token_rate`; "total output" / "total prompt"
  throughput is not it, and is left alone). A level between the qualifier and the value is read
  past ("total throughput at 2 rps was 22.9 tok/s", "prefill throughput at concurrency 4 was
  9000 tok/s": `_past_levels`).
- request rate: "N req/s", "N rps", "N QPS", "QPS: N" -- but not a load the spec offers, which
  names a level ("at 2 rps", "rate 2 req/s", "2 req/s (open loop)", a workload, offered, phase or
  ramp clause), a goodput rate, or a sustained rate (`soakspec.claims.sustain` checks those).
- tables: a column whose header names a figure ("TTFT p50 / p95 / p99", "p95 TTFT (ms)",
  "Output tok/s", "Achieved req/s") is read cell by cell, each value mapped to the header's
  aggregates, with the cell's unit or the header's ("(ms)", "in ms", or a bare word: `soakspec run`'s
  summary heads "TTFT p50/p95/p99 ms"); columns headed offered, goodput, SLO,
  threshold, target, budget, rule, drift, change, delta, regression, lag, … are not figures.
  The report's "Peak output tok/s" and "Peak concurrent requests" columns (bench serve's peaks,
  `_PEAK_COLUMN`) are read as a bench block's Peak lines are: against the level the row names,
  and a number where that level records none ("-" in the report) was added by hand.
  A table with no such column is read row by row as prose ("| p95 TTFT | 41 ms |"). A row whose
  Backend cell names a backend the evidence did not run is not read: it is CB301
  (`evidence_check`), and its figures are no other backend's.

- bench serve's result block (`_bench_figures`): the "===== Serving Benchmark Result =====" block
  vLLM's `bench serve` and SGLang's `bench_serving` print, "Label:   value" lines, fenced or not.
  Only a block `soakspec report --format bench` wrote (its `Tool: soakspec` line) is read: one
  that bench serve printed measured its own run -- another tool's load, another time -- and, like
  a figure from the server's own metrics, is not contradicted by the retained run; reading it
  would flag every honest paste. Read: "Successful requests" (the completed count), "Failed
  requests" (the level's measured requests that did not complete, every kind:
  `report.common.not_completed`), "Benchmark duration (s)" (the level's measured wall time,
  results.json `wall_s`) -- these three against the level's own figure, never a backend's over
  the run --, "Request throughput (req/s)" (request rate), "Output token throughput (tok/s)",
  "Total token throughput (tok/s)", "Mean / Median / Pxx TTFT / TPOT / ITL / E2EL (ms)", and
  "Peak output token throughput (tok/s)" and "Peak concurrent requests" (results.json
  `levels[].peak_output_tokens_per_s` / `peak_concurrent_requests`, `soakspec.judge.peaks`:
  against the level's own, never a backend's over the run -- bench serve's peaks are one run's).
  A Peak line where no level it names records the figure (results from before soakspec recorded
  peaks, a level with no completed streamed request: `report --format bench` writes no line or
  `n/a` there) was added by hand, and is CB201 whatever its value (`_PEAKS`). A capped level's block (one
  with sections "(from intended start)", `_BENCH_INTENDED`, or, pasted without them, one naming a
  level the evidence records as capped: `_block_capped`) gives bench serve's meaning to its
  labels: plain TTFT / E2EL are the time from the send (sent_ttft, sent_latency), "intended TTFT /
  E2EL" the time from the intended start; in a block printed before that layout (sections "(from
  the send)") plain TTFT / E2EL are from the intended start and "sent TTFT / E2EL" from the send --
  a pasted block is read as it was written. Scope: the block's `Level:` line, as a per-level row's
  ("sim-fast · concurrency 4": that level or the backend's run figure, a level the evidence lacks
  not checked); none (a trimmed block) is a sentence naming no level: any level fits. Its
  `Backend:` line names the backend (one the evidence did not run: the block is not read), its
  `Run:` line the run where two of that backend are given, and its `Verdict:` is checked as a
  verdict in prose is (`evidence_check.stated_finding`). Every block's lines, soakspec's or not,
  are kept from prose reading -- here, and in `evidence_check` and `scope` (`document.bench_lines`):
  bench serve's "Maximum request concurrency: 64" is its run's setting, not a claim.

What it is compared with (`EvidenceFacts.figures`, `LevelFacts.figures`, made by
`adapters.load_evidence_facts` from the evidence re-judged): per level, results.json
`levels[].ttft/itl/tpot/latency` {p50, p90, p95, p99, mean, min, max} (seconds) and the level's
output tokens/s and completed requests/s (its buckets' `output_tokens_per_s` and `qps`,
weighted by wall time: the report's "Output tok/s" and "Achieved req/s"); per backend over the
run, tokens/s and requests/s over every bucket, and the gate's own backend-scope measurements
(verdict.json rules: `mean(itl) = 14.3ms`); per level also the gate's level-scope ones where they
differ from results.json. Scoping is the count checks' (`evidence_check`): a sentence (or a
per-level row "sim-fast · concurrency 4") that names a level is compared with that level (or the
backend's run figure); a sentence naming none with every level of the backends it names (all
backends when it names none) and their run figures. It holds when ANY of those figures fits.
Two runs of one backend (a before/after, `--evidence base/ new/`) are both that backend's
candidates (`evidence_check.by_backend`): a row or sentence about it holds when either run fits.
Total throughput is compared with the buckets' `total_tokens_per_s` as output throughput is with
`output_tokens_per_s` (the report's "Total tok/s"; unknown where a bucket delivered a request of no
prompt count), and a figure from the send with a capped level's `sent_ttft` / `sent_latency`
(results.json has none of a level without max_concurrency: a figure from the send there is a
figure the evidence does not record).

Precision: a figure is compared to the precision it is written with. It holds when it lies
within half a unit of its last stated digit of the recorded value, inclusive -- the stated value
is the recorded value rounded (a tie either way) to the stated decimal places: "41 ms" fits
40.9 ms and 40.5 ms, "40.9 ms" fits 40.87 ms, "40 ms" does not fit 40.9 ms, "0.04 s" fits 41 ms.
Trailing zeros of an integer count as digits ("900 tok/s" means 900 ± 0.5), except after an
approximation word ("~900", "about", "around", "roughly", "approximately", "nearly", "almost"):
then they do not ("~900" means 850 to 950; "~41 ms" is still 40.5 to 41.5).

Bounds: "below / under / less than / at most / within / up to / <" X is an upper bound, "above /
over / more than / at least / exceeding / >" X a lower bound; checked against the same figures
(held when a figure is <= X, resp. >= X; no precision slack). A metric with no aggregate read as
a bound speaks of every request: "TTFT stayed under 50 ms" needs the max, "above" the min.

Never a figure: a gate rule and its threshold -- `p95(ttft) < 500ms` (a metric written as
`agg(metric)` followed by a comparison; `p95(ttft) = 100ms` is the gate's measurement and is
checked), anything inside `goodput(…)`, `drift(…)`, `regression(…)`, a sentence clause holding
require / warn / threshold / budget / SLO / target / limit / ceiling / rule / "gate(s) on" /
"fails if", or a value followed by "per level|bucket|…"; a change ("+5 ms", "a 5 ms TTFT
improvement", "p50 TTFT is 25 ms lower", "40 tok/s (5%) higher", "TTFT fell by 12 ms", "throughput
rose by 40 tok/s", "p95 TTFT is 25 ms below baseline": a direction word of
`soakspec.claims.direction`, the vocabulary `changes` reads claims of change with, just after or
before the value; "dropped to 40 tok/s" is the new figure and "rose above 2 req/s" a bound on it,
both read); the first figure of a change stated by two ("TTFT p50 went from 30 ms to 40 ms",
"410 ms → 360 ms", "throughput went from 30 tok/s to 40 tok/s"): the base run's, where the second
is read as this run's (`_FROM`, `direction.change_base`); and in prose, anything not asserted (negated, hedged, asked, a "Non-goals"
section: `polarity`, the rules CB101 and CB301 use).

Absent figures: a figure the evidence does not record (p75 when results.json has p50/p90/p95/p99;
a metric a run without streaming never measured) is not flagged: CB202 is for identifiers
(hashes) that appear nowhere in the evidence, and a figure from another source (the server's
own metrics, another tool) is not contradicted by the retained run.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import re
from collections.abc import Mapping, Sequence

from soakspec.claims.direction import APPROX, FROM_VERB, TO, change_after, change_base, change_before
from soakspec.claims.document import BlockKind, Document, bench_blocks
from soakspec.claims.evidence_check import (
    _AGGREGATE_ROW, Stated, _cells, _key, _line_backends, _named_levels, by_backend, for_backend, run_name, stated_finding,
)
from soakspec.claims.facts import EvidenceFacts, LevelFacts
from soakspec.claims.polarity import Polarity, polarity
from soakspec.claims.scope import _CONCURRENCY, _RATE
from soakspec.diagnostics import Diagnostic, Span
from soakspec.units import UNIT_WORDS, UNITS, Dimension, prose_quantity, unit_for_word

# ---------------------------------------------------------------- vocabulary

_NUM = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
# The time units a figure is read in: every spelling `soakspec.units` knows of a duration under an hour
# (`unit_for_word`: µs / μs / us / usec / microseconds, ms / msec / milliseconds, s / sec / seconds,
# min / mins / minutes), converted by `units.prose_quantity` (`seconds_per`), so that a `.soak`
# quantity, a claim of change and a stated figure cannot read a unit differently. Not a bare "m"
# (metres?) nor hours (no latency is written in them); minutes not as a table header's unit ("TTFT
# min" is the minimum).
TIME_UNIT_WORDS: tuple[str, ...] = tuple(sorted(
    (w for w in dict.fromkeys((*UNITS, *UNIT_WORDS)) if w != "m" and (u := unit_for_word(w)) is not None
     and UNITS[u][0] is Dimension.DURATION and UNITS[u][1] < 3600),
    key=len, reverse=True))  # fmt: skip
_TIME_UNIT = "(?:" + "|".join(map(re.escape, TIME_UNIT_WORDS)) + ")"
_SUBMINUTE_UNIT = "(?:" + "|".join(re.escape(w) for w in TIME_UNIT_WORDS if UNITS[unit_for_word(w) or "s"][1] < 60) + ")"
_METRIC = (
    r"(?P<metric>ttft|time[\s-]+to[\s-]+first[\s-]+token|itl|inter[\s-]*token[\s-]+latenc(?:y|ies)|tpot"
    r"|time[\s-]+per[\s-]+output[\s-]+token|e2e(?:[\s-]+(?:request[\s-]+)?latenc(?:y|ies))?"
    r"|end[\s-]*to[\s-]*end(?:[\s-]+(?:request[\s-]+)?latenc(?:y|ies))?|(?:request[\s-]+)?latenc(?:y|ies))"
)
_AGG1 = (r"(?:p\d{1,2}(?:\.\d+)?|median|mean|average|avg|max(?:imum)?|min(?:imum)?"
         r"|\d{1,2}(?:\.\d+)?(?:st|nd|rd|th)?[\s-]+percentile)(?![\w.]\w)")  # fmt: skip
_AGGS = rf"{_AGG1}(?:\s*(?:/|,\s*(?:and\s+)?|\s+and\s+)\s*{_AGG1}){{0,5}}"
_PHRASE = re.compile(
    rf"(?<![\w.])(?:(?P<pre>{_AGGS})(?:\s*(?P<fn>\()\s*|[\s-]+(?:(?:of|for)\s+(?:the\s+)?)?))?{_METRIC}"
    rf"(?(fn)\s*\)|(?:\s*\(\s*(?P<post1>{_AGGS})\s*\)|[\s-]+(?P<post2>{_AGGS})(?![\w(]))?)(?![\w-])",
    re.I,
)
_UPPER = r"(?:below|under|less\s+than|lower\s+than|at\s+most|no\s+more\s+than|not\s+more\s+than|within|up\s+to|\\?<=?|≤|≦)"
_LOWER = r"(?:above|over|more\s+than|greater\s+than|higher\s+than|at\s+least|no\s+less\s+than|exceeding|(?<!-)\\?>=?|≥|≧)"  # "->" is an arrow
_APPROX = APPROX
_ONE = rf"{_NUM}(?:\s*{_TIME_UNIT}(?![\w/]))?"
_LIST_SEP = r"(?:\s*/\s*|\s*,\s*(?:and\s+)?|\s+and\s+)"
_CONNECT = (r"(?:\s*(?:[:=|]|\*{1,2}|_{1,2}|\b(?:of|is|was|were|are|at(?!\s+(?:least|most)\b)|stayed|stays|remained|remains|held|holds"
            r"|came\s+in(?:\s+at)?|comes\s+in(?:\s+at)?|measured|reached|hit|sat|averaged|just)\b|,))*")  # fmt: skip
# the base's figure of a change stated by its two figures, before the new one's: "went from 410 ms to",
# "fell 12%, from 410 ms to", "410 ms → " (`direction.change_base`): the value read is the one after it
_FROM = (rf"(?:(?:{FROM_VERB})(?:\s+(?:by\s+)?(?:{_APPROX}\s*)?{_NUM}\s*(?:%|x|×|{_TIME_UNIT}(?![\w/])))?\s*,?\s+)?"
         rf"from\s+(?:{_APPROX}\s*)?{_NUM}\s*(?:{_TIME_UNIT}(?![\w/]))?\s*{TO}\s*"
         rf"|(?<![\w.]){_NUM}\s*(?:{_TIME_UNIT}(?![\w/]))?\s*(?:→|->)\s*")
_VALUE = re.compile(
    rf"{_CONNECT}(?:(?P<level>\s*,?\s*\b(?:at|for|on|in|under|with)\s+(?:concurrency\s*\d+|c\s*=\s*\d+|rate\s+{_NUM}\s*(?:rps|req/s)?"
    rf"|{_NUM}\s*(?:rps|req/s)|LEVELNAME)\s*,?){_CONNECT})?\s*(?:{_FROM})?"
    rf"\s*(?:(?P<upper>{_UPPER})|(?P<lower>{_LOWER}))?\s*(?P<approx>{_APPROX})?\s*"
    rf"(?P<vals>{_ONE}(?:{_LIST_SEP}{_ONE}){{0,5}})",
    re.I,
)
_REVERSE = re.compile(rf"(?:^|[\s(])(?P<approx>{_APPROX}\s*)?(?P<vals>{_NUM})\s*(?P<u>{_TIME_UNIT})\s+(?:of\s+)?$", re.I)
_VAL_ITEM = re.compile(rf"(?P<n>{_NUM})(?:\s*(?P<u>{_TIME_UNIT})(?![\w/]))?", re.I)
_LAT_QUALIFIER = re.compile(r"(?:follow[\s-]?up|network|queue|queueing|queuing|scheduling|schedule|lag|loop|prefill|decode|client)\s*(?:request\s+)?$", re.I)

_TOKS = re.compile(
    rf"(?<![\w.])(?P<n>{_NUM})\s*(?:(?P<total>total)\s+|output\s+|generated\s+|generation\s+|completion\s+)?(?:tok(?:en)?s?)\s*"
    r"(?:/\s*s(?:ec(?:ond)?)?|per\s+s(?:ec(?:ond)?)?)(?![\w/])",
    re.I,
)
_REQS = re.compile(
    rf"(?<![\w.])(?P<n>{_NUM})\s*(?:req(?:uest)?s?\s*(?:/\s*s(?:ec(?:ond)?)?|per\s+s(?:ec(?:ond)?)?)|rps|qps)(?![\w/])"
    rf"|\bqps\s*(?:of|[:=]|was|is|were)\s*(?P<n2>{_NUM})(?![\w.%/]|\s*(?:ms|s|tok|req)\b)",
    re.I,
)
# "total throughput", "Total tok/s", "total token throughput": prompt + output tokens/s (results.json's
# total_tokens_per_s), a figure of its own -- "total" only where it qualifies throughput / tok directly;
# "total output tok/s", "total prompt throughput" are another's (`_OTHER_TOTAL`: not checked), and
# "In total, output throughput", "Total: output throughput" state output's (`_token_rate`)
_TOTAL = re.compile(r"total[\s-]+(?:token[\s-]+)?(?:throughput|tok)", re.I)
_OTHER_TOTAL = re.compile(r"total[\s-]+(?:output|generat|decode|completion|input|prompt|prefill)", re.I)
# an output word after a bare "total" in the clause: the figure is output's ("In total, output
# throughput was ..."); with none, "total" states total throughput ("Total: 22.9 tok/s")
_OUTPUT_AFTER = re.compile(r"\b(?:output|generat|decode)", re.I)
_PER_WHO = re.compile(r"\s*(?:per|/|each)\s*(?:user|request|stream|gpu|sequence|client|worker|replica)\b", re.I)
_RATE_QUALIFIER = re.compile(r"\b(?:input|prompt|prefill|total|peak|max(?:imum)?|min(?:imum)?|per[\s-]?(?:user|request|stream|gpu|sequence))\b[^.;\d]{0,30}$", re.I)
_LOAD_CLAUSE = re.compile(r"\b(?:offer(?:s|ed|ing)?|workloads?|load\s*[:=]|scheduled?|phases?|ramp(?:s|ed|ing)?|steady|burst|spike|configured|open[\s-]loop|sweep(?:s|ing)?|goodput|sustain(?:s|ed|ing|able)?|rates?|arrivals?)\b", re.I)
_LEVEL_BEFORE = re.compile(rf"(?:\bat(?!\s+(?:least|most)\b)|\brates?\s*(?:of|[:=])?|→|->|\bto|\bfrom)\s*(?:{_NUM}\s*(?:rps|req/s)?\s*(?:,|/|and|or|to|→|->)\s*)*$", re.I)
_OPEN_LOOP_AFTER = re.compile(r"\s*\(\s*open[\s-]loop", re.I)

_RULE_CUE = re.compile(
    r"\b(?:require[sd]?|requiring|warn|thresholds?|budgets?|slos?|targets?|limits?|ceilings?|rules?|gat(?:e[sd]?|ing)\s+on"
    r"|fail(?:s|ed|ing)?\s+(?:if|when|unless|above|below|over|under))\b",
    re.I,
)
_RULE_AFTER = re.compile(r"\s*(?:per\s+(?:run|backend|level|phase|turn|bucket|window)\b|on\s+\")", re.I)
_COMPARATOR = re.compile(r"\s*\\?(?:<|>|≤|≥|==|!=)")
_FUNCTION_OPEN = re.compile(r"([A-Za-z_][\w]*)\s*\($")

METRIC_LABEL = {"ttft": "TTFT", "itl": "ITL", "tpot": "TPOT", "latency": "latency", "sent_ttft": "sent TTFT",
                "sent_latency": "sent latency", "tok_s": "output throughput", "total_tok_s": "total throughput",
                "req_s": "request rate", "completed": "successful requests", "not_completed": "failed requests",
                "duration": "benchmark duration", "peak_tok_s": "peak output token throughput",
                "peak_concurrent": "peak concurrent requests"}
# the rates (and a bench block's counts, its duration and its peaks): a figure keyed by its metric alone
RATE_UNIT = {"tok_s": "tok/s", "total_tok_s": "tok/s", "req_s": "req/s", "completed": "requests", "not_completed": "requests",
             "duration": "s", "peak_tok_s": "tok/s", "peak_concurrent": "requests"}

# "sent TTFT p50", "p50 sent TTFT", "sent_latency": the times from the send (a capped level's
# sent_ttft, sent_latency; compare's rows of them), not ttft / latency. The prefix is blanked before
# a metric is read (`from_the_send`), so the aggregate around it reads as ever
_SENT = re.compile(r"(?<![\w.])sent[\s_-]+(?=(?:ttft|time[\s-]+to[\s-]+first|e2e|end[\s-]*to[\s-]*end|(?:request[\s-]+)?latenc))", re.I)
_SENT_OF = {"ttft": "sent_ttft", "latency": "sent_latency"}


def _metric_key(text: str) -> str:
    t = text.lower()
    if t.startswith(("ttft", "time to", "time-to")) or "first" in t:
        return "ttft"
    if t.startswith(("itl", "inter")):
        return "itl"
    if t.startswith("tpot") or "per" in t:
        return "tpot"
    return "latency"


def from_the_send(text: str) -> tuple[str, frozenset[int]]:
    """`text` with "sent" before a metric blanked (offsets kept), and where those metrics begin:
    `_PHRASE` reads the blanked text, `phrase_metric` names what it found."""
    spans = [m.span() for m in _SENT.finditer(text)]
    chars = list(text)
    for a, b in spans:
        chars[a:b] = " " * (b - a)
    return "".join(chars), frozenset(b for _, b in spans)


def phrase_metric(m: re.Match[str], sent: frozenset[int]) -> str:
    """The metric a `_PHRASE` match names: ttft | itl | tpot | latency, or sent_ttft | sent_latency
    where "sent" stood before it (`from_the_send`)."""
    key = _metric_key(m.group("metric"))
    return _SENT_OF.get(key, key) if m.start("metric") in sent else key


# a level named between a rate's qualifier and its value ("total throughput at concurrency 4 was",
# "prefill throughput at 2 rps was"): read past, so that its digits do not hide the qualifier
_LEVEL_WORDS = (*_CONCURRENCY, _RATE, re.compile(rf"(?<![\w.]){_NUM}\s*(?:rps|req/s)\b", re.I))


# "max" / "peak" / "min" directly before a level names the level ("at max concurrency 8"), not the rate
_LEVEL_EXTREME = re.compile(r"\b(?:max(?:imum)?|peak|min(?:imum)?)\s+$", re.I)


def _past_levels(clause: str) -> str:
    """`clause` without the levels it names, for `_RATE_QUALIFIER` to read; a max / peak / min
    word directly before a level goes with it ("At max concurrency 8, ... 30.5 req/s" is the
    level's rate, not a peak rate the evidence does not record)."""
    for rx in _LEVEL_WORDS:
        out, last = [], 0
        for m in rx.finditer(clause):
            e = _LEVEL_EXTREME.search(clause, last, m.start())
            out += [clause[last : e.start() if e else m.start()], " "]
            last = m.end()
        clause = "".join(out) + clause[last:]
    return clause


def _token_rate(before: str) -> str | None:
    """The tokens/s figure a value is, by the words just before it (`_RATE_QUALIFIER`): output
    (tok_s) where none qualifies it, total (total_tok_s: "total throughput", "Total tok/s"), or
    one the evidence does not record (input, prompt, prefill, peak, per-user ...: None)."""
    q = _RATE_QUALIFIER.search(before)

    def bare_total(q: re.Match[str]) -> bool:  # "total" that no other rate word names ("total output")
        return q.group(0)[:5].lower() == "total" and not _OTHER_TOTAL.match(q.group(0))

    while q is not None and bare_total(q) and _OUTPUT_AFTER.search(before, q.start() + len("total")):
        q = _RATE_QUALIFIER.search(before, q.start() + len("total"))  # "In total, output ...": no qualifier
    if q is None:
        return "tok_s"
    if bare_total(q) and _RATE_QUALIFIER.search(before, q.start() + len("total")) is None:
        return "total_tok_s"  # "Total throughput", "Total: 22.9 tok/s", "The total was 22.9 tok/s"
    return None


def _aggs(text: str | None) -> list[str]:
    if not text:
        return []
    out = []
    for a in re.findall(_AGG1, text, re.I):
        a = a.lower()
        if a.startswith("p"):
            out.append(a)
        elif a == "median":
            out.append("p50")
        elif a in ("mean", "average", "avg"):
            out.append("mean")
        elif a.startswith("max"):
            out.append("max")
        elif a.startswith("min"):
            out.append("min")
        else:
            out.append("p" + re.match(r"\d+(?:\.\d+)?", a).group(0))  # type: ignore[union-attr]
    return out


def seconds_per(unit: str | None) -> float:
    """Seconds in one `unit` as written (`TIME_UNIT_WORDS`), by `units.prose_quantity`; 1 for none."""
    read = prose_quantity(1.0, unit) if unit else None
    return read[1] if read is not None and read[0] == Dimension.DURATION.value else 1.0


def _unit_text(unit: str) -> str:
    return {1e-6: "µs", 1e-3: "ms", 60.0: "min"}.get(seconds_per(unit), "s")


# ---------------------------------------------------------------- what the document states

@dataclasses.dataclass(frozen=True, slots=True)
class Hit:
    """One figure in a piece of text: offsets of its value in that text."""

    metric: str  # ttft | itl | tpot | latency | sent_ttft | sent_latency | tok_s | total_tok_s | req_s
    agg: str | None  # p95, mean, max, … (latency); None: not stated (or a rate)
    number: str  # as written, e.g. "40.9", "1,234"
    unit: str  # ms | s | µs (latency); "tok/s" | "req/s"
    start: int
    end: int
    phrase_start: int
    bound: str | None = None  # upper | lower
    approx: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Figure:
    hit: Hit
    span: Span
    backends: tuple[EvidenceFacts, ...]
    context: str | None  # text that may name a level
    per_level: bool = False
    exact_level: bool = False  # `context` is a soakspec bench block's `Level:` line: a level's exact label (`_levels_named`)


_LOOKBACK = 200  # characters read before a figure for its context: linting stays linear


def _before(text: str, pos: int) -> str:
    return text[max(0, pos - _LOOKBACK) : pos]


def _inside_call(text: str, pos: int) -> bool:
    """Is `pos` inside `name(...)` for a function other than an aggregate (goodput, drift, …)?"""
    depth = 0
    for i in range(pos - 1, max(-1, pos - 1 - _LOOKBACK), -1):
        c = text[i]
        if c == ")":
            depth += 1
        elif c == "(":
            if depth == 0:
                m = _FUNCTION_OPEN.search(text[max(0, i - 40) : i + 1])
                return bool(m) and not re.fullmatch(_AGG1, m.group(1), re.I)
            depth -= 1
    return False


def _clause_before(text: str, pos: int) -> str:
    prefix = text[max(0, pos - _LOOKBACK) : pos]
    cut = max(prefix.rfind(";"), prefix.rfind(". "), prefix.rfind(" — "), prefix.rfind(" -- "))
    return prefix[cut + 1 :]


def _is_rule(text: str, phrase_start: int, end: int) -> bool:
    return bool(_RULE_CUE.search(_clause_before(text, phrase_start)) or _RULE_AFTER.match(text, end))


def extract(text: str, level_names: Sequence[str] = ()) -> list[Hit]:
    """Every stated figure in `text` (a sentence, a line or a table cell)."""
    out: list[Hit] = []
    used: list[tuple[int, int]] = []
    names = "|".join(re.escape(n) for n in sorted(level_names, key=len, reverse=True) if n) or r"(?!x)x"
    value_rx = re.compile(_VALUE.pattern.replace("LEVELNAME", names), re.I)
    scan, sent = from_the_send(text)
    for m in _PHRASE.finditer(scan):
        if _LAT_QUALIFIER.search(_before(text, m.start())) or _inside_call(text, m.start()):
            continue
        aggs = _aggs(m.group("pre") or m.group("post1") or m.group("post2"))
        metric = phrase_metric(m, sent)
        if m.group("fn") is not None and _COMPARATOR.match(text, m.end()) and not re.match(r"\s*=(?!=)", text[m.end():]):
            continue  # `p95(ttft) < 500ms`: a rule's threshold
        v = value_rx.match(text, m.end())
        items: list[tuple[str, str | None, int, int]] = []
        bound = approx = None
        if v is not None:
            base = v.start("vals")
            items = [(x.group("n"), x.group("u"), base + x.start(), base + x.end()) for x in _VAL_ITEM.finditer(v.group("vals"))]
            while items and items[-1][1] is None:
                items.pop()
            bound = "upper" if v.group("upper") else "lower" if v.group("lower") else None
            approx = v.group("approx")
            if len(items) > 1 and len(items) != max(1, len(aggs)):
                items = items[:1] if items[0][1] else []
            if items and items[0][1] is None:  # "41 / 55 ms": the list's unit
                unit = next(u for _, u, _, _ in items if u)
                items = [(n, u or unit, a, b) for n, u, a, b in items]
            if items and (change_after(text, items[-1][3]) or change_before(text, v.start("vals"))):
                continue  # "p50 TTFT is 25 ms lower": how much it changed, not the figure
            if items and change_base(text, items[0][2], items[-1][3]):
                continue  # the base run's figure of "from 410 ms to 360 ms" (`_FROM` reads the new one's)
        elif len(aggs) <= 1:
            r = _REVERSE.search(scan, max(0, m.start() - _LOOKBACK), m.start())
            if r is not None and not any(a <= r.start("vals") < b for a, b in used):
                items = [(r.group("vals"), r.group("u"), r.start("vals"), r.end("u"))]
                approx = r.group("approx")
                if change_after(text, m.end()):
                    continue  # "a 12 ms TTFT improvement"
        if not items:
            continue
        if len(items) == 1 and len(aggs) > 1:
            continue  # "p50/p95 TTFT of 41 ms": which one?
        if (v is not None and v.group("upper") and "<" in v.group("upper") or v is not None and v.group("lower") and ">" in v.group("lower")) \
                and m.group("fn") is not None:
            continue
        if _is_rule(text, m.start(), items[-1][3]):
            continue
        for i, (n, u, a, b) in enumerate(items):
            if a > 0 and text[a - 1] in "+±−" or (a > 0 and text[a - 1] == "-" and (a < 2 or not text[a - 2].isalnum())):
                break
            out.append(Hit(metric, aggs[i] if aggs else None, n, u or "s", a, b, min(m.start(), a), bound, bool(approx)))
            used.append((a, b))
    for rx, metric in ((_TOKS, "tok_s"), (_REQS, "req_s")):
        for m in rx.finditer(text):
            g = "n" if m.group("n") is not None else "n2"
            a, b = m.start(g), m.end(g)
            if any(x <= a < y for x, y in used):
                continue
            before = _before(text, a)
            clause = _clause_before(text, a)
            if _PER_WHO.match(text, m.end()) or _inside_call(text, a):
                continue
            kind = metric
            if metric == "tok_s":  # output tokens/s, or "total throughput": prompt + output
                kind = _token_rate(_past_levels(clause))
                if kind is None:
                    continue
                kind = "total_tok_s" if m.group("total") else kind  # "5000 total tok/s"
            elif _RATE_QUALIFIER.search(_past_levels(clause)):
                continue
            if a > 0 and text[a - 1] in "+±−":
                continue
            pre = re.search(rf"(?:(?P<upper>{_UPPER})|(?P<lower>{_LOWER}))?\s*(?P<approx>{_APPROX})?\s*$", before, re.I)
            bound = "upper" if pre and pre.group("upper") else "lower" if pre and pre.group("lower") else None
            if metric == "req_s":
                if bound is None and _LEVEL_BEFORE.search(before):
                    continue  # "at 2 rps", "rate 2 req/s", "ramp 5→20 rps": a level's load
                if _OPEN_LOOP_AFTER.match(text, m.end()) or _LOAD_CLAUSE.search(clause):
                    continue
            if change_after(text, m.end()) or change_before(text, a) or _is_rule(text, a, m.end()):
                continue  # "40 tok/s higher", "rose by ~40 tok/s": a change
            if change_base(text, a, m.end()):
                continue  # "from 30 tok/s to 40 tok/s": the base run's (the new run's, after "to", is read)
            out.append(Hit(kind, None, m.group(g), RATE_UNIT[kind], a, b, a, bound, bool(pre and pre.group("approx"))))
            used.append((a, b))
    return out


# ---------------------------------------------------------------- tables

_SKIP_COLUMN = re.compile(r"goodput|offered|\bslos?\b|threshold|target|budget|limit|rule|drift|change|delta|regress|improve|Δ|%|diff|\blag\b|client|schedule|follow|in\s+flight|coalesc", re.I)
# the header's unit: "(ms)", "[ms]", ", ms", "in ms", or a bare word ("TTFT p50/p95/p99 ms", the header
# `soakspec run`'s summary prints)
_HEADER_UNIT = re.compile(
    rf"[(\[]\s*(?P<u>{_SUBMINUTE_UNIT})\s*[)\]]|,\s*(?P<u2>{_SUBMINUTE_UNIT})\s*$|\bin\s+(?P<u3>{_SUBMINUTE_UNIT})\b"
    rf"|(?<![^\s*_])(?P<u4>{_SUBMINUTE_UNIT})(?![^\s*_])",
    re.I,
)


# bench serve's two peaks as a column: the report's "Peak output tok/s" and "Peak concurrent
# requests" (`report.common.PEAK_TOKENS_HEAD`), bench serve's own labels too ("Peak output token
# throughput (tok/s)"); a level's own figures, as a bench block's Peak lines are (`_PEAKS`).
# Not "Peak concurrency": in a review that is the highest level run, not a figure of one
_PEAK_COLUMN = re.compile(
    r"^\W*peak\s+(?:(?P<tok>(?:output\s+)?(?:token\s+throughput|tok(?:en)?s?\s*(?:/|per)\s*s(?:ec(?:ond)?)?))"
    r"|concurrent\s+requests)\b", re.I)


@dataclasses.dataclass(frozen=True, slots=True)
class _Column:
    metric: str | None  # None: not a figure column (read as prose); "skip": never read
    aggs: tuple[str, ...] = ()
    unit: str | None = None


def _column(header: str) -> _Column:
    if _SKIP_COLUMN.search(header):
        return _Column("skip")
    scan, sent = from_the_send(header)
    m = _PHRASE.search(scan)
    if m is not None:
        u = _HEADER_UNIT.search(header)
        unit = next((g for g in u.groups() if g), None) if u else None
        return _Column(phrase_metric(m, sent), tuple(_aggs(m.group("pre") or m.group("post1") or m.group("post2"))), unit)
    h = header.lower()
    if (peak := _PEAK_COLUMN.search(h)) is not None:  # bench serve's peaks, the report's columns
        return _Column("peak_tok_s" if peak.group("tok") else "peak_concurrent")
    if re.search(r"tok(?:en)?s?\s*(?:/|per)\s*s", h):
        kind = _token_rate(h)  # "Output tok/s", "Total tok/s" (the report's columns); not "Prefill tok/s"
        return _Column(kind) if kind else _Column("skip")
    if re.search(r"req(?:uest)?s?\s*(?:/|per)\s*s|\brps\b|\bqps\b|throughput\s*\(\s*req", h):
        return _Column("req_s")
    return _Column(None)


def is_figure_column(header: str) -> bool:
    """Is a table column headed `header` read as a figure ("p95 TTFT (ms)", "Output tok/s")?"""
    return _column(header).metric not in (None, "skip")


def _cell_hits(text: str, col: _Column) -> list[Hit]:
    text = text.split("(")[0] if not text.lstrip().startswith("(") else text
    if col.metric in RATE_UNIT:
        m = re.search(rf"(?:(?P<upper>{_UPPER})|(?P<lower>{_LOWER}))?\s*(?P<approx>{_APPROX})?\s*(?P<n>{_NUM})", text, re.I)
        if m is None:
            return []
        bound = "upper" if m.group("upper") else "lower" if m.group("lower") else None
        return [Hit(col.metric, None, m.group("n"), RATE_UNIT[col.metric], m.start("n"), m.end("n"), m.start("n"), bound, bool(m.group("approx")))]
    items = [(x.group("n"), x.group("u") or col.unit, x.start(), x.end()) for x in _VAL_ITEM.finditer(text)]
    if not items or any(u is None for _, u, _, _ in items):
        return []
    aggs: list[str | None] = list(col.aggs) or [None]
    if len(items) != len(aggs):
        return []
    pre = re.match(rf"\s*(?:(?P<upper>{_UPPER})|(?P<lower>{_LOWER}))?\s*(?P<approx>{_APPROX})?", text, re.I)
    bound = "upper" if pre and pre.group("upper") else "lower" if pre and pre.group("lower") else None
    return [Hit(col.metric or "latency", agg, n, u or "s", a, b, a, bound if len(items) == 1 else None, bool(pre and pre.group("approx")))
            for agg, (n, u, a, b) in zip(aggs, items)]  # fmt: skip


def _tables(doc: Document) -> list[list[int]]:
    """Contiguous runs of table rows (line numbers; the first is the header)."""
    runs: list[list[int]] = []
    for b in doc.blocks:
        if b.kind is not BlockKind.TABLE_ROW:
            continue
        between = doc.lines[runs[-1][-1] : b.first_line - 1] if runs else ["x"]
        if runs and len(between) <= 1 and all(line.strip() and "-" in line and set(line.strip()) <= set("|:- \t") for line in between):
            runs[-1].append(b.first_line)
        else:
            runs.append([b.first_line])
    return runs


def _table_figures(doc: Document, evidence: Sequence[EvidenceFacts]) -> tuple[list[Figure], set[int]]:
    """Figures in the columns of tables that have figure columns (the lines read are returned:
    prose reading skips them)."""
    by_key = by_backend(evidence)  # each run's facts of a backend: a before/after cites two runs of one
    out: list[Figure] = []
    done: set[int] = set()
    for run in _tables(doc):
        header = _cells(doc.lines[run[0] - 1])
        cols = [_column(c[2]) for c in header]
        if not any(c.metric is not None for c in cols):
            continue  # no figure column: its rows are read as prose
        done |= set(run)
        backend_col = next((i for i, c in enumerate(header) if re.search(r"backend", c[2], re.I)), None)
        name_col = backend_col if backend_col is not None else next((i for i, c in enumerate(header) if re.search(r"level", c[2], re.I)), 0)
        for lineno in run[1:]:
            line = doc.lines[lineno - 1]
            off = doc.line_offset(lineno)
            cells = _cells(line)
            name = cells[name_col][2] if name_col < len(cells) else ""
            ev = by_key.get(_key(name))
            context, per_level, backends = line, False, _line_backends(line, evidence)
            if ev is not None:
                backends = ev
            elif "·" in name and (ev := by_key.get(_key(name.partition("·")[0]))) is not None:
                backends, context, per_level = ev, name.partition("·")[2], True
            elif backend_col is not None and name not in ("", "-", "—", "n/a") and not _AGGREGATE_ROW.search(name):
                continue  # a row for a backend the evidence did not run: CB301 (`evidence_check`), not another's figure
            for (a, _, text), col in zip(cells, cols):
                if col.metric == "skip" or text in ("", "-", "—", "n/a"):
                    continue
                hits = _cell_hits(text, col) if col.metric is not None else extract(text)
                for h in hits:
                    out.append(Figure(h, doc.span(off + a + h.start, off + a + h.end), backends, context, per_level))
    return out, done


# ---------------------------------------------------------------- bench serve's result block

_BENCH_FIELD = re.compile(rf"^\s*(?P<label>[^:]*?)\s*:\s+(?P<value>{_NUM})\s*$")
_BENCH_TEXT = re.compile(r"^\s*(?P<label>tool|run|verdict|backend|level)\s*:\s+(?P<value>\S.*?)\s*$", re.I)
_BENCH_LATENCY = re.compile(
    rf"(?P<agg>mean|median|p\d{{1,2}}(?:\.\d+)?)\s+(?:(?P<sent>sent\s+)|(?P<intended>intended\s+))?(?P<metric>ttft|tpot|itl|e2el|e2e\s+latency)"
    rf"\s*\(\s*(?P<u>{_SUBMINUTE_UNIT})\s*\)", re.I)
_BENCH_LATENCY_KEY = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "latency", "e2e latency": "latency"}
_BENCH_RATES = {  # label (lower case, spaces collapsed) -> the figure; "Total throughput": SGLang's older label
    "successful requests": "completed", "request throughput (req/s)": "req_s",
    "output token throughput (tok/s)": "tok_s", "total token throughput (tok/s)": "total_tok_s",
    "total throughput (tok/s)": "total_tok_s",
    "failed requests": "not_completed", "benchmark duration (s)": "duration",
    "peak output token throughput (tok/s)": "peak_tok_s", "peak concurrent requests": "peak_concurrent",
}
# a level's figure a soakspec block states by its own field rather than `figures` (`_check`)
_LEVEL_FIELD = {"completed": "completed", "not_completed": "not_completed", "duration": "wall_s",
                "peak_tok_s": "peak_tok_s", "peak_concurrent": "peak_concurrent"}
# bench serve's peaks (a one-second bin's output tokens, the most requests in flight at a moment):
# a level's own figures; where none of the levels a line names has one, soakspec's block wrote no
# such number, so one in it was added by hand
_PEAKS = frozenset({"peak_tok_s", "peak_concurrent"})
_WHOLE = frozenset({"completed", "not_completed", *_PEAKS})  # figures shown as whole numbers
SOAKSPEC_TOOL = "soakspec"  # the `Tool:` line `soakspec report --format bench` writes


# a capped level's block (`soakspec.report.bench`): bench serve's labels hold the time from the send,
# a section "(from intended start)" of "intended TTFT" the time with the wait counted; a block printed
# before has sections "(from the send)" of "sent TTFT" instead, and its plain labels are intended-start
_BENCH_INTENDED = re.compile(r"^\s*-+\s*.*\(from\s+intended\s+start\)\s*-+\s*$", re.I)


# the older layout's marks: a section "(from the send)" or a "sent TTFT" / "sent E2EL" label
_BENCH_SENT = re.compile(r"^\s*(?:-+\s*.*\(from\s+the\s+send\)\s*-+|\S.*\bsent\s+(?:ttft|e2el)\b.*)\s*$", re.I)


def _levels_named(ev: EvidenceFacts, f: Figure) -> tuple[LevelFacts, ...]:
    """The levels of `ev` a figure's context names. A soakspec bench block's `Level:` line is
    the label `report --format bench` wrote (`LevelRow.label`): the level with that exact label,
    so `w1 / concurrency 2` is not also `w2 / concurrency 2` (the loose reading, `_named_levels`,
    takes any level at concurrency 2); where no label matches exactly (a hand-written line), the
    loose reading."""
    if f.exact_level and f.context is not None:
        want = " ".join(f.context.lower().split())
        exact = tuple(lv for lv in ev.levels if " ".join(lv.label.lower().split()) == want)
        if exact:
            return exact
    return _named_levels(ev, f.context or "")


def _block_capped(lines: Sequence[str], backends: Sequence[EvidenceFacts], level: str | None) -> bool:
    """Whether a soakspec block is a capped level's as printed now (bench serve's plain TTFT /
    E2EL the time from the send): it has a "(from intended start)" section; or, pasted without
    those sections, it has no mark of the older layout (`_BENCH_SENT`) and the level it names
    (its `Level:`; none: every level of its backends) is capped in the evidence
    (`LevelFacts.capped`). A block trimmed of both its sections reads as the newer layout."""
    if any(_BENCH_INTENDED.match(ln) for ln in lines):
        return True
    if any(_BENCH_SENT.match(ln) for ln in lines):
        return False
    want = " ".join(level.lower().split()) if level else None
    named = [lv for ev in backends for lv in ev.levels
             if want is None or want in (" ".join(lv.label.lower().split()), " ".join(lv.offered.lower().split()))]
    return bool(named) and all(lv.capped for lv in named)


def _bench_hit(label: str, m: re.Match[str], capped: bool = False) -> Hit | None:
    """The figure a block's line states; `capped`: the block has intended-start sections (a capped
    level's, as printed now), so bench serve's plain TTFT / E2EL labels are the time from the send."""
    key = " ".join(label.lower().split())
    a, b = m.start("value"), m.end("value")
    if key in _BENCH_RATES:
        kind = _BENCH_RATES[key]
        return Hit(kind, None, m.group("value"), RATE_UNIT[kind], a, b, a)
    lat = _BENCH_LATENCY.fullmatch(label.strip())
    if lat is None:
        return None  # Total input tokens, Maximum request concurrency, ...: not a figure
    metric = _BENCH_LATENCY_KEY[" ".join(lat.group("metric").lower().split())]
    if lat.group("intended"):
        if metric not in ("ttft", "latency"):
            return None  # "intended TPOT": no such figure
    elif lat.group("sent") or capped:
        metric = _SENT_OF.get(metric, metric)
    if metric not in ("ttft", "tpot", "itl", "latency", "sent_ttft", "sent_latency"):
        return None  # "sent TPOT": no such figure
    return Hit(metric, _aggs(lat.group("agg"))[0], m.group("value"), lat.group("u"), a, b, a)


def _bench_figures(doc: Document, evidence: Sequence[EvidenceFacts]) -> tuple[list[Figure], list[Stated], set[int]]:
    """Figures in bench serve result blocks that soakspec wrote (`Tool: soakspec`,
    `soakspec report --format bench`), fenced or not, and each such block's `Verdict:` (checked
    as the prose verdict is: `evidence_check.stated_finding`); every block's lines are returned,
    so that prose reading skips them. A block with no such line is another tool's run (bench
    serve's own): not the evidence's figures, and not read. Where two runs of the block's backend
    are given (a before/after), its `Run:` line says which run's figures it holds; a run id that
    neither has leaves both (a block retitled by hand is still checked)."""
    by_key = by_backend(evidence)
    out: list[Figure] = []
    verdicts: list[Stated] = []
    done: set[int] = set()
    for first, last in bench_blocks(doc):
        done |= set(range(first, last + 1))
        text: dict[str, tuple[str, int]] = {}
        for ln in range(first, last + 1):
            if (m := _BENCH_TEXT.match(doc.lines[ln - 1])) is not None:
                text.setdefault(m.group("label").lower(), (m.group("value"), ln))
        if text.get("tool", ("",))[0].lower() != SOAKSPEC_TOOL:
            continue  # another tool's run
        backends: tuple[EvidenceFacts, ...] = tuple(evidence)
        if "backend" in text:
            ev = by_key.get(_key(text["backend"][0]))
            if ev is None:
                continue  # a backend the evidence did not run: its figures are no other backend's
            backends = ev
        if "run" in text and (same := tuple(ev for ev in backends if ev.run_id == text["run"][0])):
            backends = same
        if "verdict" in text:
            value, ln = text["verdict"]
            off = doc.line_offset(ln) + doc.lines[ln - 1].index(value, doc.lines[ln - 1].index(":") + 1)
            verdicts.append(Stated("gate", value, value, doc.span(off, off + len(value)), backends))
        level = text["level"][0] if "level" in text else None
        capped = _block_capped([doc.lines[ln - 1] for ln in range(first, last + 1)], backends, level)
        for ln in range(first, last + 1):
            m = _BENCH_FIELD.match(doc.lines[ln - 1])
            h = _bench_hit(m.group("label"), m, capped) if m is not None else None
            if h is None:
                continue
            off = doc.line_offset(ln)
            out.append(Figure(h, doc.span(off + h.start, off + h.end), backends, level, per_level=level is not None,
                              exact_level=level is not None))
    return out, verdicts, done


# ---------------------------------------------------------------- prose

def _prose_figures(doc: Document, evidence: Sequence[EvidenceFacts], skip: set[int], negated_blocks: frozenset[int]) -> list[Figure]:
    out: list[Figure] = []
    names = sorted({ev.backend for ev in evidence} | {n for ev in evidence for lv in ev.levels for n in (lv.label, lv.offered) if n and n != "-"})
    starts = doc.line_starts
    for s in doc.sentences:
        block = doc.blocks[s.block]
        first = bisect.bisect_right(starts, s.start)
        if block.kind in (BlockKind.CODE, BlockKind.QUOTE) or first in skip or first in doc.code_lines or first in doc.quote_lines:
            continue
        raw = doc.sentence_text(s, masked=False)
        masked = doc.sentence_text(s)
        hits = extract(raw, names)
        if not hits:
            continue
        backends = _line_backends(raw, evidence)
        for h in hits:
            if polarity(masked, h.phrase_start, h.end, s.block in negated_blocks) is not Polarity.ASSERTED:
                continue
            out.append(Figure(h, doc.span(s.start + h.start, s.start + h.end), backends, raw))
    return out


# ---------------------------------------------------------------- comparing

def _stated_value(h: Hit) -> tuple[float, float]:
    """(value, half a unit of its last stated digit), in the stated unit."""
    num = h.number.replace(",", "")
    value = float(num)
    if "." in num:
        step = 10.0 ** -len(num.split(".")[1])
    elif h.approx and num.strip("0"):
        step = 10.0 ** (len(num) - len(num.rstrip("0")))
    else:
        step = 1.0
    return value, step / 2


def _in_stated_unit(h: Hit, x: float) -> float:
    return x / seconds_per(h.unit) if h.metric not in RATE_UNIT else x


def _fits(h: Hit, candidates: tuple[float, ...], lo_hi: tuple[float, float] | None) -> bool:
    value, half = _stated_value(h)
    eps = 1e-12 * max(1.0, abs(value))
    if lo_hi is not None:  # no aggregate: the range of what was recorded
        lo, hi = (_in_stated_unit(h, x) for x in lo_hi)
        if h.bound == "upper":
            return hi <= value + eps
        if h.bound == "lower":
            return lo >= value - eps
        return lo - half - eps <= value <= hi + half + eps
    for x in map(lambda v: _in_stated_unit(h, v), candidates):
        if h.bound == "upper" and x <= value + eps or h.bound == "lower" and x >= value - eps:
            return True
        if h.bound is None and abs(x - value) <= half + eps:
            return True
    return False


def _show(h: Hit, x: float) -> str:
    x = _in_stated_unit(h, x)
    if h.metric in _WHOLE:
        return f"{x:.0f} {h.unit}"
    decimals = len(h.number.split(".")[1]) if "." in h.number else 0
    sig = 3 - 1 - math.floor(math.log10(abs(x))) if x else 0
    digits = min(6, max(decimals + 1, sig, 0))
    return f"{x:.{digits}f} {h.unit if h.metric in RATE_UNIT else _unit_text(h.unit)}"


def _label(h: Hit) -> str:
    base = METRIC_LABEL[h.metric]
    return f"{base} {h.agg}" if h.agg else base


def _stated_text(h: Hit) -> str:
    bound = {"upper": "at most ", "lower": "at least ", None: ""}[h.bound]
    unit = h.unit if h.metric in RATE_UNIT else _unit_text(h.unit)
    return f"{_label(h)} {bound}{'~' if h.approx else ''}{h.number} {unit}"


_MAX_SHOWN = 6


def _check(f: Figure, path: str) -> Diagnostic | None:
    h = f.hit
    named: list[tuple[EvidenceFacts, LevelFacts]] = []
    if f.context is not None:
        named = [(ev, lv) for ev in f.backends for lv in _levels_named(ev, f)]
    if f.per_level and not named:
        return None  # a per-level row naming no level the evidence has
    sets: list[tuple[str, Mapping[str, tuple[float, ...]]]]
    def who(ev: EvidenceFacts) -> str:
        return run_name(ev, f.backends)

    if h.metric in _PEAKS and not any(
            getattr(lv, _LEVEL_FIELD[h.metric]) is not None
            for lv in ([lv for _, lv in named] if named else [lv for ev in f.backends for lv in ev.levels])):
        return Diagnostic(
            "CB201", f"states {_stated_text(h)}{for_backend(f.backends)} as soakspec's; the evidence records no such "
            "figure for that level and `soakspec report` writes no such number (the bench block `n/a` or no line, the "
            "per-level table `-`): it was added by hand",
            f.span, path, hint="remove the figure, or paste bench serve's own block for bench serve's figures",
        )

    def figures_of(facts: EvidenceFacts | LevelFacts) -> Mapping[str, tuple[float, ...]]:
        if h.metric not in _LEVEL_FIELD:
            return facts.figures
        v = getattr(facts, _LEVEL_FIELD[h.metric], None)  # a backend's facts have no duration or failed count of bench serve's
        return {h.metric: (float(v),)} if v is not None else {}

    if named:
        sets = [(f"{who(ev)} · {lv.label}", figures_of(lv)) for ev, lv in named]
        sets += [(f"{who(ev)} over the run", figures_of(ev)) for ev in dict.fromkeys(ev for ev, _ in named)]
    else:
        sets = [(f"{who(ev)} · {lv.label}", figures_of(lv)) for ev in f.backends for lv in ev.levels]
        sets += [(f"{who(ev)} over the run", figures_of(ev)) for ev in f.backends]
    key = h.metric if h.metric in RATE_UNIT else f"{h.metric}.{h.agg}"
    shown: list[str] = []
    known = False
    for where, figs in sets:
        if h.metric in RATE_UNIT or h.agg is not None:
            vals = figs.get(key, ())
            if not vals:
                continue
            known = True
            if _fits(h, vals, None):
                return None
            shown.append(f"{where}: {_show(h, vals[0])}")
        else:
            lo, hi = figs.get(f"{h.metric}.min", ()), figs.get(f"{h.metric}.max", ())
            if not lo or not hi:
                continue
            known = True
            if _fits(h, (), (lo[0], hi[0])):
                return None
            shown.append(f"{where}: {_show(h, lo[0])} to {_show(h, hi[0])}")
    if not known:
        return None  # the evidence records no such figure: nothing to contradict
    more = len(shown) - _MAX_SHOWN
    rec = "; ".join(shown[:_MAX_SHOWN]) + (f"; and {more} more" if more > 0 else "")
    return Diagnostic(
        "CB201", f"states {_stated_text(h)}{for_backend(f.backends)}; the evidence records {rec}", f.span, path,
        hint="correct the document from the evidence (lint-claims never rewrites); a figure holds within half a unit "
        "of its last stated digit",
    )  # fmt: skip


def check_figures(doc: Document, path: str, evidence: Sequence[EvidenceFacts], negated_blocks: frozenset[int] = frozenset()) -> list[Diagnostic]:
    """CB201: a latency, throughput or request-rate figure the evidence contradicts, and a
    soakspec bench block's verdict that is not the run's."""
    if not evidence:
        return []
    bench, verdicts, in_blocks = _bench_figures(doc, evidence)
    table, done = _table_figures(doc, evidence)
    out: list[Diagnostic] = [d for st in verdicts if (d := stated_finding(st, path)) is not None]
    seen: set[tuple[int, int]] = set()
    for f in bench + table + _prose_figures(doc, evidence, done | in_blocks, negated_blocks):
        if (f.span.line, f.span.column) in seen:
            continue
        seen.add((f.span.line, f.span.column))
        d = _check(f, path)
        if d is not None:
            out.append(d)
    return out
