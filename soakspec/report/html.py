"""`--format html`: one self-contained page.

No script, no stylesheet link, no font, no image: inline CSS and inline SVG charts drawn by
`soakspec.report.charts`, and a Content-Security-Policy of `default-src 'none'` so a browser
would refuse any network fetch even if something slipped through. Every string from the
evidence or the spec is escaped with `html.escape` (evidence is untrusted input).

Sections: the verdict and its summary; how the run went when it did not simply complete (abort
time and reason, crash diagnosis, a failed pre-flight: `<ul class="run-state">`); the
results table (the md report's columns: each
backend's own status, rejected and disconnected counts, the runtime boundary's status); the
per-level table (offered vs achieved rate, percentiles, every outcome count; marked when the
performance rules were not evaluated); per backend, one chart per metric in `CHART_METRICS`,
each a value per bucket over time (x = seconds since the backend's first bucket, levels
shaded, a gap between levels, `<line class="threshold">` at the threshold of every plain rule
on that metric, `<rect class="failing-bucket">` over each bucket where a rule failed, offered
rate beside achieved on the qps chart); the rules table; provenance and workload; the claim
boundary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from soakspec.report import common as C
from soakspec.report.charts import Band, Mark, Series, Threshold, bar_chart, broken_at, empty_chart, esc, line_chart
from soakspec.report.serverview import html_charts as server_charts

CHART_METRICS = ("ttft", "itl", "throughput", "qps", "failures", "gpu_memory", "rss", "client")
FAILURE_KINDS = (("failed", "failed", "#d62728"), ("timeout", "timeouts", "#ff7f0e"),
                 ("rejected", "rejected", "#9467bd"), ("disconnected", "disconnected", "#7f7f7f"))
PCT_COLORS = (("p50", "#1f77b4"), ("p95", "#ff7f0e"), ("p99", "#d62728"))

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:24px;color:#1b1f23;background:#fff}
h1{font-size:22px;margin:0 0 6px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
h3{font-size:15px;margin:18px 0 6px}
.badge{display:inline-block;padding:2px 10px;border-radius:12px;font-weight:600;color:#fff;margin-right:8px}
.PASS{background:#1a7f37}.FAIL{background:#cf222e}.INCONCLUSIVE{background:#9a6700}
table{border-collapse:collapse;margin:8px 0;font-size:13px}th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa}td.num{text-align:right;font-variant-numeric:tabular-nums}code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px}
tr.s-fail td{background:#ffebe9}tr.s-inconclusive td,tr.s-not_evaluated td{background:#fff8c5}tr.s-warn td{background:#fff1e5}
.status{font-weight:600}.details{margin:4px 0 0 0;padding-left:18px;color:#57606a}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(380px,1fr));gap:10px}
svg.chart{background:#fff;width:100%;height:auto}
svg .frame{fill:none;stroke:#d0d7de}svg .grid{stroke:#eaeef2}svg .axis{stroke:#57606a}
svg .tick{font-size:10px;fill:#57606a}svg .ctitle{font-size:12px;font-weight:600;fill:#1b1f23}
svg .legend{font-size:10px;fill:#1b1f23}svg .blabel{font-size:10px;fill:#57606a}svg .empty{font-size:13px;fill:#57606a}
svg .band0{fill:#f6f8fa}svg .band1{fill:#eef3f8}
svg .failing-bucket{fill:#cf222e;fill-opacity:.18;stroke:#cf222e;stroke-width:1.5}
svg .warn-bucket{fill:#d4a72c;fill-opacity:.10;stroke:#9a6700;stroke-width:1;stroke-dasharray:3 2}
svg .threshold{stroke:#cf222e;stroke-width:1.5;stroke-dasharray:6 3}svg .tlabel{font-size:10px;fill:#cf222e;paint-order:stroke;stroke:#fff;stroke-width:3px;stroke-linejoin:round}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:8px 0}dl.facts dt{color:#57606a}dl.facts dd{margin:0}
.note{color:#57606a;font-size:12px}
td.boundary-bad{color:#cf222e;font-weight:700}tr.own-failed td.own{color:#cf222e;font-weight:600}
tr.own-inconclusive td.own{color:#9a6700}ul.run-state{background:#fff8c5;border:1px solid #d4a72c;padding:6px 6px 6px 26px}tr.level-gap td{border-top:3px solid #57606a}
div.wide{overflow-x:auto}table.levels{font-size:12px}table.levels th,table.levels td{padding:4px 5px}
table.levels td.num,table.levels td.offered,table.levels code{white-space:nowrap}
"""


