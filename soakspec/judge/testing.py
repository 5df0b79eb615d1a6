"""Synthetic evidence for the judge's tests: a clean run of a spec, in memory or on disk.

`EvidenceBuilder(spec)` lays out what a perfect run of `spec` would leave behind -- every
planned backend, level and bucket with requests, matched traces, telemetry, a passing follow-up
and consistent provenance -- as plain mutable dicts. Tests break one thing (fail a request,
drop a bucket, cut the run short, change a commit) and then either `build()` an in-memory
`Evidence` (treated as verified) or `write(dir)` a real evidence directory the way `soakspec run`
writes one -- the evidence package's writers, request lines by `RequestRecord.to_line`, a
finalized, hashed manifest, then results.json and verdict.json bound to it -- which
`load_evidence` reads back (tests/test_evidence_builders.py compares it with a real run).
"""

from __future__ import annotations

import copy
import dataclasses
import gzip
import hashlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from soakspec import windows
from soakspec.evidence import layout
from soakspec.judge import schedproof
from soakspec.judge.evidence import BackendEvidence, Evidence, Integrity
from soakspec.lang.spec import Backend, Spec
from soakspec.plan import BackendPlan, Level, plan as make_plan

T0 = 1_747_000_000.0
COMMIT = "0123456789abcdef0123456789abcdef01234567"
FINGERPRINT = "f" * 64
BINARY_SHA = "b" * 64


