"""`--format md`: the PR-ready "Retained evidence" section, in the seed PR's shape.

    ## Retained evidence: <soak>
    - run, commit, model, model revision, hardware, rehearsal, time scale, run status,
      workload line(s), required trace coverage
    **Verdict: PASS** -- all N required rules hold.
    | Backend | Runtime boundary | Boundary check | Completed | Failed/timeouts | Rejected |
      Disconnected | Buckets | Own rules | Artifact SHA-256 |
    footnotes: what the Artifact SHA-256 and Own rules columns are
    ### How the run went   only when it did not simply complete: abort time and reason, each
                           backend's crash diagnosis, a failed
                           pre-flight (a fenced block: evidence text, shown literally)
    ### Per level          offered vs achieved rate, tokens/s, in flight, TTFT / ITL / TPOT /
                           latency percentiles, every outcome count (marked when the
                           performance rules were not evaluated)
    ### Load generator     the client's own health per level (event-loop lag, CPU, the
                           machine's CPU, schedule lag, achieved vs offered, coalesced ITL)
    ### Rules that did not pass     (a fenced text block: the judge's own words)
    ### Claim Boundary     the spec's claims, then "It does not claim:" and every exclude verbatim

Built to pass `soakspec lint-claims --spec SPEC --evidence DIR`:
  - every value in the results table and the provenance lines is the evidence's own (the table
    columns are the ones the linter reads; the backend's own status sits in "Own rules", a
    column the linter does not compare with the run's verdict);
  - the rules' messages (which quote bucket-level counts) sit in a fenced code block, which the
    linter reads neither as prose statements nor as assertions;
  - exclusions are list items under "It does not claim:", which negates each of them whatever
    its wording; no generated sentence mentions an excluded item or a shape the spec did not
    cover (durations are the spec's planned ones).
Evidence strings in the tables are code spans (backticks stripped by the linter; GitHub shows
them literally, so `<script>` or `|` cannot change the page).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from soakspec.report import common as C
from soakspec.report.serverview import md_lines as server_md_lines

HEADER = ("Backend", "Runtime boundary", "Boundary check", "Completed", "Failed/timeouts", "Rejected", "Disconnected",
          "Buckets", "Own rules", "Artifact SHA-256")

ARTIFACT_NOTE_MD = (
    "Artifact SHA-256: the sha256 that the run's manifest.json records for the backend's "
    f"`backends/<name>/{C.ARTIFACT_FILE}`, re-hashed by `soakspec verify` before this report was made."
)

_PLAIN = re.compile(r"[A-Za-z0-9 .,:=+/()%@-]*")
_MD_SPECIAL = re.compile(r"([\\`*\[\]<>|&~])")
_BLOCK_START = re.compile(r"^(\d{0,9})(#(?=#{0,5}(?: |$))|[+-](?= |$)|-(?=(?: ?-){2,} ?$)|(?<=\d)[.)](?= |$))")
_HEADING_END = re.compile(r"(?<= )(#+)$")
_EDGE_UNDERSCORE = re.compile(r"(?<![^\W_])_|_(?![^\W_])")  # not between two letters or digits


def md_text(value: Any) -> str:
    """Inline text with Markdown's active characters escaped: `~` (GitHub's strikethrough) and
    an underscore at a word's edge (`_see runbook_`); one inside a word is kept -- GitHub never
    emphasises there, and names like prompt_words must stay readable."""
    text = _EDGE_UNDERSCORE.sub(r"\\_", _MD_SPECIAL.sub(r"\\\1", C.one_line(value)))
    # what would open a block where the text starts a line or a list item (`- # Fastest`: a
    # heading; `- ---`: a rule; `- 1) x`, `- + x`: a list of its own) is escaped too
    text = _BLOCK_START.sub(lambda m: f"{m.group(1)}\\{m.group(2)}" if m.group(1) else f"\\{m.group(2)}", text, count=1)
    # and a heading's closing sequence (`## Retained evidence: load #` would drop the #)
    return _HEADING_END.sub(r"\\\1", text)


def md_code(value: Any, *, table: bool = True) -> str:
    """A code span for untrusted text: shown literally, safe inside a table cell (`table`: a
    pipe escaped as `\\|`, which a table row reads before the span; elsewhere -- a list item --
    the backslash would show, so `table=False` leaves the pipe as it is)."""
    text = C.one_line(value)
    if table:
        text = text.replace("|", "\\|")
    if not text:
        return "-"
    run = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * (run + 1)
    pad = " " if run or text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def md_cell(value: Any) -> str:
    """Plain when harmless (`host-staged`, `NCCL 2.26.2, NCCL=1`), else a code span."""
    text = C.one_line(value)
    if not text:
        return "-"
    return text if _PLAIN.fullmatch(text) else md_code(text)


def fence_for(lines: Sequence[str]) -> str:
    run = max((len(m) for line in lines for m in re.findall(r"`+", line)), default=0)
    return "`" * max(3, run + 1)


def _num(v: int | None) -> str:
    return "-" if v is None else str(v)


def results_table(rows: Sequence[C.BackendRow]) -> list[str]:
    out = ["| " + " | ".join(HEADER) + " |", "|" + "|".join("---" for _ in HEADER) + "|"]
    for r in rows:
        fail = "-" if r.failed is None and r.timeouts is None else f"{_num(r.failed)} / {_num(r.timeouts)}"
        cells = [
            md_cell(r.name),
            md_cell(r.runtime) if r.runtime else "-",
            r.boundary_check if r.boundary_check in C.BOUNDARY_OK or r.boundary_check in ("-", "not run")
            else f"**{md_text(r.boundary_check)}**",
            _num(r.completed),
            fail,
            _num(r.rejected),
            _num(r.disconnected),
            _num(r.buckets),
            md_text(r.gate),
            r.artifact_sha256 or "-",
        ]
        out.append("| " + " | ".join(cells) + " |")
    return out


def _fmt_s(v: Any) -> str:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return "-"
    return f"{v * 1000:.1f} ms" if v < 1 else f"{v:.2f} s"


def _fmt_rate(v: Any, digits: int = 1) -> str:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return "-"
    return f"{v:.{digits}f}"


def _pct(d: Any, keys: Sequence[str] = C.DEFAULT_PERCENTILES) -> str:
    if not isinstance(d, Mapping):
        return "-"
    return " / ".join(C.approx(d, k) + _fmt_s(d.get(k)) for k in keys)


def _mean(d: Any) -> str:
    """A distribution's mean (over the same samples as its percentiles); "-" without one."""
    return _fmt_s(d.get("mean")) if isinstance(d, Mapping) else "-"