_num = C.num
# no fetch of any kind (script, style sheet, font, image, frame): only the page's inline style
CSP_META = "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">"


# ------------------------------------------------------------------------------ charts


def _time_scale(values: Sequence[float]) -> tuple[float, str]:
    m = max(values, default=0.0)
    return (1000.0, "ms") if m < 1 else (1.0, "s")


def _size_scale(values: Sequence[float]) -> tuple[float, str]:
    m = max(values, default=0.0)
    for unit, f in (("TiB", 1024.0**4), ("GiB", 1024.0**3), ("MiB", 1024.0**2), ("KiB", 1024.0)):
        if m >= f:
            return f, unit
    return 1.0, "B"


CHART_OF = {"ttft": "ttft", "itl": "itl", "throughput": "throughput", "qps": "qps", "rss": "rss",
            "gpu_memory": "gpu_memory", "gpu_memory_device": "gpu_memory"}  # rule metric -> its chart; others: failures


def rule_overlays(verdict: Any, spec: Any, backend: str, t0: float) -> tuple[dict[str, list[tuple[float, str]]], dict[str, list[Mark]]]:
    """(chart -> [(threshold in base units, rule text)], chart -> failing-bucket marks) for one
    backend: the thresholds of the spec's plain comparisons (not drift/slope) on charted
    metrics, and the buckets (or levels) where a rule failed, from the verdict's instances."""
    thresholds: dict[str, list[tuple[float, str]]] = {}
    marks: dict[str, list[Mark]] = {}
    rules = [r for r in getattr(getattr(spec, "gate", None), "rules", ()) if r.klass == "performance"]
    for r in rules:
        chart = CHART_OF.get(r.expr.metric)
        if chart and r.threshold is not None and r.expr.wrapper is None and r.backend in (None, backend):
            thresholds.setdefault(chart, []).append((float(r.threshold), C.one_line(r.text or r.expr.text)))
    for res in verdict.rules:
        if res.status not in ("fail", "warn") or res.metric in ("server", "cpu"):  # charted by report/serverview.py
            continue
        chart = CHART_OF.get(res.metric or "", "failures")
        seen = set()
        for where in [d.where for d in res.details if d.status in ("fail", "warn")] + ([res.where] if res.where else []):
            if where.backend != backend or where.start is None or where.end is None:
                continue
            key = (where.start, where.end)
            if key in seen:
                continue
            seen.add(key)
            label = f"{res.rule}: {res.status_word} — {where.text}"
            kind = "warn-bucket" if res.status == "warn" else "failing-bucket"
            marks.setdefault(chart, []).append(Mark(where.start - t0, where.end - t0, label, kind))
    return thresholds, marks


