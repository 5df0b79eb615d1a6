"""Adapters: a checked spec -> (ClaimBoundary, Coverage); an evidence directory -> EvidenceFacts.

The only module of `soakspec.claims` that touches files or the language front end. Kept thin
and tolerant on purpose: the spec and evidence formats are still moving.

Spec (via `soakspec.lang`): `load_spec(path)` when it exists, else `parse_file` + `check`.
Reads `spec.claims.claims`/`.excludes` (strings, or objects with `.text`), `spec.backends`
(`.name`, `.runtime.label`), `spec.workloads` (`.concurrency` or `.load.concurrency`,
`.rates` or `.load.rates`, `.duration_s`, `.prompt_words` (int or tuple), `.prompt_file`,
`.max_tokens`), `spec.model.id`/`.revision`, `spec.hardware` (optional) and `spec.sha256`
(else the SHA-256 of the file's bytes).

Evidence directory (`load_evidence_facts(dir)`, one `EvidenceFacts` per backend). results.json
and verdict.json below are the evidence RE-JUDGED (`_rejudge`: verified, judged with the spec
the manifest embeds, as `soakspec gate`/`report` do), not the stored files, which no hash
covers; the stored files are compared with them (`stored_mismatch`, CB402). Only evidence that
cannot be re-judged (no embedded spec) is read from the stored files:
- manifest.json: `spec_sha256` or `spec.sha256`; `backends` as {name: entry} or [{name, …}];
  per entry `commit_after`/`commit_before` (or under `source`), `model.revision`,
  `runtime_boundary.display` (or a string); `artifacts` {relpath: sha256}.
- results.json: `backends` as {name: entry} or [{name, …}]; per entry `completed`,
  `failed`, `timeouts` (or `requests.completed/failed/timeout`), `buckets` (int or list; a
  list's items give `concurrency`), `batches`/`leafs`/`leaves` (int or list), `gate` (string,
  or `{verdict}`/`{passed: bool}`), `duration_s`, `concurrency_levels`; `levels` (per level:
  label as the reports print it, concurrency/rate, `requests`, its buckets -> `LevelFacts`;
  its `ttft`/`itl`/`tpot`/`latency` (and a capped level's `sent_ttft`/`sent_latency`) aggregates
  and its buckets' `output_tokens_per_s` / `total_tokens_per_s` / `qps` -> `LevelFacts.figures`).
- verdict.json rules' details (`observed_text` "p99(ttft) = 1.82s", `observed`) at backend and
  level scope -> `EvidenceFacts.figures` / `LevelFacts.figures` (the gate's own measurements).
- manifest.json `gpus.devices[].name` -> `hardware` ("2x NVIDIA GeForce RTX 5090").
- verdict.json (optional): `verdict` (PASS/FAIL/INCONCLUSIVE) when a backend has no `gate`.
- The report hash of a backend: the artifact whose relpath names the backend and contains
  "report", else the backend's requests.jsonl (what `soakspec report --format md` cites in
  its Artifact SHA-256 column). Every other 64-hex string anywhere in
  manifest.json/results.json, and the SHA-256 of those two files, go into `artifact_sha256`,
  so a document may cite any hash the evidence records.

A comparison (`change_facts(doc, source)`, for `lint-claims --compare`): `soakspec compare`'s
JSON document -- `Comparison.to_json()` of a comparison run in-process, or a file `compare
--format json` wrote -- whose `schema_version` is one this soakspec writes and `kind` is
"comparison". Each `rows[]` entry's `backend`, `new_backend`, `label`, `metric`, `stat`, `unit`,
`base`, `new`, `change`, `change_kind`, `ci_low`, `ci_high`, `row_confidence`, `verdict` and
`turn` are read (a multi-turn level's rows per turn are kept with their turn: a claim that
names a turn is checked against them, one that names none against the level's rows); a row
without them, or a document of another kind or version, is an `AdapterError`, never a
comparison read as empty.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from pathlib import Path
from typing import Any

from soakspec.claims.facts import ChangeFacts, ChangeRow, SweepChangeRow, ClaimBoundary, Coverage, EvidenceFacts, LevelFacts
from soakspec.diagnostics import Diagnostic
from soakspec.evidence import layout
from soakspec.evidence.io import loads


class AdapterError(Exception):
    """The spec or evidence cannot be turned into facts (printed as one line, exit 2)."""


# ---------------------------------------------------------------- spec

def _lang():
    try:
        import soakspec.lang as lang
    except ImportError as e:  # pragma: no cover - only before the language front end lands
        raise AdapterError(f"the .soak language front end is not available ({e})") from e
    if not hasattr(lang, "load_spec") and not (hasattr(lang, "parse_file") and hasattr(lang, "check")):
        raise AdapterError("soakspec.lang has neither load_spec nor parse_file/check: the language front end has not landed")
    return lang


def _text(x: Any) -> str:
    return x if isinstance(x, str) else str(getattr(x, "text", x))


def _ints(v: Any) -> tuple[int, ...]:
    if v is None:
        return ()
    if isinstance(v, (int, float)):
        return (int(v),)
    return tuple(int(x) for x in v)


def _sweep_cover(load: Any, conc: tuple[int, ...], rts: tuple[float, ...]) -> tuple[str, float, tuple[float, ...]]:
    """A sweep's axis, its highest level and its grid (every level it may probe)."""
    from soakspec.plan import sweep_grid

    if rts:
        lo, hi = min(rts), max(rts)
        step = getattr(load, "rate_step", None) or (hi - lo) / 16 or 1.0
        return "rate", hi, sweep_grid(lo, hi, step, integer=False)
    lo, hi = min(conc), max(conc)
    return "concurrency", float(hi), sweep_grid(lo, hi, max(1, int(getattr(load, "step", 1) or 1)), integer=True)