def _itl(lv: Any, keys: Sequence[str] = C.DEFAULT_PERCENTILES) -> str:
    """ITL percentiles with how many of their gaps are coalesced (not independent samples)."""
    out = _pct(lv.itl, keys)
    co = lv.itl_coalesced
    if isinstance(co, Mapping) and isinstance(co.get("gaps"), int) and co["gaps"]:
        out += f" ({co.get('coalesced', 0):,} of {co['gaps']:,} gaps coalesced)"
    return out


def _pct_or_dash(v: Any) -> str:
    return "-" if v is None else f"{v * 100:.0f} %"


CLIENT_HEAD = ("Backend / level", "Event-loop lag p99", "Client CPU (of a core)", "Machine CPU", "Schedule lag p99",
               "Achieved / offered", "Coalesced ITL")


def client_table(results: Mapping[str, Any]) -> list[str]:
    """The load generator's own health per level, beside the server's numbers: the worst bucket
    of each (judged by the built-in client_healthy)."""
    rows = []
    for c in C.client_rows(results):
        ach = "-" if c.achieved is None or not c.offered else f"{c.achieved:.3g} / {round(c.offered, 2):g}"
        rows.append([f"{md_cell(c.backend)} · {md_text(c.label)}", _fmt_s(c.lag_p99), _pct_or_dash(c.cpu), _pct_or_dash(c.host_cpu),
                     _fmt_s(c.schedule_lag_p99), ach, _pct_or_dash(c.coalesced)])
    if not rows:
        return []
    return ["| " + " | ".join(CLIENT_HEAD) + " |", "|" + "|".join("---" for _ in CLIENT_HEAD) + "|"] + ["| " + " | ".join(r) + " |" for r in rows]


def level_head(keys: Sequence[str] = C.DEFAULT_PERCENTILES) -> tuple[str, ...]:
    """The per-level table's header: each of TTFT / ITL / TPOT / latency as a mean column (bench
    serve's first figure) beside one cell of its percentiles (`keys`); bench serve's two peaks
    beside the mean they top (output tok/s, in flight), named as `lint-claims` reads them."""
    return (("Backend / level", "Offered", "Achieved req/s", "Output tok/s", C.PEAK_TOKENS_HEAD, "Total tok/s", "Mean in flight",
             C.PEAK_CONCURRENT_HEAD)
            + tuple(h for _, name in C.DISTS for h in (f"{name} mean", C.pct_head(name, keys)))
            + ("Completed", "Failed", "Timeouts", "Rejected", "Disconnected"))


LEVEL_HEAD = level_head()