def backend_charts(b: Mapping[str, Any], gpu_reason: str | None, verdict: Any = None, spec: Any = None) -> list[str]:
    """One chart per metric of `CHART_METRICS` for one backend of results.json."""
    name = C.one_line(b.get("name"))
    windows = [w for w in b.get("buckets") or [] if isinstance(w, Mapping)
               and _num(w.get("started")) is not None and _num(w.get("ended")) is not None]
    windows.sort(key=lambda w: w["started"])
    if not windows:
        return [empty_chart(name, m, m, "no bucket with a known time window") for m in CHART_METRICS]
    t0 = min(w["started"] for w in windows)
    x_max = max(w["ended"] for w in windows) - t0
    mids = [((w["started"] + w["ended"]) / 2 - t0) for w in windows]
    bands: list[Band] = []
    keys: list[tuple[Any, Any]] = []
    for w in windows:
        key = (w.get("workload"), w.get("level"))
        if keys and keys[-1] == key:
            bands[-1] = Band(bands[-1].x0, w["ended"] - t0, bands[-1].label)
        else:
            keys.append(key)
            bands.append(Band(w["started"] - t0, w["ended"] - t0, C.one_line(w.get("level_label") or f"level {w.get('level')}")))

    lv_keys = [(w.get("workload"), w.get("level")) for w in windows]
    th, marks = rule_overlays(verdict, spec, name, t0) if verdict is not None else ({}, {})

    def lines(metric: str, factor: float = 1.0) -> list[Threshold]:
        return [Threshold(v * factor, label) for v, label in th.get(metric, [])]

    out = []
    for metric, title in (("ttft", "TTFT per bucket"), ("itl", "ITL per bucket")):
        vals = {p: [(_num((w.get(metric) or {}).get(p)) if isinstance(w.get(metric), Mapping) else None) for w in windows]
                for p, _ in PCT_COLORS}
        factor, unit = _time_scale([v for vs in vals.values() for v in vs if v is not None] + [v for v, _ in th.get(metric, [])])
        series = [Series(p, broken_at([(x, v * factor if v is not None else None) for x, v in zip(mids, vals[p])], lv_keys), color)
                  for p, color in PCT_COLORS]
        out.append(line_chart(name, metric, title, unit, series, bands, x_max, lambda v, u=unit: f"{v:.3g} {u}",
                              empty="no completed requests", thresholds=lines(metric, factor), marks=marks.get(metric, ())))
    tps = [_num(w.get("output_tokens_per_s")) for w in windows]
    out.append(line_chart(name, "throughput", "Throughput (output tokens/s)", "tokens/s",
                          [Series("tokens/s", broken_at(list(zip(mids, tps)), lv_keys), "#2ca02c")], bands, x_max,
                          lambda v: f"{v:.1f} tokens/s", thresholds=lines("throughput"), marks=marks.get("throughput", ())))
    qps = [_num(w.get("qps")) for w in windows]
    ramps = {(lv.get("workload"), lv.get("index")) for lv in b.get("levels") or [] if isinstance(lv, Mapping) and C.ramp_range(lv)}
    # a ramp's bucket `rate` is where the ramp ends, not what the bucket offered: no offered point there.
    # An open loop whose schedule the run recorded: the arrivals its schedule put in the bucket
    # (`scheduled_rate`, what it actually offered), not the nominal rate a random schedule only averages
    offered = [_num(w.get("scheduled_rate")) if _num(w.get("scheduled_rate")) is not None
               else None if (w.get("workload"), w.get("level")) in ramps else _num(w.get("rate")) for w in windows]
    qps_series = [Series("achieved", broken_at(list(zip(mids, qps)), lv_keys), "#1f77b4")]
    if any(v is not None for v in offered):
        qps_series.append(Series("offered", broken_at(list(zip(mids, offered)), lv_keys), "#8250df", "5 3"))
    qps_title = "Requests/s: achieved vs offered" if len(qps_series) > 1 else "Completed requests per second"
    out.append(line_chart(name, "qps", qps_title, "req/s", qps_series, bands,
                          x_max, lambda v: f"{v:.2f} req/s", thresholds=lines("qps"), marks=marks.get("qps", ())))
    bars = []
    total_bad = 0
    for w in windows:
        req = w.get("requests") if isinstance(w.get("requests"), Mapping) else {}
        vals = [float(_num(req.get(k)) or 0.0) for k, _, _ in FAILURE_KINDS]
        total_bad += int(sum(vals))
        bars.append((w["started"] - t0, w["ended"] - t0, vals))
    out.append(bar_chart(name, "failures", "Unsuccessful requests per bucket", "requests", bars,
                         [(label, color) for _, label, color in FAILURE_KINDS], bands, x_max,
                         note=None if total_bad else f"no unsuccessful request in {len(windows)} buckets",
                         marks=marks.get("failures", ())))
    for metric, title, missing in (
        ("gpu_memory", "GPU memory of the server's processes", gpu_reason or "no GPU telemetry in these buckets"),
        ("rss", "Server RSS", "no server RSS telemetry"),
    ):
        means = [_num((w.get(metric) or {}).get("mean")) if isinstance(w.get(metric), Mapping) else None for w in windows]
        maxes = [_num((w.get(metric) or {}).get("max")) if isinstance(w.get(metric), Mapping) else None for w in windows]
        known = [v for v in means + maxes if v is not None]
        if not known:
            out.append(empty_chart(name, metric, title, missing))
            continue
        factor, unit = _size_scale(known)
        series = [Series("mean", broken_at([(x, v / factor if v is not None else None) for x, v in zip(mids, means)], lv_keys), "#1f77b4"),
                  Series("max", broken_at([(x, v / factor if v is not None else None) for x, v in zip(mids, maxes)], lv_keys), "#d62728", "4 3")]
        out.append(line_chart(name, metric, title, unit, series, bands, x_max, lambda v, u=unit: f"{v:.3g} {u}",
                              thresholds=lines(metric, 1.0 / factor), marks=marks.get(metric, ())))
    out.append(_client_chart(name, windows, mids, lv_keys, bands, x_max, spec))
    return out