def coverage_from_spec(spec: Any) -> Coverage:
    levels: set[int] = set()
    rates: set[float] = set()
    words: set[int] = set()
    max_tokens: set[int] = set()
    prompt_file = None
    duration = 0.0
    total = 0.0
    sweep_axis: str | None = None
    sweep_high: float | None = None
    for w in getattr(spec, "workloads", ()):
        load = getattr(w, "load", None)
        conc = _ints(getattr(w, "concurrency", None) or getattr(load, "concurrency", None))
        rts = tuple(float(r) for r in (getattr(w, "rates", None) or getattr(load, "rates", None) or ()))
        levels |= set(conc)
        rates |= set(rts)
        words |= set(_ints(getattr(w, "prompt_words", None)))
        max_tokens |= set(_ints(getattr(w, "max_tokens", None)))
        prompt_file = prompt_file or getattr(w, "prompt_file", None)
        d = float(getattr(w, "duration_s", 0.0) or 0.0)
        duration = max(duration, d)
        total += d * max(1, len(conc) + len(rts))
        if getattr(load, "search", None) is not None and (conc or rts):  # a sweep covers its whole grid
            sweep_axis, sweep_high, grid = _sweep_cover(load, conc, rts)
            levels |= {int(v) for v in grid} if sweep_axis == "concurrency" else set()
            rates |= {float(v) for v in grid} if sweep_axis == "rate" else set()
            total = max(total, float(getattr(load, "max_wall_s", 0.0) or 0.0))
    backends = tuple(b.name for b in getattr(spec, "backends", ()))
    runtimes = tuple(
        b.runtime.label for b in getattr(spec, "backends", ()) if getattr(b, "runtime", None) is not None
    )
    model = getattr(spec, "model", None)
    hardware = getattr(spec, "hardware", ()) or ()
    return Coverage(
        concurrency_levels=tuple(sorted(levels)),
        rates=tuple(sorted(rates)),
        duration_s=duration,
        total_duration_s=total,
        prompt_words=tuple(sorted(words)),
        prompt_file=prompt_file,
        max_tokens=tuple(sorted(max_tokens)),
        backends=backends,
        runtime_boundaries=runtimes,
        hardware=tuple(str(h) for h in hardware) if not isinstance(hardware, str) else (hardware,),
        model_ids=tuple(x for x in [getattr(model, "id", None)] if x),
        model_revisions=tuple(x for x in [getattr(model, "revision", None)] if x),
        sweep_axis=sweep_axis,
        sweep_high=sweep_high,
    )


def load_boundary_and_coverage(
    spec_path: str | Path, source: str | None = None
) -> tuple[ClaimBoundary | None, Coverage | None, str | None, list[Diagnostic]]:
    """Parse and check a spec (its `source` text when the caller has read it already, else the
    file). Returns (boundary, coverage, spec sha256, diagnostics); the first three are None when
    the spec has errors. Raises AdapterError when the front end is missing."""
    from soakspec.diagnostics import has_errors

    lang = _lang()
    path = Path(spec_path)
    if source is not None:
        tree, diags = lang.parse(source, str(path))
        spec = None
        if tree is not None and not has_errors(diags):
            spec, more = lang.check(tree, path=str(path))
            diags = list(diags) + list(more)
    elif hasattr(lang, "load_spec"):
        spec, diags, *_ = lang.load_spec(path)
    else:
        parsed = lang.parse_file(path)
        tree, diags = parsed[0], list(parsed[1])
        spec = None
        if tree is not None and not has_errors(diags):
            spec, more = lang.check(tree, path=str(path))
            diags = diags + list(more)
    diags = list(diags)
    if spec is None or has_errors(diags):
        return None, None, None, diags
    claims = getattr(spec, "claims", None)
    boundary = ClaimBoundary(
        claims=tuple(_text(c) for c in getattr(claims, "claims", ())),
        excludes=tuple(_text(e) for e in getattr(claims, "excludes", ())),
    )
    sha = getattr(spec, "sha256", None) or hashlib.sha256(path.read_bytes()).hexdigest()
    return boundary, coverage_from_spec(spec), sha, diags


# ---------------------------------------------------------------- evidence

_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")


def _read_json(path: Path) -> Any:
    """A stored JSON file of the evidence, or None when there is none -- nor any plain file
    (`layout.plain_file`): a FIFO named results.json would block the read, a symlink lead
    out of the directory; `verify` reports either (V106)."""
    if not layout.plain_file(path):
        return None
    try:
        return loads(path.read_text(encoding="utf-8"))  # bounded depth and numbers
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise AdapterError(f"{path}: cannot read evidence: {e}") from e


