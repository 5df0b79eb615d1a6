"""Checks 3 and 5: values the document states about the evidence (CB201, CB202) and stale
evidence (CB401).

What is read (raw text, so values in `code` count; fenced code and blockquotes are skipped
except for the SHA-256 rule):

- a results table (tab- or pipe-separated) whose header has a "Backend" column; columns are
  recognised by name: Runtime boundary, Completed, Failed/timeouts (or Failed, Timeouts),
  Buckets / leafs (or Buckets, Leafs/Leaves/Batches), Gate (or Verdict/Status), a column
  containing "SHA". A row is compared with the evidence of the backend it names (case and
  punctuation ignored: "NCCL" = "nccl"); a row for another name that reports a count or a gate --
  or a figure, in a table with a Backend column and figure columns ("| vllm | 30.0 |" under "p95
  TTFT (ms)", whose figures `figures` then does not blame on a backend that ran) -- is CB301 (a
  backend that was not run), unless it sums or joins backends ("combined", "total",
  "host-staged + NCCL"), which is checked only by the SHA-256 rule. "-" cells are skipped.
- lines: "commit: <hex>" (7-64 hex, a prefix of the recorded commit is fine), "model
  revision: <hex>", "N completed" / "completed: N", "N failures"/"no failures"/"failed: N",
  "N timeouts"/"timeouts: N", "N buckets", "N leafs/leaves/batches", "concurrency 4,8",
  "duration_s=120", "runtime boundary: …", "gate: passed" -- and the verdict in prose: "the
  gate passed", "verdict: PASS", "all (N) required rules hold / held" (soakspec's own PASS
  line; a negated one, "did not pass", "not all rules held", is no claim). A line naming one or more evidence
  backends is compared with those; otherwise the value must match some backend (for
  completed/failed/timeouts also the sum over backends).
- levels: a count (completed, failed, timeouts, buckets) in a sentence that names a level --
  by the label or Offered text the reports print ("concurrency 4", "rate 2 rps", "phase
  steady, concurrency 8", "2 req/s (open loop)") or by its load ("c=4", "4 concurrent
  requests", "at 2 rps") -- is that level's figure (results.json `levels[].requests`), the sum
  over the levels named, or the backend's total; anything else is flagged naming both. A
  sentence naming no level is compared with the totals. A per-level table row ("sim-fast ·
  concurrency 4") is compared with its level only.
- every 64-hex value anywhere: it must be a hash the evidence records (CB202), and in a
  table's SHA column it must be that backend's report hash (CB201).
- a commit or model revision ("commit: <hex>") where none of the backends it is about recorded
  one (the report's "commit: not recorded") is CB202: the evidence does not support a claim of a
  specific commit. Where one is recorded, a different one is CB201.

Performance figures (latency percentiles and means, tokens/s, requests/s) are CB201 too, checked
by `soakspec.claims.figures` with the level scoping above (`_named_levels`, `_line_backends`).

CB401: an evidence set whose spec hash differs from the current spec's is stale; reported at
the first place the document cites one of its hashes, else on line 1.

CB402 (a warning, placed like CB401): the evidence's stored results.json / verdict.json say
something the evidence re-judged does not (the facts come from re-judging; see
`adapters.load_evidence_facts`), or contradict themselves.
"""

from __future__ import annotations

import bisect
import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

from soakspec.claims.document import BlockKind, Document, bench_lines
from soakspec.claims.facts import EvidenceFacts, LevelFacts
from soakspec.claims.scope import _CONCURRENCY, _RATE, NUMBER_LIST
from soakspec.diagnostics import Diagnostic, Severity, Span

_HEX64 = re.compile(r"(?<![0-9A-Fa-f])[0-9A-Fa-f]{64}(?![0-9A-Fa-f])")


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def by_backend(evidence: Sequence[EvidenceFacts]) -> dict[str, tuple[EvidenceFacts, ...]]:
    """The evidence by backend name (`_key`): every run's facts of that name -- a before/after
    document cites two runs of one backend, and a figure or count of either run is that run's."""
    out: dict[str, tuple[EvidenceFacts, ...]] = {}
    for ev in evidence:
        out[_key(ev.backend)] = out.get(_key(ev.backend), ()) + (ev,)
    return out