def _client_chart(name: str, windows, mids, lv_keys, bands, x_max: float, spec: Any) -> str:
    """The load generator beside the server: event-loop lag p99 and client CPU per bucket, with
    the gate's client_lag as the threshold line."""
    clients = [w.get("client") if isinstance(w.get("client"), Mapping) else {} for w in windows]
    lag = [_num(c.get("lag_p99")) for c in clients]
    cpu = [_num(c.get("cpu")) for c in clients]
    if not any(v is not None for v in lag + cpu):
        return empty_chart(name, "client", "Load generator health", "no client-health samples (client.jsonl)")
    gate = getattr(spec, "gate", None)
    limit = getattr(gate, "client_lag", 0.05)
    series = [Series("lag p99 (ms)", broken_at([(x, v * 1000 if v is not None else None) for x, v in zip(mids, lag)], lv_keys), "#d62728"),
              Series("CPU (% of a core)", broken_at([(x, v * 100 if v is not None else None) for x, v in zip(mids, cpu)], lv_keys), "#1f77b4", "4 3")]
    return line_chart(name, "client", "Load generator: event-loop lag p99 (ms) and CPU (%)", "ms / %", series, bands, x_max,
                      lambda v: f"{v:.3g}", thresholds=[Threshold(limit * 1000, f"client_lag {limit * 1000:g} ms")])


# ------------------------------------------------------------------------------ page