def _by_name(v: Any) -> dict[str, dict]:
    if isinstance(v, dict):
        return {str(k): (e if isinstance(e, dict) else {}) for k, e in v.items()}
    if isinstance(v, list):
        return {str(e["name"]): e for e in v if isinstance(e, dict) and "name" in e}
    return {}


def _hashes(obj: Any, prefix: str, out: dict[str, str]) -> None:
    if isinstance(obj, dict):
        for k, v in obj.items():
            _hashes(v, f"{prefix}/{k}", out)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _hashes(v, f"{prefix}/{i}", out)
    elif isinstance(obj, str) and _HEX64.match(obj):
        out[prefix] = obj.lower()


def _count(v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v)):
        return int(v)
    if isinstance(v, (list, tuple, dict)):
        return len(v)
    return None


def _gate(v: Any) -> str | None:
    if isinstance(v, dict):
        if "passed" in v and isinstance(v["passed"], bool):
            return "passed" if v["passed"] else "failed"
        v = v.get("verdict") or v.get("status")
    if isinstance(v, bool):
        return "passed" if v else "failed"
    if isinstance(v, str):
        s = v.strip().lower()
        return {"pass": "passed", "fail": "failed"}.get(s, s)
    return None


def _first(d: dict, *keys: str) -> Any:
    for k in keys:
        cur: Any = d
        for part in k.split("."):
            cur = cur.get(part) if isinstance(cur, dict) else None
        if cur is not None:
            return cur
    return None


def _hardware(manifest: dict) -> tuple[str, ...]:
    """`gpus.devices[].name` counted by name: ("2x NVIDIA GeForce RTX 5090",)."""
    devices = _first(manifest, "gpus.devices") or []
    names: dict[str, int] = {}
    for d in devices if isinstance(devices, list) else []:
        if isinstance(d, dict) and d.get("name"):
            names[str(d["name"])] = names.get(str(d["name"]), 0) + 1
    return tuple(f"{n}x {name}" for name, n in names.items())


def _figures(results: dict) -> dict[str, float | None]:
    """A sweep's claimable figures (results.json `figures`: max_sustainable_*)."""
    figs = results.get("figures")
    if not isinstance(figs, dict):
        return {}
    return {str(k): (float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None)
            for k, v in figs.items() if str(k).startswith("max_sustainable_")}  # fmt: skip


def _lower_bounds(results: dict) -> frozenset[str]:
    """The sweep figures that are only a lower bound (results.json `sweep[].lower_bound`)."""
    return frozenset(str(sw.get("figure")) for sw in results.get("sweep") or []
                     if isinstance(sw, dict) and sw.get("lower_bound") and sw.get("figure"))  # fmt: skip


_LATENCY_METRICS = ("ttft", "itl", "tpot", "latency")
_SENT_METRICS = ("sent_ttft", "sent_latency")  # results.json levels' times from the send (a capped level's; else null)
_OBSERVED = re.compile(r"^(?P<agg>p\d+(?:\.\d+)?|mean|median|max|min)"
                       r"\((?P<metric>ttft|itl|tpot|latency|sent_ttft|sent_latency|throughput|total_throughput|qps)\)\s*=\s")
_RATE_KEYS = {"throughput": "tok_s", "total_throughput": "total_tok_s", "qps": "req_s"}
# a level's and a run's rates: the figure's key, its buckets' results.json field, and whether one
# bucket without a value leaves the figure unknown (total tokens/s of a bucket that delivered a
# request with no prompt count is unknown: the other buckets' mean is not the level's)
_RATE_FIELDS = (("tok_s", "output_tokens_per_s", False), ("req_s", "qps", False), ("total_tok_s", "total_tokens_per_s", True))


