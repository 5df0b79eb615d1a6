"""The end-of-run summary `soakspec run` prints after the verdict's rule lines.

    summary_lines(results, run_dir, verdict) -> list[str]    the text form (stdout)
    summary_json(results, run_dir, verdict)  -> dict         `--format json`'s `run_summary` member

Both come from results.json's shape (`summarize_run`), through `common.level_rows` -- the rows
the Markdown and HTML per-level tables show -- so the terminal, the reports and results.json
cannot disagree; nothing here computes a statistic. Per backend and level:

  offered      the offered load (`4 req/s (open loop)`, `concurrency 4`); an open loop whose
               seeded schedule put another rate in the measured window, that rate with the
               nominal beside it (`44.4 req/s scheduled (open loop, 40 nominal)`; `--format
               json`: `scheduled_rate` beside the nominal `offered_rate`)
  req/s        achieved: requests completed per second (the buckets' qps -- the requests that
               ended in each bucket, whenever they started -- weighted by wall time)
  tok/s        output tokens per second of those requests (likewise)
  in flight    mean requests in flight (likewise)
  TTFT / ITL / TPOT / latency   mean, and p50 / p95 / p99 (or the percentiles `--percentiles`
               chose among those results.json stores), over the level's completed requests
               (ITL: every token gap pooled); `--format json` gives mean, p50, p90, p95, p99
  completed / failed / timeouts / rejected / disconnected   measured requests by outcome

then a note for each level whose ITL gaps are 5% coalesced or more (`COALESCED_NOTE_SHARE`),

and a last line naming the command that renders the full report (`soakspec report DIR
--format html`).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from soakspec.report import common as C

SCHEMA_VERSION = 1
PCTS = C.DEFAULT_PERCENTILES
JSON_FIGURES = ("mean", "p50", "p90", "p95", "p99")  # run_summary's per metric: every one results.json stores
COUNTS = (("completed", "completed"), ("failed", "failed"), ("timeout", "timeouts"), ("rejected", "rejected"),
          ("disconnected", "disconnected"))
# report/common.py DISTS, named as this plain-text summary writes them: a word in lower case, an acronym as it is
DISTS = tuple((key, name if name.isupper() else name.lower()) for key, name in C.DISTS)


def report_command(run_dir: Any) -> str:
    return f"soakspec report {shlex.quote(str(run_dir))} --format html --out report.html"


def _pcts(d: Mapping[str, Any] | None) -> dict[str, float | None]:
    """A metric's figures for run_summary: None each where the level has no sample (or an older
    results.json lacks p90)."""
    return {p: (C.num(d.get(p)) if d else None) for p in JSON_FIGURES}


def level_json(lv: C.LevelRow) -> dict[str, Any]:
    out: dict[str, Any] = {
        "backend": lv.backend, "workload": lv.workload, "level": lv.level, "label": lv.label,
        "offered": lv.offered, "offered_rate": lv.offered_rate, "scheduled_rate": lv.scheduled_rate, "achieved_rate": lv.qps,
        "output_tokens_per_s": lv.tokens_per_s, "total_tokens_per_s": lv.total_tokens_per_s, "mean_in_flight": lv.in_flight,
        # bench serve's two peaks (results.json's, as the bench block and the reports show them)
        "peak_output_tokens_per_s": lv.peak_tokens_per_s, "peak_concurrent_requests": lv.peak_concurrent,
    }
    for key, _ in DISTS:
        out[key] = _pcts(getattr(lv, key))
    out["requests"] = {name: C.as_int(lv.requests.get(key)) for key, name in COUNTS}
    return out


def summary_json(results: Mapping[str, Any], run_dir: Any, verdict: Any = None) -> dict[str, Any]:
    judged = None if verdict is None else not C.performance_not_evaluated(verdict)
    return {"schema_version": SCHEMA_VERSION, "levels": [level_json(lv) for lv in C.level_rows(results)],
            "performance_evaluated": judged, "report_command": report_command(run_dir)}


def _secs(v: float | None) -> str:
    if v is None:
        return "-"
    ms = v * 1000
    return f"{ms:.1f}" if ms < 100 else f"{ms:.0f}"


def _trio(d: Mapping[str, Any] | None, keys: Sequence[str] = PCTS) -> str:
    vals = [C.num(d.get(p)) if d else None for p in keys]
    return " / ".join((C.approx(d, p) if v is not None else "") + _secs(v) for p, v in zip(keys, vals)) \
        if any(v is not None for v in vals) else "-"


def _mean(d: Mapping[str, Any] | None) -> str:
    """A metric's mean in ms (over the samples its percentiles use); "-" where the level has none."""
    return _secs(C.num(d.get("mean")) if d else None)