def _results_table(rows: Sequence[C.BackendRow]) -> list[str]:
    head = ("Backend", "Runtime boundary", "Boundary check", "Completed", "Failed/timeouts", "Rejected", "Disconnected",
            "Buckets", "Own rules", "Artifact SHA-256")
    out = ['<table class="results"><thead><tr>' + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr></thead><tbody>"]
    for r in rows:
        def n(v: int | None) -> str:
            return "-" if v is None else str(v)
        fail = "-" if r.failed is None and r.timeouts is None else f"{n(r.failed)} / {n(r.timeouts)}"
        rt = esc(r.runtime) if r.runtime else "-"
        check = r.boundary_check
        check_cls = "ok" if check in C.BOUNDARY_OK else "bad" if check not in ("-", "not run") else "na"
        own = r.gate.split(":")[0].split(" ")[0]
        out.append(
            f'<tr class="own-{esc(own)}"><td><code>{esc(r.name)}</code></td><td>{rt}</td>'
            f'<td class="boundary-{check_cls}">{esc(check)}</td><td class="num">{n(r.completed)}</td>'
            f'<td class="num">{fail}</td><td class="num">{n(r.rejected)}</td><td class="num">{n(r.disconnected)}</td>'
            f'<td class="num">{n(r.buckets)}</td><td class="own">{esc(r.gate)}</td>'
            f'<td class="mono">{esc(r.artifact_sha256 or "-")}</td></tr>'
        )
    out.append("</tbody></table>")
    return out


def _pct3(d: Mapping[str, Any] | None, keys: Sequence[str] = C.DEFAULT_PERCENTILES) -> str:
    if not d:
        return "-"
    vals = [_num(d.get(k)) for k in keys]
    known = [v for v in vals if v is not None]
    if not known:
        return "-"
    factor, unit = (1000.0, "ms") if max(known) < 1 else (1.0, "s")  # one unit per cell: p50 / p95 / p99 ms
    return " / ".join("-" if v is None else C.approx(d, k) + _sig3(v * factor)
                      for k, v in zip(keys, vals)) + f" {unit}"


def _mean(d: Mapping[str, Any] | None) -> str:
    """A distribution's mean (over the same samples as its percentiles), in ms below 1 s."""
    v = _num(d.get("mean")) if d else None
    if v is None:
        return "-"
    return f"{_sig3(v * 1000)} ms" if v < 1 else f"{_sig3(v)} s"


def _sig3(v: float) -> str:
    """Three significant digits, trailing zeros kept (`1.00`, `19.1`, `100`, `0.675`)."""
    a = abs(v)
    return f"{v:.0f}" if a >= 100 else f"{v:.1f}" if a >= 10 else f"{v:.2f}" if a >= 1 else f"{v:.3f}"


def _rate(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _count(v: int | None) -> str:
    """A whole figure (bench serve's peaks: tokens in one second, requests at once); "-" for none."""
    return "-" if v is None else str(v)


def _coal(lv: Any) -> str:
    co = lv.itl_coalesced
    if isinstance(co, Mapping) and isinstance(co.get("gaps"), int) and co["gaps"]:
        return f'<br><span class="note">{co.get("coalesced", 0):,} of {co["gaps"]:,} gaps coalesced</span>'
    return ""


def level_table(results: Mapping[str, Any], verdict: Any, keys: Sequence[str] = C.DEFAULT_PERCENTILES) -> list[str]:
    """The per-level table: offered vs achieved rate, tokens/s and its peak second, in flight and
    its peak (bench serve's two peaks, "-" where a level has none), each per-request
    metric's mean beside its percentiles (`keys`), counts."""
    rows = C.level_rows(results)
    if not rows:
        return []
    with_label = any(lv.label != lv.offered for lv in rows)  # a closed loop's level label is its offered load
    head = ("Backend", *(("Level",) if with_label else ()), "Offered", "Achieved req/s", "Output tok/s", C.PEAK_TOKENS_HEAD,
            "Total tok/s", "Mean in flight", C.PEAK_CONCURRENT_HEAD,
            *(h for _, name in C.DISTS for h in (f"{name} mean", C.pct_head(name, keys))), "Completed", "Failed", "Timeouts",
            "Rejected", "Disconnected")
    out = []
    if C.performance_not_evaluated(verdict):
        out.append(f'<p class="note not-evaluated">{esc(C.NOT_EVALUATED_NOTE)}</p>')
    out.append('<div class="wide"><table class="levels"><thead><tr>' + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr></thead><tbody>")
    prev = None
    for lv in rows:
        req = lv.requests
        cls = ' class="level-gap"' if prev is not None and prev != lv.backend else ""
        prev = lv.backend
        counts = "".join(f'<td class="num">{esc(req.get(k, "-"))}</td>' for k in ("completed", "failed", "timeout", "rejected", "disconnected"))
        dists = "".join(f'<td class="num">{_mean(getattr(lv, key))}</td><td class="num">{_pct3(getattr(lv, key), keys)}'
                        f'{_coal(lv) if key == "itl" else ""}</td>' for key, _ in C.DISTS)
        out.append(
            f'<tr{cls}><td><code>{esc(lv.backend)}</code></td>' + (f'<td>{esc(lv.label)}</td>' if with_label else "")
            + f'<td class="offered">{esc(lv.offered)}</td>'
            f'<td class="num">{_rate(lv.qps)}</td><td class="num">{_rate(lv.tokens_per_s, 1)}</td><td class="num">{_count(lv.peak_tokens_per_s)}</td>'
            f'<td class="num">{_rate(lv.total_tokens_per_s, 1)}</td><td class="num">{_rate(lv.in_flight)}</td>'
            f'<td class="num">{_count(lv.peak_concurrent)}</td>{dists}{counts}</tr>'
        )
    out.append("</tbody></table></div>")
    return out


def turn_table(results: Mapping[str, Any], keys: Sequence[str] = C.DEFAULT_PERCENTILES) -> list[str]:
    """Multi-turn levels: TTFT and latency percentiles (`keys`) by user turn (results.json levels' `turns`)."""
    rows = C.turn_rows(results)
    if not rows:
        return []
    head = ("Backend", "Level", "Turn", "Completed / requests", "Prompt tokens (mean)", C.pct_head("TTFT", keys), C.pct_head("Latency", keys))
    out = ["<h2>By turn</h2>", f'<p class="note">{esc(C.TURN_NOTE)}</p>',
           '<table class="levels turns"><thead><tr>' + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr></thead><tbody>"]
    for t in rows:
        tokens = "-" if t.prompt_tokens is None else f"{t.prompt_tokens:,.0f}"
        out.append(f"<tr><td><code>{esc(t.backend)}</code></td><td>{esc(t.label)}</td><td class=\"num\">{esc(t.turn)}</td>"
                   f"<td class=\"num\">{esc('-' if t.completed is None else t.completed)} / {esc('-' if t.total is None else t.total)}</td>"
                   f"<td class=\"num\">{esc(tokens)}</td><td class=\"num\">{_pct3(t.ttft, keys)}</td><td class=\"num\">{_pct3(t.latency, keys)}</td></tr>")
    out.append("</tbody></table>")
    return out


def _rules_table(verdict: Any, meta: Mapping[str, Any] | None = None) -> list[str]:
    out = ['<table class="rules"><thead><tr><th>Class</th><th>Rule</th><th>Status</th><th>Observed</th><th>Explanation</th></tr></thead><tbody>']
    for r in verdict.rules:
        sev = "" if r.severity == "require" else ' <span class="note">(warn)</span>'
        details = (C.rule_detail_lines(r) + C.measured_lines(meta or {}, r)) if r.status != "pass" else []
        det = ('<ul class="details">' + "".join(f"<li>{esc(d)}</li>" for d in details) + "</ul>") if details else ""
        if r.observed_text is not None:
            observed = r.observed_text
        elif isinstance(r.observed, bool):
            observed = "yes" if r.observed else "no"
        else:
            observed = "-" if r.observed is None else f"{r.observed:g}"
        out.append(
            f'<tr class="s-{esc(r.status)}"><td>{esc(r.klass)}</td><td><code>{esc(r.rule)}</code>{sev}</td>'
            f'<td class="status">{esc(r.status_word)}</td><td>{esc(observed)}</td><td>{esc(r.message)}{det}</td></tr>'
        )
    out.append("</tbody></table>")
    return out


def _facts(verdict: Any, meta: Mapping[str, Any], spec: Any) -> list[str]:
    model_id, revision = C.model_lines(meta, spec)
    rehearsal, scale = C.run_lines(verdict, meta)
    items = [("run", meta.get("run_id") or verdict.run_id or "unknown"), ("commit", C.commit_line(meta)),
             ("model", model_id), ("model revision", revision), ("hardware", C.hardware_line(meta))]
    host = C.host_line(meta)
    if host:
        items.append(("host CPU", host))
    items += [("rehearsal", rehearsal), ("time scale", scale)]
    items += C.run_state_lines(meta)
    for w in getattr(spec, "workloads", ()):
        items.append((f"workload {w.name}", C.workload_line(w)))
    need = C.required_trace_coverage(spec)
    if need is not None:
        items.append(("required trace coverage", f"{need * 100:g}%"))
    m = meta.get("manifest") if isinstance(meta.get("manifest"), Mapping) else {}
    if m.get("started_at"):
        items.append(("started", f"{m.get('started_at')} (ended {m.get('ended_at') or 'unknown'})"))
    if meta.get("manifest_sha256"):
        items.append(("manifest.json sha256", meta["manifest_sha256"]))
    integ = meta.get("integrity") if isinstance(meta.get("integrity"), Mapping) else {}
    if integ.get("verified"):
        bad = list(integ.get("tampered") or [])
        items.append(("verification", f"{integ.get('checked', 0)} artifacts re-hashed; "
                      + (f"{len(bad)} changed, missing or unlisted: " + "; ".join(f"{f['path']}: {f['message']}" for f in bad[:10])
                         if bad else "all match the manifest")))
    for note in verdict.notes:
        items.append(("note", note))
    return ['<dl class="facts">'] + [f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in items] + ["</dl>"]


def _claims(spec: Any) -> list[str]:
    cb = getattr(spec, "claims", None)
    claims = [c for c in getattr(cb, "claims", ()) if C.one_line(c)]
    excludes = [e for e in getattr(cb, "excludes", ()) if C.one_line(e)]
    out = ["<h2>Claim Boundary</h2>"]
    if claims:
        out.append("<p>The evidence claims:</p><ul>" + "".join(f"<li>{esc(C.one_line(c))}</li>" for c in claims) + "</ul>")
    else:
        out.append("<p>The spec states no claim.</p>")
    if excludes:
        out.append("<p>It does not claim:</p><ul>" + "".join(f"<li>{esc(C.one_line(e))}</li>" for e in excludes) + "</ul>")
    else:
        out.append("<p>The spec lists no exclusion.</p>")
    return out


def sweep_html(results: Mapping[str, Any]) -> list[str]:
    """A sweep's figure and every probe in the order it ran (results.json `sweep`)."""
    out: list[str] = []
    for sw in C.sweep_views(results):
        out += [f"<h2>Sweep: <code>{esc(sw.backend)}</code></h2>",
                f"<p><strong>{esc(sw.figure)} = {esc(sw.value)}</strong>{esc(sw.bound)}</p>",
                f"<table><tr><th>Probe</th><th>{esc(sw.axis)}</th><th>Holds</th><th>Why</th></tr>"]
        out += [f"<tr><td>{n}</td><td>{esc(value)}</td><td>{holds}</td><td>{esc(why)}</td></tr>" for n, value, holds, why in sw.probes]
        out.append("</table>")
    return out


def goodput_html(results: Mapping[str, Any]) -> list[str]:
    """Per SLO set the gate names, per level: the share and rate of requests meeting it."""
    rows = C.goodput_rows(results)
    if not rows:
        return []
    out = ["<h2>Goodput</h2>", "<table><tr><th>SLO</th><th>Backend / level</th><th>Met / measured</th><th>Goodput</th><th>Goodput rate</th></tr>"]
    for g in rows:
        out.append(f"<tr><td>{esc(g.get('slo'))}</td><td>{esc(g.get('backend'))} · {esc(g.get('label'))}</td>"
                   f"<td>{esc(g.get('met'))} / {esc(g.get('requests'))}</td><td>{esc(g['share'])}</td><td>{_rate(g.get('goodput_rate'))} req/s</td></tr>")
    out.append("</table>")
    out.append(f'<p class="note">{esc(C.GOODPUT_NOTE)}</p>')
    return out


def render(verdict: Any, results: Mapping[str, Any], meta: Mapping[str, Any], spec: Any,
           percentiles: Sequence[str] = C.DEFAULT_PERCENTILES) -> str:
    """The page; `percentiles`: the results.json keys the per-level and per-turn tables show."""
    soak = getattr(getattr(spec, "header", None), "name", None) or verdict.soak
    rows = C.backend_rows(verdict, results, meta, spec)
    gpu_reason = C.gpu_unavailable_reason(meta)
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        CSP_META,
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>soakspec report: {esc(soak)}</title>",
        f"<style>{CSS}</style>",
        "</head><body>",
        f"<h1>soakspec report: {esc(soak)}</h1>",
        f'<p><span class="badge {esc(verdict.outcome)}">{esc(verdict.outcome)}</span>{esc(C.verdict_sentence(verdict))}</p>',
    ]
    state = C.run_state_lines(meta)
    if not C.run_went_normally(state):
        out.append('<ul class="run-state">' + "".join(f"<li><b>{esc(k)}</b>: {esc(v)}</li>" for k, v in state) + "</ul>")
    out += _results_table(rows)
    out.append(f'<p class="note">{esc(C.ARTIFACT_NOTE.replace("`", ""))} {esc(C.GATE_NOTE)}</p>')
    per_level = level_table(results, verdict, percentiles)
    if per_level:
        out.append("<h2>Per level</h2>")
        out += per_level
        out += [f'<p class="note">{esc(n)}</p>' for n in C.exclusion_notes(results)]
        out += [f'<p class="note">{esc(n)}</p>' for n in C.drain_notes(results)]
    out += turn_table(results, percentiles)
    health = C.client_rows(results)
    if health:
        out.append("<h2>Load generator</h2>")
        out.append(f'<p class="note">{esc(C.CLIENT_NOTE)}</p>')
        out.append('<table class="levels client"><thead><tr>' + "".join(f"<th>{esc(h)}</th>" for h in
                   ("Backend", "Level", "Event-loop lag p99", "Client CPU", "Machine CPU", "Schedule lag p99", "Achieved / offered",
                    "Coalesced ITL")) + "</tr></thead><tbody>")  # fmt: skip
        for c in health:
            pct = lambda v: "-" if v is None else f"{v * 100:.0f} %"  # noqa: E731
            ms = lambda v: "-" if v is None else f"{v * 1000:.1f} ms"  # noqa: E731
            ach = "-" if c.achieved is None or not c.offered else f"{c.achieved:.3g} / {round(c.offered, 2):g}"
            out.append(f"<tr><td><code>{esc(c.backend)}</code></td><td>{esc(c.label)}</td><td class=\"num\">{ms(c.lag_p99)}</td>"
                       f"<td class=\"num\">{pct(c.cpu)}</td><td class=\"num\">{pct(c.host_cpu)}</td>"
                       f"<td class=\"num\">{ms(c.schedule_lag_p99)}</td><td class=\"num\">{esc(ach)}</td>"
                       f"<td class=\"num\">{pct(c.coalesced)}</td></tr>")
        out.append("</tbody></table>")
        out += [f'<p class="note">{esc(n)}</p>' for n in C.cap_notes(results)]
    out += sweep_html(results) + goodput_html(results)
    out.append("<h2>Per bucket, over time</h2>")
    out.append('<p class="note">One point per bucket at its midpoint; shaded bands are the levels, and no line joins '
               "two levels. TTFT and ITL percentiles pool the bucket's completed requests; memory is the mean and maximum "
               "of the telemetry samples taken in the bucket. A dashed red line is a rule's threshold; a red-shaded "
               "bucket is one where a rule failed (an amber outline: where a warn rule did not pass).</p>")
    for b in results.get("backends") or []:
        if not isinstance(b, Mapping):
            continue
        out.append(f'<section class="backend" data-backend="{esc(b.get("name"))}"><h3>Backend <code>{esc(b.get("name"))}</code></h3>')
        out.append('<div class="charts">')
        out += backend_charts(b, gpu_reason, verdict, spec)
        out += server_charts(b, verdict, spec)  # the server's own /metrics and its CPU (report/serverview.py)
        out.append("</div></section>")
    out.append("<h2>Rules</h2>")
    out += _rules_table(verdict, meta)
    out.append("<h2>Run</h2>")
    out += _facts(verdict, meta, spec)
    out += _claims(spec)
    out.append(f'<p class="note">Generated by soakspec from the evidence of run {esc(meta.get("run_id") or verdict.run_id or "unknown")}; '
               "the verdict was re-judged for this report.</p>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
