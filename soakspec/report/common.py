"""What every report format shows, computed once: the results-table rows, provenance lines,
workload lines and the rules that did not pass. Pure; the formats only lay these out.

Inputs (see `soakspec.report.render`):
  verdict  -- `judge(spec, evidence)`, re-judged by the caller (never a stored verdict.json)
  results  -- `summarize(evidence, spec)` (results.json's shape)
  meta     -- `evidence_meta(evidence)`: the manifest, its sha256, the integrity findings
  spec     -- the checked spec the verdict was judged with

Definitions the reports state:
  Completed, Failed/timeouts -- measured requests of the backend (warm-up and follow-up
      excluded), as results.json counts them;
  Rejected, Disconnected -- measured requests the server refused (HTTP 429/503 or a refused
      connection) and requests whose stream was cut, as results.json counts them;
  Buckets     -- the backend's buckets over all its levels (results.json `buckets`);
  Boundary check -- the runtime boundary's status as the run recorded it: confirmed (observed),
      declared (stated by the spec, not observed), or a failure in capitals (MISSING,
      CONTRADICTORY, ...), so "missing" never reads like "confirmed";
  Own rules   -- the backend's status from ITS rules (`soakspec.report.status`), not the run's
      verdict (which is stated once, above the table);
  Artifact SHA-256 -- the sha256 that manifest.json records for the backend's
      `backends/<name>/requests.jsonl` (the raw per-request evidence every number is computed
      from; `soakspec verify` re-hashes it). See ARTIFACT_NOTE.

Everything read from the evidence is untrusted text: formats escape it (`clean_text` removes
what no output format can carry: control characters and lone surrogates).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from soakspec.evidence import layout
from soakspec.lang.metrics import exclusion_title
from soakspec.lang.replay import sharing
from soakspec.plan import workload_sweep
from soakspec.units import format_duration

GATE_WORD = {"PASS": "passed", "FAIL": "failed", "INCONCLUSIVE": "inconclusive"}
STATUS_MARK = {"pass": "PASS", "fail": "FAIL", "inconclusive": "????", "not_evaluated": "----", "warn": "WARN"}
ARTIFACT_FILE = layout.REQUESTS
ARTIFACT_NOTE = (
    "Artifact SHA-256: the sha256 that the run's manifest.json records for the backend's "
    f"backends/<name>/{ARTIFACT_FILE} (re-hashed by `soakspec verify` before this report was made)."
)
GATE_NOTE = ("Own rules: each backend's status from the rules as they apply to that backend; the run's verdict "
             "above is one judgment over every backend, re-judged from the evidence for this report.")
NO_GPU_TELEMETRY = "no GPU telemetry (NVML not available)"
BOUNDARY_OK = ("confirmed", "declared")

_BAD_CHARS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffe\uffff\ud800-\udfff\u202a-\u202e\u2066-\u2069]")


def clean_text(value: Any) -> str:
    """`str(value)` without characters no report format can carry (C0 controls other than tab,
    newline and CR; DEL; lone surrogates; U+FFFE/U+FFFF) or should not: the bidirectional
    embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069), which reorder how the
    rest of a line is shown ('Trojan Source': an error ending in U+202E 'SSAP' reads 'PASS').
    Each is shown as `\\xNN`/`\\uNNNN`."""
    text = value if isinstance(value, str) else str(value)
    return _BAD_CHARS.sub(lambda m: f"\\x{ord(m.group(0)):02x}" if ord(m.group(0)) < 0x100 else f"\\u{ord(m.group(0)):04x}", text)


def one_line(value: Any) -> str:
    """`clean_text` with every run of whitespace (newlines included) made one space."""
    return " ".join(clean_text(value).split())


def gate_word(outcome: str) -> str:
    return GATE_WORD.get(outcome, outcome.lower())


def num(v: Any) -> float | None:
    """A JSON number as a float; None for anything else (booleans included)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def approx(dist: Any, key: str) -> str:
    """"≈" where results.json says a distribution's `key` percentile ("p99") is known only
    within bounds (binned gaps: its `bounds`, judge/gapbins.py), else "" -- the mark every
    report and the run summary put before such a figure."""
    bounds = dist.get("bounds") if isinstance(dist, Mapping) else None
    return "≈" if isinstance(bounds, Mapping) and key in bounds else ""


# The percentiles the per-level and per-turn tables show, and the run summary prints, unless
# `--percentiles` chooses others (`parse_percentiles`); JSON carries every stored one regardless.
DEFAULT_PERCENTILES = ("p50", "p95", "p99")
# the per-request distributions every report's per-level table shows, in its order: (results.json
# levels' key, display name). The run summary writes a word in lower case ("latency mean ms")
# and an acronym as it is (`runsummary.py`); bench.py keeps bench serve's own section names.
DISTS = (("ttft", "TTFT"), ("itl", "ITL"), ("tpot", "TPOT"), ("latency", "Latency"))


def parse_percentiles(text: str) -> tuple[str, ...]:
    """`--percentiles 50,90,99` -> ("p50", "p90", "p99"): the results.json keys of the listed
    percentiles, ascending, each once. Raises ValueError, saying why, for a list that is empty,
    holds something not a number, a percentile outside 0 < p < 100, or one results.json does not
    store (`soakspec.judge.summary.PERCENTILES`: 50, 90, 95, 99).

    Why only the stored ones: the run summary is printed from the results.json that `run` just
    wrote, and results.json's shape does not depend on a display flag; a report re-judges the
    evidence, and could compute any percentile from it, but then `report` and `run` would show
    figures the other cannot, and a table would hold a number no results.json records (which
    `soakspec lint-claims` checks documents against). A percentile the tables show is one
    results.json holds, computed as every percentile is (`stats.percentile`)."""
    from soakspec.judge.summary import PERCENTILES

    stored = ", ".join(f"{q:g}" for q in PERCENTILES)
    items = [t.strip() for t in text.split(",")]
    if not any(items) or not all(items):
        raise ValueError(f"expected percentiles separated by commas, such as 50,90,99 (results.json stores {stored})")
    got: set[float] = set()
    for t in items:
        try:
            q = float(t[1:] if t[:1] in ("p", "P") else t)
        except ValueError:
            raise ValueError(f"{t!r} is not a percentile (a number, such as 90 or 99)") from None
        if not 0 < q < 100:  # NaN too
            raise ValueError(f"{t} is outside 0 < p < 100")
        if q not in PERCENTILES:
            raise ValueError(f"p{q:g} is not one of the percentiles results.json stores ({stored})")
        got.add(q)
    return tuple(f"p{q:g}" for q in sorted(got))


