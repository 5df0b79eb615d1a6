"""The server's own metrics: its Prometheus `/metrics`, scraped on the run's timeline.

`scrape_metrics(scrape, url, deps, rec)` runs beside the load and the liveness watch (started
by `driver.run_backend` once the backend is ready, cancelled with the load). Every
`MetricsScrape.interval_s` it GETs `url + path` -- scrapes start on a fixed cadence, as
Prometheus's do, so a slow answer does not stretch the interval; a scrape that outlasts its
slot (a timeout longer than the interval) skips the slots it missed, one scrape at a time,
never back to back -- each attempt bounded by `timeout_s` (data from
the plan, applied here with `trio.move_on_after`), parses the answer with prometheus_client's
text-format parser (in a worker thread: a vLLM /metrics is ~100 kB) and appends one line to
backends/<name>/metrics.jsonl (schema "metrics"), fsynced:

    {"schema_version": 1, "t": <run clock, epoch s>, "ok": true, "status": 200, "error": null,
     "seconds": 0.004, "families": {"vllm:num_requests_running": {"type": "gauge", "value": 3.0,
       "series": 1}, "vllm:num_preemptions_total": {"type": "counter", "value": 0.0, "series": 1},
       "vllm:time_to_first_token_seconds": {"type": "histogram", "sum": 1.2, "count": 40.0,
       "buckets": [[0.001, 0.0], ..., [null, 40.0]], "series": 1}}}

Only the families the plan names are kept (those the gate's rules name, and the default set
`plan.DEFAULT_SERVER_METRICS`), each summed over its label sets (`series` says how many) --
a ratio gauge (`RATIO_SUFFIXES`) averaged over them -- so the file stays bounded. A counter is keyed by its sample name (`..._total`, as /metrics shows it);
a histogram bucket's `le` is a number, `null` for +Inf. A counter also has each label set's value (`by`, up
to MAX_SERIES label sets) and its `step`: its increase since the backend's previous scrape
that had it, each label set its own counter (up by its rise, a fall its reset, a label set not
seen before from 0, one gone a gap). Beyond MAX_SERIES the sum alone cannot tell one label set
disappearing (80 engines' tokens, one gone: the sum falls by its value) from every counter
resetting, and a sum read as a reset counted the whole family again; `step` is what the judge
reads then -- one number a scrape, computed here from the label sets' last values (held in
memory for the run, at most MAX_TRACKED a family; beyond, no step, and the judge calls such a
fall INCONCLUSIVE rather than guess). A failed scrape is a line too
(`ok: false`, the HTTP status or null, the error): never silently dropped.

The load's end wakes the loop for one last scrape (`LastScrape`), which the driver waits for
(bounded) before the server is stopped: the last bucket is bracketed by a scrape after it.

A default (undeclared) scrape whose first answer is a 4xx (404: no such endpoint) records "not available" and stops; a
declared one keeps scraping whatever it gets, and the judge's `metrics_scraped` fails it. What
happened is summarised in the backend's manifest entry (`metrics`: path, interval, declared,
status, scrapes, failures, the first error).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
from collections.abc import Iterable
from typing import Any

import httpx
import trio
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from soakspec.evidence.io import EvidenceError, JsonlWriter
from soakspec.evidence.redact import REDACTED, Redactor, clip, is_secret_label, record_redactor, scrub
from soakspec.plan import MetricsScrape
from soakspec.runner.httpxclient import send_once_more_if_unanswered
from soakspec.runner.protocol import describe_transport_error
from soakspec.runner.recorder import durable, off_loop

MAX_BUCKETS = 128  # histogram buckets kept per family (more: its sum and count only, with a `note`)
MAX_SERIES = 64  # a counter's label sets kept one by one (`by`; more: its sum and `step` only)
MAX_TRACKED = 100_000  # label sets a backend's scrapes remember for a counter's `step` (more: no `step`)
MAX_ERROR_CHARS = 300
MAX_REDIRECTS = 3  # same-host redirects a scrape follows (/metrics -> /metrics/)


class ScrapeLog:
    """What the scrapes of one backend did, for its manifest entry."""

    def __init__(self, scrape: MetricsScrape) -> None:
        self.scrape = scrape
        self.scrapes = 0
        self.failures = 0
        self.ok = 0
        self.first_error: str | None = None
        self.status = "not scraped"  # scraped (at least once) | failing (never) | not available | not scraped
        self.families: set[str] = set()

    def add(self, row: dict[str, Any]) -> None:
        self.scrapes += 1
        if row["ok"]:
            self.ok += 1
            self.families.update(row["families"])
        else:
            self.failures += 1
            self.first_error = self.first_error or row["error"]
        status = row.get("status")
        if self.scrapes == 1 and not self.scrape.declared and isinstance(status, int) and 400 <= status < 500:
            self.status = "not available"  # a default scrape of a server without /metrics
        else:
            self.status = "scraped" if self.ok else "failing"

    def to_json(self) -> dict[str, Any]:
        s = self.scrape
        return {"path": scrub(s.path), "interval_s": s.interval_s, "timeout_s": s.timeout_s, "declared": s.declared,
                "status": self.status, "scrapes": self.scrapes, "failed": self.failures,
                "first_error": self.first_error, "families": sorted(self.families)}


def _le(v: str) -> float | None:
    f = float(v)
    return None if math.isinf(f) else f


def _bound(v: str | None) -> bool:
    """`v` is a histogram bucket's `le`: a number (+Inf included)."""
    try:
        return v is not None and not math.isnan(float(v))
    except ValueError:
        return False