def _hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class EvidenceBuilder:
    """A clean run of `spec`. Attributes are plain data that tests may edit before building:

    manifest     the manifest dict (backends[i]["levels"] hold the bucket windows)
    records      backend name -> list of requests.jsonl rows (warm-up, measured, follow-up)
    traces       backend name -> list of traces.jsonl rows
    telemetry    backend name -> list of telemetry.jsonl rows
    metrics      backend name -> list of metrics.jsonl rows (a scrape every 5 s of a vLLM-like
                 /metrics, for a backend whose plan scrapes one: `metrics_rows`)
    followups    backend name -> followup.json dict
    client       backend name -> client.jsonl rows (the load generator's health). None by default,
                 and then no client.jsonl is written: evidence shaped like a run from before
                 soakspec measured its client, whose client_healthy is not judged. The
                 builder's closed-loop records are sparse (`per_bucket` requests a bucket, far
                 below the offered concurrency), which real client samples would rightly call
                 a client that did not keep up; `with_client()` adds the samples of a healthy
                 load generator (`client_rows`) for tests about client health.
    scheduled    (keyword) True by default: an open loop at a fixed rate is laid out as the runner
                 sends it -- one record per arrival of its seeded schedule (`schedproof.expected`:
                 warm-up arrivals in bucket -1, the rest in the bucket each was due in), its
                 manifest entry recording the schedule, so the judge's schedule proof holds and
                 `per_bucket` does not apply to it. False: such a level keeps `per_bucket`
                 evenly spaced records, which follow no schedule, and its entry records none --
                 evidence as from before the schedule proof, judged "not proven" (for tests whose
                 meaning is in those records' spacing).
    server_logs  backend name -> server.log text, to replace the default one (`server_log`: the
                 runtime's version line, one trace line per trace row when the backend's traces
                 come from its log, built from `traces` when the evidence is built)
    """

    def __init__(self, spec: Spec, *, per_bucket: int = 8, latency: float = 1.0, t0: float = T0,
                 run_id: str = "run1", time_scale: float = 1.0, rehearsal: bool = False,
                 only: tuple[str, ...] = (), scheduled: bool = True):
        self.spec = spec
        self.run_id = run_id
        self.per_bucket = per_bucket
        self.scheduled = scheduled
        self.latency = latency
        self._seq = 0
        p = make_plan(spec, time_scale=time_scale, rehearse=rehearsal, only=only)
        self.records: dict[str, list[dict[str, Any]]] = {}
        self.traces: dict[str, list[dict[str, Any]]] = {}
        self.telemetry: dict[str, list[dict[str, Any]]] = {}
        self.metrics: dict[str, list[dict[str, Any]]] = {}
        self.followups: dict[str, dict[str, Any]] = {}
        self.server_logs: dict[str, str] = {}
        self.client: dict[str, list[dict[str, Any]]] = {}
        self._rehearsal = rehearsal
        backends = []
        t = t0
        for bp in p.backends:
            entry, t = self._backend(bp, t)
            backends.append(entry)
        self.manifest: dict[str, Any] = self._manifest(backends, t0, t, time_scale=time_scale, rehearsal=rehearsal, only=only)

        self._seq = 0  # request ids added after the clean run count from 1 again (as they always have)

    def _level(self, name: str, lv: Level, t: float) -> tuple[dict[str, Any], float]:
        """One level's manifest entry, its requests appended to records[name]; and the time
        after it drained."""
        started = t
        ms = started + lv.warmup_s
        buckets = []
        for bk in lv.buckets:
            a = ms + bk.start_s
            buckets.append({"index": bk.index, "start": a, "end": a + bk.length_s, "planned_length_s": bk.length_s})
        me = ms + lv.duration_s
        entry = lv.to_json() | {  # the runner's entry: the plan's part, then what happened
            "started_at": started, "measure_start": ms, "measure_end": me, "drained_at": me + self.latency,
            "completed": True, "buckets": buckets,
        }
        if "schedule" in entry and not self.scheduled:
            del entry["schedule"]  # opted out: the level's schedule is not recorded, as before the schedule proof (not proven)
        if "schedule" in entry:  # an open loop: one record per arrival of its seeded schedule, as the runner sends
            edges = [b["start"] for b in buckets]
            times = list(schedproof.expected(entry))
            for s in times:
                k = windows.holding(edges, s)
                self.records[name].append(self.request(name, lv.workload, lv.index, k, s, conc=lv.concurrency, rate=lv.rate))
            measured = sum(s >= ms for s in times)
            sent = len(times)
        else:
            for bk, b in zip(lv.buckets, buckets):
                for i in range(self.per_bucket):
                    s = b["start"] + bk.length_s * i / self.per_bucket
                    self.records[name].append(self.request(name, lv.workload, lv.index, bk.index, s, conc=lv.concurrency, rate=lv.rate))
            measured = sent = self.per_bucket * len(lv.buckets)
        # what the load measures: requests x latency over the measured time
        entry |= {"sent": sent, "mean_in_flight": round(measured * self.latency / lv.duration_s, 3)}
        if lv.requests_per_level is not None:  # a counted level's (`LevelRun.count_json`): it ran every bucket
            n = lv.requests_per_level
            by = "duration" if measured < n else "min_duration" if measured > n and lv.min_duration_s is not None else "count"
            entry |= {"measured_sent": measured, "ended_by": by}
        return entry, me + self.latency + 1.0

    @staticmethod
    def _runtime_boundary(be: Backend) -> dict[str, Any]:
        rt = be.runtime
        if rt is None:
            return {"declared": None, "detected": None, "env_observed": {}, "status": "undeclared", "display": "undeclared", "details": []}
        if rt.log_pattern:
            return {"declared": rt.label, "detected": rt.version, "env_observed": {k: "1" for k in rt.require_env},
                    "status": "confirmed", "display": rt.label, "details": []}
        return {"declared": rt.label, "detected": None, "env_observed": {}, "status": "declared", "display": rt.label, "details": []}

    def _backend(self, bp: BackendPlan, t: float) -> tuple[dict[str, Any], float]:
        """One backend's manifest entry, with its requests, traces, telemetry and follow-up;
        and the time after it."""
        be = bp.backend
        name = be.name
        self.records[name] = []
        levels = []
        start_of_backend = t
        for lv in bp.levels:
            entry, t = self._level(name, lv, t)
            levels.append(entry)
        fu = None
        if bp.follow_up:
            fu = self.request(name, bp.levels[0].workload, 0, -2, t, conc=1, rate=None)
            self.records[name].append(fu)
            t += self.latency + 1.0
        self.followups[name] = {"required": bp.follow_up, "record": copy.deepcopy(fu), "passed": bp.follow_up,
                                "reason": None, "server_idle": True if bp.follow_up else None}
        trace_source = be.traces.source
        self.traces[name] = [self.trace_row(r) for r in self.records[name]] if trace_source != "none" else []
        self.telemetry[name] = [
            {"schema_version": 1, "t": x, "server_pid": 4242, "server_rss_bytes": 2 << 30, "server_pss_bytes": 2 << 30,
             "gpus": [{"index": g, "memory_used": 40 << 30, "process_memory_used": 38 << 30,
                       "utilization_gpu": 90.0, "temperature_c": 60.0, "power_w": 300.0} for g in (be.gpus or (0,))],
             "server_cpu_s": 1.5 * (x - start_of_backend), "server_cpu_percent": 150.0}
            for x in _frange(start_of_backend, t, 5.0)
        ]
        metrics_entry = None
        if bp.metrics is not None:
            self.metrics[name] = metrics_rows(start_of_backend, t)
            metrics_entry = {"path": bp.metrics.path, "interval_s": 5.0, "timeout_s": bp.metrics.timeout_s,
                             "declared": bp.metrics.declared, "status": "scraped", "scrapes": len(self.metrics[name]),
                             "failed": 0, "first_error": None, "families": sorted(self.metrics[name][0]["families"])}
        spec = self.spec
        return {
            **({"metrics": metrics_entry} if metrics_entry is not None else {}),
            "name": name, "safe_name": layout.safe_name(name), "kind": "sim" if self._rehearsal else be.kind, "url": None,
            "argv": list(be.argv) or None, "env": dict(be.env), "cwd": None, "pid": 4242,
            "started_at": None, "ready_at": None, "ready_seconds": None, "exit_status": 0, "stop_signal": "SIGTERM",
            "runtime_boundary": self._runtime_boundary(be),
            # like the runner: a commit only from a declared repository, a binary hash only for a
            # launched binary (sim, url and shell backends have none)
            "source": ({"repo": spec.source.repo, "commit_before": COMMIT, "commit_after": COMMIT,
                        "dirty_before": False, "dirty_after": False, "reason": None} if spec.source.repo is not None else
                       {"repo": None, "commit_before": None, "commit_after": None, "dirty_before": None,
                        "dirty_after": None, "reason": None}),
            "model": {"id": spec.model.id, "revision": spec.model.revision, "path": spec.model.path,
                      "fingerprint": FINGERPRINT, "fingerprint_files": {}, "reason": None},
            "server_binary": ({"path": be.argv[0] if be.argv else None, "sha256": BINARY_SHA}
                              if be.kind == "launch" and not self._rehearsal else None),
            "levels": levels, "planned_levels": len(bp.levels), "trace_source": trace_source, "server_log_cut": None, "server_log_moved": None,
            "aborted_reason": None, "timeouts": bp.timeouts(),
            "aborted_at": None, "crash_diagnosis": [], "preflight": None,
            # like the runner: whose socket answered readiness, for a server it launched
            "port_listener": {"owner": "server", "via": "server", "pid": 4242, "reason": None} if be.kind != "url" or self._rehearsal else None,
        }, t

    def _manifest(self, backends: list[dict[str, Any]], t0: float, t: float, *, time_scale: float, rehearsal: bool,
                  only: tuple[str, ...]) -> dict[str, Any]:
        from soakspec.evidence.manifest import utc_iso

        spec = self.spec
        m: dict[str, Any] = {
            "schema_version": 1, "soakspec_version": "0.0.0", "run_id": self.run_id, "status": "complete",
            "incomplete_reason": None, "rehearsal": rehearsal, "time_scale": time_scale,
            "spec": {"path": spec.path, "text": spec.canonical_text, "sha256": spec.sha256},
            "started_at": utc_iso(t0), "started_at_epoch": t0, "ended_at": utc_iso(t), "ended_at_epoch": t,
            "host": {"hostname": "h", "cpu_model": "cpu", "cpu_cores": 2, "memory_total": 1 << 30,
                     "kernel": "6.0", "os": "Linux", "python_version": "3.11", "soakspec_version": "0.0.0"},
            "gpus": {"available": False, "reason": "synthetic"},
            "backends": backends, "aborts": [], "artifacts": {}, "command": ["soakspec", "run", spec.path or "spec.soak"],
            "preflight": True, "aborted_at": None,
        }
        if only:
            m["only"] = list(only)
        return m

    # ---------------------------------------------------------------- rows

    def request(self, backend: str, workload: str, level: int, bucket: int, start: float, *,
                conc: int | None, rate: float | None, outcome: str = "completed", error: str | None = None,
                status: int | None = 200) -> dict[str, Any]:
        self._seq += 1
        rid = f"{self.run_id}-{layout.safe_name(backend)}-{self._seq:05d}"
        lat = self.latency
        ok = outcome == "completed"
        wl = next((w for w in self.spec.workloads if w.name == workload), None)
        tokens = min(64, max(wl.max_tokens)) if wl is not None and wl.max_tokens else 64  # never above max_tokens
        out = tokens if ok else 0
        text = f"out {rid}"
        return {  # RequestRecord.to_json()'s keys (records carry no schema_version)
            "request_id": rid, "backend": backend, "workload": workload, "level": level,
            "concurrency": conc, "rate": rate, "bucket": bucket, "worker": 0,
            "intended_start": start, "start": start, "first_byte": start + 0.05, "first_token": start + 0.1 if ok else None,
            "end": start + lat, "status": status, "outcome": outcome, "error": error,
            "finish_reason": "length" if ok else None, "server_id": f"cmpl-{rid}-0",
            "prompt_tokens": 64, "output_tokens": out, "tokens_source": "usage", "itl_source": "exact",
            "chunks": out, "ttft": 0.1 if ok else None, "latency": lat, "tpot": (lat - 0.1) / max(tokens - 1, 1) if ok and tokens > 1 else None,
            "itl": [round((lat - 0.1) / max(tokens - 1, 1), 6)] * (tokens - 1) if ok else [], "output_sha256": _hex(text) if ok else None,
            "output_chars": len(text) if ok else 0, "empty_text": False,
            "coalesced": 0, "usage_decreased": False, "client_delay": 0.0001 if ok else None,
        }

    def trace_row(self, r: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "schema_version": 1, "trace_id": f"cmpl-{r['request_id']}-0", "request_id": r["request_id"], "matched": True,
            "reason": None, "window_checked": True, "times": [r["start"], r["end"]], "source": "server.log", "offset": 0,
            "payload": {"request_id": f"cmpl-{r['request_id']}-0", "terminal_reason": "finished", "queued": r["start"]},
        }

    def _trace_pattern(self, be: Backend) -> str | None:
        from soakspec.lang import simtrace

        if self._rehearsal or be.kind == "sim":
            return simtrace.TRACE_PATTERN
        return be.traces.pattern if be.traces.source == "log" else None

    def server_log(self, be: Backend) -> str:
        """What the server printed: a start line, the runtime's version line (when the backend
        declares a version the log can confirm), one trace line per trace row when its traces
        come from the log, and a ready line. Rebuilt from `traces` on every `build`/`write`."""
        import json
        import re

        lines = ["server starting"]
        rt = be.runtime
        if rt is not None and rt.version:
            for cand in (f"NCCL version {rt.version}", f"version {rt.version}", rt.version):
                if rt.log_pattern is None or re.search(rt.log_pattern, cand):
                    lines.append(cand)
                    break
        lines.append("ready")
        pattern = self._trace_pattern(be)
        if pattern is not None:
            rx = re.compile(pattern)
            for row in self.traces.get(be.name, []):
                payload = json.dumps(row["payload"], sort_keys=True)
                for prefix in ("soakspec_sim_trace ", "pegainfer_http_trace ", ""):
                    if (m := rx.search(prefix + payload)) is not None and m.groupdict().get("json") == payload:
                        lines.append(prefix + payload)
                        break
        return "\n".join(lines) + "\n"

    def log_of(self, name: str) -> str:
        if name in self.server_logs:
            return self.server_logs[name]
        be = next(b for b in self.spec.backends if b.name == name)
        return self.server_log(be)

    # ---------------------------------------------------------------- edits

    def entry(self, backend: str) -> dict[str, Any]:
        for b in self.manifest["backends"]:
            if b["name"] == backend:
                return b
        raise KeyError(backend)

    def level(self, backend: str, index: int, workload: str | None = None) -> dict[str, Any]:
        for lv in self.entry(backend)["levels"]:
            if lv["index"] == index and (workload is None or lv["workload"] == workload):
                return lv
        raise KeyError((backend, index))

    def measured(self, backend: str, level: int | None = None, bucket: int | None = None) -> Iterator[dict[str, Any]]:
        for r in self.records[backend]:
            if r["bucket"] < 0:
                continue
            if level is not None and r["level"] != level:
                continue
            if bucket is not None and r["bucket"] != bucket:
                continue
            yield r

    def set_outcome(self, r: dict[str, Any], outcome: str, error: str, status: int | None = 200) -> dict[str, Any]:
        """Turn a measured request into a failure of the given kind (in place)."""
        r.update(outcome=outcome, error=error, status=status, first_token=None, ttft=None, tpot=None, itl=[],
                 output_tokens=0, chunks=0, finish_reason=None, output_sha256=None, output_chars=0)
        return r

    def untrace(self, request_id: str, backend: str) -> None:
        self.traces[backend] = [t for t in self.traces[backend] if t["request_id"] != request_id]

    def drop_bucket_requests(self, backend: str, level: int, bucket: int) -> None:
        """No request started in that bucket (the manifest's `sent` drops accordingly)."""
        gone = {r["request_id"] for r in self.measured(backend, level, bucket)}
        for lv in self.entry(backend)["levels"]:
            if lv["index"] == level:
                lv["sent"] -= len(gone)
        self.records[backend] = [r for r in self.records[backend] if r["request_id"] not in gone]
        self.traces[backend] = [t for t in self.traces[backend] if t["request_id"] not in gone]

    def with_client(self, **kw: Any) -> EvidenceBuilder:
        """Every backend's client.jsonl rows: a load process sampled every second from the
        backend's first level's start to its last level's drain (`client_rows`; `kw`: its lag,
        cpu, host_cpu). Returns the builder."""
        for b in self.manifest["backends"]:
            lvs = b.get("levels") or []
            if lvs:
                self.client[b["name"]] = client_rows(b["name"], lvs[0]["started_at"], lvs[-1]["drained_at"] + 1.0, **kw)
        return self

    # ---------------------------------------------------------------- outputs

    def build(self) -> Evidence:
        """An in-memory `Evidence`, treated as verified (nothing on disk to re-hash)."""
        backends = []
        for b in self.manifest["backends"]:
            n = b["name"]
            backends.append(BackendEvidence(
                name=n, safe_name=layout.safe_name(n), entry=copy.deepcopy(b),
                records=tuple(copy.deepcopy(self.records.get(n, []))), traces=tuple(copy.deepcopy(self.traces.get(n, []))),
                telemetry=tuple(copy.deepcopy(self.telemetry.get(n, []))), followup=copy.deepcopy(self.followups.get(n)),
                server_log=self.log_of(n), metrics=tuple(copy.deepcopy(self.metrics.get(n, []))),
                client=tuple(sorted(copy.deepcopy(self.client.get(n, [])), key=lambda r: r["t"])),
            ))
        return Evidence(copy.deepcopy(self.manifest), tuple(backends), Integrity(checked=0, verified=True), None, None)

    def write(self, run_dir: str | Path, *, finalize: bool = True) -> Path:
        """Write a real evidence directory (writers of `soakspec.evidence`), hash it into the
        manifest like a finished run, and return its path."""
        from soakspec.evidence.buckets import lines_for
        from soakspec.evidence.io import GzipJsonlWriter, JsonlWriter, write_bytes_atomic, write_json_atomic
        from soakspec.evidence.manifest import write_manifest
        from soakspec.evidence.results import write_results, write_verdict
        from soakspec.evidence.verify import finalize_artifacts
        from soakspec.judge.judge import judge
        from soakspec.judge.summary import summarize
        from soakspec.runner.records import RequestRecord

        root = Path(run_dir)
        root.mkdir(parents=True, exist_ok=True)
        m = copy.deepcopy(self.manifest)
        final_status, final_reason = m["status"], m["incomplete_reason"]
        m.update(status="running", incomplete_reason=None, ended_at=None, ended_at_epoch=None, artifacts={})
        write_manifest(root, m)
        for b in m["backends"]:
            n = b["name"]
            d = layout.RunLayout(root).backend_dir(n)
            d.mkdir(parents=True, exist_ok=True)
            with GzipJsonlWriter(d / layout.REQUESTS) as w:  # as the runner writes them: one batch of lines
                w.write_lines(b"".join(RequestRecord.from_json(r).to_line() for r in self.records.get(n, [])))
            with JsonlWriter(d / layout.BUCKETS) as w:  # the recorder's per-bucket lines
                for line in lines_for(b.get("levels") or (), [RequestRecord.from_json(r).freeze() for r in self.records.get(n, [])]):
                    w.write(line)
            for fname, rows in ((layout.TRACES, self.traces.get(n, [])), (layout.TELEMETRY, self.telemetry.get(n, [])),
                                (layout.METRICS, self.metrics.get(n, []))):
                if fname == layout.METRICS and n not in self.metrics:
                    continue
                with (GzipJsonlWriter if fname == layout.TRACES else JsonlWriter)(d / fname) as w:  # traces.jsonl.gz: gzip
                    for row in rows:
                        w.write(_on_disk(row) if fname == layout.TRACES and b.get("trace_source") == "log" else row)
            fu = self.followups.get(n)
            if isinstance(fu, dict) and isinstance(fu.get("record"), dict):  # the record as the runner stores it
                fu = fu | {"record": RequestRecord.from_json(fu["record"]).to_json()}
            write_json_atomic(d / layout.FOLLOWUP, fu)
            write_bytes_atomic(d / layout.SERVER_LOG_GZ, gzip.compress(self.log_of(n).encode(), mtime=0))  # as a run ends
        if any(self.client.values()):  # as a run leaves it (runner/clienthealth.py)
            with JsonlWriter(root / layout.CLIENT) as w:
                for rows in self.client.values():
                    for row in rows:
                        w.write(row)
        # no client rows: no client.jsonl, as a run from before soakspec measured its client
        # (the judge's client_healthy: not judged); an empty client.jsonl would say it measured
        # nothing (INCONCLUSIVE). `with_client()` gives the samples of a healthy load generator.
        if finalize:
            m.update(status=final_status, incomplete_reason=final_reason, ended_at=self.manifest["ended_at"],
                     ended_at_epoch=self.manifest["ended_at_epoch"], artifacts=finalize_artifacts(root))
            sha = write_manifest(root, m)
            # like `soakspec run`: results.json and verdict.json after the final manifest, bound to it
            evidence = dataclasses.replace(self.build(), manifest_sha256=sha)
            write_results(root, summarize(evidence, self.spec))
            write_verdict(root, judge(self.spec, evidence).to_json())
        return root


