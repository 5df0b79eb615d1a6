"""Plan -> evidence directory: the only stage that does I/O and runs async (trio).

`execute(plan, options)` launches each backend (one after another, or side by side when the
spec says `parallel = true`), waits for its readiness probe, drives every planned level,
sends the clean follow-up request, tears the server down, and records everything in the
evidence directory as it happens (requests.jsonl is appended per request and fsynced at
every bucket end). Afterwards it detects the runtime boundary from the server log, matches
server traces, and finalizes the manifest.

Aborts (exit 4): a backend that cannot start, is never ready or dies mid-run; SIGINT,
SIGTERM or SIGHUP. The evidence written so far stays, the manifest is marked `aborted`
with the reason, and every server is stopped (SIGTERM, grace, SIGKILL). If soakspec itself
is SIGKILLed, the reaper kills the servers and the manifest still says `running`, which
`verify` and `gate` report as incomplete.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import re
import secrets as _secrets
import shlex
import signal
import sys
from pathlib import Path
from typing import Any

import trio

from soakspec.evidence import layout as L
from soakspec.evidence.io import EvidenceError, JsonlWriter, RunLock, write_json_atomic
from soakspec.evidence.manifest import backend_entry, finalize_manifest, model_entry, new_manifest, source_entry, write_manifest
from soakspec.evidence.redact import secret_values
from soakspec.lang import simtrace
from soakspec.lang.spec import Backend
from soakspec.plan import BackendPlan, Plan
from soakspec.runner.clock import RunClock
from soakspec.runner.h11client import H11Connection
from soakspec.runner.load import LevelContext, LiveStats, Shapes, drive_level
from soakspec.runner.procs import BackendError, Reaper, Server, free_port, launch, log_tail, stop, wait_ready
from soakspec.runner.progress import Progress
from soakspec.runner.records import RequestRecord



class RunAborted(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class RunOptions:
    out_dir: Path | None = None  # the evidence directory; default soak-evidence/<run_id>
    run_id: str | None = None
    quiet: bool = False
    argv: tuple[str, ...] = ()
    nvml_module: Any = None  # test seam for telemetry
    workers: int = 1  # load processes per level (`--workers`, see runner/workers.py)


@dataclasses.dataclass(frozen=True)
class RunResult:
    run_dir: Path
    status: str  # complete | aborted | incomplete
    reason: str | None


def make_run_id(name: str) -> str:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{L.safe_name(name)}-{stamp}-{_secrets.token_hex(3)}"


def _runtime_banner(backend: Backend) -> str | None:
    """In a rehearsal, make the simulator print a log line the declared pattern recognises,
    so that the boundary machinery is exercised: the regex's literal prefix + the version."""
    rt = backend.runtime
    if rt is None or rt.log_pattern is None or rt.version is None:
        return None
    prefix = re.split(r"(?<!\\)[(\[]", rt.log_pattern, maxsplit=1)[0]
    prefix = re.sub(r"\\(.)", r"\1", prefix).lstrip("^")
    banner = prefix + rt.version
    return banner if re.search(rt.log_pattern, banner) else None


def _sim_argv(backend: Backend, port: int, model: str, rehearse: bool) -> list[str]:
    from soakspec.sim.config import sim_argv

    opts = dict(backend.sim)
    if rehearse and "runtime_banner" not in opts:
        banner = _runtime_banner(backend)
        if banner:
            opts["runtime_banner"] = banner
    opts.setdefault("model", model)
    return [sys.executable, "-m", "soakspec", "sim", "--host", "127.0.0.1", "--port", str(port), *sim_argv(opts)]