def level_table(results: Mapping[str, Any], keys: Sequence[str] = C.DEFAULT_PERCENTILES) -> list[str]:
    """Per backend and level: offered load and achieved rate, output tokens/s and its peak second, total (prompt + output)
    tokens/s, in flight and the most completed requests in flight at once, TTFT / ITL /
    TPOT / latency mean and percentiles (`keys`, results.json's: p50 / p95 / p99 unless `--percentiles` chose) and every outcome count."""
    rows = []
    for lv in C.level_rows(results):
        req = lv.requests
        dists = [c for key, _ in C.DISTS
                 for c in (_mean(getattr(lv, key)), _itl(lv, keys) if key == "itl" else _pct(getattr(lv, key), keys))]
        rows.append([f"{md_cell(lv.backend)} · {md_text(lv.label)}", md_text(lv.offered), _fmt_rate(lv.qps, 2),
                     _fmt_rate(lv.tokens_per_s), _num(lv.peak_tokens_per_s), _fmt_rate(lv.total_tokens_per_s),
                     _fmt_rate(lv.in_flight, 2), _num(lv.peak_concurrent)] + dists
                    + [_num(C.as_int(req.get(k))) for k in ("completed", "failed", "timeout", "rejected", "disconnected")])
    if not rows:
        return []
    head = level_head(keys)
    return ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"] + ["| " + " | ".join(r) + " |" for r in rows]


def turn_head(keys: Sequence[str] = C.DEFAULT_PERCENTILES) -> tuple[str, ...]:
    return ("Backend / level", "Turn", "Completed / requests", "Prompt tokens (mean)", C.pct_head("TTFT", keys), C.pct_head("Latency", keys))


TURN_HEAD = turn_head()