def run_name(ev: EvidenceFacts, among: Sequence[EvidenceFacts]) -> str:
    """The backend's name in a message, with its evidence directory where another run given has
    a backend of that name (a before/after: `sim (base/)`, `sim (new/)`)."""
    if ev.source and any(o is not ev and _key(o.backend) == _key(ev.backend) for o in among):
        return f"{ev.backend} ({ev.source})"
    return ev.backend


def for_backend(backends: Sequence[EvidenceFacts]) -> str:
    """` for NAME` where a statement is about one backend (of one run or several), else ''."""
    names = {ev.backend for ev in backends}
    return f" for {next(iter(names))}" if len(names) == 1 else ""


def _totals(facts: Sequence[tuple[EvidenceFacts, Any]]) -> set[Any]:
    """The sums over several backends of their values: one value per backend name, never two of
    one backend (a before/after's two runs of one backend are not two backends; two backends run
    apart, `run --backend` each, are). Empty when the facts name fewer than two backends."""
    by_name: dict[str, list[Any]] = {}
    for ev, v in facts:
        by_name.setdefault(_key(ev.backend), []).append(v)
    if len(by_name) < 2:
        return set()
    sums: set[Any] = {0}
    for values in by_name.values():
        sums = {t + v for t in sums for v in values}
        if len(sums) > 4096:  # many runs of many backends: the totals of each run only
            return {sum(v for _, v in run) for run in _by_source(facts) if len(run) > 1}
    return sums


def _by_source(facts: Sequence[tuple[EvidenceFacts, Any]]) -> list[list[tuple[EvidenceFacts, Any]]]:
    runs: dict[str | None, list[tuple[EvidenceFacts, Any]]] = {}
    for ev, v in facts:
        runs.setdefault(ev.source, []).append((ev, v))
    return list(runs.values())


def _norm_text(s: str) -> str:
    return " ".join(s.replace("`", "").split()).casefold()


@dataclasses.dataclass(frozen=True, slots=True)
class Stated:
    kind: str  # completed | failed | timeouts | buckets | batches | concurrency | duration | commit | revision | runtime | gate | sha
    value: object
    text: str
    span: Span
    backends: tuple[EvidenceFacts, ...]  # candidates this statement is about
    context: str | None = None  # the text that may name a level (the sentence; a per-level row's label)
    per_level: bool = False  # a per-level table row: compared with the level it names, or not at all


_FIELD_LABEL = {
    "completed": "completed",
    "failed": "failed",
    "timeouts": "timeouts",
    "buckets": "buckets",
    "batches": "leafs",
    "concurrency": "concurrency levels",
    "duration": "duration_s",
    "commit": "commit",
    "revision": "model revision",
    "runtime": "runtime boundary",
    "gate": "gate",
    "sha": "report SHA-256",
}


def _recorded(ev: EvidenceFacts, kind: str) -> object:
    return {
        "completed": ev.completed,
        "failed": ev.failed,
        "timeouts": ev.timeouts,
        "buckets": ev.buckets,
        "batches": ev.batches,
        "concurrency": tuple(ev.concurrency_levels) or None,
        "duration": ev.duration_s,
        "commit": ev.commit,
        "revision": ev.model_revision,
        "runtime": ev.runtime_boundary,
        "gate": ev.gate,
        "sha": ev.report_sha256,
    }[kind]


def _matches(kind: str, stated: object, recorded: object) -> bool:
    if kind in ("commit", "revision"):
        return str(recorded).lower().startswith(str(stated).lower())
    if kind == "sha":
        return str(recorded).lower() == str(stated).lower()
    if kind == "runtime":
        return _norm_text(str(stated)) == _norm_text(str(recorded))
    if kind == "gate":
        return _norm_gate(str(stated)) == _norm_gate(str(recorded))
    if kind == "concurrency":
        return set(stated) <= set(recorded)  # type: ignore[arg-type]
    if kind == "duration":
        return abs(float(stated) - float(recorded)) < 1e-6  # type: ignore[arg-type]
    return stated == recorded


def _norm_gate(s: str) -> str:
    s = s.strip().lower()
    return {"pass": "passed", "ok": "passed", "green": "passed", "held": "passed", "hold": "passed", "fail": "failed",
            "inconclusive": "inconclusive"}.get(s, s)


def _fmt(kind: str, v: object) -> str:
    if kind == "concurrency":
        return ",".join(map(str, v))  # type: ignore[call-overload]
    if kind == "duration":
        return f"{float(v):g}"  # type: ignore[arg-type]
    if kind == "gate" and str(v).lower() in ("held", "hold", "green"):
        return f"{_norm_gate(str(v))} ('{v}')"  # "All required rules held": the gate passed
    return str(v)