class _BackendRun:
    """Everything about one backend during a run (mutable state lives here, nowhere else)."""

    def __init__(self, engine: "_Engine", bp: BackendPlan, index: int):
        self.engine = engine
        self.bp = bp
        self.backend = bp.backend
        self.index = index
        self.dir = engine.layout.backend_dir(self.backend.name)
        self.server: Server | None = None
        self.entry: dict[str, Any] = {}
        self.levels: list[dict] = []
        self.followup: dict | None = None
        self.started_at: float | None = None
        self.ready_at: float | None = None
        self.base_url: str | None = None
        self.env_set: dict[str, str] = dict(self.backend.env)
        self.launched_argv: list[str] | None = None
        self.writer: JsonlWriter | None = None
        self.stats = LiveStats()
        self.aborted_reason: str | None = None
        self.trace_offset = 0
        self.source_before: dict | None = None
        self.seq = 0

    def trace_file_path(self) -> Path:
        f = self.backend.traces.file or ""
        return Path(f) if os.path.isabs(f) else self.engine.spec_dir / f

    # -------------------------------------------------------------- ids
    def next_id(self) -> tuple[int, str]:
        i = self.seq
        self.seq += 1
        return i, f"{self.engine.id_prefix}-{self.index}-{i:07d}"

    # -------------------------------------------------------------- lifecycle
    async def run(self) -> None:
        eng = self.engine
        b = self.backend
        self.dir.mkdir(parents=True, exist_ok=True)
        repo = eng.source_repo()
        if repo is not None:
            from soakspec.evidence.provenance import git_state

            self.source_before = await trio.to_thread.run_sync(git_state, repo)
        # Request and trace lines are not schema-checked as they are written: a full jsonschema
        # pass costs milliseconds per record, more than the request itself. RequestRecord.to_json
        # is tested against the schema, and `verify`/`gate` check every line after the run.
        self.writer = JsonlWriter(eng.layout.requests(b.name), schema=None)
        kind = "sim" if eng.plan.rehearsal else b.kind
        if b.traces.source == "jsonl" and not eng.plan.rehearsal:
            from soakspec.evidence.traces import file_offset

            # only what the server appends from now on belongs to this run
            self.trace_offset = file_offset(self.trace_file_path())
        try:
            if kind == "url":
                self.base_url = b.url.rstrip("/")
            else:
                await self._launch(kind)
            await self._ready()
            async with trio.open_nursery() as n:
                n.start_soon(self._watch_process)
                n.start_soon(self._telemetry)
                n.start_soon(self._ticker)
                await self._drive()
                n.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                if self.server is not None:
                    await stop(self.server, b.shutdown_grace_s if not eng.plan.rehearsal else min(b.shutdown_grace_s, 5.0), eng.reaper)
                if self.writer is not None:
                    self.writer.close()
                await self._collect()

    async def _launch(self, kind: str) -> None:
        eng = self.engine
        b = self.backend
        host = "127.0.0.1"
        port = free_port(host)
        self.base_url = f"http://{host}:{port}"
        model = eng.plan.spec.model
        fields = {
            "port": str(port),
            "host": host,
            "url": self.base_url,
            "model_path": model.path or "",
            "model_id": model.id or "",
            "model_revision": model.revision or "",
            "backend": b.name,
        }
        argv: list[str] | None = None
        shell: str | None = None
        if kind == "sim":
            argv = _sim_argv(b, port, model.request_name, eng.plan.rehearsal)
        elif kind == "launch":
            argv = [a.format(**fields) for a in b.argv]
        else:
            shell = b.shell.format(**{k: shlex.quote(v) for k, v in fields.items()})
        self.launched_argv = argv if argv is not None else ["/bin/sh", "-c", shell or ""]
        env = dict(os.environ)
        env.update(self.env_set)
        if b.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, b.gpus))
            self.env_set["CUDA_VISIBLE_DEVICES"] = env["CUDA_VISIBLE_DEVICES"]
        env.setdefault("PYTHONUNBUFFERED", "1")
        cwd = None
        if b.cwd is not None and kind != "sim":
            cwd = str((eng.spec_dir / b.cwd).resolve()) if not os.path.isabs(b.cwd) else b.cwd
        elif kind != "sim":
            cwd = str(eng.spec_dir)
        self.cwd = cwd
        self.started_at = eng.clock.now()
        from soakspec.evidence.redact import redact_argv

        eng.progress.log(f"[{b.name}] starting: {' '.join(redact_argv(self.launched_argv))}")
        log = str(eng.layout.server_log(b.name)) if b.capture_log or eng.plan.rehearsal else None
        self.server = await launch(b.name, argv, shell, env, cwd, log, eng.reaper, self.started_at)

    async def _ready(self) -> None:
        eng = self.engine
        b = self.backend
        r = b.ready
        timeout = r.timeout_s
        if eng.plan.rehearsal:
            timeout = min(timeout, 60.0)
        t_ready = await wait_ready(self.server, b.name, self.base_url + r.path, r.method, r.status, timeout, r.interval_s, eng.http)
        del t_ready
        self.ready_at = eng.clock.now()
        if self.started_at is None:
            self.started_at = self.ready_at
        eng.progress.log(f"[{b.name}] ready after {self.ready_at - self.started_at:.1f}s at {self.base_url}")

    async def _watch_process(self) -> None:
        if self.server is None:
            await trio.sleep_forever()
        from soakspec.runner.procs import describe_exit

        rc = await self.server.process.wait()
        self.server.poll()
        raise BackendError(self.backend.name, f"server {describe_exit(rc)} during the run", log_tail(self.server.log_path))

    async def _telemetry(self) -> None:
        from soakspec.evidence.telemetry import telemetry_record

        eng = self.engine
        interval = max(0.5, eng.plan.spec.telemetry.interval_s * (eng.plan.time_scale if eng.plan.rehearsal else 1.0))
        pid = self.server.pid if self.server is not None else None
        with JsonlWriter(eng.layout.telemetry(self.backend.name), schema="telemetry") as w:
            while True:
                rec = await trio.to_thread.run_sync(telemetry_record, eng.nvml, pid)
                w.write(rec)
                w.flush_fsync()
                await trio.sleep(interval)

    async def _ticker(self) -> None:
        while True:
            self.engine.progress.tick(self.stats)
            await trio.sleep(0.25)

    def _sink(self, records: list[RequestRecord]) -> None:
        # one write per batch (the file stays line-atomic); `to_line` is `dumps_line(to_json())`
        self.writer.write_lines(b"".join([rec.to_line() for rec in records]))

    async def _drive(self) -> None:
        eng = self.engine
        b = self.backend
        host, port = _host_port(self.base_url)
        api_key = os.environ.get(b.api_key_env) if b.api_key_env else None

        def connect() -> H11Connection:
            return H11Connection(host, port, eng.clock, api_key=api_key)

        for lv in self.bp.levels:
            workload = next(w for w in eng.plan.spec.workloads if w.name == lv.workload)
            shapes = Shapes(workload, eng.plan.spec.model.request_name, eng.prompts(workload))
            self.stats = LiveStats()
            nb = len(lv.buckets)

            def on_bucket(k: int, _lv=lv, _nb=nb) -> None:
                self.writer.flush_fsync()
                eng.progress.bucket_done(b.name, _lv.label, k, _nb, self.stats)

            ctx = LevelContext(b.name, eng.clock, connect, shapes, self._sink, self.next_id, stats=self.stats, on_bucket=on_bucket)
            eng.progress.level_started(
                b.name, f"{lv.workload} / {lv.label}", lv.warmup_s + lv.duration_s, lv.buckets[0].length_s, nb, lv.warmup_s
            )
            entry = {
                "workload": lv.workload, "index": lv.index, "mode": lv.mode, "concurrency": lv.concurrency,
                "rate": lv.rate, "batch_requests": lv.batch_requests, "planned_duration_s": lv.duration_s,
                "bucket_s": lv.buckets[0].length_s, "warmup_s": lv.warmup_s, "deadline_s": lv.deadline_s,
                "started_at": eng.clock.now(), "measure_start": eng.clock.now() + lv.warmup_s, "measure_end": None,
                "drained_at": None, "completed": False, "buckets": [], "sent": 0,
            }  # fmt: skip
            self.levels.append(entry)
            try:
                if eng.options.workers > 1:
                    from soakspec.runner.workers import drive_level_workers, processes_for

                    entry["workers"] = processes_for(lv, eng.options.workers)
                    job = {
                        "host": host, "port": port, "api_key_env": b.api_key_env, "workload": workload,
                        "model": shapes.model, "prompts": shapes.prompts, "backend": b.name, "headers": ctx.headers,
                        "id_prefix": f"{eng.id_prefix}-{self.index}", "first_index": self.seq,
                    }  # fmt: skip
                    run, self.seq = await drive_level_workers(lv, ctx, job, eng.options.workers, self.writer.write_lines)
                else:
                    run = await drive_level(lv, ctx)
            finally:
                entry["sent"] = self.stats.sent
                self.writer.flush_fsync()
            entry.update(
                started_at=run.started_at, measure_start=run.measure_start, measure_end=run.measure_end,
                drained_at=run.drained_at, completed=run.completed, buckets=run.bucket_windows(), sent=run.sent,
                mean_in_flight=round(run.mean_in_flight, 3),
            )  # fmt: skip
        if self.bp.follow_up:
            await self._follow_up(connect)

    async def _follow_up(self, connect) -> None:
        eng = self.engine
        workload = eng.plan.spec.workloads[0]
        shapes = Shapes(workload, eng.plan.spec.model.request_name, eng.prompts(workload))
        _, rid = self.next_id()
        rec = RequestRecord(request_id=rid, backend=self.backend.name, workload=workload.name, level=-1, concurrency=1, bucket=-2)
        conn = connect()
        try:
            await conn.send(shapes.make(0, smallest=True), rid, (), rec, deadline=eng.clock.now() + self.bp.follow_up_deadline_s)
        finally:
            with trio.CancelScope(shield=True):
                await conn.aclose()
        self._sink([rec])
        passed = str(rec.outcome) == "completed"
        self.followup = {
            "required": True,
            "record": rec.to_json(),
            "passed": passed,
            "reason": None if passed else f"follow-up request {rec.outcome}: {rec.error or 'no detail'}",
            "server_idle": None,
        }
        eng.progress.log(f"[{self.backend.name}] clean follow-up: {'passed' if passed else 'FAILED'}")

    # -------------------------------------------------------------- afterwards
    async def _collect(self) -> None:
        """Runtime boundary, traces, provenance and the manifest entry. Never raises."""
        eng = self.engine
        b = self.backend
        try:
            await trio.to_thread.run_sync(self._collect_sync)
        except Exception as e:  # noqa: BLE001 - keep the evidence; say what could not be derived
            eng.progress.error(f"[{b.name}] could not finish the evidence: {type(e).__name__}: {e}")
            self.entry.setdefault("collect_error", f"{type(e).__name__}: {e}")
            self.entry.setdefault("name", b.name)

    def _collect_sync(self) -> None:
        from soakspec.evidence.provenance import binary_sha256, git_state
        from soakspec.evidence.runtime import RuntimeDecl, detect_runtime_boundary
        from soakspec.evidence.traces import TraceSource, collect_traces, match_traces

        eng = self.engine
        b = self.backend
        log_path = eng.layout.server_log(b.name)
        log_text = ""
        if log_path.exists():
            log_text = log_path.read_bytes().decode("utf-8", "replace")
        rt = b.runtime
        decl = None
        if rt is not None:
            decl = RuntimeDecl(
                label=rt.label, log_regex=rt.log_pattern, expected_version=rt.version,
                required_env=tuple((n, None) for n in rt.require_env),
            )  # fmt: skip
        launched_env = dict(self.env_set)
        boundary = detect_runtime_boundary(decl, launched_env, log_text)

        # traces
        requests = _match_view(eng.layout.requests(b.name), b.traces.id_field) if eng.layout.requests(b.name).exists() else []
        tr = b.traces
        source_kind = tr.source
        pattern, forms = tr.pattern, tr.id_forms
        if eng.plan.rehearsal or b.kind == "sim":
            source_kind, pattern, forms = "log", simtrace.TRACE_PATTERN, simtrace.ID_FORMS
        trace_rows: list[dict] = []
        if source_kind != "none":
            if source_kind == "log":
                src = TraceSource(kind="log", pattern=pattern, id_field=tr.id_field)
                traces, _bad = collect_traces(log_path, 0, src) if log_path.exists() else ([], [])
            else:
                path = self.trace_file_path()
                src = TraceSource(kind="jsonl", id_field=tr.id_field, name=str(path))
                traces, _bad = collect_traces(path, self.trace_offset, src) if path.exists() else ([], [])
            match = match_traces(requests, traces, tr.id_field, forms, eng.plan.spec.gate.trace_window_s)
            trace_rows = match.records()
            if self.followup is not None:
                fid = self.followup["record"]["request_id"]
                ts = match.matched.get(fid)
                if ts and ts[0].payload is not None:
                    p = ts[0].payload
                    if "active" in p and "pending" in p:
                        self.followup["server_idle"] = int(p.get("active") or 0) <= 1 and int(p.get("pending") or 0) == 0
        with JsonlWriter(eng.layout.traces(b.name)) as w:
            for row in trace_rows:
                w.write(row)
        if self.followup is None:
            self.followup = {"required": self.bp.follow_up, "record": None, "passed": False, "reason": "the follow-up request was not sent (the run ended before it)", "server_idle": None}
        write_json_atomic(eng.layout.followup(b.name), self.followup)

        repo = eng.source_repo()
        after = git_state(repo) if repo is not None else None
        model = eng.plan.spec.model
        model_path = None
        if model.path:
            model_path = model.path if os.path.isabs(model.path) else str(eng.spec_dir / model.path)
        binary = None
        if self.launched_argv and b.kind == "launch" and not eng.plan.rehearsal:
            binary = binary_sha256(self.launched_argv, self.cwd)
        entry = backend_entry(
            name=b.name,
            kind="sim" if eng.plan.rehearsal else b.kind,
            argv=self.launched_argv,
            env=self.env_set,
            cwd=getattr(self, "cwd", None),
            url=self.base_url,
            pid=self.server.pid if self.server else None,
            started_at=self.started_at,
            ready_at=self.ready_at,
            exit_status=self.server.exit_status if self.server else None,
            stop_signal=self.server.stop_signal if self.server else None,
            runtime_boundary=boundary,
            source=source_entry(repo, self.source_before, after) if repo is not None else None,
            model=model_entry(model.id, model_path, model.revision),
            server_binary={"path": binary.get("path"), "sha256": binary.get("sha256")} if binary else None,
        )
        entry["levels"] = self.levels
        entry["trace_source"] = source_kind
        entry["aborted_reason"] = self.aborted_reason
        entry["planned_levels"] = len(self.bp.levels)
        self.entry = entry