TTFT_LE = (0.1, 0.25, 0.5, 1.0, 2.5)
STALL_S = 0.01  # runner/clienthealth.py STALL_S: lags above it are kept one by one
MAX_CLIENT_ROWS = 2000  # a long synthetic soak's client.jsonl windows are widened to stay this few


def client_rows(backend: str, start: float, end: float, *, lag: float = 0.002, cpu: float = 0.2,
                host_cpu: float = 0.3, process: int = 0) -> list[dict[str, Any]]:
    """client.jsonl rows of a load process that kept up from `start` to `end`, as
    runner/clienthealth.py writes them: back-to-back windows of a second (wider for a long
    soak: at most `MAX_CLIENT_ROWS` of them, none over 60 s), each `lag` late at p99 and max,
    `cpu` of a core busy (every wake-up `lag` late: above `STALL_S`, each one is a stall)."""
    span = max(0.0, end - start)
    window = min(60.0, max(1.0, span / MAX_CLIENT_ROWS))
    tick = 0.005
    rows = []
    a = start
    while a < end:
        b = min(end, a + window)
        weight = b - a
        wakeups = max(1, int(weight / (tick + lag)))
        rows.append({"schema_version": 1, "start": round(a, 6), "t": round(b, 6), "backend": backend, "process": process,
                     "wakeups": wakeups, "lag_p50": lag, "lag_p99": lag, "lag_max": lag, "cpu": cpu, "host_cpu": host_cpu,
                     "tick_s": tick, "stall_s": STALL_S, "weight_s": round(weight, 6),
                     "stalls": [lag] * wakeups if lag > STALL_S else []})  # every wake-up `lag` late
        a = b
    return rows