def turn_section(results: Mapping[str, Any], keys: Sequence[str] = C.DEFAULT_PERCENTILES) -> list[str]:
    """Multi-turn levels: TTFT and latency percentiles (`keys`) by user turn (results.json levels' `turns`)."""
    rows = C.turn_rows(results)
    if not rows:
        return []
    head = turn_head(keys)
    out = ["### By turn", "", md_text(C.TURN_NOTE), "", "| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for t in rows:
        tokens = "-" if t.prompt_tokens is None else f"{t.prompt_tokens:,.0f}"
        out.append(f"| {md_cell(t.backend)} · {md_text(t.label)} | {md_text(t.turn)} | {_num(t.completed)} / {_num(t.total)} | "
                   f"{tokens} | {_pct(t.ttft, keys)} | {_pct(t.latency, keys)} |")
    return out + [""]


def sweep_section(results: Mapping[str, Any]) -> list[str]:
    """A sweep's figure and every probe in the order it ran (results.json `sweep`)."""
    out: list[str] = []
    for sw in C.sweep_views(results):
        out += [f"### Sweep: {md_text(sw.backend)}", "", f"**{md_text(sw.figure)} = {md_text(sw.value)}**{md_text(sw.bound)}", "",
                f"| Probe | {md_text(sw.axis)} | Holds | Why |", "|---|---|---|---|"]
        out += [f"| {n} | {md_cell(value)} | {holds} | {md_cell(C.one_line(str(why or '')))} |" for n, value, holds, why in sw.probes]
        out.append("")
    return out


def goodput_section(results: Mapping[str, Any]) -> list[str]:
    """Per SLO set the gate names, per level: the share and rate of requests meeting it."""
    rows = C.goodput_rows(results)
    if not rows:
        return []
    out = ["### Goodput", "", "| SLO | Backend / level | Met / measured | Goodput | Goodput rate |", "|---|---|---|---|---|"]
    for g in rows:
        out.append(f"| {md_cell(g.get('slo'))} | {md_cell(g.get('backend'))} · {md_text(g.get('label'))} | "
                   f"{_num(C.as_int(g.get('met')))} / {_num(C.as_int(g.get('requests')))} | {g['share']} | {_fmt_rate(g.get('goodput_rate'), 2)} req/s |")
    return out + ["", C.GOODPUT_NOTE, ""]


def render(verdict: Any, results: Mapping[str, Any], meta: Mapping[str, Any], spec: Any,
           percentiles: Sequence[str] = C.DEFAULT_PERCENTILES) -> str:
    """The Markdown section; `percentiles`: the results.json keys the per-level and per-turn
    tables show (`soakspec report --percentiles`, `C.parse_percentiles`)."""
    rows = C.backend_rows(verdict, results, meta, spec)
    model_id, revision = C.model_lines(meta, spec)
    rehearsal, scale = C.run_lines(verdict, meta)
    soak = getattr(getattr(spec, "header", None), "name", None) or verdict.soak
    lines = [f"## Retained evidence: {md_text(soak)}", ""]

    run_id = meta.get("run_id") or verdict.run_id
    lines.append(f"- run: {md_code(run_id, table=False) if run_id else 'unknown'}")
    lines.append(f"- commit: {md_text(C.commit_line(meta))}")
    lines.append(f"- model: {md_text(model_id)}")
    lines.append(f"- model revision: {md_text(revision)}")
    lines.append(f"- hardware: {md_text(C.hardware_line(meta))}")
    host = C.host_line(meta)
    if host:
        lines.append(f"- host CPU: {md_text(host)}")
    lines.append(f"- rehearsal: {md_text(rehearsal)}")
    lines.append(f"- time scale: {md_text(scale)}")
    state = C.run_state_lines(meta)
    lines.append(f"- run status: {md_text(_status_word(meta))}" + ("" if C.run_went_normally(state) else " (see How the run went)"))
    workloads = list(getattr(spec, "workloads", ()))
    for w in workloads:
        label = "workload" if len(workloads) == 1 else f"workload {md_code(w.name, table=False)}"
        lines.append(f"- {label}: {md_text(C.workload_line(w))}")
    need = C.required_trace_coverage(spec)
    if need is not None:
        lines.append(f"- required trace coverage: {need * 100:g}%")
    for note in verdict.notes:
        lines.append(f"- note: {md_text(note)}")
    lines.append("")

    lines.append(f"**Verdict: {verdict.outcome}** ({md_text(C.verdict_sentence(verdict))})")
    lines.append("")
    lines += results_table(rows)
    lines.append("")
    lines += [ARTIFACT_NOTE_MD, ""]
    manifest_sha = meta.get("manifest_sha256")
    if manifest_sha:
        lines += [f"manifest.json: {manifest_sha}", ""]
    lines += [md_text(C.GATE_NOTE), ""]

    if not C.run_went_normally(state):
        lines += ["### How the run went", ""] + _fenced([f"{k}: {v}" for k, v in state]) + [""]

    per_level = level_table(results, percentiles)
    if per_level:
        lines += ["### Per level", ""]
        if C.performance_not_evaluated(verdict):
            lines += [md_text(C.NOT_EVALUATED_NOTE), ""]
        lines += per_level + [""]
        notes = C.exclusion_notes(results)
        if notes:  # the judge's own words, fenced like the rules' messages (not prose claims)
            fence = fence_for(notes)
            lines += ["What the means and percentiles leave out:", "", fence + "text"] + notes + [fence, ""]
    for note in C.drain_notes(results):  # a count-bounded level's last bucket that holds its drain
        lines += [md_text(note), ""]
    lines += turn_section(results, percentiles)
    health = client_table(results)
    if health:
        lines += ["### Load generator", "", md_text(C.CLIENT_NOTE), ""] + health + [""]
        for note in C.cap_notes(results):  # what each level's declared max_concurrency held back
            lines += [md_text(note), ""]
    lines += server_md_lines(results, spec)

    lines += sweep_section(results) + goodput_section(results)
    open_rules = C.open_rules(verdict)
    lines += ["### Rules that did not pass", ""]
    if open_rules:
        body = []
        for r in open_rules:
            sev = "" if r.severity == "require" else " (warn)"
            body.append(f"{C.STATUS_MARK[r.status]}  [{C.one_line(r.klass)}] {C.one_line(r.rule)}{sev} — {C.one_line(r.message)}")
            body += [f"      {d}" for d in C.rule_detail_lines(r)]
            body += [f"      {d}" for d in C.measured_lines(meta, r)]
        fence = fence_for(body)
        lines += [fence + "text"] + body + [fence]
    else:
        lines.append("None: every rule passed.")
    lines.append("")

    lines += claim_boundary(spec)
    return "\n".join(lines).rstrip("\n") + "\n"


def _status_word(meta: Mapping[str, Any]) -> str:
    m = meta.get("manifest") if isinstance(meta.get("manifest"), Mapping) else {}
    return str(m.get("status")) if isinstance(m.get("status"), str) else "unknown"


def _fenced(body: Sequence[str]) -> list[str]:
    """Evidence text (abort reasons, server-log lines) in a fenced block: shown literally, and
    read by lint-claims neither as prose nor as an assertion."""
    fence = fence_for(body)
    return [fence + "text", *body, fence]


def claim_boundary(spec: Any) -> list[str]:
    cb = getattr(spec, "claims", None)
    claims = [C.one_line(c) for c in getattr(cb, "claims", ()) if C.one_line(c)]
    excludes = [C.one_line(e) for e in getattr(cb, "excludes", ()) if C.one_line(e)]
    out = ["### Claim Boundary", ""]
    if len(claims) == 1:
        text = md_text(claims[0])
        out.append(f"This is {text}{'' if text.endswith(('.', '!', '?')) else '.'}")
    elif claims:
        out += ["The evidence claims:", ""] + [f"- {md_text(c)}" for c in claims]
    else:
        out.append("The spec states no claim.")
    out.append("")
    if excludes:
        out += ["It does not claim:", ""] + [f"- {md_text(e)}" for e in excludes]
    else:
        out.append("The spec lists no exclusion.")
    return out