def _match_view(path: Path, id_field: str) -> list[dict]:
    """The request fields trace matching uses, read one line at a time: a long soak's
    requests.jsonl read whole as dicts takes ~5 KiB per request (850 MiB after 30 minutes
    at 94 requests/s). A cut-off last line is skipped, a corrupt whole line raises."""
    from soakspec.evidence.io import EvidenceFormatError, iter_jsonl

    keys = (id_field, "server_id", "start", "end")
    bad: list[tuple[int, str | None]] = []
    out = [{k: r[k] for k in keys if k in r} for _, r in iter_jsonl(path, bad) if isinstance(r, dict)]
    corrupt = next(((n, m) for n, m in bad if m is not None), None)
    if corrupt is not None:
        raise EvidenceFormatError(path, *corrupt)
    return out


def _host_port(url: str) -> tuple[str, int]:
    m = re.match(r"https?://(\[[^\]]+\]|[^/:]+)(?::(\d+))?", url)
    host = m.group(1).strip("[]")
    port = int(m.group(2) or (443 if url.startswith("https") else 80))
    return host, port


class _Engine:
    def __init__(self, plan: Plan, options: RunOptions, progress: Progress):
        self.plan = plan
        self.options = options
        self.progress = progress
        self.clock = RunClock()
        self.run_id = options.run_id or make_run_id(plan.spec.header.name)
        self.id_prefix = "soak-" + _secrets.token_hex(4)
        self.layout = L.RunLayout(Path(options.out_dir) if options.out_dir else Path("soak-evidence") / self.run_id)
        self.reaper = Reaper()
        self.spec_dir = Path(plan.spec.path).resolve().parent if plan.spec.path and os.path.exists(plan.spec.path) else Path.cwd()
        self.http = None
        self.nvml = None
        self._prompts: dict[str, tuple[str, ...]] = {}
        self.runs: list[_BackendRun] = []

    def source_repo(self) -> Path | None:
        repo = self.plan.spec.source.repo
        if repo is None:
            return None
        return Path(repo) if os.path.isabs(repo) else (self.spec_dir / repo).resolve()

    def prompts(self, workload) -> tuple[str, ...]:
        if workload.prompt_file is None:
            return ()
        if workload.name not in self._prompts:
            self._prompts[workload.name] = load_prompts(self.spec_dir / workload.prompt_file)
        return self._prompts[workload.name]