# ---------------------------------------------------------------- levels

_LEVEL_KINDS = ("completed", "failed", "timeouts", "buckets")
_RATE_BARE = re.compile(r"(?<![\w.])(?P<n>\d+(?:\.\d+)?)\s*(?:rps|req/s)\b", re.I)


def _level_value(lv: LevelFacts, kind: str) -> int | None:
    return {"completed": lv.completed, "failed": lv.failed, "timeouts": lv.timeouts, "buckets": lv.buckets}[kind]


def _named_levels(ev: EvidenceFacts, text: str) -> tuple[LevelFacts, ...]:
    """The levels of `ev` that `text` names (`named_levels`)."""
    return named_levels(ev.levels, text)


def named_levels(levels: Sequence[LevelFacts], text: str) -> tuple[LevelFacts, ...]:
    """The levels of `levels` that `text` names: by the label or Offered text the reports print
    (`concurrency 4`, `rate 2 rps`, `phase steady, concurrency 8`, `2 req/s (open loop)`), or by
    its load in the words scope-checking reads (`concurrency 4`, `c=4`, `4 concurrent requests`,
    `at 2 rps`, `rate 2 req/s`)."""
    if not levels:
        return ()
    norm = _norm_text(text)
    conc: set[int] = set()
    for rx in _CONCURRENCY:
        for m in rx.finditer(text):
            conc |= {int(x) for x in re.findall(r"\d+", m.group("list"))}
    rates = {float(m.group("n")) for rx in (_RATE, _RATE_BARE) for m in rx.finditer(text)}
    out = []
    for lv in levels:
        names = {_norm_text(lv.label), _norm_text(lv.offered)} - {"", "-"}
        if any(re.search(rf"(?<![\w.]){re.escape(n)}(?!\w|\.\d)", norm) for n in names):
            out.append(lv)
        elif lv.rate is not None:
            if any(abs(r - lv.rate) < 1e-9 for r in rates):
                out.append(lv)
        elif lv.concurrency is not None and lv.concurrency in conc:
            out.append(lv)
    return tuple(out)


def _level_check(st: Stated) -> tuple[bool, str] | None:
    """A count stated in a sentence (or row) that names a level: (holds, what the evidence
    records). It holds when it is a named level's figure, the sum over the levels named, or the
    backend's total (and, for several backends, the sums over them). None: no level named."""
    per: list[tuple[EvidenceFacts, list[tuple[LevelFacts, int]], object]] = []
    for ev in st.backends:
        named = [(lv, v) for lv in _named_levels(ev, st.context or "") if (v := _level_value(lv, st.kind)) is not None]
        if named:
            per.append((ev, named, _recorded(ev, st.kind)))
    if not per:
        return None
    ok: set[object] = set()
    for _, named, total in per:
        ok |= {v for _, v in named} | {sum(v for _, v in named), total}
    ok |= _totals([(ev, sum(v for _, v in named)) for ev, named, _ in per])  # over the backends named
    if all(isinstance(t, int) for _, _, t in per):
        ok |= _totals([(ev, t) for ev, _, t in per])
    parts = []
    for ev, named, total in per:
        who = run_name(ev, st.backends)
        levels = ", ".join(f"{who} · {lv.label}: {v}" for lv, v in named)
        parts.append(levels + (f" ({who} in total: {total})" if total is not None else ""))
    return st.value in ok, "; ".join(parts)


# ---------------------------------------------------------------- results tables

def _cells(line: str) -> list[tuple[int, int, str]]:
    """(start, end, text) of each cell, offsets in the line, text stripped."""
    sep = "\t" if "\t" in line else "|"
    out: list[tuple[int, int, str]] = []
    pos = 0
    for part in line.split(sep):
        lead = len(part) - len(part.lstrip())
        text = part.strip()
        out.append((pos + lead, pos + lead + len(text), text))
        pos += len(part) + 1
    if sep == "|":
        if out and not out[0][2]:
            out = out[1:]
        if out and not out[-1][2]:
            out = out[:-1]
    return out