def _whole(v: int | None) -> str:
    """A whole figure (a count, a peak), "-" for none."""
    return "-" if v is None else str(v)


def _rate(v: float | None, digits: int) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> list[str]:
    widths = [max(len(head[i]), *(len(r[i]) for r in rows)) for i in range(len(head))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)).rstrip()

    return [line(head)] + [line(r) for r in rows]


# A level whose ITL gaps are this share coalesced or more gets a note under the tables: its ITL
# percentiles (0 ms where most gaps are) are not independent samples, and a reader of the terminal
# has no other sign of it (the reports say it beside every ITL cell, the client-health table too).
COALESCED_NOTE_SHARE = 0.05


def _coalesced_notes(levels: Sequence[C.LevelRow]) -> list[str]:
    """"note: ITL of sim-fast · rate 1500: 6,200 of 10,000 gaps (62%) coalesced ..." for each
    level at COALESCED_NOTE_SHARE or more."""
    out = []
    for lv in levels:
        co = lv.itl_coalesced or {}
        gaps, n = C.as_int(co.get("gaps")), C.as_int(co.get("coalesced"))
        if gaps and n is not None and n / gaps >= COALESCED_NOTE_SHARE:
            out.append(f"note: ITL of {lv.backend} · {lv.label}: {n:,} of {gaps:,} gaps ({n / gaps:.0%}) coalesced -- tokens "
                       "that arrived together (one read, or a chunk of several tokens), their gaps split rather than "
                       "measured: its ITL percentiles are not independent samples (the report's client health says "
                       "whether the client read late)")
    return [""] + out if out else []


def summary_lines(results: Mapping[str, Any], run_dir: Any, verdict: Any = None, percentiles: Sequence[str] = PCTS) -> list[str]:
    """Two aligned tables (rates and counts; latency means and percentiles -- `percentiles`,
    results.json keys -- in ms) and the report line; with `verdict`, a note when its
    performance rules were not evaluated (figures measured, not judged)."""
    levels = C.level_rows(results)
    out = []
    if levels and verdict is not None and C.performance_not_evaluated(verdict):
        out += ["", C.NOT_EVALUATED_NOTE]
    if levels:
        names = [[lv.backend, lv.label] for lv in levels]
        offered = any(lv.offered != lv.label for lv in levels)  # a closed loop's level is its offered load
        rates = [n + ([lv.offered] if offered else []) + [_rate(lv.qps, 2), _rate(lv.tokens_per_s, 1), _whole(lv.peak_tokens_per_s),
                                                          _rate(lv.total_tokens_per_s, 1), _rate(lv.in_flight, 2), _whole(lv.peak_concurrent)]
                 + [_whole(C.as_int(lv.requests.get(k))) for k, _ in COUNTS]
                 for n, lv in zip(names, levels)]
        # bench serve's two peaks beside the means they top, headed as lint-claims reads them (`claims.figures`)
        head = (["backend", "level"] + (["offered"] if offered else [])
                + ["req/s", "tok/s", "peak tok/s", "total tok/s", "in flight", "peak concurrent requests"] + [n for _, n in COUNTS])
        left = 3 if offered else 2
        out += ["", "per level (results.json):"]
        out += ["  " + x for x in _table(head, rates, [False] * left + [True] * (len(head) - left))]
        lat = [n + [c for key, _ in DISTS for c in (_mean(getattr(lv, key)), _trio(getattr(lv, key), percentiles))]
               for n, lv in zip(names, levels)]
        head = ["backend", "level"] + [h for _, name in DISTS for h in (f"{name} mean ms", C.pct_head(name, percentiles, "/") + " ms")]
        out += [""] + ["  " + x for x in _table(head, lat, [False, False] + [True] * (2 * len(DISTS)))]
        out += _coalesced_notes(levels)
    out += ["", f"full report: {report_command(run_dir)}"]
    return [C.clean_text(x) for x in out]


__all__ = ["report_command", "summary_json", "summary_lines"]
