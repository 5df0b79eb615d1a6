"""`soakspec compare` output: Markdown (PR-ready), one self-contained HTML page, JSON.

    render(comparison, fmt) -> str     fmt in FORMATS; pure, deterministic, ends in a newline

Every string from the evidence (backend names, labels, directories) is escaped for its format.
Levels one run has and the other has no level of the same load for are listed after the rows
("Unpaired levels"), each with the run it is in.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from soakspec.compare import Comparison
from soakspec.compare.intervals import family_confidence
from soakspec.compare.rows import Row, signed_percent
from soakspec.compare.sweep import SweepRow
from soakspec.report.charts import esc
from soakspec.report.common import one_line
from soakspec.report.html import CSP_META
from soakspec.report.md import md_cell, md_code, md_text

FORMATS = ("md", "html", "json")
MARK = {"regression": "REGRESSION", "improvement": "improvement", "no significant change": "no significant change",
        "insufficient samples": "insufficient samples", "missing": "missing", "inconclusive": "INCONCLUSIVE"}
HEAD = ("Backend / level", "Metric", "Base", "New", "Change", "Interval", "n base / new", "Verdict")
SWEEP_HEAD = ("Backend", "Figure", "Base", "New", "Change", "Verdict", "What the searches know")


def _val(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "s":
        return f"{v * 1000:.1f} ms" if abs(v) < 1 else f"{v:.3f} s"
    if unit == "ratio":  # a share of the requests
        return f"{v * 100:.1f}%"
    if unit == "/s":  # qps: completed requests a second, written as the report writes it (and lint-claims reads it)
        return f"{v:.2f} req/s"
    return f"{v:.2f} {unit}"


def _pct(v: float | None) -> str:
    return "-" if v is None else signed_percent(v)


def _points(v: float | None) -> str:
    """A difference of shares, in percentage points (a proportion's change: `Row.absolute`)."""
    return "-" if v is None else signed_percent(v, " pp")


def _cells(r: Row) -> list[str]:
    where = r.backend if r.backend == r.new_backend else f"{r.backend} → {r.new_backend}"
    pct = _points if r.absolute else _pct
    iv = "-" if r.low is None else f"{pct(r.low)} .. {pct(r.high)}"
    verdict = MARK[r.verdict] + (f" (needs {r.need})" if r.verdict == "insufficient samples" else "")
    return [f"{where} · {r.where}", f"{r.stat}({r.metric})", _val(r.base, r.unit), _val(r.new, r.unit), pct(r.change),
            iv, f"{r.n_base} / {r.n_new}", verdict]


def _sweep_cells(sw: SweepRow) -> list[str]:
    """The sweep's own figure (compare/sweep.py): base and new as the verdicts state them, the
    change in the figure's unit, and why the verdict (each run's highest holding and first
    failing level, the step)."""
    where = sw.backend if sw.backend == sw.new_backend else f"{sw.backend} → {sw.new_backend}"
    change = "-" if sw.change is None else f"{sw.change:+g}{sw.unit}" + (f" ({_pct(sw.relative)})" if sw.relative is not None else "")
    return [where, sw.figure, sw.base.text, sw.new.text, change, MARK.get(sw.verdict, sw.verdict), sw.message]


def _method(c: Comparison) -> str:
    m = len(c.rows)
    return (f"Change: new / base - 1 of each statistic; of ratio(errors), the share of unsuccessful requests, "
            f"new - base in percentage points (pp). Interval: {c.confidence * 100:g}% family-wise "
            f"(Bonferroni over the {m} row{'s' if m != 1 else ''} of this comparison: each row's interval is a "
            f"{family_confidence(c.confidence, m) * 100:.4g}% interval, so every verdict above is after the correction), "
            f"seeded bootstrap ({c.resamples} draws, seed {c.seed}; "
            "percentiles from the exact order-statistic bootstrap); means over buckets: Fieller's t interval; "
            "ratio(errors): Newcombe's score interval (each side's requests over their design effect where failures come in bursts). "
            "Regression: the whole interval is on the worse side.")


def _row_notes(c: Comparison) -> list[str]:
    """Each row note once, with the rows it is about."""
    by: dict[str, list[str]] = {}
    for r in c.rows:
        if r.note:
            by.setdefault(r.note, []).append(f"{r.backend} · {r.where} {r.stat}({r.metric})")
    return [f"{', '.join(rows)}: {note}" for note, rows in by.items()]


def render_md(c: Comparison) -> str:
    lines = ["## Comparison", "",
             f"- base: {md_code(c.base.dir, table=False)} (run {md_text(c.base.run_id or 'unknown')}, manifest {c.base.manifest_sha256 or '-'})",
             f"- new: {md_code(c.new.dir, table=False)} (run {md_text(c.new.run_id or 'unknown')}, manifest {c.new.manifest_sha256 or '-'})",
             ""]
    lines += [f"**Comparison: {c.outcome}** ({md_text(c.summary())})", ""]
    for n in c.notes:
        lines.append(f"- note: {md_text(n)}")
    if c.notes:
        lines.append("")
    if c.rules:
        lines += ["### Rules", "", "| Rule | Status | Worst row |", "|---|---|---|"]
        for o in c.rules:
            lines.append(f"| {md_text(o.rule.text())} | {o.status.upper()} | {md_text(o.message)} |")
        lines.append("")
    if c.sweeps:
        lines += ["### Sweep", "", "| " + " | ".join(SWEEP_HEAD) + " |", "|" + "|".join("---" for _ in SWEEP_HEAD) + "|"]
        for sw in c.sweeps:
            cells = [md_cell(x) for x in _sweep_cells(sw)]
            if sw.verdict == "regression":
                cells[5] = f"**{cells[5]}**"
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["### Per level", "", "| " + " | ".join(HEAD) + " |", "|" + "|".join("---" for _ in HEAD) + "|"]
    for r in c.rows:
        cells = _cells(r)
        cells[0] = md_cell(cells[0])
        if r.verdict == "regression":
            cells[-1] = f"**{cells[-1]}**"
        lines.append("| " + " | ".join(cells) + " |")
    notes = _row_notes(c)
    if notes:
        lines += [""] + [f"- {md_text(n)}" for n in notes]
    if c.unpaired:
        lines += ["", "### Unpaired levels", "", "| Backend / level | Only in | Level |", "|---|---|---|"]
        for u in c.unpaired:
            lines.append(f"| {md_cell(f'{u.backend} · {u.label}')} | the {u.side} run | {u.level} of {md_cell(u.workload)} |")
    lines += ["", md_text(_method(c))]
    return "\n".join(lines) + "\n"


_CSS = """body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td:first-child,th:first-child,td:nth-child(2){text-align:left}
tr.regression{background:#fdd}tr.improvement{background:#dfd}tr.insufficient,tr.missing{color:#888}
.PASS{color:#070}.FAIL{color:#b00}.INCONCLUSIVE{color:#a60}"""


def render_html(c: Comparison) -> str:
    """One self-contained page, as the report's (`soakspec.report.html`): no script, no link, a
    Content-Security-Policy that refuses every fetch, every string escaped (`charts.esc`:
    characters HTML cannot carry shown as `\\xNN` first)."""
    e = esc
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', CSP_META, "<title>soakspec comparison</title>",
           f"<style>{_CSS}</style></head><body>", "<h1>Comparison</h1>",
           f"<p>base: <code>{e(one_line(c.base.dir))}</code> (run {e(c.base.run_id or 'unknown')})<br>"
           f"new: <code>{e(one_line(c.new.dir))}</code> (run {e(c.new.run_id or 'unknown')})</p>",
           f'<p class="verdict {c.outcome}" id="outcome"><strong>{c.outcome}</strong> — {e(c.summary())}</p>']
    if c.notes:
        out.append("<ul>" + "".join(f"<li>{e(n)}</li>" for n in c.notes) + "</ul>")
    if c.rules:
        out.append('<h2>Rules</h2><table id="rules"><tr><th>Rule</th><th>Status</th><th>Worst row</th></tr>')
        for o in c.rules:
            out.append(f'<tr class="{o.status}"><td>{e(o.rule.text())}</td><td>{o.status.upper()}</td><td>{e(o.message)}</td></tr>')
        out.append("</table>")
    if c.sweeps:
        out.append('<h2>Sweep</h2><table id="sweep"><tr>' + "".join(f"<th>{e(h)}</th>" for h in SWEEP_HEAD) + "</tr>")
        for sw in c.sweeps:
            out.append(f'<tr class="{sw.verdict.split()[0]}">' + "".join(f"<td>{e(x)}</td>" for x in _sweep_cells(sw)) + "</tr>")
        out.append("</table>")
    out.append('<h2>Per level</h2><table id="rows"><tr>' + "".join(f"<th>{e(h)}</th>" for h in HEAD) + "</tr>")
    for r in c.rows:
        cls = r.verdict.split()[0]
        out.append(f'<tr class="{cls}">' + "".join(f"<td>{e(x)}</td>" for x in _cells(r)) + "</tr>")
    out.append("</table>")
    notes = _row_notes(c)
    if notes:
        out.append('<ul class="row-notes">' + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul>")
    if c.unpaired:
        out.append('<h2>Unpaired levels</h2><table id="unpaired"><tr><th>Backend / level</th><th>Only in</th><th>Level</th></tr>')
        for u in c.unpaired:
            out.append(f'<tr class="{u.side}"><td>{e(u.backend)} · {e(u.label)}</td><td>the {u.side} run</td>'
                       f"<td>{u.level} of {e(u.workload)}</td></tr>")
        out.append("</table>")
    out.append(f"<p>{e(_method(c))}</p></body></html>")
    return "\n".join(out) + "\n"


def render_json(c: Comparison) -> str:
    return json.dumps(c.to_json(), indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"  # strict JSON


_RENDER: dict[str, Callable[[Comparison], str]] = {"md": render_md, "html": render_html, "json": render_json}


def render(c: Comparison, fmt: str) -> str:
    if fmt not in _RENDER:
        raise ValueError(f"unknown comparison format {fmt!r} (one of {', '.join(FORMATS)})")
    return _RENDER[fmt](c)