def _column(header: str) -> str | None:
    h = header.lower()
    if "sha" in h:
        return "sha"
    if "backend" in h:
        return "backend"
    if "runtime" in h:
        return "runtime"
    if "fail" in h and "timeout" in h:
        return "failed/timeouts"
    if "fail" in h:
        return "failed"
    if "timeout" in h:
        return "timeouts"
    if "bucket" in h and re.search(r"lea[fv]|batch", h):
        return "buckets/batches"
    if "bucket" in h:
        return "buckets"
    if re.search(r"lea[fv]|batch", h):
        return "batches"
    if "complet" in h or h == "ok":
        return "completed"
    if "gate" in h or "verdict" in h or "status" in h:
        return "gate"
    return None


# a row that sums or joins backends ("combined", "host-staged + NCCL", "total") is no backend of its own
_AGGREGATE_ROW = re.compile(r"\+|&|\b(?:combined|total|totals|all|overall|sum|aggregate|both|average|mean|baseline)\b", re.I)


def _table_statements(
    doc: Document, by_key: dict[str, tuple[EvidenceFacts, ...]], unknown: list[tuple[str, Span]] | None = None
) -> tuple[list[Stated], set[int]]:
    """Statements of the results tables' rows; a row that reports results (a count, a gate or a
    figure: "| vllm | 30.0 |" under "p95 TTFT (ms)") for a backend the evidence does not have is
    added to `unknown` (its name and span). A table with a Backend column and figure columns but no
    count column is read only for such rows (`figures` checks its figures; its lines stay prose here)."""
    from soakspec.claims.figures import is_figure_column  # figures imports this module's helpers

    out: list[Stated] = []
    table_lines: set[int] = set()
    columns: list[str | None] | None = None
    figure_cols: list[bool] = []
    results_table = False
    prev_line = -10
    for b in doc.blocks:
        if b.kind is not BlockKind.TABLE_ROW:
            continue
        line = doc.lines[b.first_line - 1]
        off = doc.line_offset(b.first_line)
        cells = _cells(line)
        contiguous = b.first_line - prev_line <= 2
        prev_line = b.first_line
        kinds = [_column(c[2]) for c in cells]
        figures = [k is None and is_figure_column(c[2]) for c, k in zip(cells, kinds)]
        if "backend" in kinds and (sum(k is not None for k in kinds) >= 2 or any(figures)):
            columns, figure_cols = kinds, figures
            results_table = sum(k is not None for k in kinds) >= 2
            if results_table:
                table_lines.add(b.first_line)
            continue
        if columns is None or not contiguous:
            columns = None
            continue
        if results_table:
            table_lines.add(b.first_line)
        name = next((c[2] for c, k in zip(cells, columns) if k == "backend"), None)
        ev = by_key.get(_key(name or ""))  # (each run's facts of that backend)
        level = None
        if ev is None and "·" in (name or ""):  # a per-level table: "sim-fast · concurrency 4", as the reports print it
            be, _, level = (name or "").partition("·")
            ev = by_key.get(_key(be))
        if ev is None:
            cell = next((c for c, k in zip(cells, columns) if k == "backend"), None)
            reports = any(
                (k not in (None, "backend", "sha", "runtime") or fig) and t not in ("", "-", "—", "n/a")
                for (_, _, t), k, fig in zip(cells, columns, figure_cols)
            )
            if unknown is not None and cell is not None and name and reports and not _AGGREGATE_ROW.search(name):
                unknown.append((name.partition("·")[0].strip() or name, doc.span(off + cell[0], off + cell[1])))
            continue
        first = len(out)
        for (a, e, text), kind in zip(cells, columns):
            if kind in (None, "backend") or text in ("", "-", "—", "n/a"):
                continue
            span = doc.span(off + a, off + e)
            if kind == "runtime":
                out.append(Stated("runtime", text, text, span, ev))
            elif kind == "gate":
                out.append(Stated("gate", text, text, span, ev))
            elif kind == "sha":
                m = _HEX64.search(text)
                if m:
                    out.append(Stated("sha", m.group(0).lower(), m.group(0), doc.span(off + a + m.start(), off + a + m.end()), ev))
            elif "/" in kind:
                k1, k2 = kind.split("/")
                for k, m in zip((k1, k2), re.finditer(r"\d+", text)):
                    out.append(Stated(k, int(m.group(0)), m.group(0), doc.span(off + a + m.start(), off + a + m.end()), ev))
            else:
                m = re.search(r"\d+", text)
                if m:
                    out.append(Stated(kind, int(m.group(0)), m.group(0), doc.span(off + a + m.start(), off + a + m.end()), ev))
        if level is not None:  # the row's counts are that level's; its other cells are not per-level claims here
            out[first:] = [dataclasses.replace(st, context=level, per_level=True) for st in out[first:] if st.kind in _LEVEL_KINDS]
    return out, table_lines