def _key(family: Any) -> str:
    """A family's name as /metrics shows it: a counter by its `_total` sample name."""
    if family.type == "counter" and any(s.name.endswith("_total") for s in family.samples):
        return family.name + "_total"
    return family.name


def _histogram(samples: Iterable[Any]) -> dict[str, Any] | None:
    """A histogram's samples summed over their label sets; more than MAX_BUCKETS bounds: its sum
    and count, no buckets, and a `note` saying why (a rule's pNN quotes it)."""
    buckets: dict[float | None, float] = {}
    total = count = 0.0
    series = 0
    odd = 0.0  # the sum of the label sets' _sum samples that are not finite (an observation of +Inf)
    for s in samples:
        if not math.isfinite(s.value):
            if s.name.endswith("_sum") or s.name.endswith("_gsum"):
                odd += s.value
            continue
        if s.name.endswith("_bucket") and "le" in s.labels:
            le = _le(s.labels["le"])
            buckets[le] = buckets.get(le, 0.0) + s.value
        elif s.name.endswith("_sum") or s.name.endswith("_gsum"):
            total += s.value
        elif s.name.endswith("_count") or s.name.endswith("_gcount"):
            count += s.value
            series += 1
    if len(buckets) > MAX_BUCKETS:
        return {"type": "histogram", "sum": nonfinite_text(odd) if odd else total, "count": count, "series": series, "buckets": [],
                "note": f"{len(buckets)} buckets, more than the {MAX_BUCKETS} a scrape keeps: its sum and count only"}
    order = sorted(buckets, key=lambda b: math.inf if b is None else b)
    return {"type": "histogram", "sum": nonfinite_text(odd) if odd else total, "count": count, "series": series,
            "buckets": [[b, buckets[b]] for b in order]}


def _summary(samples: Iterable[Any]) -> dict[str, Any]:
    samples = list(samples)
    total = math.fsum(s.value for s in samples if s.name.endswith("_sum") and math.isfinite(s.value))
    odd = sum(s.value for s in samples if s.name.endswith("_sum") and not math.isfinite(s.value))
    count = math.fsum(s.value for s in samples if s.name.endswith("_count") and math.isfinite(s.value))
    return {"type": "summary", "sum": nonfinite_text(odd) if odd else total, "count": count,
            "series": sum(1 for s in samples if s.name.endswith("_count"))}


def nonfinite_text(v: float) -> str:
    """A sample value that is not finite as the text format writes it, and metrics.jsonl holds it
    (JSON has no infinity): "+Inf", "-Inf" or "NaN". The judge reads an infinity as the value it
    is (compared honestly: +Inf fails `max(...) < 64`) and NaN as the server saying it has no
    value (the scope INCONCLUSIVE, never passed on the other scrapes)."""
    return "NaN" if math.isnan(v) else ("+Inf" if v > 0 else "-Inf")


_PARTS = ("_bucket", "_sum", "_count")

# a gauge that is a fraction of one engine's capacity or traffic (vLLM's kv_cache_usage_perc,
# gpu_prefix_cache_hit_rate, spec_decode_draft_acceptance_rate, spec_decode_efficiency; SGLang's
# token_usage, cache_hit_rate): per engine with --data-parallel-size, so its label sets are
# averaged (Prometheus' avg()), not summed -- two engines at 90% and 70% are not 160%, two
# accepting 0.7 of their drafts not 1.4. (Not every `_rate`: a per-second rate adds up.)
RATIO_SUFFIXES = ("_perc", "_ratio", "_usage", "hit_rate", "acceptance_rate", "_efficiency")


