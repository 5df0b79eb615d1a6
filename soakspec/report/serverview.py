"""The server's side of a report: its own /metrics per bucket and its process tree's CPU.

`html_charts(b, verdict, spec)` gives one backend's charts (one per server metric a rule
names -- or, when no rule names one, the queue gauges vLLM and SGLang expose -- and the CPU
chart), each with its rules' threshold lines and failing buckets, from results.json's
`server_metrics` and per-bucket `cpu` (`soakspec.judge.servermetrics.results_section`).
`md_lines(results, spec)` gives the Markdown section: per backend, how the scrapes went ("not
available" for a server without /metrics) and each charted family's per-bucket range.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from soakspec.judge.common import plural, rule_display
from soakspec.report import common as C
from soakspec.report.charts import Band, Mark, Series, Threshold, broken_at, empty_chart, line_chart

# charted when no rule names a server metric (the first of each pair the server exposes)
DEFAULT_CHARTS = (("vllm:num_requests_running", "sglang:num_running_reqs"), ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
                  ("vllm:kv_cache_usage_perc", "sglang:token_usage"))
_num = C.num


def _rules(spec: Any) -> list[Any]:
    return [r for r in getattr(getattr(spec, "gate", None), "rules", ()) if r.klass == "performance"]


def charted_families(b: Mapping[str, Any], spec: Any) -> list[str]:
    """The families to chart for one backend of results.json: those its rules name, else the
    default queue and cache gauges the server exposes."""
    sm = b.get("server_metrics") if isinstance(b.get("server_metrics"), Mapping) else {}
    have = sm.get("families") if isinstance(sm.get("families"), Mapping) else {}
    named = [f for r in _rules(spec) if r.backend in (None, b.get("name")) for f in (r.expr.server, r.expr.over) if f]
    out = list(dict.fromkeys(named))  # both counters of a ratio(server(...), server(...))
    if not out:
        for pair in DEFAULT_CHARTS:
            out += [next(n for n in pair if n in have)] if any(n in have for n in pair) else []
    return out


def _lookup(have: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    for n in (name, name + "_total", name[:-6] if name.endswith("_total") else None):
        if n is not None and isinstance(have.get(n), Mapping):
            return have[n]
    return None


def _windows(b: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    ws = [w for w in b.get("buckets") or [] if isinstance(w, Mapping) and _num(w.get("started")) is not None
          and _num(w.get("ended")) is not None]
    return sorted(ws, key=lambda w: w["started"])


def _frame(ws: Sequence[Mapping[str, Any]]) -> tuple[float, float, list[Band], list[tuple[Any, Any]], list[float]]:
    t0 = ws[0]["started"]
    bands: list[Band] = []
    keys: list[tuple[Any, Any]] = []
    for w in ws:
        key = (w.get("workload"), w.get("level"))
        if bands and keys[-1] == key:
            bands[-1] = Band(bands[-1].x0, w["ended"] - t0, bands[-1].label)
        else:
            bands.append(Band(w["started"] - t0, w["ended"] - t0, C.one_line(w.get("level_label") or f"level {w.get('level')}")))
        keys.append(key)
    return t0, max(w["ended"] for w in ws) - t0, bands, keys, [((w["started"] + w["ended"]) / 2 - t0) for w in ws]


def _overlays(verdict: Any, spec: Any, backend: str, t0: float, want) -> tuple[list[Threshold], list[Mark]]:
    """Threshold lines of the plain rules `want(rule)` selects, and the buckets where they failed."""
    rules = [r for r in _rules(spec) if want(r) and r.backend in (None, backend)]
    lines = [Threshold(float(r.threshold), C.one_line(r.text or r.expr.text)) for r in rules
             if r.threshold is not None and r.expr.wrapper is None and r.expr.agg not in ("count", "rate")]
    texts = {rule_display(r) for r in rules}
    marks: list[Mark] = []
    seen = set()
    for res in getattr(verdict, "rules", ()):
        if res.rule not in texts or res.status not in ("fail", "warn"):
            continue
        for where in [d.where for d in res.details if d.status in ("fail", "warn")] + ([res.where] if res.where else []):
            if where.backend != backend or where.start is None or where.end is None or (where.start, where.end) in seen:
                continue
            seen.add((where.start, where.end))
            marks.append(Mark(where.start - t0, where.end - t0, f"{res.rule}: {res.status_word} — {where.text}"))
    return lines, marks


_SERIES = {"gauge": (("mean", "#1f77b4", None), ("max", "#d62728", "4 3")),
           "counter": (("rate", "#2ca02c", None),),
           "histogram": (("mean", "#1f77b4", None), ("p99", "#d62728", "4 3")),
           "summary": (("mean", "#1f77b4", None),)}
# the y axis: what a point is (the legend says which statistic of the bucket)
_WHAT = {"gauge": "value in the bucket", "counter": "per second", "histogram": "observation", "summary": "observation"}


def _value(e: Any, key: str) -> float | None:
    if not isinstance(e, Mapping):
        return None
    v = e.get(key)
    if isinstance(v, Mapping):
        # a quantile in the +Inf bucket ([lo, null]) is only a lower bound: not drawn as a value
        return None if _beyond(v) else _num(v.get("value"))
    return _num(v)


def _beyond(q: Mapping[str, Any]) -> bool:
    """A per-bucket quantile estimate that fell in the histogram's +Inf bucket."""
    bd = q.get("bucket")
    return isinstance(bd, list) and len(bd) == 2 and bd[1] is None and _num(bd[0]) is not None