# ---------------------------------------------------------------- prose lines

def _int(s: str) -> int:
    return 0 if s.lower() in ("no", "zero", "none") else int(s)


_NUMLIST = NUMBER_LIST
_PROSE: list[tuple[str, re.Pattern[str], Callable[[str], object]]] = [
    ("commit", re.compile(r"\bcommit(?:\s+sha)?\s*[:=]?\s*`?(?P<v>(?=[0-9a-f]*\d)[0-9a-f]{7,64})\b", re.I), str.lower),
    ("revision", re.compile(r"\b(?:model\s+)?revision\s*[:=]?\s*`?(?P<v>(?=[0-9a-f]*\d)[0-9a-f]{7,64})\b", re.I), str.lower),
    ("completed", re.compile(r"\b(?P<v>\d+)\s+(?:requests?\s+)?(?:completed|succeeded|successful\s+requests?)\b|\bcompleted\s*[:=]\s*(?P<v2>\d+)|\bcompleted\s+(?P<v3>\d+)\s+requests?\b", re.I), _int),
    ("failed", re.compile(r"\b(?P<v>\d+|no|zero)\s+(?:failed\s+requests?|request\s+failures?|failures?)\b|\bfail(?:ed|ures?)\s*[:=]\s*(?P<v2>\d+)", re.I), _int),
    ("timeouts", re.compile(r"\b(?P<v>\d+|no|zero)\s+timeouts?\b|\btimeouts?\s*[:=]\s*(?P<v2>\d+)", re.I), _int),
    ("buckets", re.compile(r"\b(?P<v>\d+)\s+buckets?\b|\bbuckets\s*[:=]\s*(?P<v2>\d+)", re.I), int),
    ("batches", re.compile(r"\b(?P<v>\d+)\s+(?:leaf|leafs|leaves|batches)\b|\b(?:leafs|leaves|batches)\s*[:=]\s*(?P<v2>\d+)", re.I), int),
    ("concurrency", re.compile(rf"\bconcurrency(?:\s+levels?)?\s*[:=]?\s*(?P<v>{_NUMLIST})", re.I), lambda s: tuple(int(x) for x in re.findall(r"\d+", s))),
    ("duration", re.compile(r"\bduration(?:_s)?\s*[:=]\s*(?P<v>\d+(?:\.\d+)?)\s*(?P<u>ms|s|m|h)?\b", re.I), float),
    ("runtime", re.compile(r"\bruntime[ _-]boundary\s*[:=]\s*(?P<v>[^;\n]+?)\s*$", re.I), str),
    ("gate", re.compile(r"\bgate\s*[:=]\s*(?P<v>passed|failed|inconclusive|pass|fail)\b", re.I), str),
    # the same in prose: "The gate passed.", "Verdict: **PASS**", "All 15 required rules hold"
    # (soakspec's own PASS line); a negated one ("did not pass") is not this shape
    ("gate", re.compile(r"\b(?:gate|verdict)\s+(?:was\s+|is\s+|has\s+)?(?P<v>passed|failed|inconclusive|green)\b"
                        r"|\bverdict\s*[:=]\s*\**(?P<v2>pass|fail|inconclusive)\b"
                        r"|(?<!\bnot\s)\ball\s+(?:\d+\s+)?(?:of\s+the\s+)?(?:required\s+)?(?:gate\s+)?(?:rules|checks)\s+(?P<v3>passed|held|hold)\b", re.I), str),
]
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def _line_backends(line: str, evidence: Sequence[EvidenceFacts]) -> tuple[EvidenceFacts, ...]:
    named = []
    for ev in evidence:
        variants = {ev.backend, ev.backend.replace("-", " "), ev.backend.replace("_", " ")}
        if any(re.search(rf"(?<![\w-]){re.escape(v)}(?![\w-])", line, re.I) for v in variants):
            named.append(ev)
    return tuple(named) or tuple(evidence)


def _sentence_at(doc: Document, starts: list[int], pos: int, line: str) -> str:
    """The sentence holding offset `pos` (its raw text: values in `code` count), else the line."""
    i = bisect.bisect_right(starts, pos) - 1
    if i >= 0 and doc.sentences[i].start <= pos < doc.sentences[i].end:
        return doc.sentence_text(doc.sentences[i], masked=False)
    return line