def _real(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def _level_figures(row: Any, level: Any) -> dict[str, tuple[float, ...]]:
    """A level's measured figures as the per-level report table shows them (`LevelRow`): each
    latency metric's p50/p95/p99/mean/min/max (results.json `levels[].ttft` … in seconds), and
    the wall-time-weighted mean over its buckets of output tokens/s, total (prompt + output)
    tokens/s and completed requests/s (`_levels` adds their plain mean over buckets,
    `_bucket_means`); and a capped level's times from the send as its cap note gives them
    (results.json `levels[].sent_ttft`, `sent_latency`: null at a level with no max_concurrency)."""
    out: dict[str, tuple[float, ...]] = {}
    for metric in _LATENCY_METRICS + _SENT_METRICS:
        stats = (getattr(row, metric, None) if metric in _LATENCY_METRICS else level.get(metric)) or {}
        for agg, v in stats.items() if isinstance(stats, dict) else ():
            if agg != "count" and (x := _real(v)) is not None:
                out[f"{metric}.{agg}"] = (x,)
    for key, v in (("tok_s", row.tokens_per_s), ("req_s", row.qps), ("total_tok_s", row.total_tokens_per_s)):
        if (x := _real(v)) is not None:
            out[key] = (x,)
    return out


def _judged_figures(verdict: Any) -> dict[tuple[str, str | None, int | None], dict[str, float]]:
    """The gate's own measurements (verdict.json rules' details, `p99(ttft) = 1.82s`), by
    (backend, workload, level): level None for a backend-scope rule. Only plain aggregates of a
    latency metric, of throughput and of qps (not drift, goodput, bucket or window scopes)."""
    out: dict[tuple[str, str | None, int | None], dict[str, float]] = {}
    rules = verdict.get("rules") if isinstance(verdict, dict) else None
    for r in rules if isinstance(rules, list) else ():
        if not isinstance(r, dict) or r.get("scope") not in ("backend", "level"):
            continue
        for d in r.get("details") or ():
            if not isinstance(d, dict):
                continue
            m = _OBSERVED.match(str(d.get("observed_text") or ""))
            where = d.get("where") if isinstance(d.get("where"), dict) else {}
            x = _real(d.get("observed"))
            if m is None or x is None or not where.get("backend") or where.get("bucket") is not None:
                continue
            agg = "p50" if m.group("agg") == "median" else m.group("agg")
            metric = m.group("metric")
            if metric in _RATE_KEYS:
                if agg != "mean":
                    continue
                key = _RATE_KEYS[metric]
            else:
                key = f"{metric}.{agg}"
            level = where.get("level") if r.get("scope") == "level" else None
            out.setdefault((str(where["backend"]), where.get("workload") if level is not None else None, level), {})[key] = x
    return out


def _merge(figures: dict[str, tuple[float, ...]], judged: dict[str, float]) -> dict[str, tuple[float, ...]]:
    out = dict(figures)
    for k, v in judged.items():
        if all(abs(v - x) > 1e-12 * max(1.0, abs(x)) for x in out.get(k, ())):
            out[k] = out.get(k, ()) + (v,)
    return out


def _run_figures(entry: dict, judged: dict[str, float]) -> dict[str, tuple[float, ...]]:
    """A backend's figures over the whole run: output tokens/s, total tokens/s and requests/s over
    every bucket of its levels (wall-time weighted, as a level's are), and the gate's backend-scope
    measurements."""
    from soakspec.report.common import levels_with_buckets, wall_mean, wall_mean_whole

    buckets = [w for _, _, ws in levels_with_buckets({"backends": [entry]}) for w in ws]
    out: dict[str, tuple[float, ...]] = {}
    for key, field, whole in _RATE_FIELDS:
        if (x := _real((wall_mean_whole if whole else wall_mean)(buckets, field))) is not None:
            out[key] = (x,)
    return _merge(out, judged)


def _levels(entry: dict, judged: dict[tuple[str, str | None, int | None], dict[str, float]] | None = None,
            manifest_levels: Any = None) -> tuple[LevelFacts, ...]:
    """A results.json backend's levels, labelled as the reports label them
    (`soakspec.report.common.level_rows`: the same words, so a document copying a report's
    level names them the same way); capped where the manifest's entry of that level (same
    workload and index) declares max_concurrency -- results.json's levels do not say."""
    from soakspec.judge.index import capped
    from soakspec.report.common import level_rows, levels_with_buckets, not_completed

    caps = {(e.get("workload"), e.get("index")): capped(e) for e in manifest_levels or () if isinstance(e, dict)}

    one = {"backends": [entry]}
    out = []
    for (_, lv, buckets), row in zip(levels_with_buckets(one), level_rows(one)):
        req = row.requests
        conc, rate = lv.get("concurrency"), lv.get("rate")
        mine = (judged or {}).get((str(entry.get("name")), lv.get("workload"), lv.get("index")), {})
        out.append(LevelFacts(
            label=row.label, offered=row.offered, workload=row.workload,
            concurrency=conc if isinstance(conc, int) and not isinstance(conc, bool) else None,
            rate=float(rate) if isinstance(rate, (int, float)) and not isinstance(rate, bool) and lv.get("mode") in (None, "open") else None,
            completed=_count(req.get("completed")), failed=_count(req.get("failed")),
            timeouts=_count(_first(dict(req), "timeout", "timeouts")),
            buckets=len(buckets) if isinstance(entry.get("buckets"), list) else None,
            figures=_merge(_merge(_level_figures(row, lv), _bucket_means(buckets)), mine),
            capped=caps.get((lv.get("workload"), lv.get("index")), False),
            not_completed=not_completed(req), wall_s=_real(lv.get("wall_s")),
            peak_tok_s=_count(lv.get("peak_output_tokens_per_s")), peak_concurrent=_count(lv.get("peak_concurrent_requests")),
        ))  # fmt: skip
    return tuple(out)


def _bucket_means(buckets: Any) -> dict[str, float]:
    """A level's output tokens/s and requests/s as the mean over its buckets (each bucket one
    value, whatever its wall time): the gate's `mean(throughput)` / `mean(qps)` and what
    `soakspec compare` shows. It differs from the report's wall-time-weighted figure where a
    bucket is short (a duration not a whole number of buckets), and both are the evidence's."""
    from soakspec.report.common import timed_values  # which buckets count: the report's rule

    out: dict[str, float] = {}
    for key, field, whole in _RATE_FIELDS:
        known = timed_values([(_real(w.get(field)), _real(w.get("wall_s"))) for w in buckets if isinstance(w, dict)], whole)
        if known:
            out[key] = math.fsum(v for v, _ in known) / len(known)
    return out


# ---------------------------------------------------------------- re-judging

def _stored_outcome(verdict: Any) -> str | None:
    out = verdict.get("outcome", verdict.get("verdict")) if isinstance(verdict, dict) else None
    return out if out in ("PASS", "FAIL", "INCONCLUSIVE") else None


def _rules_outcome(verdict: Any) -> str | None:
    """The outcome verdict.json's own rules give (`judge.verdict.decide`), None without rules."""
    import types

    from soakspec.judge.verdict import decide

    rules = verdict.get("rules") if isinstance(verdict, dict) else None
    if not isinstance(rules, list) or not rules:
        return None
    return decide([types.SimpleNamespace(severity=r.get("severity"), status=r.get("status")) for r in rules if isinstance(r, dict)])


def _rejudge(root: Path, manifest: dict) -> tuple[dict, dict] | str | None:
    """Re-judge the evidence as `soakspec run` judged it at its end (`judge_and_write`, nothing
    written), with the spec the run used (embedded in the manifest; `cli_support.spec_for`): (results,
    verdict) documents -- what results.json and verdict.json hold when nobody edited them. None
    when the manifest embeds no spec (hand-made evidence, or from before specs were embedded);
    a reason (str) when the evidence cannot be re-judged. Nothing a spec names is executed:
    judging reads files only."""
    from soakspec.judge.evidence import Evidence, Integrity

    bare = Evidence(manifest, (), Integrity(), None, str(root))
    if bare.spec_text is None:
        return None
    from soakspec.exitcodes import UsageError
    from soakspec.judge.cli_support import judge_and_write, spec_for

    try:
        spec, _ = spec_for(bare, None, str(root))
        verdict, results = judge_and_write(root, spec, write=False, retained=True)  # as `gate` judges it
    except UsageError as e:
        return str(e).splitlines()[0]
    except Exception as e:  # noqa: BLE001 - evidence this soakspec cannot judge: say why, fall back
        return f"{type(e).__name__}: {e}"
    return results, verdict.to_json()


_COMPARED = (("completed", "completed"), ("failed", "failed"), ("timeouts", "timeouts"), ("buckets", "buckets"),
             ("batches", "leafs"), ("concurrency_levels", "concurrency levels"))  # fmt: skip


def _mismatches(stored: tuple[EvidenceFacts, ...], judged: tuple[EvidenceFacts, ...]) -> list[str]:
    """What the stored results.json says that the evidence re-judged does not: the values
    lint-claims reads (totals, per-level counts, sweep figures), per backend."""
    out = []
    theirs = {ev.backend: ev for ev in stored}
    # the p90s came later: a file with none is older; one with some and a p90 missing was edited
    later_aggs = any(k.rpartition(".")[2] in _LATER_AGGS for ev in stored for figs in (ev.figures, *(lv.figures for lv in ev.levels))
                     for k in figs)  # fmt: skip
    for ev in judged:
        st = theirs.get(ev.backend)
        if st is None:
            out.append(f"results.json has no backend {ev.backend}")
            continue
        for field, label in _COMPARED:
            a, b = getattr(st, field), getattr(ev, field)
            if a != b:
                out.append(f"results.json records {label} {_show(a)} for {ev.backend}; re-judged: {_show(b)}")
        mine = {(lv.workload, lv.label): lv for lv in st.levels}
        for lv in ev.levels:
            s = mine.get((lv.workload, lv.label))
            for field in ("completed", "failed", "timeouts"):
                a, b = getattr(s, field, None), getattr(lv, field)
                if a != b:
                    out.append(f"results.json records {field} {_show(a)} for {ev.backend} · {lv.label}; re-judged: {_show(b)}")
            for field, key in (("peak_tok_s", "peak_output_tokens_per_s"), ("peak_concurrent", "peak_concurrent_requests")):
                a, b = getattr(s, field, None), getattr(lv, field)
                if a is not None and a != b:  # none stored: a results.json from before they were recorded
                    out.append(f"results.json records {key} {_show(a)} for {ev.backend} · {lv.label}; re-judged: {_show(b)}")
            out += [f"results.json records {k} {a} for {ev.backend} · {lv.label}; re-judged: {b}"
                    for k, a, b in _figure_changes(getattr(s, "figures", {}), lv.figures, later_aggs)]  # fmt: skip
        out += [f"results.json records {k} {a} for {ev.backend} over the run; re-judged: {b}"
                for k, a, b in _figure_changes(st.figures, ev.figures, later_aggs)]  # fmt: skip
        if dict(st.sustainable) != dict(ev.sustainable):
            out.append(f"results.json records sweep figures {dict(st.sustainable)}; re-judged: {dict(ev.sustainable)}")
    return out


# Figures re-judged from the retained records differ from the run's own in the last digits (the
# records keep microseconds): a stored figure is another only beyond these.
_FIGURE_RTOL = 1e-5
_FIGURE_ATOL_S = 2e-6


_RATE_UNITS = {"tok_s": " tok/s", "total_tok_s": " tok/s", "req_s": " req/s"}
# figures results.json has held only since sent_ttft, sent_latency and total_throughput became metrics
# (a level's sent_ttft / sent_latency, its buckets' total_tokens_per_s): a results.json written
# before lacks them all, and is not edited for that (one that has some and lacks others is)
_WRITTEN_LATER = frozenset({*_SENT_METRICS, "total_tok_s"})
# a distribution's p90 came later than its p50/p95/p99/mean/min/max: a results.json none of whose
# distributions has a p90 key is an older one, not an edit (one p90 missing among others, or one
# present and differing, is an edit)
_LATER_AGGS = frozenset({"p90"})


def _later_keys(figures: Any) -> set[str]:
    return {k for k in figures if k.split(".")[0] in _WRITTEN_LATER}


def _figure_changes(stored: Any, judged: Any, later_aggs: bool = False) -> list[tuple[str, str, str]]:
    """Figures (their results.json value, the first of each) that differ: (key, stored, re-judged),
    shown with their unit (seconds for latencies). `later_aggs`: the results.json stores a p90
    somewhere (`_LATER_AGGS`), so a p90 missing here is an edit, not an older file."""
    out = []
    for k in sorted(set(stored) | set(judged)):
        a, b = (stored.get(k) or (None,))[0], (judged.get(k) or (None,))[0]
        if a is None and b is None or a is None and k.split(".")[0] in _WRITTEN_LATER and not _later_keys(stored):
            continue  # a results.json from before soakspec wrote these figures: not an edit
        if a is None and not later_aggs and k.rpartition(".")[2] in _LATER_AGGS:
            continue  # a distribution stored before soakspec wrote its p90: not an edit
        if a is None or b is None or abs(a - b) > _FIGURE_RTOL * max(abs(a), abs(b)) + (0 if k in _RATE_UNITS else _FIGURE_ATOL_S):
            unit = _RATE_UNITS.get(k, " s")
            out.append((k, "nothing" if a is None else f"{a:.6g}{unit}", "nothing" if b is None else f"{b:.6g}{unit}"))
    return out


def _show(v: Any) -> str:
    if v is None:
        return "nothing"
    return ",".join(map(str, v)) if isinstance(v, tuple) else str(v)


def _self_mismatches(root: Path, results: Any, verdict: Any) -> list[str]:
    """Without a re-judgement: results.json / verdict.json bound to another manifest, and a
    verdict.json whose outcome its own rules do not give."""
    out = []
    manifest_sha = hashlib.sha256((root / "manifest.json").read_bytes()).hexdigest()
    for name, doc in (("results.json", results), ("verdict.json", verdict)):
        bound = doc.get("manifest_sha256") if isinstance(doc, dict) else None
        if isinstance(bound, str) and bound.lower() != manifest_sha:
            out.append(f"{name} is bound to a different manifest (manifest_sha256 {bound[:12]}…, manifest.json {manifest_sha[:12]}…)")
    said, ruled = _stored_outcome(verdict), _rules_outcome(verdict)
    if said is not None and ruled is not None and said != ruled:
        out.append(f"verdict.json says {said}, but its own rules give {ruled}; {ruled} is used")
    return out


def load_evidence_facts(evidence_dir: str | Path) -> tuple[EvidenceFacts, ...]:
    """One EvidenceFacts per backend of the run in `evidence_dir`.

    The facts come from re-judging the evidence, never from the run's stored results.json and
    verdict.json: those are written after the manifest is finalized, so no artifact hash covers
    them (`soakspec verify` checks only their `manifest_sha256` binding), and an edited copy
    would otherwise pass as the evidence. Like `soakspec gate` and `report`, the evidence is
    verified and judged with the spec embedded in its manifest (`_rejudge`: the run's own
    `judge_and_write`); where the stored files say something else, that goes into
    `stored_mismatch` (CB402). A manifest that embeds no spec (hand-made or older evidence), or
    evidence this soakspec cannot judge, falls back to the stored files, checked for what they
    can show by themselves (their manifest binding; a verdict its own rules contradict)."""
    from soakspec.evidence.io import EvidenceNotFound, require_evidence_dir

    try:
        root = require_evidence_dir(evidence_dir)
    except EvidenceNotFound as e:
        raise AdapterError(str(e)) from None
    manifest = _read_json(root / "manifest.json")
    if not isinstance(manifest, dict):
        raise AdapterError(f"{root}: manifest.json is not a JSON object")
    stored_results = _read_json(root / "results.json")
    stored_verdict = _read_json(root / "verdict.json")
    judged = _rejudge(root, manifest)
    if isinstance(judged, tuple):
        results, verdict = judged
        out = _facts(root, manifest, results, verdict)
        said, now = _stored_outcome(stored_verdict), _stored_outcome(verdict)
        notes = []
        if said is not None and said != now:
            ruled = _rules_outcome(stored_verdict)
            own = f" (its own rules give {ruled})" if ruled is not None and ruled != said else ""
            notes.append(f"verdict.json says {said}{own}; re-judged from the evidence: {now}")
        if isinstance(stored_results, dict):
            notes += _mismatches(_facts(root, manifest, stored_results, verdict), out)
    else:
        results = stored_results if isinstance(stored_results, dict) else {}
        verdict = stored_verdict
        notes = [] if judged is None else [
            f"cannot be re-judged ({judged}); the stored results.json and verdict.json are used unverified"]
        notes += _self_mismatches(root, stored_results, stored_verdict)
        ruled = _rules_outcome(verdict)
        if ruled is not None and ruled != _stored_outcome(verdict):
            verdict = dict(verdict, verdict=ruled)  # a verdict contradicted by its own rules: its rules
        out = _facts(root, manifest, results, verdict)
    return tuple(dataclasses.replace(ev, stored_mismatch=tuple(notes)) for ev in out)


def _facts(root: Path, manifest: dict, results: dict, verdict: Any) -> tuple[EvidenceFacts, ...]:
    """The facts of `results` and `verdict` (re-judged, or the stored files as a fallback)."""
    artifacts = {str(k): str(v).lower() for k, v in (manifest.get("artifacts") or {}).items() if isinstance(v, str)}
    extra: dict[str, str] = {}
    _hashes(manifest, "manifest.json", extra)
    _hashes(results, "results.json", extra)
    for name in ("manifest.json", "results.json"):
        p = root / name
        if layout.plain_file(p):
            extra[name] = hashlib.sha256(p.read_bytes()).hexdigest()
    spec_sha = _first(manifest, "spec_sha256", "spec.sha256")
    m_backends = _by_name(manifest.get("backends"))
    r_backends = _by_name(results.get("backends"))
    if not m_backends and "backend" in manifest:
        m_backends = {str(manifest["backend"]): manifest}
    names = list(dict.fromkeys([*m_backends, *r_backends]))
    if not names:
        raise AdapterError(f"{root}: the evidence names no backends")
    run_gate = _gate(verdict) if isinstance(verdict, dict) else None
    hardware = _hardware(manifest)
    judged = _judged_figures(verdict)

    out = []
    for name in names:
        m = m_backends.get(name, {})
        r = r_backends.get(name, {})
        safe = str(m.get("safe_name") or r.get("safe_name") or name)
        report = next(
            (h for rel, h in artifacts.items() if (name in rel or safe in rel) and "report" in rel.lower()),
            None,
        ) or artifacts.get(f"{layout.BACKENDS}/{safe}/{layout.REQUESTS}")
        rb = m.get("runtime_boundary") or r.get("runtime_boundary")
        runtime = rb.get("display") if isinstance(rb, dict) else rb
        buckets_v = r.get("buckets")
        levels = _ints(_first(r, "concurrency_levels") or _first(m, "concurrency_levels"))
        if not levels and isinstance(buckets_v, list):
            levels = tuple(sorted({int(b["concurrency"]) for b in buckets_v if isinstance(b, dict) and isinstance(b.get("concurrency"), int)}))
        duration = _first(r, "duration_s") or _first(m, "duration_s", "workload.duration_s")
        out.append(
            EvidenceFacts(
                backend=name,
                completed=_count(_first(r, "completed", "requests.completed")),
                failed=_count(_first(r, "failed", "requests.failed")),
                timeouts=_count(_first(r, "timeouts", "timeout", "requests.timeout", "requests.timeouts")),
                buckets=_count(buckets_v),
                batches=_count(_first(r, "batches", "leafs", "leaves")),
                concurrency_levels=levels,
                duration_s=float(duration) if isinstance(duration, (int, float)) else None,
                commit=_first(m, "commit_after", "commit_before", "source.commit_after", "source.commit_before", "commit")
                or _first(manifest, "commit", "source.commit_after"),
                model_revision=_first(m, "model.revision") or _first(manifest, "model.revision"),
                runtime_boundary=str(runtime) if runtime else None,
                report_sha256=report,
                artifact_sha256={**extra, **artifacts},
                spec_sha256=str(spec_sha).lower() if spec_sha else None,
                gate=_gate(r.get("gate")) or run_gate,
                source=str(root),
                hardware=hardware,
                run_id=str(manifest["run_id"]) if manifest.get("run_id") else None,
                sustainable=_figures(results),
                sustainable_at_least=_lower_bounds(results),
                levels=_levels(r, judged, m.get("levels")),
                figures=_run_figures(r, judged.get((name, None, None), {})),
            )
        )
    return tuple(out)


# ---------------------------------------------------------------- a comparison (`--compare`)

_ROW_FIELDS = {"backend": str, "label": str, "metric": str, "stat": str, "unit": str, "verdict": str, "change_kind": str}
_ROW_NUMBERS = ("base", "new", "change", "ci_low", "ci_high")
_LABEL_CONCURRENCY = re.compile(r"\bconcurrency\s+(\d+)\b")
_LABEL_RATE = re.compile(r"\brate\s+(\d+(?:\.\d+)?)\s*(?:rps|req/s)\b")


def _number(row: dict[str, Any], key: str, where: str) -> float | None:
    v = row.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise AdapterError(f"{where}: `{key}` is not a number")
    return float(v)


def _change_row(row: Any, where: str) -> ChangeRow | None:
    from soakspec.compare.metrics import BY_NAME, MAX_TURNS

    if not isinstance(row, dict):
        raise AdapterError(f"{where}: not a JSON object")
    for key, kind in _ROW_FIELDS.items():
        if not isinstance(row.get(key), kind):
            raise AdapterError(f"{where}: no `{key}`")
    turn = row.get("turn")
    if turn is not None and (not isinstance(turn, int) or isinstance(turn, bool) or turn < 1):
        raise AdapterError(f"{where}: `turn` is not a turn number")
    metric = BY_NAME.get(row["metric"])
    if metric is None:
        raise AdapterError(f"{where}: unknown metric {row['metric']!r}")
    nums = {k: _number(row, k, where) for k in _ROW_NUMBERS}
    conf = _number(row, "row_confidence", where)
    label = row["label"]
    conc = _LABEL_CONCURRENCY.search(label)
    rate = _LABEL_RATE.search(label)
    return ChangeRow(
        backend=row["backend"], label=label, metric=row["metric"], stat=row["stat"], unit=row["unit"],
        base=nums["base"], new=nums["new"], change=nums["change"], low=nums["ci_low"], high=nums["ci_high"],
        verdict=row["verdict"], higher_is_worse=metric.higher_is_worse, absolute=row["change_kind"] == "difference",
        row_confidence=conf if conf is not None else float("nan"), new_backend=str(row.get("new_backend") or row["backend"]),
        concurrency=int(conc.group(1)) if conc else None, rate=float(rate.group(1)) if rate else None,
        turn=turn, later_turns=turn is not None and turn > MAX_TURNS,
    )


_SWEEP_FIGURES = ("max_sustainable_rate", "max_sustainable_concurrency")
_SWEEP_VERDICTS = ("regression", "improvement", "no significant change", "inconclusive")


def _sweep_row(row: Any, where: str) -> SweepChangeRow:
    """One of compare's JSON `sweep[]` rows (`SweepRow.to_json`) -> SweepChangeRow."""
    if not isinstance(row, dict):
        raise AdapterError(f"{where}: not a JSON object")
    for key in ("backend", "metric", "verdict"):
        if not isinstance(row.get(key), str):
            raise AdapterError(f"{where}: no `{key}`")
    if row["metric"] not in _SWEEP_FIGURES:
        raise AdapterError(f"{where}: unknown sweep figure {row['metric']!r}")
    if row["verdict"] not in _SWEEP_VERDICTS:
        raise AdapterError(f"{where}: unknown sweep verdict {row['verdict']!r}")
    return SweepChangeRow(backend=row["backend"], figure=row["metric"], unit=str(row.get("unit") or ""),
                          base=_number(row, "base", where), new=_number(row, "new", where), verdict=row["verdict"],
                          message=str(row.get("message") or ""), new_backend=str(row.get("new_backend") or row["backend"]),
                          base_failing=_first_failing(row, "base_sweep", where),
                          new_failing=_first_failing(row, "new_sweep", where))


def _first_failing(row: dict[str, Any], key: str, where: str) -> float | None:
    """A run's lowest failing level above its figure (`SweepFigure.to_json` `first_failing`);
    None where the row does not record one (nothing above known to fail, or an older compare
    JSON): the run's interval is then open above, which never makes a claimed size wrong."""
    sweep = row.get(key)
    return _number(sweep, "first_failing", f"{where}: {key}") if isinstance(sweep, dict) else None


def change_facts(doc: Any, source: str) -> ChangeFacts:
    """`soakspec compare`'s JSON document (`Comparison.to_json()`) -> ChangeFacts. An
    AdapterError (exit 2) for anything else: another kind of document, a schema version this
    soakspec does not write, a row without the fields a claim is checked against."""
    from soakspec.compare import SCHEMA_VERSION

    if not isinstance(doc, dict) or doc.get("kind") != "comparison":
        raise AdapterError(f"{source}: not a comparison (`soakspec compare --format json` writes one)")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise AdapterError(f"{source}: comparison schema_version {doc.get('schema_version')!r}; this soakspec reads "
                           f"{SCHEMA_VERSION}")
    rows = doc.get("rows")
    if not isinstance(rows, list):
        raise AdapterError(f"{source}: the comparison has no `rows` list")
    out = [_change_row(r, f"{source}: rows[{i}]") for i, r in enumerate(rows)]
    sweep = doc.get("sweep") or []  # absent where neither run swept
    if not isinstance(sweep, list):
        raise AdapterError(f"{source}: the comparison's `sweep` is not a list")
    sweeps = tuple(_sweep_row(r, f"{source}: sweep[{i}]") for i, r in enumerate(sweep))
    verdict = doc.get("verdict") if isinstance(doc.get("verdict"), str) else None
    reasons = tuple(str(x) for x in doc.get("reasons") or () if isinstance(x, str)) if isinstance(doc.get("reasons"), list) else ()
    return ChangeFacts(source, tuple(r for r in out if r is not None), verdict, reasons, sweeps)


def read_change_facts(path: str | Path, text: str) -> ChangeFacts:
    """A compare JSON file's text (read by the caller, bounded) -> ChangeFacts."""
    try:
        doc = loads(text)
    except ValueError as e:  # a JSON (or msgspec) decode error: one line, exit 2
        raise AdapterError(f"{path}: not JSON ({e})") from None
    return change_facts(doc, str(path))