def load_prompts(path: Path) -> tuple[str, ...]:
    """Prompts from a file: JSONL (`prompt`/`text` field, or ShareGPT `conversations`), or
    one prompt per non-empty line of plain text."""
    import json

    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            if line.startswith("{"):
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError:
                    out.append(line)
                    continue
                if isinstance(obj.get("prompt"), str):
                    out.append(obj["prompt"])
                elif isinstance(obj.get("text"), str):
                    out.append(obj["text"])
                elif isinstance(obj.get("conversations"), list) and obj["conversations"]:
                    first = obj["conversations"][0]
                    out.append(str(first.get("value") or first.get("content") or ""))
            else:
                out.append(line)
    if not out:
        raise RunAborted(f"prompt file {path} has no prompts")
    return tuple(out)


async def _execute(eng: _Engine) -> tuple[str, str | None]:
    """Returns (status, reason)."""
    import httpx

    from soakspec.evidence.telemetry import NvmlSource

    plan = eng.plan
    eng.nvml = NvmlSource(eng.options.nvml_module) if eng.options.nvml_module is not None else NvmlSource()
    gpus = eng.nvml.gpu_inventory()
    manifest = new_manifest(
        run_id=eng.run_id,
        spec_text=plan.spec.canonical_text,
        spec_path=plan.spec.path,
        rehearsal=plan.rehearsal,
        time_scale=plan.time_scale,
        started_at=eng.clock.now(),
        gpus=gpus,
        command=list(eng.options.argv),
        secrets=_run_secrets(plan),
    )
    ran = [bp.name for bp in plan.backends]
    if ran != [b.name for b in plan.spec.backends]:
        manifest["only"] = ran  # a --backend run: the judge expects just these backends
    write_manifest(eng.layout.root, manifest)
    # progress and error output (a server's log tail included) never shows them either
    eng.progress.secrets = tuple({*eng.progress.secrets, *(s for s in _run_secrets(plan) if len(s) >= 4)})
    status, reason = "complete", None
    if plan.spec.telemetry.require_gpus and not gpus.get("available"):
        status, reason = "aborted", f"the spec requires GPUs and NVML reports none ({gpus.get('reason')})"
        eng.progress.error(f"soakspec run: {reason}")
        return _finish(eng, manifest, status, reason)

    eng.reaper.start()
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(10.0), trust_env=False) as http:
            eng.http = http
            try:
                async with trio.open_nursery() as top:
                    top.start_soon(_signals, top.cancel_scope, eng)
                    await _run_backends(eng)
                    top.cancel_scope.cancel()
            except* BackendError as group:
                err = group.exceptions[0]
                while isinstance(err, BaseExceptionGroup):
                    err = err.exceptions[0]
                status, reason = "aborted", str(err)
                for r in eng.runs:
                    if r.backend.name == err.backend:
                        r.aborted_reason = err.message
                eng.progress.error(f"soakspec run: {err}")
                if err.log_tail:
                    eng.progress.error(f"last lines of {err.backend}'s log:\n{err.log_tail}")
            except* EvidenceError as group:
                err = group.exceptions[0]
                while isinstance(err, BaseExceptionGroup):  # nested nurseries nest the groups
                    err = err.exceptions[0]
                status, reason = "aborted", f"cannot write evidence: {err}"
                eng.progress.error(f"soakspec run: {reason}")
            if eng.signal_name is not None:
                status, reason = "aborted", f"interrupted by {eng.signal_name}"
                eng.progress.error(f"soakspec run: {reason}; servers stopped, evidence kept")
    finally:
        eng.reaper.close()
        eng.nvml.close()
    return _finish(eng, manifest, status, reason)