def _prose_statements(doc: Document, evidence: Sequence[EvidenceFacts], skip: set[int]) -> list[Stated]:
    out: list[Stated] = []
    starts = [s.start for s in doc.sentences]
    by_level = any(ev.levels for ev in evidence)
    for i, line in enumerate(doc.lines):
        lineno = i + 1
        if lineno in skip or lineno in doc.code_lines or lineno in doc.quote_lines:
            continue
        off = doc.line_offset(lineno)
        cands = _line_backends(line, evidence)
        for kind, rx, conv in _PROSE:
            for m in rx.finditer(line):
                g = next(n for n in ("v", "v2", "v3") if n in rx.groupindex and m.group(n) is not None)
                value = conv(m.group(g))
                if kind == "duration":
                    value = float(value) * _DURATION_UNITS.get((m.group("u") or "s").lower(), 1.0)  # type: ignore[arg-type]
                span = doc.span(off + m.start(g), off + m.end(g))
                context = _sentence_at(doc, starts, off + m.start(g), line) if by_level and kind in _LEVEL_KINDS else None
                out.append(Stated(kind, value, m.group(g), span, cands, context))
    return out


# ---------------------------------------------------------------- the checks

def stated_finding(st: Stated, path: str, known: frozenset[str] = frozenset()) -> Diagnostic | None:
    """The finding on one stated value (a count, the verdict, a commit, ...): CB201 where the
    evidence records another, CB202 for a commit or revision it records none of (`known`: the
    hashes it does know). `check_evidence`'s check of prose and tables, and `figures`' of a
    soakspec bench block's `Verdict:` line -- one rule, fenced or not."""
    label = _FIELD_LABEL[st.kind]
    named = _level_check(st) if st.context is not None else None
    if named is not None:  # the sentence or row names a level: that level's figure (or the total)
        holds, rec = named
        if holds:
            return None
        return Diagnostic(
            "CB201", f"states {label} {_fmt(st.kind, st.value)}{for_backend(st.backends)}; the evidence records {rec}", st.span, path,
            hint="correct the document from the evidence (lint-claims never rewrites)",
        )  # fmt: skip
    if st.per_level:
        return None  # a per-level row naming no level the evidence has: not a claim about the totals
    recorded = [(ev, _recorded(ev, st.kind)) for ev in st.backends]
    recorded = [(ev, r) for ev, r in recorded if r is not None]
    if not recorded:
        if st.kind in ("commit", "revision") and str(st.value).lower() not in known:
            # a specific commit (revision) cited where the evidence records none: nothing supports it
            who = ", ".join(ev.backend for ev in st.backends)
            return Diagnostic(
                "CB202", f"{label} {st.text} appears nowhere in the evidence (it records no {label} for {who})", st.span, path,
                hint=f"cite the {label} the evidence records (`soakspec report` shows it); evidence that recorded none "
                f"supports no claim of a specific {label}",
            )  # fmt: skip
        return None
    if any(_matches(st.kind, st.value, r) for _, r in recorded):
        return None
    if st.kind in ("completed", "failed", "timeouts") and len(st.backends) > 1 and len(recorded) == len(st.backends):
        if st.value in _totals([(ev, int(r)) for ev, r in recorded]):  # type: ignore[call-overload]
            return None  # the total over the backends (one run of each)
    rec = "; ".join(f"{run_name(ev, st.backends)}: {_fmt(st.kind, r)}" for ev, r in recorded)
    who = for_backend([ev for ev, _ in recorded])
    return Diagnostic(
        "CB201", f"states {label} {_fmt(st.kind, st.value)}{who}; the evidence records {rec}", st.span, path,
        hint="correct the document from the evidence (lint-claims never rewrites)",
    )  # fmt: skip