def html_charts(b: Mapping[str, Any], verdict: Any = None, spec: Any = None) -> list[str]:
    """One backend's server-metric charts and its CPU chart (see the module docstring)."""
    name = C.one_line(b.get("name"))
    ws = _windows(b)
    sm = b.get("server_metrics") if isinstance(b.get("server_metrics"), Mapping) else {}
    have = sm.get("families") if isinstance(sm.get("families"), Mapping) else {}
    fams = charted_families(b, spec)
    if not ws:
        return [empty_chart(name, f"server:{f}", f, "no bucket with a known time window") for f in fams]
    t0, x_max, bands, keys, mids = _frame(ws)
    out = []
    if not fams:  # nothing to chart: say why (not available, failing, off)
        out.append(empty_chart(name, "server", "Server metrics", scrape_status(sm) or "the server exposes none of the default families"))
    for fam in fams:
        f = _lookup(have, fam)
        metric = f"server:{fam}"
        if f is None:
            status = scrape_status(sm)  # the Markdown report says it on the backend's line above
            out.append(empty_chart(name, metric, fam, absent_family(sm) + (f"; {status}" if status else "")))
            continue
        kind = str(f.get("type"))
        per = f.get("per_bucket") if isinstance(f.get("per_bucket"), Mapping) else {}
        vals = [per.get(f"{w.get('workload')}:{w.get('level')}:{w.get('bucket')}") for w in ws]
        series = [Series(label, broken_at([(x, _value(e, label)) for x, e in zip(mids, vals)], keys), color, dash)
                  for label, color, dash in _SERIES.get(kind, _SERIES["gauge"])]
        lines, marks = _overlays(verdict, spec, name, t0, lambda r, fam=fam: r.expr.server == fam and r.expr.over is None)
        # (a ratio's threshold is a share, not a level of either counter it divides: not drawn on them)
        out.append(line_chart(name, metric, fam, _WHAT.get(kind, kind), series, bands, x_max,
                              lambda v: f"{v:.4g}", empty=f"no scrape of {fam} inside a bucket", thresholds=lines, marks=marks))
    cpu = [(_num((w.get("cpu") or {}).get("mean")), _num((w.get("cpu") or {}).get("max"))) if isinstance(w.get("cpu"), Mapping)
           else (None, None) for w in ws]
    if not any(v is not None for pair in cpu for v in pair):
        out.append(empty_chart(name, "cpu", "Server CPU", "no CPU telemetry of the server's processes (a url backend's process is not soakspec's to see)"))
        return out
    series = [Series("mean", broken_at([(x, m * 100 if m is not None else None) for x, (m, _) in zip(mids, cpu)], keys), "#1f77b4"),
              Series("max", broken_at([(x, m * 100 if m is not None else None) for x, (_, m) in zip(mids, cpu)], keys), "#d62728", "4 3")]
    lines, marks = _overlays(verdict, spec, name, t0, lambda r: r.expr.metric == "cpu")
    out.append(line_chart(name, "cpu", "Server CPU (process tree; 100% = one core)", "%", series, bands, x_max,
                          lambda v: f"{v:.1f}%", thresholds=[Threshold(t.y * 100, t.label) for t in lines], marks=marks))
    return out


def scrape_status(sm: Mapping[str, Any] | None) -> str | None:
    """`not available: /metrics answered HTTP 404` and the like; None when the scrapes went fine."""
    if not isinstance(sm, Mapping) or not sm:
        return "no server metrics recorded (metrics off)"
    status, path = sm.get("status"), sm.get("path") or "/metrics"
    if status == "not available":
        return f"server metrics not available: {path} answered {sm.get('first_error')}"
    if sm.get("failed"):
        return f"{sm.get('failed')} of {sm.get('scrapes')} scrapes of {path} failed; first: {C.one_line(sm.get('first_error'))}"
    return None