def pct_head(name: str, keys: Sequence[str], sep: str = " / ") -> str:
    """A percentile column's header: `TTFT p50 / p95 / p99`."""
    return f"{name} " + sep.join(keys)


def as_int(v: Any) -> int | None:
    """A JSON number as an int (a count read from results.json); None for anything else."""
    f = num(v)
    return int(f) if f is not None else None


def not_completed(requests: Any) -> int | None:
    """A level's measured requests that did not complete (results.json `requests.total` less
    `requests.completed`): bench serve's "Failed requests", every request that was not a
    success whatever its kind (the Markdown report splits them by kind). None where either
    count is unknown. The bench block writes it and `lint-claims` checks it by this one rule."""
    r = _map(requests)
    total, done = as_int(r.get("total")), as_int(r.get("completed"))
    return None if total is None or done is None else total - done


def _map(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


# ------------------------------------------------------------------------------ the table


@dataclasses.dataclass(frozen=True)
class BackendRow:
    """One row of the results table (None: not recorded)."""

    name: str
    runtime: str | None  # the runtime boundary as displayed (manifest `runtime_boundary.display`)
    runtime_status: str | None  # confirmed | declared | generic | ...
    completed: int | None
    failed: int | None
    timeouts: int | None
    buckets: int | None
    gate: str  # the backend's own status: `passed (5 rules)`, `failed: <rules>`, ..., `not run`
    artifact_sha256: str | None
    ran: bool = True
    rejected: int | None = None
    disconnected: int | None = None

    @property
    def boundary_check(self) -> str:
        """`confirmed`, `declared`, or the failing status in capitals (`MISSING`); `-` unknown."""
        s = self.runtime_status
        if not s:
            return "-" if self.ran else "not run"
        return s if s in BOUNDARY_OK else s.upper()


def manifest_entry(meta: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    for e in _list(_map(meta.get("manifest")).get("backends")):
        if isinstance(e, Mapping) and e.get("name") == name:
            return e
    return {}


def artifact_sha256(meta: Mapping[str, Any], safe_name: str) -> str | None:
    """The manifest's sha256 of `backends/<safe_name>/requests.jsonl` (None when not listed)."""
    arts = _map(_map(meta.get("manifest")).get("artifacts"))
    sha = arts.get(f"{layout.BACKENDS}/{safe_name}/{ARTIFACT_FILE}")
    return sha.lower() if isinstance(sha, str) and re.fullmatch(r"[0-9a-fA-F]{64}", sha) else None


def own_status(verdict: Any, meta: Mapping[str, Any], name: str) -> str:
    """The backend's own status cell: from `meta["backend_status"]` (set by `prepare`, which
    re-judges performance rules per backend), else from the verdict's listed instances."""
    statuses = meta.get("backend_status")
    if isinstance(statuses, Mapping) and name in statuses:
        return statuses[name].cell()
    from soakspec.report.status import BackendStatus, RuleStatus, _for_backend

    rows = tuple(RuleStatus(r.rule, r.severity, r.klass, _for_backend(r, name)) for r in verdict.rules)
    req = [x for x in rows if x.severity == "require"]
    word = ("failed" if any(x.status == "fail" for x in req) else
            "inconclusive" if any(x.status in ("inconclusive", "not_evaluated") for x in req) else "passed")
    return BackendStatus(name, word, rows).cell()


def backend_rows(verdict: Any, results: Mapping[str, Any], meta: Mapping[str, Any], spec: Any) -> list[BackendRow]:
    """One row per backend in the evidence, then one per backend the spec declares that the run
    should have had but did not record (`not run`)."""
    rows: list[BackendRow] = []
    seen = set()
    for b in _list(results.get("backends")):
        if not isinstance(b, Mapping):
            continue
        name = str(b.get("name"))
        seen.add(name)
        entry = manifest_entry(meta, name)
        rb = _map(b.get("runtime_boundary")) or _map(entry.get("runtime_boundary"))
        req = _map(b.get("requests"))
        safe = b.get("safe_name") if isinstance(b.get("safe_name"), str) else layout.safe_name(name)
        rows.append(BackendRow(
            name=name,
            runtime=one_line(rb["display"]) if isinstance(rb.get("display"), str) else None,
            runtime_status=str(rb["status"]) if isinstance(rb.get("status"), str) else None,
            completed=as_int(req.get("completed")),
            failed=as_int(req.get("failed")),
            timeouts=as_int(req.get("timeout")),
            buckets=len(_list(b.get("buckets"))),
            gate=own_status(verdict, meta, name),
            artifact_sha256=artifact_sha256(meta, safe),
            rejected=as_int(req.get("rejected")),
            disconnected=as_int(req.get("disconnected")),
        ))
    only = _list(_map(meta.get("manifest")).get("only"))
    for be in getattr(spec, "backends", ()) if spec is not None else ():
        if be.name in seen or (only and be.name not in only):
            continue
        rows.append(BackendRow(be.name, be.runtime.label if be.runtime else None, None, None, None, None, None,
                               "not run", None, ran=False))
    return rows


# ------------------------------------------------------------------------------ provenance


def _distinct(values: Sequence[Any]) -> list[Any]:
    return list(dict.fromkeys(v for v in values))


def commit_line(meta: Mapping[str, Any]) -> str:
    """`0123abc…` when every backend recorded the same commit before and after its run."""
    entries = [e for e in _list(_map(meta.get("manifest")).get("backends")) if isinstance(e, Mapping)]
    srcs = [_map(e.get("source")) for e in entries]
    after = _distinct([s.get("commit_after") for s in srcs])
    before = _distinct([s.get("commit_before") for s in srcs])
    if not srcs or all(v is None for v in after + before):
        reasons = _distinct([one_line(s["reason"]) for s in srcs if isinstance(s.get("reason"), str) and s.get("reason")])
        repo = any(s.get("repo") for s in srcs)
        why = reasons[0] if reasons else ("no commit was recorded" if repo else "the spec declares no source repository")
        return f"not recorded ({why})"
    if len(after) == 1 and after == before:
        text = one_line(after[0])
    elif len(after) == 1 and after[0] is not None:
        text = f"{one_line(after[0])} (changed during the run; it started at {', '.join(one_line(b) for b in before if b)})"
    else:
        per = "; ".join(f"{one_line(e.get('name'))} {one_line(_map(e.get('source')).get('commit_after'))}" for e in entries)
        text = f"differs between backends ({per})"
    if any(s.get("dirty_before") or s.get("dirty_after") for s in srcs):
        text += " (working tree dirty)"
    return text


def model_lines(meta: Mapping[str, Any], spec: Any) -> tuple[str, str]:
    """(model id, model revision) as recorded by the backends, else as the spec declares."""
    entries = [e for e in _list(_map(meta.get("manifest")).get("backends")) if isinstance(e, Mapping)]
    models = [_map(e.get("model")) for e in entries]
    ids = _distinct([m.get("id") for m in models if m.get("id")])
    revs = _distinct([m.get("revision") for m in models if m.get("revision")])
    model = getattr(spec, "model", None)
    if not ids and model is not None and model.id:
        ids = [model.id]
    mid = ", ".join(one_line(i) for i in ids) or "not recorded"
    if len(revs) == 1:
        rev = one_line(revs[0])
    elif revs:
        rev = "differs between backends (" + "; ".join(
            f"{one_line(e.get('name'))} {one_line(_map(e.get('model')).get('revision'))}" for e in entries) + ")"
    else:
        rev = "not recorded"
    return mid, rev


def _per_child(meta: Mapping[str, Any], key: str, line: Callable[[Mapping[str, Any]], str | None]) -> str | None:
    """A `soakspec combine`d run whose children ran on different machines: each child's line,
    after its backends (`host-staged: 2x H100 ...; nccl: 2x A100 ...`); None when they agree
    (or the run is not combined): the manifest's own value, the first child's, says it."""
    children = [c for c in _list(_map(meta.get("manifest")).get("combined_from")) if isinstance(c, Mapping)]
    lines = [line(_map(c.get(key))) for c in children]
    if len(set(lines)) <= 1:
        return None
    return "; ".join(f"{', '.join(one_line(b) for b in _list(c.get('backends')))}: {ln or 'not recorded'}"
                     for c, ln in zip(children, lines))


def hardware_line(meta: Mapping[str, Any]) -> str:
    """`2x NVIDIA GeForce RTX 5090, CUDA 12.8, driver 570.86` or `no GPU telemetry (NVML not available)`
    (a combined run of children on different GPUs: each child's, `_per_child`)."""
    per = _per_child(meta, "gpus", lambda g: _hardware_line({"manifest": {"gpus": g}}))
    return per if per is not None else _hardware_line(meta)


def _hardware_line(meta: Mapping[str, Any]) -> str:
    gpus = _map(_map(meta.get("manifest")).get("gpus"))
    devices = [d for d in _list(gpus.get("devices")) if isinstance(d, Mapping)]
    if gpus.get("available") is True and devices:
        counts: dict[str, int] = {}
        for d in devices:
            name = one_line(d.get("name")) if d.get("name") else "unknown GPU"
            counts[name] = counts.get(name, 0) + 1
        parts = [", ".join(f"{n}x {name}" for name, n in counts.items())]
        if gpus.get("cuda_version"):
            parts.append(f"CUDA {one_line(gpus['cuda_version'])}")
        if gpus.get("driver_version"):
            parts.append(f"driver {one_line(gpus['driver_version'])}")
        return ", ".join(parts)
    return gpu_unavailable_reason(meta) or NO_GPU_TELEMETRY


def gpu_unavailable_reason(meta: Mapping[str, Any]) -> str | None:
    """`no GPU telemetry (NVML not available)` when the manifest records no GPU, else None.
    Never the raw reason (an exception's text, a library path): that stays in manifest.json,
    where `soakspec verify` and a reader of the evidence find it."""
    gpus = _map(_map(meta.get("manifest")).get("gpus"))
    if gpus.get("available") is True and _list(gpus.get("devices")):
        return None
    if gpus.get("available") is True:
        return "no GPU telemetry (NVML found no GPU device)"
    return NO_GPU_TELEMETRY


def host_line(meta: Mapping[str, Any]) -> str | None:
    per = _per_child(meta, "host", lambda h: _host_line({"manifest": {"host": h}}))
    return per if per is not None else _host_line(meta)


def _host_line(meta: Mapping[str, Any]) -> str | None:
    host = _map(_map(meta.get("manifest")).get("host"))
    cpu = host.get("cpu_model")
    if not cpu:
        return None
    cores = as_int(host.get("cpu_cores"))
    return one_line(cpu) + (f", {cores} cores" if cores else "")


def run_lines(verdict: Any, meta: Mapping[str, Any]) -> tuple[str, str]:
    """(`rehearsal: no`, `time scale: 1 (full scale)`) in words."""
    rehearsal, scale = verdict.rehearsal, verdict.time_scale  # as the judge read the manifest
    r = "yes: every backend was replaced by the simulator" if rehearsal else "no"
    if scale == 1:
        s = "1 (full scale)"
    else:
        s = f"{scale:g} (every duration was multiplied by {scale:g})"
    if (rehearsal or scale != 1) and not getattr(verdict, "passed", False):
        s += "; such a run cannot pass a full-scale gate unless the gate sets allow_rehearsal"
    return r, s


def _join(values: Sequence[Any]) -> str:
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def workload_line(w: Any) -> str:
    """The seed's workload line for one workload, from the spec (planned values)."""
    parts = []
    if w.prompt_file:
        parts.append(f"prompt_file={one_line(w.prompt_file)}")
        if w.prompt_order == "shuffled":  # a seeded order, not the file's (soakspec/draws.py)
            parts.append(f"prompt_order=shuffled(seed={w.load.seed})")
        if w.multi_turn:
            parts.append("multi_turn")
        if w.multi_turn and w.think_time:
            think = "-".join(f"{t:g}s" for t in dict.fromkeys(w.think_time))
            parts.append(f"think_time={think}" + (f"(seed={w.load.seed})" if len(set(w.think_time)) > 1 else ""))
    elif w.prompt_tokens:  # token-exact prompts: the line said nothing of the prompt at all
        parts.append(f"prompt_tokens={_join(w.prompt_tokens)}")
        if w.prefix_tokens:
            parts.append(f"prefix_tokens={w.prefix_tokens}")
            if w.prefix_groups > 1:
                parts.append(f"prefix_groups={w.prefix_groups}(seed={w.load.seed})")
    elif w.load.replay is not None:  # each request's lengths are its trace line's, not prompt_words / max_tokens
        parts.append(f"prompt of input_length {'tokens' if w.load.replay.tokens else 'words'}, max_tokens=output_length "
                     "(each request its trace line's)")
    elif w.prompt_words is not None:
        parts.append(f"prompt_words={w.prompt_words}")
    if w.load.replay is None:
        parts.append(f"max_tokens={_join(w.max_tokens)}")
    if w.length_range:  # random lengths around prompt_words/prompt_tokens and max_tokens
        parts.append(f"length_range={w.length_range * 100:g}%")
    s = w.sampling
    if s.greedy:
        parts.append("greedy")
    else:
        samp = [f"temperature={s.temperature:g}", f"top_p={s.top_p:g}"]
        if s.top_k is not None:
            samp.append(f"top_k={s.top_k}")
        if s.seed is not None:
            samp.append(f"seed={s.seed}")
        parts.append("sampling " + " ".join(samp))
    parts.append("ignore-EOS" if w.ignore_eos else "stops at EOS")
    load = w.load
    if load.phases or load.replay is not None:
        parts.append(shaped_load_text(load, w.warmup_s + w.duration_s))
    elif load.search is not None:  # the levels are the search's bounds, not levels that ran as such
        parts.append(f"{workload_sweep(w).label()} ({load.search})")
        parts.append(f"open loop ({load.arrival} arrivals, seed {load.seed})" if load.mode == "open" else "closed loop")
    elif load.mode == "open":
        bursty = f", burstiness {load.burstiness:g}" if load.burstiness != 1 else ""
        parts.append(f"open loop, rates {', '.join(f'{r:g}' for r in load.rates)} rps ({load.arrival} arrivals{bursty}, seed {load.seed})")
    else:
        parts.append(f"concurrency {_join(load.concurrency)}")
        parts.append("closed loop" if load.mode == "closed" else f"batch mode (batches of {load.requests})")
    # what changes what the figures mean: the cap's queue is in TTFT and latency, and a count
    # (not the duration) ends a level (README, Load shapes)
    if load.max_concurrency is not None:
        parts.append(f"max_concurrency={load.max_concurrency}")
    if load.requests_per_level is not None:
        parts.append(f"requests_per_level={load.requests_per_level}")
    if load.requests_per_level is not None and load.min_duration_s is not None:
        parts.append(f"min_duration_s={load.min_duration_s:g}")
    per = "in all" if load.phases else "per probe" if load.search else "per level"
    if load.requests_per_level is not None:
        per += " (at most: the count ends it)" if load.min_duration_s is None else " (at most: the count and min_duration end it)"
    parts.append(f"duration_s={w.duration_s:g} {per}")
    parts.append(f"bucket_s={w.bucket_s:g}")
    if w.warmup_s:
        parts.append(f"warmup_s={w.warmup_s:g}")
    if w.warmup_requests is not None:  # a counted warmup: bucket 0 starts once its requests have finished
        parts.append(f"warmup={w.warmup_requests} requests per level")
    parts.append(f"deadline_s={w.deadline_s:g}")
    parts.append(f"/v1/{'chat/completions' if w.endpoint == 'chat' else 'completions'}, {'streaming' if w.stream else 'not streaming'}")
    if w.follow_up:
        parts.append("clean follow-up request")
    return ", ".join(parts)


def required_trace_coverage(spec: Any) -> float | None:
    from soakspec.judge.summary import required_trace_coverage as rtc

    return rtc(spec)


# ------------------------------------------------------------------------------ rules


def open_rules(verdict: Any) -> list[Any]:
    """Rules that did not pass (fail, inconclusive, not evaluated, warn), in the verdict's order."""
    return [r for r in verdict.rules if r.status != "pass"]


def rule_detail_lines(r: Any) -> list[str]:
    """The failing instances under a rule's message (the first is often the message itself)."""
    shown = list(r.details)
    if shown and shown[0].message in r.message:
        shown = shown[1:]
    lines = [f"{d.where.text}: {d.message}" if d.where.text else d.message for d in shown]
    extra = r.failing - len(r.details)
    if extra > 0:
        lines.append(f"... and {extra} more")
    return [one_line(x) for x in lines]


def observed_lines(r: Any) -> list[str]:
    """Key: value lines of what a rule observed (JUnit system-out, HTML titles)."""
    out = [f"rule: {r.rule}", f"class: {r.klass}", f"severity: {r.severity}", f"status: {r.status}"]
    if r.line is not None:
        out.append(f"spec line: {r.line}")
    if r.scope:
        out.append(f"scope: {r.scope}" + (f" ({r.window_s:g}s windows)" if r.window_s else ""))
    if r.threshold_text is not None or r.op is not None:
        out.append(f"threshold: {r.op or ''} {r.threshold_text or ''}".rstrip())
    if r.observed_text is not None:
        out.append(f"observed: {r.observed_text}")
    elif isinstance(r.observed, bool):
        out.append(f"observed: {'yes' if r.observed else 'no'}")
    elif r.observed is not None:
        out.append(f"observed: {r.observed:g}")
    if r.samples is not None:
        out.append(f"samples: {r.samples}")
    if r.needs is not None:
        out.append(f"needs: {r.needs} more")
    if r.where is not None and r.where.text:
        out.append(f"where: {r.where.text}")
    if r.instances:
        out.append(f"instances: {r.instances} evaluated, {r.failing} not passing")
    out.append(f"message: {r.message}")
    out += [f"  {d}" for d in rule_detail_lines(r)]
    return [clean_text(x) for x in out]


def verdict_sentence(verdict: Any) -> str:
    """`2 of 14 required rules could not be decided; 1 warning` -- the summary without rule
    text (rule text goes into code blocks, where review tools do not read it as prose)."""
    req = [r for r in verdict.rules if r.severity == "require"]
    failed = sum(1 for r in req if r.status == "fail")
    unsure = sum(1 for r in req if r.status in ("inconclusive", "not_evaluated"))
    warned = sum(1 for r in verdict.rules if r.severity == "warn" and r.status != "pass")
    if verdict.outcome == "FAIL":
        text = f"{failed} of {len(req)} required rules failed"
        if unsure:
            text += f", {unsure} could not be decided"
    elif verdict.outcome == "INCONCLUSIVE":
        text = f"{unsure} of {len(req)} required rules could not be decided"
        if failed:  # a partial run's (killed before it finished): its verdict is never FAIL, but these failed
            text += f", {failed} failed on the evidence so far"
    else:
        text = f"all {len(req)} required rules hold"
    if warned:
        text += f"; {warned} warn rule{'s' if warned != 1 else ''} did not pass"
    return text


# ------------------------------------------------------------------------------ per level


@dataclasses.dataclass(frozen=True)
class LevelRow:
    """One backend and level of results.json, as the per-level tables show it."""

    backend: str
    workload: str | None
    level: int | None
    label: str
    offered: str  # `4 req/s (open loop)`, `concurrency 4`, `concurrency 4, batches of 8`
    offered_rate: float | None  # req/s an open-loop level offered (nominal: results.json `rate`)
    qps: float | None  # achieved: requests completed per second (ended in the level's buckets)
    tokens_per_s: float | None
    in_flight: float | None  # mean requests in flight
    ttft: Mapping[str, Any] | None
    itl: Mapping[str, Any] | None
    tpot: Mapping[str, Any] | None
    latency: Mapping[str, Any] | None
    requests: Mapping[str, Any]
    itl_coalesced: Mapping[str, Any] | None = None  # {gaps, coalesced}: ITL samples that are not independent
    excluded: Mapping[str, Any] | None = None  # {tpot: {reason: n}, itl: {...}}: completed requests left out
    total_tokens_per_s: float | None = None  # prompt + output tokens/s (None: a bucket's unknown, `wall_mean_whole`)
    scheduled_rate: float | None = None  # req/s an open loop's schedule put in its measured window (`offered_text`)
    # bench serve's two peaks, results.json's `peak_output_tokens_per_s` / `peak_concurrent_requests`
    # as judged (`soakspec.judge.peaks`; the bench block prints the same fields): None where the level
    # has none (no completed request) or the results are from before they were recorded
    peak_tokens_per_s: int | None = None
    peak_concurrent: int | None = None


# the per-level table's heads of the two peaks (md and html): bench serve's `Peak output token
# throughput (tok/s)` and `Peak concurrent requests`, shortened as the table's other heads are, and
# as `lint-claims` reads a column (`claims.figures`); a level without one shows "-"
PEAK_TOKENS_HEAD, PEAK_CONCURRENT_HEAD = "Peak output tok/s", "Peak concurrent requests"


@dataclasses.dataclass(frozen=True)
class ClientRow:
    """The load generator's health over one backend and level (results.json buckets' `client`):
    the worst bucket of each measure, so a saturated bucket is never averaged away."""

    backend: str
    label: str
    lag_p99: float | None  # event-loop lag p99 (time-weighted), worst bucket
    cpu: float | None  # a load process's CPU, fraction of one core, worst bucket
    host_cpu: float | None  # the machine's CPUs busy, worst bucket
    schedule_lag_p99: float | None
    achieved: float | None  # achieved concurrency (closed) or rate (open) of the bucket furthest below its offered
    offered: float | None  # what that bucket offered
    coalesced: float | None  # share of the level's ITL gaps that are coalesced
    lags: tuple[float | None, ...] = ()  # per bucket, in order (the HTML chart)
    # an open loop under max_concurrency: its requests, those that waited for a slot, the wait's
    # p99 (worst bucket); None: the level declared no cap
    cap_requests: int | None = None
    cap_waited: int | None = None
    cap_wait_p99: float | None = None
    # and its TTFT and latency from the send (results.json levels' sent_ttft, sent_latency)
    sent_ttft: Mapping[str, Any] | None = None
    sent_latency: Mapping[str, Any] | None = None


def _worst(vals: Sequence[Any], pick=max) -> float | None:
    known = [v for v in (num(x) for x in vals) if v is not None]
    return pick(known) if known else None


def levels_with_buckets(results: Mapping[str, Any]):
    """(backend, level, that level's buckets) for every level of results.json, in order."""
    for b in _list(results.get("backends")):
        if not isinstance(b, Mapping):
            continue
        buckets = [w for w in _list(b.get("buckets")) if isinstance(w, Mapping)]
        for lv in _list(b.get("levels")):
            if isinstance(lv, Mapping):
                yield b, lv, [w for w in buckets if w.get("level") == lv.get("index") and w.get("workload") == lv.get("workload")]


def client_rows(results: Mapping[str, Any]) -> list[ClientRow]:
    out = []
    for b, lv, mine in levels_with_buckets(results):
        cs = [_map(w.get("client")) for w in mine]
        if not any(c.get("samples") for c in cs):
            continue
        co = _map(lv.get("itl_coalesced"))
        gaps = num(co.get("gaps"))
        # the bucket that fell furthest short of what it offered (a ramp offers less before its peak)
        pairs = [(a, o) for c in cs if (a := num(c.get("achieved"))) is not None and (o := num(c.get("offered")))]
        achieved, offered = min(pairs, key=lambda p: p[0] / p[1]) if pairs else (None, _worst([c.get("offered") for c in cs]))
        out.append(ClientRow(
            backend=one_line(b.get("name")), label=one_line(lv.get("label") or f"level {lv.get('index')}"),
            lag_p99=_worst([c.get("lag_p99") for c in cs]), cpu=_worst([c.get("cpu") for c in cs]),
            host_cpu=_worst([c.get("host_cpu") for c in cs]), schedule_lag_p99=_worst([c.get("schedule_lag_p99") for c in cs]),
            achieved=achieved, offered=offered,
            coalesced=(num(co.get("coalesced")) or 0) / gaps if gaps else None,
            lags=tuple(num(c.get("lag_p99")) for c in cs),
            **_cap_fields(cs), sent_ttft=_map(lv.get("sent_ttft")) or None, sent_latency=_map(lv.get("sent_latency")) or None,
        ))  # fmt: skip
    return out


def _cap_fields(cs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The level's waits behind its max_concurrency, from its buckets' client rows (none: {})."""
    counted = [(c.get("cap_requests"), c.get("cap_waited")) for c in cs]
    counted = [(n, w) for n, w in counted if type(n) is int and type(w) is int]
    if not counted:
        return {}
    return {"cap_requests": sum(n for n, _ in counted), "cap_waited": sum(w for _, w in counted),
            "cap_wait_p99": _worst([c.get("cap_wait_p99") for c in cs])}


def cap_notes(results: Mapping[str, Any]) -> list[str]:
    """`sim · rate 40 rps, max_concurrency 2: 78 of 80 requests waited for a slot (p99 wait
    4.6s) ...`: what each level's declared cap held back, where a level declared one."""
    out = []
    for c in client_rows(results):
        if c.cap_waited is None:
            continue
        wait = f" (worst bucket's p99 wait {format_duration(c.cap_wait_p99)})" if c.cap_wait_p99 is not None and c.cap_waited else ""
        out.append(f"{c.backend} · {c.label}: {c.cap_waited} of {c.cap_requests} requests waited for a slot under "
                   f"max_concurrency{wait}. The wait is the spec's declared cap, counted in their latency and TTFT (from "
                   "the intended send time), not judged as the load generator's schedule lag." + _sent_text(c))
    return out


def _sent_text(c: ClientRow) -> str:
    """` From the send (the server's view, as vLLM's bench serve measures): TTFT p50 / p95 / p99
    82ms / 95ms / 101ms, latency ...`: the level's sent_ttft and sent_latency, where results.json has them."""
    parts = []
    for name, d in (("TTFT", c.sent_ttft), ("latency", c.sent_latency)):
        vals = [num(d.get(p)) for p in ("p50", "p95", "p99")] if d else []
        if vals and all(v is not None for v in vals):
            parts.append(f"{name} p50 / p95 / p99 " + " / ".join(format_duration(v) for v in vals))
    if not parts:
        return ""
    return (" From the send (the server's view, what vLLM's bench serve and SGLang's bench_serving report; "
            "rules: sent_ttft, sent_latency): " + ", ".join(parts) + ".")


def drain_notes(results: Mapping[str, Any]) -> list[str]:
    """`sim · rate 40 rps, max_concurrency 1, 20 requests: bucket 0 ran 4.72s of its planned 1s:
    it holds the drain of 19 requests ...`: a level its count ended whose last bucket is longer
    than planned (`judge.summary.drain_summary`), so its per-bucket figures are read over that
    bucket's whole window."""
    out = []
    for b in _list(results.get("backends")):
        if not isinstance(b, Mapping):
            continue
        for lv in _list(b.get("levels")):
            d = lv.get("drain") if isinstance(lv, Mapping) else None
            if not isinstance(d, Mapping) or num(d.get("wall_s")) is None or num(d.get("planned_length_s")) is None:
                continue
            label = one_line(lv.get("label") or f"level {lv.get('index')}")
            out.append(f"{one_line(b.get('name'))} · {label}: bucket {d.get('bucket')} ran {format_duration(num(d['wall_s']))} "
                       f"of its planned {format_duration(num(d['planned_length_s']))}: it holds the drain of "
                       f"{d.get('ended_late')} requests that ended after its planned end. A level its requests_per_level "
                       "ends measures until its last request ends (requests queued behind max_concurrency, or still "
                       "running, are served then); a request belongs to the bucket it was due in, its wait in its latency, "
                       "so this bucket's rates and server scrapes span its whole window.")
    return out


CLIENT_NOTE = ("The load generator's own health, worst bucket of each level: a saturated client reports its own lag as "
               "the server's latency, so the built-in client_healthy makes such a run INCONCLUSIVE (thresholds: the gate's "
               "client_lag, client_cpu, client_schedule_lag, client_concurrency).")


def exclusion_notes(results: Mapping[str, Any]) -> list[str]:
    """`TPOT leaves out 3 completed requests of sim-fast · concurrency 4: fewer than 2 tokens (3)`:
    every metric that leaves requests out says how many and why (a capped level's times from the
    send by `lang.metrics.exclusion_title`: "TTFT from the send leaves out ...")."""
    out = []
    for lv in level_rows(results):
        for metric, why in _map(lv.excluded).items():
            why = _map(why)
            n = sum(int(v) for v in why.values() if isinstance(v, int))
            if n:
                reasons = "; ".join(f"{one_line(k)} ({v})" for k, v in sorted(why.items()))
                out.append(f"{exclusion_title(metric)} leaves out {n} completed request{'s' if n != 1 else ''} of {lv.backend} · {lv.label}: {reasons}")
    return out


def _valued(windows: Sequence[Mapping[str, Any]], key: str) -> list[tuple[float | None, float | None]]:
    """Each bucket's (value of `key`, wall time), as JSON numbers or None."""
    return [(num(w.get(key)), num(w.get("wall_s"))) for w in windows]


def timed_values(pairs: Sequence[tuple[float | None, float | None]], whole: bool = False) -> list[tuple[float, float]] | None:
    """The (value, wall time) of the buckets that have a wall time (> 0) and a value. With
    `whole`, None when a bucket with a wall time has no value: the figure over the level is
    unknown then (total_tokens_per_s of a bucket that delivered a request with no prompt count),
    and the other buckets' would read as the level's. The one rule for which buckets count: the
    report's wall-time-weighted means and lint-claims' per-bucket means (`claims/adapters.py`)."""
    if whole and any(v is None and t is not None and t > 0 for v, t in pairs):
        return None
    return [(v, t) for v, t in pairs if v is not None and t is not None and t > 0]


def _weighted(known: list[tuple[float, float]] | None) -> float | None:
    wall = sum(t for _, t in known or ())
    return sum(v * t for v, t in known or ()) / wall if wall else None


def wall_mean(windows: Sequence[Mapping[str, Any]], key: str) -> float | None:
    """A per-bucket rate over a level: the buckets' values weighted by their wall time."""
    return _weighted(timed_values(_valued(windows, key)))


def wall_mean_whole(windows: Sequence[Mapping[str, Any]], key: str) -> float | None:
    """`wall_mean`, but None when a bucket with a wall time has no value: total_tokens_per_s of
    a bucket that delivered a request with no prompt count is unknown, and the other buckets'
    mean would read as the level's."""
    return _weighted(timed_values(_valued(windows, key), whole=True))


def shaped_load_text(load: Any, until_s: float = float("inf")) -> str:
    """A workload's phases (`phases ramp 5→20 rps 1s, steady 20 rps 1.5s, ...`) or its replayed
    trace, with its prefix sharing over the requests sent before `until_s` (the warmup and duration)."""
    if load.replay is not None:
        rp = load.replay
        text = (f"replay of {len(rp.offsets_s)} requests from {rp.path} ({rp.format}, sha256 {rp.sha256[:12]}"
                + (f", speed {rp.speed:g}" if rp.speed != 1 else "") + ")")
        if not rp.hash_ids:
            return text
        blocks, distinct, _ = sharing(rp.offsets_s, rp.input_lens, rp.hash_ids, rp.hash_block, rp.speed, until_s)
        share = (blocks - distinct) / blocks if blocks else 0.0
        return (text + f", prompts from its hash_ids in blocks of {rp.hash_block} {'tokens' if rp.tokens else 'words'} "
                f"(seed {load.seed}): {blocks:,} blocks, {distinct:,} distinct, {share:.0%} repeat an earlier request's")
    unit = " rps" if load.mode == "open" else ""
    what = "open loop" if load.mode == "open" else "closed loop, concurrency"
    items = []
    for p in load.phases:
        val = f"{p.start:g}{unit}" if p.end is None else f"{p.start:g}→{p.end:g}{unit}" + (f" in {p.steps} steps" if p.steps else "")
        extra = f" (burstiness {p.burstiness:g})" if p.burstiness != 1 else ""
        items.append(f"{p.name} {val} for {p.duration_s:g}s{extra}")
    arrivals = f" ({load.arrival} arrivals, seed {load.seed})" if load.mode == "open" else ""
    return f"{what} in phases: " + ", ".join(items) + arrivals


def ramp_range(lv: Mapping[str, Any]) -> tuple[float, float, str] | None:
    """(start, end, kind) of a ramp level (results.json level `shape`); None for any other."""
    shape = _map(lv.get("shape"))
    a, b = num(shape.get("start")), num(shape.get("end"))
    if shape.get("kind") not in ("open_ramp", "closed_ramp") or a is None or b is None:
        return None
    return a, b, str(shape["kind"])


def offered_text(lv: Mapping[str, Any]) -> tuple[str, float | None]:
    """The offered load as text, and the one (nominal) rate an open loop offered (None for a
    ramp, whose level `rate` is only where it ends). An open loop whose schedule put another
    rate in the measured window (results.json `scheduled_rate`: seeded random arrivals, 44.4
    req/s in a window of a 40 rps level) offered that: `44.4 req/s scheduled (open loop, 40
    nominal)`, so an achieved 43.7 does not read as the server beating the offer."""
    ramp = ramp_range(lv)
    if ramp is not None:
        a, b, kind = ramp
        return (f"{a:g}→{b:g} req/s (open loop ramp)", None) if kind == "open_ramp" else (f"concurrency {a:g}→{b:g} (ramp)", None)
    mode, rate, conc, batch = lv.get("mode"), num(lv.get("rate")), as_int(lv.get("concurrency")), as_int(lv.get("batch_requests"))
    if rate is not None and mode in (None, "open"):
        sched = num(lv.get("scheduled_rate"))
        if sched is not None and f"{sched:.3g}" != f"{rate:.3g}":  # a random schedule's window: what it offered, the nominal beside
            return f"{sched:.3g} req/s scheduled (open loop, {rate:g} nominal)", rate
        return f"{rate:g} req/s (open loop)", rate
    parts = [f"concurrency {conc}"] if conc is not None else []
    if batch:
        parts.append(f"batches of {batch}")
    return (", ".join(parts) or "-"), None


def count_text(lv: Mapping[str, Any]) -> str:
    """A count-bounded level's requests sent of those asked (results.json `requests_per_level`):
    `, 40 of 40 requests`, or `, 12 of 40 requests (ended by its duration: not complete)`; ""
    for a level run for its duration."""
    c = _map(lv.get("requests_per_level"))
    sent, asked = as_int(c.get("sent")), as_int(c.get("asked"))
    if sent is None or asked is None:
        return ""
    short = " (ended by its duration: not complete)" if c.get("ended_by") not in ("count", "min_duration") else ""
    if not short and sent < asked:  # an open loop's n arrivals, some never sent (`not_sent`)
        short = " (not complete: the load generator could not send the rest)"
    least = c.get("min_duration_s")
    if c.get("ended_by") == "min_duration" and isinstance(least, int | float):  # it sent on past its count
        return f", {sent} requests (at least {asked}; ended by its min_duration, {format_duration(least)})"
    return f", {sent} of {asked} requests{short}"


def level_rows(results: Mapping[str, Any]) -> list[LevelRow]:
    out = []
    for b, lv, mine in levels_with_buckets(results):
        offered, rate = offered_text(lv)
        offered += count_text(lv)
        out.append(LevelRow(
            backend=one_line(b.get("name")), workload=lv.get("workload"), level=as_int(lv.get("index")),
            label=one_line(lv.get("label") or f"level {lv.get('index')}"), offered=offered, offered_rate=rate,
            qps=wall_mean(mine, "qps"), tokens_per_s=wall_mean(mine, "output_tokens_per_s"),
            in_flight=wall_mean(mine, "in_flight"),
            ttft=_map(lv.get("ttft")) or None, itl=_map(lv.get("itl")) or None, tpot=_map(lv.get("tpot")) or None,
            latency=_map(lv.get("latency")) or None, requests=_map(lv.get("requests")),
            itl_coalesced=_map(lv.get("itl_coalesced")) or None, excluded=_map(lv.get("excluded")) or None,
            total_tokens_per_s=wall_mean_whole(mine, "total_tokens_per_s"), scheduled_rate=num(lv.get("scheduled_rate")),
            peak_tokens_per_s=as_int(lv.get("peak_output_tokens_per_s")), peak_concurrent=as_int(lv.get("peak_concurrent_requests")),
        ))
    return out


@dataclasses.dataclass(frozen=True)
class TurnRow:
    """One user turn of a multi-turn level (results.json levels' `turns`)."""

    backend: str
    label: str
    turn: str  # "3", or "21+" for the last entry of turns past those listed one by one
    completed: int | None
    total: int | None
    ttft: Mapping[str, Any] | None
    latency: Mapping[str, Any] | None
    prompt_tokens: float | None  # the mean of the server's counts


TURN_NOTE = ("Multi-turn chat: a turn's prompt carries its conversation so far, so its prompt grows with the "
             "turn while the server's prefix cache may hold the history; TTFT by turn shows what that costs.")


def turn_rows(results: Mapping[str, Any]) -> list[TurnRow]:
    """Per backend, level and user turn of a multi-turn workload, in order (none without one)."""
    out = []
    for b, lv, _ in levels_with_buckets(results):
        for t in _list(lv.get("turns")):
            if not isinstance(t, Mapping) or as_int(t.get("turn")) is None:
                continue
            req = _map(t.get("requests"))
            out.append(TurnRow(
                backend=one_line(b.get("name")), label=one_line(lv.get("label") or f"level {lv.get('index')}"),
                turn=f"{t['turn']}+" if t.get("and_later") is True else str(t["turn"]),
                completed=as_int(req.get("completed")), total=as_int(req.get("total")),
                ttft=_map(t.get("ttft")) or None, latency=_map(t.get("latency")) or None,
                prompt_tokens=num(_map(t.get("prompt_tokens")).get("mean")),
            ))
    return out


NOT_EVALUATED_NOTE = ("Performance rules were not evaluated (a required validity or evidence check failed); "
                      "the figures below are measured from the evidence but not judged.")


def performance_not_evaluated(verdict: Any) -> bool:
    return any(r.klass == "performance" and r.status == "not_evaluated" for r in verdict.rules)


def measured_lines(meta: Mapping[str, Any], r: Any) -> list[str]:
    """For a performance rule that was not evaluated: what each backend measured (marked)."""
    if r.status != "not_evaluated" or r.klass != "performance":
        return []
    out = []
    statuses = meta.get("backend_status")
    for name, st in (statuses.items() if isinstance(statuses, Mapping) else ()):
        for rs in st.rules:
            if rs.rule == r.rule and rs.klass == "performance" and rs.measured is not None:
                m = rs.measured
                shown = m.observed_text or m.message
                out.append(one_line(f"measured, not evaluated: backend {name}: {shown} (would be {m.status_word})"))
    return out


# ------------------------------------------------------------------------------ how the run went

MAX_DIAGNOSIS_LINES = 8  # per backend: the log lines that look like the cause (the manifest keeps them all)


def _at(epoch: Any, start: Any) -> str:
    """`at +12.3s into the run, 12:01:00 UTC` for an epoch time, given the run's start epoch."""
    import datetime as _dt

    t, t0 = num(epoch), num(start)
    if t is None:
        return "at an unrecorded time"
    try:
        clock = _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        clock = None
    rel = f"+{t - t0:.1f}s into the run" if t0 is not None else None
    return "at " + (f"{rel}, {clock}" if rel and clock else rel or clock or f"{t:g}")


def run_state_lines(meta: Mapping[str, Any]) -> list[tuple[str, str]]:
    from soakspec.evidence.redact import redact_text

    """(label, text) facts about how the run went, from the manifest: its status (and when and
    why it aborted), each backend's abort time and crash diagnosis (the server-log lines that
    look like the cause), a failed pre-flight. (A skipped pre-flight and a restricted run,
    `only`, are in the verdict's notes, which every format shows.)"""
    m = _map(meta.get("manifest"))
    out: list[tuple[str, str]] = []
    status = m.get("status") if isinstance(m.get("status"), str) else "unknown"
    start = m.get("started_at_epoch")
    text = one_line(status)
    if status == "running":  # the start-of-run manifest: nothing finalized it
        text += ": the run is incomplete -- its manifest was never finalized (still going, or killed before it ended)"
    if status != "complete":
        if isinstance(m.get("incomplete_reason"), str) and m.get("incomplete_reason"):
            text += f": {one_line(m['incomplete_reason'])}"
        if m.get("aborted_at") is not None:
            text += f" ({_at(m.get('aborted_at'), start)})"
    out.append(("run status", text))
    for e in _list(m.get("backends")):
        if not isinstance(e, Mapping):
            continue
        name = one_line(e.get("name"))
        if e.get("aborted_reason") or e.get("aborted_at") is not None:
            why = one_line(e["aborted_reason"]) if isinstance(e.get("aborted_reason"), str) else "no reason recorded"
            out.append((f"backend {name}", f"aborted {_at(e.get('aborted_at'), start)}: {why}"))
        # the server's own log lines: credential-looking values are scrubbed before they reach a PR
        diag = [one_line(redact_text(x)) for x in _list(e.get("crash_diagnosis")) if isinstance(x, str) and x.strip()]
        if diag:
            shown = diag[-MAX_DIAGNOSIS_LINES:]
            more = f" (last {len(shown)} of {len(diag)}; all in manifest.json)" if len(diag) > len(shown) else ""
            out.append((f"backend {name} crash diagnosis", f"server log lines that look like the cause{more}: " + " | ".join(shown)))
        failed = [p for p in _list(e.get("preflight")) if isinstance(p, Mapping) and p.get("passed") is False]
        for p in failed:
            rec = _map(p.get("record"))
            why = rec.get("error") or rec.get("outcome") or "did not complete"
            out.append((f"backend {name} pre-flight", f"workload {one_line(p.get('workload'))} failed: {one_line(why)}"))
    return out


def run_state_json(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The same facts for `--format json`: values as the manifest records them (the crash
    diagnosis's server-log lines scrubbed of credential-looking values, as in every report)."""
    from soakspec.evidence.redact import redact_text

    m = _map(meta.get("manifest"))
    backends = {}
    for e in _list(m.get("backends")):
        if isinstance(e, Mapping) and isinstance(e.get("name"), str):
            backends[e["name"]] = {
                "aborted_at": num(e.get("aborted_at")),
                "aborted_reason": e.get("aborted_reason") if isinstance(e.get("aborted_reason"), str) else None,
                "crash_diagnosis": [redact_text(x) for x in _list(e.get("crash_diagnosis")) if isinstance(x, str)],
                "preflight": (None if e.get("preflight") is None else
                              [{"workload": p.get("workload"), "passed": p.get("passed")} for p in _list(e.get("preflight"))
                               if isinstance(p, Mapping)]),
            }
    return {
        "status": m.get("status") if isinstance(m.get("status"), str) else None,
        "incomplete_reason": m.get("incomplete_reason") if isinstance(m.get("incomplete_reason"), str) else None,
        "aborted_at": num(m.get("aborted_at")),
        "preflight": m.get("preflight") if isinstance(m.get("preflight"), bool) else None,
        "only": [x for x in _list(m.get("only")) if isinstance(x, str)] or None,
        "backends": backends,
        "lines": [{"label": k, "text": v} for k, v in run_state_lines(meta)],
    }


def run_went_normally(lines: Sequence[tuple[str, str]]) -> bool:
    """Only `run status: complete`: nothing the reports need to call out."""
    return [k for k, _ in lines] == ["run status"] and lines[0][1] == "complete"


# ---------------------------------------------------------------- sweeps and goodput (results.json)

GOODPUT_NOTE = ("Goodput counts measured requests that completed and meet every condition; a request that failed, "
                "timed out or lacks a condition's value does not. The share is of the requests sent in the level; "
                "the rate is of the requests the server delivered in its buckets (the part of Achieved req/s that met it).")


@dataclasses.dataclass(frozen=True)
class SweepView:
    """One backend's sweep as reports show it: the figure, its value, and every probe in run order."""

    backend: Any
    figure: Any
    axis: Any
    value: str  # "12 rps", or "none (...)"
    bound: str  # "" or why the search stopped early
    probes: tuple[tuple[int, Any, str, Any], ...]  # (probe number, value, holds: yes | no | inconclusive, why)


def _sweep_value(sw: Mapping[str, Any], unit: str) -> str:
    """The figure of results.json's sweep entry as the verdict states it (`judge.sweep.value_text`)."""
    from soakspec.judge.sweep import value_text

    result = sw.get("result")
    bound = sw.get("lower_bound")
    probes = [p for p in sw.get("probes") or [] if isinstance(p, Mapping) and isinstance(p.get("value"), (int, float))]
    return value_text(result if isinstance(result, (int, float)) else None, bound if isinstance(bound, str) else None,
                      probes, unit)


def sweep_views(results: Mapping[str, Any]) -> list[SweepView]:
    out = []
    for sw in results.get("sweep") or []:
        if not isinstance(sw, Mapping):
            continue
        unit = " rps" if sw.get("axis") == "rate" else ""
        value = _sweep_value(sw, unit)
        bound = " — bounded by max wall time (the best holding level so far)" if sw.get("bounded_by_wall_time") else ""
        probes = tuple(
            (i + 1, p.get("value"), "yes" if p.get("passed") else ("inconclusive" if p.get("status") == "inconclusive" else "no"),
             p.get("why"))
            for i, p in enumerate(sw.get("probes") or []) if isinstance(p, Mapping))  # fmt: skip
        out.append(SweepView(sw.get("backend"), sw.get("figure"), sw.get("axis"), value, bound, probes))
    return out


def goodput_rows(results: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """results.json `goodput` rows (per SLO set and level), each with `share` as text."""
    rows = [g for g in results.get("goodput") or [] if isinstance(g, Mapping)]
    return [dict(g, share="n/a" if g.get("goodput") is None else f"{g['goodput'] * 100:.4g}%") for g in rows]