def metrics_rows(start: float, end: float, step: float = 5.0, running: float = 4.0, waiting: float = 0.0,
                 kv: float = 0.5, tokens_per_s: float = 100.0, ttft_per_s: float = 2.0) -> list[dict[str, Any]]:
    """metrics.jsonl rows of a steady vLLM-like server scraped every `step` from `start` to
    `end`: gauges running/waiting/kv-cache usage, counters of preemptions (0) and generation
    tokens (`tokens_per_s`), and a TTFT histogram gaining `ttft_per_s` observations of 0.2 s."""
    rows = []
    for i, x in enumerate(_frange(start, end + step, step)):
        n = ttft_per_s * step * i
        rows.append({"schema_version": 1, "t": x, "ok": True, "status": 200, "error": None, "seconds": 0.001, "families": {
            "vllm:num_requests_running": {"type": "gauge", "value": running, "series": 1},
            "vllm:num_requests_waiting": {"type": "gauge", "value": waiting, "series": 1},
            "vllm:kv_cache_usage_perc": {"type": "gauge", "value": kv, "series": 1},
            "vllm:num_preemptions_total": {"type": "counter", "value": 0.0, "series": 1},
            "vllm:generation_tokens_total": {"type": "counter", "value": tokens_per_s * step * i, "series": 1},
            "vllm:time_to_first_token_seconds": {"type": "histogram", "sum": 0.2 * n, "count": n, "series": 1,
                                                 "buckets": [[le, 0.0 if le < 0.2 else n] for le in TTFT_LE] + [[None, n]]},
        }})
    return rows