def absent_family(sm: Mapping[str, Any]) -> str:
    """Why a charted family has no values, as both reports say it: the server answered and did
    not expose it, or no scrape succeeded, so whether it does is unknown."""
    path = C.one_line(sm.get("path") or "/metrics")
    scrapes, failed = _num(sm.get("scrapes")), _num(sm.get("failed")) or 0
    if scrapes is not None and scrapes > failed and sm.get("status") != "not available":
        return "not exposed by the server"
    return f"unknown (no scrape of {path} succeeded)"


def _fmt(v: float | None) -> str:
    return "—" if v is None else f"{v:.4g}"


_NONFINITE = {"+Inf": math.inf, "-Inf": -math.inf}  # results.json's text for a gauge's infinity (JSON has none)


def _md_range(entries: Sequence[Mapping[str, Any]], key: str) -> str:
    """The per-bucket `key` values' range as the Markdown report gives it: "+Inf" / "-Inf" (a
    gauge's infinity, as results.json and the server's text format write it) are values and
    bound the range, and the scrapes the server answered NaN in (no value: `nan_scrapes`) are
    counted beside it -- neither left out silently (the chart cannot draw them; the text says them)."""
    vals = []
    for e in entries:
        x = e.get(key)
        v = _value(e, key) if isinstance(x, Mapping) else _NONFINITE.get(x) if isinstance(x, str) else _num(x)
        if v is not None:
            vals.append(v)
    nan = [n for e in entries if isinstance(n := e.get("nan_scrapes"), int) and not isinstance(n, bool) and n > 0]

    def show(v: float) -> str:
        return ("+Inf" if v > 0 else "-Inf") if math.isinf(v) else _fmt(v)

    rng = f"{show(min(vals))} to {show(max(vals))}" if vals else "no bucket value"
    return rng + (f"; NaN (the server's no value) in {plural(sum(nan), 'scrape')} of {plural(len(nan), 'bucket')}" if nan else "")


def md_lines(results: Mapping[str, Any], spec: Any = None) -> list[str]:
    """The Markdown report's "Server metrics" section (empty when no backend has any)."""
    from soakspec.report.md import md_code, md_text

    out: list[str] = []
    for b in results.get("backends") or []:
        if not isinstance(b, Mapping):
            continue
        cpu = [w["cpu"] for w in b.get("buckets") or [] if isinstance(w, Mapping) and isinstance(w.get("cpu"), Mapping)]
        means = [v for c in cpu if (v := _num(c.get("mean"))) is not None]
        peaks = [v for c in cpu if (v := _num(c.get("max"))) is not None]
        if means and peaks:
            out.append(f"- {md_code(b.get('name'), table=False)} server CPU (process tree, 100% = one core): per-bucket mean "
                       f"{min(means) * 100:.0f}% to {max(means) * 100:.0f}%, peak {max(peaks) * 100:.0f}%")
        if not isinstance(b.get("server_metrics"), Mapping):
            continue
        sm = b["server_metrics"]
        have = sm.get("families") if isinstance(sm.get("families"), Mapping) else {}
        status = scrape_status(sm) or f"{sm.get('scrapes')} scrapes of {sm.get('path') or '/metrics'}, none failed"
        out.append(f"- {md_code(b.get('name'), table=False)}: {md_text(status)}")
        for fam in charted_families(b, spec):
            f = _lookup(have, fam)
            if f is None:  # absent from what the server answered; or never answered: then unknown
                out.append(f"  - {md_code(fam, table=False)}: {md_text(absent_family(sm))}")
                continue
            kind = str(f.get("type"))
            key = _SERIES.get(kind, _SERIES["gauge"])[0][0]
            rng = _md_range([e for e in (f.get("per_bucket") or {}).values() if isinstance(e, Mapping)], key)
            res = ""
            if kind == "histogram":
                bounds = [e.get("p99", {}).get("bucket") for e in (f.get("per_bucket") or {}).values() if isinstance(e, Mapping)]
                widest = max((bd for bd in bounds if isinstance(bd, list) and _num(bd[0]) is not None and _num(bd[1]) is not None), key=lambda bd: bd[1] - bd[0], default=None)
                res = f"; p99 estimated within its histogram bucket (widest {widest[0]:g} to {widest[1]:g})" if widest else ""
                qs = [q for e in (f.get("per_bucket") or {}).values() if isinstance(e, Mapping) and isinstance(q := e.get("p99"), Mapping)]
                if over := [q for q in qs if _beyond(q)]:
                    top = max(_num(q["bucket"][0]) for q in over)  # type: ignore[type-var]
                    res += (f"; p99 above the histogram's largest finite bound ({top:g}) in {len(over)} of "
                            f"{plural(len(qs), 'bucket')}: a lower bound, not charted")
            out.append(f"  - {md_code(fam, table=False)} ({md_text(kind)}): per-bucket {key} {rng}{res}")
    if not out:
        return []
    return ["### Server metrics and CPU", "", *out, ""]


__all__ = ["charted_families", "html_charts", "md_lines", "scrape_status"]