def check_evidence(doc: Document, path: str, evidence: Sequence[EvidenceFacts], current_spec_sha256: str | None = None) -> list[Diagnostic]:
    """CB201 (a stated value differs from the evidence) and CB202 (a SHA-256 the evidence does
    not record; a commit or revision cited where it records none)."""
    if not evidence:
        return []
    by_key = by_backend(evidence)
    unknown: list[tuple[str, Span]] = []
    table, table_lines = _table_statements(doc, by_key, unknown)
    statements = table + _prose_statements(doc, evidence, table_lines | bench_lines(doc))  # a bench block: `figures`
    out: list[Diagnostic] = []
    names = ", ".join(dict.fromkeys(ev.backend for ev in evidence))
    for name, span in unknown:  # a results row for a backend that was not run
        out.append(Diagnostic(
            "CB301", f'reports results for backend "{name}", which the evidence does not record (backends: {names})', span, path,
            hint="report only the backends the evidence ran; a row that sums them can be named 'combined' or 'total'",
        ))  # fmt: skip
    flagged: set[tuple[int, int]] = set()
    known = set().union(*(ev.known_hashes() for ev in evidence))
    if current_spec_sha256:
        known.add(current_spec_sha256.lower())
    for st in statements:
        d = stated_finding(st, path, frozenset(known))
        if d is not None:
            out.append(d)
            flagged.add((st.span.line, st.span.column))

    for m in _HEX64.finditer(doc.text):
        span = doc.span(m.start(), m.end())
        if m.group(0).lower() in known or (span.line, span.column) in flagged:
            continue
        out.append(
            Diagnostic(
                "CB202",
                f"SHA-256 {m.group(0)} appears nowhere in the evidence",
                span,
                path,
                hint="cite hashes from the evidence manifest (soakspec verify re-hashes them)",
            )
        )
    return out


def _evidence_span(doc: Document, low: str, ev: EvidenceFacts) -> Span:
    """Where a finding about a whole evidence directory goes: the first place the document cites
    one of its hashes, else line 1."""
    hashes = [h for h in [ev.report_sha256, *ev.artifact_sha256.values(), ev.spec_sha256] if h]
    where = [w for w in (low.find(h.lower()) for h in hashes) if w >= 0]
    if where:
        return doc.span(min(where), min(where) + 64)
    return doc.line_span(1) if doc.text.strip() else Span(1, 1, 1, 1)


MAX_STORED_MISMATCHES = 5  # CB402 names this many disagreements of one evidence directory, then counts


def check_stored(doc: Document, path: str, evidence: Sequence[EvidenceFacts]) -> list[Diagnostic]:
    """CB402 (a warning): the run's stored results.json / verdict.json disagree with the evidence
    re-judged, or with themselves. The document was checked against the re-judged evidence (see
    `adapters.load_evidence_facts`); this says the stored files are not to be believed."""
    out: list[Diagnostic] = []
    seen: set[str] = set()
    low = doc.text.lower()
    for ev in evidence:
        key = ev.source or f"backend {ev.backend}"
        if not ev.stored_mismatch or key in seen:
            continue
        seen.add(key)
        src = f"{ev.source}: " if ev.source else ""
        shown = list(ev.stored_mismatch[:MAX_STORED_MISMATCHES])
        more = len(ev.stored_mismatch) - len(shown)
        out.append(
            Diagnostic(
                "CB402",
                src + "; ".join(shown) + (f"; and {more} more" if more > 0 else ""),
                _evidence_span(doc, low, ev),
                path,
                Severity.WARNING,
                hint="results.json and verdict.json are not hashed (`soakspec verify` checks only their binding "
                "to the manifest); where the evidence can be re-judged, the document is checked against it "
                "(what `soakspec gate` and `soakspec report` show), not against these files",
            )
        )
    return out


def check_stale(doc: Document, path: str, evidence: Sequence[EvidenceFacts], current_spec_sha256: str | None) -> list[Diagnostic]:
    """CB401: evidence produced from a different spec than the current one."""
    if not current_spec_sha256:
        return []
    out: list[Diagnostic] = []
    seen: set[tuple[str, str]] = set()
    low = doc.text.lower()
    for ev in evidence:
        if not ev.spec_sha256 or ev.spec_sha256.lower() == current_spec_sha256.lower():
            continue
        key = (ev.source or f"backend {ev.backend}", ev.spec_sha256.lower())  # one per evidence dir
        if key in seen:
            continue
        seen.add(key)
        span = _evidence_span(doc, low, ev)
        src = f" ({ev.source})" if ev.source else ""
        out.append(
            Diagnostic(
                "CB401",
                f"stale evidence{src}: backend {ev.backend} was run from spec sha256 {ev.spec_sha256}, "
                f"but the current spec is {current_spec_sha256}",
                span,
                path,
                hint="re-run the soak with the current spec, or cite evidence produced from it",
            )
        )
    return out