def _frange(a: float, b: float, step: float) -> list[float]:
    out = []
    x = a
    while x < b:
        out.append(x)
        x += step
    return out


def tables_alive() -> int:
    """How many of the judge's request tables this process holds now (after a collection):
    what a test of a command's memory counts (compare and combine let a run's table go)."""
    import gc

    from soakspec.judge.table import RequestTable

    gc.collect()
    return sum(isinstance(o, RequestTable) for o in gc.get_objects())


def spec_from_text(text: str, path: str = "<test>") -> Spec:
    """Parse and check spec text; raise ValueError with the diagnostics when it does not check."""
    from soakspec.diagnostics import render_text
    from soakspec.lang import load_text

    spec, diags, shown = load_text(text, path)
    if spec is None:
        raise ValueError(render_text(diags, {path: shown}))
    return spec


def small_spec(rules: str = "require failed == 0", *, levels: str = "[2]", mode: str = "closed",
               duration: str = "2m", bucket: str = "1m", gate: str = "", traces: bool = True,
               backends: tuple[str, ...] = ("a",), follow_up: bool = True) -> Spec:
    """A one-workload spec over `url` backends, for rule tests. `rules` are gate lines."""
    blocks = []
    for b in backends:
        tr = '\n  traces {\n    source = jsonl\n    file = "traces.jsonl"\n  }' if traces else ""
        blocks.append(f'backend "{b}" {{\n  url = "http://127.0.0.1:8000"{tr}\n  runtime {{\n    label = "host-staged"\n  }}\n}}')
    load = f"mode = {mode}\n    " + (f"rate = {levels}" if mode == "open" else f"concurrency = {levels}")
    if mode == "batch":
        load += "\n    requests = 4"
    text = (
        'soak "small" {}\n'
        + "\n".join(blocks)
        + f'\nworkload "w" {{\n  load {{\n    {load}\n  }}\n  duration = {duration}\n  bucket = {bucket}\n'
        + f"  deadline = 30s\n  follow_up = {'true' if follow_up else 'false'}\n}}\n"
        + "gate {\n  " + gate + "\n  " + "\n  ".join(rules.splitlines()) + "\n}\n"
    )
    return spec_from_text(text)


def _on_disk(row: Mapping[str, Any]) -> dict[str, Any]:
    """A log trace's row as the runner stores it (`TraceMatch.records(in_log=True)`): its times
    and payload are in server.log's line at `offset`."""
    return {k: v for k, v in row.items() if k not in ("times", "payload")}