def is_ratio(name: str) -> bool:
    return name.endswith(RATIO_SUFFIXES)


def _shaped(samples: Iterable[Any], wanted: set[str]) -> dict[str, dict[str, Any]]:
    """The wanted histograms and summaries among untyped lines (no `# TYPE`, legal), by their
    names' shape as Prometheus' own conventions give it: `x_bucket{le=<number>}` lines make `x` a
    histogram (with its `x_sum`, `x_count`); `x_sum` and `x_count`, with no `x` line other than
    `x{quantile=...}`, a summary. Anything else is left as the parser gave it (a gauge each)."""
    parts: dict[str, dict[str, list[Any]]] = {}
    for s in samples:
        base = next((s.name[:-len(p)] for p in _PARTS if s.name.endswith(p) and s.name[:-len(p)] in wanted), None)
        if base is not None:
            parts.setdefault(base, {}).setdefault(s.name[len(base):], []).append(s)
        elif s.name in wanted:
            parts.setdefault(s.name, {}).setdefault("", []).append(s)
    out: dict[str, dict[str, Any]] = {}
    for base, p in parts.items():
        bks, own = p.get("_bucket", []), p.get("", [])
        if bks and not own and all(_bound(s.labels.get("le")) for s in bks):
            entry = _histogram(s for ss in p.values() for s in ss)
            if entry is not None:
                out[base] = entry
        elif not bks and "_sum" in p and "_count" in p and all("quantile" in s.labels for s in own):
            out[base] = _summary(s for ss in p.values() for s in ss)
    return out


# the key of `_pseudonym`: a process's own, never written, so a pseudonym can't be matched to
# a guessed value (an unkeyed hash of a short secret could be), yet the same value has the same
# pseudonym in every scrape of the run (a backend is scraped by one process)
_PSEUDONYM_KEY = os.urandom(16)


def _pseudonym(value: str) -> str:
    """A redacted label value that still tells label sets apart: `<redacted>#` and 8 hex digits
    of a keyed hash of the value, the same for the same value throughout the run."""
    return REDACTED + "#" + hmac.new(_PSEUDONYM_KEY, value.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:8]


def _label_value(name: str, value: str, redactor: Redactor) -> str:
    """A label value as metrics.jsonl may hold it: the server's text, redacted as a request
    record's is (the run's secrets, credential patterns), and whatever a secret-named label
    (`api_key`, `token`, `auth`: `is_secret_label`) holds -- a pseudonym in its place, so that
    two label sets stay two (each counter its own, `by`)."""
    if is_secret_label(name) or redactor.text(value) != value:
        return _pseudonym(value)
    return value


def _labels(s: Any, redactor: Redactor) -> str:
    """A sample's label set as one string, its names sorted, its values redacted
    (`_label_value`): `engine="0",model_name="m"`."""
    return ",".join(f'{k}="{_label_value(k, v, redactor)}"' for k, v in sorted(s.labels.items()))