def _run_secrets(plan: Plan) -> set[str]:
    """Secret values the run knows: in the spec (env, launch argv, shell command lines) and the
    endpoints' API keys (read from the environment)."""
    found: set[str] = set()
    for b in plan.spec.backends:
        found |= secret_values(dict(b.env), [*b.argv, *([b.shell] if b.shell else [])])
        if b.api_key_env and os.environ.get(b.api_key_env):
            found.add(os.environ[b.api_key_env])
    return found


def _finish(eng: _Engine, manifest: dict, status: str, reason: str | None) -> tuple[str, str | None]:
    manifest = dict(manifest)
    manifest["backends"] = [r.entry for r in eng.runs if r.entry]
    finalize_manifest(eng.layout.root, manifest, status, reason)
    return status, reason


async def _signals(scope: trio.CancelScope, eng: _Engine) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as sigs:
        async for signum in sigs:
            eng.signal_name = signal.Signals(signum).name
            scope.cancel()
            return


async def _run_backends(eng: _Engine) -> None:
    for i, bp in enumerate(eng.plan.backends):
        eng.runs.append(_BackendRun(eng, bp, i))
    if eng.plan.parallel:
        async with trio.open_nursery() as n:
            for r in eng.runs:
                n.start_soon(r.run)
    else:
        for r in eng.runs:
            await r.run()


def execute(plan: Plan, options: RunOptions, progress: Progress | None = None) -> RunResult:
    """Run the plan; returns where the evidence is and how the run ended."""
    progress = progress or Progress(quiet=options.quiet)
    eng = _Engine(plan, options, progress)
    eng.signal_name = None
    with RunLock(eng.layout.root):
        progress.start()
        try:
            status, reason = trio.run(_execute, eng, restrict_keyboard_interrupt_to_checkpoints=True)
        finally:
            progress.stop()
    return RunResult(eng.layout.root, status, reason)


__all__ = ["RunAborted", "RunOptions", "RunResult", "execute", "load_prompts", "make_run_id", "secret_values"]