# the sample names of a typed family `x`, by its type: `x` + one of these
_SUFFIXES = {
    "counter": ("", "_total", "_created"),
    "gauge": ("",),
    "summary": ("", "_sum", "_count", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
}


def _regrouped(families: Iterable[Any]) -> list[Any]:
    """The parser's families with every line of a typed family in it, wherever it stands.

    prometheus_client's text parser closes a family at the first line whose name its type does
    not allow there, and makes every line after it (until the next `# TYPE`) an untyped family
    of its own. OpenMetrics puts an `x_created` line after each label set of a counter,
    histogram or summary (prometheus_client's own `generate_latest` does): only the first label
    set stayed in the histogram or summary `x`, the others were read as untyped lines -- left
    out, and a summary's `x{quantile=...}` became a gauge `x`. Each untyped line named as a part
    of a family declared above it (`_SUFFIXES`) is put back into that family. (Not the
    OpenMetrics parser: it refuses what the text format allows and servers send -- no `# EOF`,
    a counter without `_total` -- and would need this reading as its fallback anyway.)"""
    out: list[Any] = []
    declared: dict[str, Any] = {}  # a sample name -> the typed family it is a part of
    for fam in families:
        if fam.type in ("unknown", "untyped") and len(fam.samples) == 1 and (home := declared.get(fam.samples[0].name)) is not None:
            home.samples.append(fam.samples[0])
            continue
        if fam.type in _SUFFIXES:
            merged = Metric(fam.name, fam.documentation, fam.type)
            merged.samples = list(fam.samples)
            for suffix in _SUFFIXES[fam.type]:
                declared[fam.name + suffix] = merged
            fam = merged
        out.append(fam)
    return out


def _step(per: dict[str, float], seen: dict[str, dict[str, float] | None], key: str) -> float | None:
    """A counter's increase since the previous scrape that had it, each label set its own
    counter (as the judge's `_increase_by`): up by the difference, a label set that went down
    reset (its new value counts), one never seen before new (its value counts), one gone a gap.
    `seen` holds each label set's last value across the backend's scrapes (updated); None once a
    family has had more than MAX_TRACKED label sets (then no step)."""
    last = seen.get(key, {})
    if last is None:
        return None
    step = math.fsum(v - last[lab] if lab in last and v >= last[lab] else v for lab, v in per.items())
    last.update(per)
    seen[key] = last if len(last) <= MAX_TRACKED else None
    return step


def summarize(text: str, keep: Iterable[str], redactor: Redactor | None = None,
              seen: dict[str, dict[str, float] | None] | None = None) -> dict[str, Any]:
    """The kept families of a Prometheus text exposition, summed over their label sets, a ratio gauge averaged: a
    gauge with a value that is not finite its sum's (`nonfinite_text`: "+Inf", "-Inf", "NaN" -- with a NaN, or
    with both infinities, as Prometheus' sum()); elsewhere a value that is not finite is left out (a counter's
    label set read as not in that scrape: a gap, never a reset); label values (a counter's `by`) redacted by
    `redactor` (default: the run's, `record_redactor()`). With `seen` (the backend's scrapes so
    far, updated), a counter has its `step` too (`_step`). Raises ValueError when the text does not parse."""
    wanted = set(keep)
    redactor = redactor if redactor is not None else record_redactor()
    out: dict[str, Any] = {}
    typed: set[str] = set()  # the keys a `# TYPE` line gave their type
    loose: list[Any] = []  # the lines of untyped families, for `_shaped`
    finite_n: dict[str, int] = {}  # a gauge's label sets with a finite value (a ratio's mean)
    odd: dict[str, set[str]] = {}  # a gauge's values that are not finite, as the text format writes them
    by: dict[str, dict[str, float]] = {}  # a counter's value per label set
    for fam in _regrouped(text_string_to_metric_families(text)):
        # untyped (no `# TYPE` line, or `untyped`): the parser makes each line a family of its own
        untyped = fam.type in ("unknown", "untyped")
        if untyped:
            loose.extend(fam.samples)
        key = _key(fam)
        # an untyped `_total` is a counter by Prometheus' naming: named without `_total` too, as
        # a typed counter is (the parser gives it that name) -- it was dropped, named so
        name = key[:-6] if untyped and key.endswith("_total") else fam.name
        if key not in wanted and name not in wanted:
            continue
        if not untyped:
            typed.add(key)
        elif key in typed and out.get(key, {}).get("type") in ("histogram", "summary"):
            continue  # a line of a typed histogram or summary (`_regrouped`) never becomes a gauge of its name
        if fam.type in ("histogram", "gaugehistogram"):
            entry = _histogram(fam.samples)
            if entry is not None:
                out[key] = entry
        elif fam.type == "summary":
            out[key] = _summary(fam.samples)
        else:
            vals = [s.value for s in fam.samples if not s.name.endswith("_created")]
            finite = [v for v in vals if math.isfinite(v)]
            # an untyped `_total` is a counter by Prometheus' naming -- kept as a gauge, no
            # counter rule (bare, rate()) could judge it
            kind = "counter" if fam.type == "counter" or (untyped and key.endswith("_total")) else "gauge"
            prev = out.get(key)
            if untyped and prev is not None and prev["type"] == kind:
                # an untyped family's label sets are summed too, where only the last one's value was kept
                if prev["value"] is not None:
                    finite.append(prev["value"])
                vals.extend([0.0] * prev["series"])
                finite_n[key] = finite_n.get(key, 0) + len(finite) - (prev["value"] is not None)
            else:
                finite_n[key] = len(finite)
            out[key] = {"type": kind, "value": math.fsum(finite) if finite else None, "series": len(vals)}
            if kind == "gauge":
                odd.setdefault(key, set()).update(nonfinite_text(v) for v in vals if not math.isfinite(v))
            if kind == "counter":
                per = by.setdefault(key, {})
                for smp in fam.samples:
                    if not smp.name.endswith("_created") and math.isfinite(smp.value):
                        lab = _labels(smp, redactor)
                        per[lab] = per.get(lab, 0.0) + smp.value
    # an untyped histogram or summary was not read at all (its `_bucket`, `_sum`, `_count` lines
    # matched no wanted name) or read as a gauge (a summary's quantiles summed)
    out.update((k, v) for k, v in _shaped(loose, wanted).items() if k not in typed)
    for k, v in out.items():
        if v["type"] == "counter" and len(by.get(k, ())) <= MAX_SERIES:
            # each label set's own value: its increase is its own, reset by its own going down
            # (the judge's `Series.by`), as Prometheus' sum(increase(...))
            v["by"] = sorted([lab, x] for lab, x in by.get(k, {}).items())
        if v["type"] == "counter" and seen is not None and (step := _step(by.get(k, {}), seen, k)) is not None:
            # beyond MAX_SERIES the sum alone cannot tell a label set gone from a reset: its
            # increase since the last scrape, per label set, is what the judge reads then
            v["step"] = step
        if v["type"] == "gauge" and odd.get(k):
            # Prometheus' sum() or avg() of them: NaN with a NaN, or with +Inf and -Inf; else the infinity
            v["value"] = "NaN" if "NaN" in odd[k] or len(odd[k]) > 1 else next(iter(odd[k]))
        elif v["type"] == "gauge" and is_ratio(k) and v["value"] is not None and finite_n.get(k, 1) > 1:
            v["value"] /= finite_n[k]  # the mean over its label sets (RATIO_SUFFIXES)
    for k in [k for k, v in out.items()
              if v["type"] in ("counter", "gauge") and not v["series"] and out.get(k + "_total", {}).get("type") == "counter"]:
        # OpenMetrics' counter (`# TYPE x counter` or `# HELP x` over `x_total` lines): the
        # parser gives an empty family `x` and untyped `x_total` lines (a counter above); the
        # empty one was found first for `server("x")` and said nothing
        del out[k]
    return out


async def scrape_once(http: httpx.AsyncClient, url: str, scrape: MetricsScrape) -> tuple[int | None, str | None, str | None]:
    """(HTTP status, body text, error) of one bounded GET; body only for a 200 within the limits.
    A connection dropped before any answer is tried once more (`send_once_more_if_unanswered`)."""
    with trio.move_on_after(scrape.timeout_s):
        try:
            redirects = 0
            while True:
                resp = await send_once_more_if_unanswered(http, "GET", url, stream=True)
                try:
                    if resp.is_redirect and resp.next_request is not None:
                        # a redirect on the same host is followed, as Prometheus does (a mounted
                        # prometheus_client app answers /metrics with 307 to /metrics/)
                        nxt = resp.next_request.url
                        if (nxt.scheme, nxt.host, nxt.port) != (resp.url.scheme, resp.url.host, resp.url.port):
                            return resp.status_code, None, f"HTTP {resp.status_code}: a redirect to another host ({clip(record_redactor().text(str(nxt)), 100)}), not followed"
                        if redirects == MAX_REDIRECTS:
                            return resp.status_code, None, f"HTTP {resp.status_code}: more than {MAX_REDIRECTS} redirects"
                        redirects += 1
                        url = str(nxt)
                        continue
                    return await _read(resp, scrape)
                finally:
                    await resp.aclose()
        except httpx.HTTPError as e:
            return None, None, describe_transport_error(e)[:MAX_ERROR_CHARS]
    return None, None, f"no answer within {scrape.timeout_s:g}s"


async def _read(resp: httpx.Response, scrape: MetricsScrape) -> tuple[int | None, str | None, str | None]:
    """`scrape_once`'s answer of the final (not redirecting) response."""
    if resp.status_code != 200:
        return resp.status_code, None, f"HTTP {resp.status_code}"
    body = bytearray()
    async for chunk in resp.aiter_bytes():
        body += chunk
        if len(body) > scrape.max_bytes:
            return 200, None, f"answer larger than {scrape.max_bytes} bytes"
    return 200, body.decode("utf-8", "replace"), None


async def scrape_row(http: httpx.AsyncClient, url: str, scrape: MetricsScrape, now,
                     seen: dict[str, dict[str, float] | None] | None = None) -> dict[str, Any]:
    """One metrics.jsonl line: the scrape at `now()` (its start), parsed; `seen`: the backend's
    counters' label sets so far, for their `step` (`summarize`)."""
    t = now()
    status, text, error = await scrape_once(http, url + scrape.path, scrape)
    took = max(0.0, now() - t)
    families: dict[str, Any] = {}
    if text is not None:
        try:
            # the run's redactor, given: the worker thread need not share the run's context
            families = await trio.to_thread.run_sync(summarize, text, scrape.families, record_redactor(), seen)
        except Exception as e:  # noqa: BLE001 - whatever the parser raises, a bad answer is a failed scrape, not a dead run
            # the parser quotes the answer's offending line: the server's text, redacted as a
            # request record's error body is (the run's secrets, credential patterns, a secret
            # cut off by the limit) before metrics.jsonl, the manifest and the reports get it
            error = clip(record_redactor().text(f"not Prometheus text format: {type(e).__name__}: {e}"[:MAX_ERROR_CHARS]),
                         MAX_ERROR_CHARS)
    return {"schema_version": 1, "t": t, "ok": error is None, "status": status, "error": error,
            "seconds": round(took, 6), "families": families}


class LastScrape:
    """The scrape after the load: `after_load()` (the driver, once the load has ended) wakes
    the scrape loop for one more scrape and waits for it, bounded, before the server is stopped.
    Without it a counter's or histogram's change over the last bucket stopped at the last
    scrape inside it: up to a scrape interval of the run's end uncounted."""

    def __init__(self) -> None:
        self.load_done = trio.Event()
        self.finished = trio.Event()

    async def after_load(self, scrape: MetricsScrape) -> None:
        self.load_done.set()
        with trio.move_on_after(scrape.last_wait_s):
            await self.finished.wait()


def next_slot(slot: float, now: float, interval: float) -> float:
    """`slot` if it is still ahead of `now`, else the first slot of the cadence after `now`.
    The caller takes the slot it is given (the scrape starts now) and asks again after the
    scrape for when the next one starts."""
    if slot > now:
        return slot
    k = math.floor((now - slot) / interval) + 1
    while slot + k * interval <= now:  # the division's rounding: (0.3 - 0.25) / 0.01 is 4.999..., slot 5 is now
        k += 1
    return slot + k * interval


async def scrape_metrics(scrape: MetricsScrape, url: str, deps: Any, rec: Any, last: LastScrape | None = None) -> None:
    """Scrape until cancelled, or until the one scrape after `last.load_done` (see the module
    docstring); `rec.metrics_scrape` holds the summary."""
    try:
        await _scrape_loop(scrape, url, deps, rec, last)
    finally:
        if last is not None:
            last.finished.set()


async def _scrape_loop(scrape: MetricsScrape, url: str, deps: Any, rec: Any, last: LastScrape | None) -> None:
    log = ScrapeLog(scrape)
    final = False
    seen: dict[str, dict[str, float] | None] = {}  # the counters' label sets so far (`summarize`'s `step`)
    rec.metrics_scrape = log.to_json()
    try:
        w = JsonlWriter(deps.layout.metrics(rec.name), schema="metrics")
        try:
            slot = trio.current_time()  # when the next scrape starts (trio's clock: the cadence)
            while True:
                slot = next_slot(slot, trio.current_time(), scrape.interval_s)
                row = await scrape_row(deps.http, url, scrape, deps.clock.now, seen)
                w.write(row)
                await durable(w)
                log.add(row)
                rec.metrics_scrape = log.to_json()
                if log.status == "not available":
                    deps.progress.log(f"[{rec.name}] no server metrics: {scrape.path} answered {row['status']} (recorded as not available)")
                    return
                if final:
                    return
                slot = next_slot(slot, trio.current_time(), scrape.interval_s)
                if last is None:
                    await trio.sleep_until(slot)
                    continue
                with trio.move_on_at(slot):
                    await last.load_done.wait()
                final = last.load_done.is_set()  # one more scrape, at or after the load's end
        finally:
            await off_loop(w.close)
    except EvidenceError as e:
        raise rec.status.evidence_failed(e)


__all__ = ["LastScrape", "ScrapeLog", "scrape_metrics", "scrape_once", "scrape_row", "summarize"]
