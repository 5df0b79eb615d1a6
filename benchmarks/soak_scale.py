"""Evidence at soak scale: how `gate`, `verify` and `report` cope with N requests.

    python benchmarks/soak_scale.py --requests 100000 --out /tmp/scale-1e5
    python benchmarks/soak_scale.py --requests 1000000 --out /tmp/scale-1e6 --keep
    python benchmarks/soak_scale.py --out /tmp/scale-1e6 --measure-only   # time an existing directory

Writes a complete, verifiable evidence directory of N requests through the runner's own
writers -- no network, no server: the records are built directly as `RequestRecord`s (64
output tokens each, ITL per token) and written by the real `BackendRecorder` (requests.jsonl.gz
in batches, a gzip member closed and fsynced at every bucket end, then that bucket's
buckets.jsonl line; the follow-up record), the level entry is the real
`LevelRun`'s, one simulator trace line per request goes to server.log in the simulator's
format (`soakspec.lang.simtrace`), the runner's `collect` matches the traces (traces.jsonl.gz),
caps and gzips server.log into server.log.gz, and builds the backend's manifest entry, `finalize_manifest` hashes every artifact, and the run's own judging
(`judge_run_dir`, as `soakspec run` ends) writes results.json and verdict.json. One sim backend,
one level at concurrency 256 of many 60 s buckets; every request completes. Its runtime
boundary declares a `log_pattern`, as real specs do (specs/vllm.soak, specs/dsv2lite.soak), so
the judge also reads the runtime's version line from server.log; and a `per window` ITL rule
(20 s windows that cut the 60 s buckets), as soak claims use.

Then it prints the directory and times `soakspec gate DIR`, `soakspec verify DIR` and
`soakspec report DIR --format html` as separate processes under `/usr/bin/time -v` (`apt-get
install -y time`), printing wall time, peak RSS and the evidence's bytes on disk per request.
The generator itself judges the run in-process (that is what `soakspec run` does), so it needs
about as much memory as `gate`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import trio

CONCURRENCY = 256
TOKENS = 64
TTFT = 0.005  # seconds
ITL = 0.001
BUCKET_S = 60
POISSON_SEED = 7  # `--arrival poisson`'s schedule

SPEC = """\
soak "soak-scale" {{
  description = "benchmarks/soak_scale.py: {n} synthetic requests written through the runner's writers."
}}

backend "sim" {{
  sim {{
    slots = {c}
    ttft = 5ms
    itl = 1ms
  }}
  runtime {{
    label = "NCCL 2.26.2"
    log_pattern = r"NCCL version (?P<version>\d+\.\d+\.\d+)"
  }}
}}

workload "chat" {{
  prompt_words = 16
  max_tokens = {tokens}
  ignore_eos = true
  load {{
{load}
  }}
  warmup = 0s
  duration = {duration}s
  bucket = {bucket}s
  deadline = 10s
  follow_up = true
}}

gate {{
  require completed_run
  require artifacts_verified
  require bucket_coverage
  require follow_up
  require runtime_boundary_specific
  require failed == 0
  require trace_coverage >= 99%
  require p95(ttft) < 500ms
  require p99(itl) < 50ms
  require p99(latency) < 2s
  # a window that cuts the buckets: its ITL from cells cut at its edges (a warn: the last
  # windows of the generated level may be empty, which is inconclusive, not a failure)
  warn p99(itl) < 50ms per window 20s
}}
"""


# `--spread`: times as a real server's vary -- TTFT and every per-token gap drawn from a
# lognormal (medians 80 ms and 20 ms), each request in a slot of SPREAD_SLOT_S a worker (128
# requests a second: 10^6 requests are 130 one-minute buckets, 10^7 a 22-hour soak of 1,302).
# The default profile's gaps are 1 ms plus up to 0.2 ms of jitter (at most ~200 distinct
# microsecond values a bucket) and its buckets few (5 at 10^6): what the judge holds per
# bucket (`GapCells`: each distinct gap of each cell) is far smaller there than for a real
# server's day-long soak.
SPREAD_TTFT, SPREAD_TTFT_SIGMA = 0.080, 0.5
SPREAD_ITL, SPREAD_ITL_SIGMA = 0.020, 0.35
SPREAD_SLOT_S = 2.0


def _latency(spread: bool = False) -> float:
    """A request's slot a worker: its latency (the fixed profile), or SPREAD_SLOT_S."""
    return SPREAD_SLOT_S if spread else TTFT + (TOKENS - 1) * ITL


def duration_for(n: int, spread: bool = False) -> int:
    """Whole seconds (a multiple of the bucket) that hold n requests at the closed-loop rate."""
    per_worker = math.ceil(n / CONCURRENCY)
    seconds = math.ceil(per_worker * _latency(spread) * 1.001) + 1
    return max(BUCKET_S, math.ceil(seconds / BUCKET_S) * BUCKET_S)


class _Spread:
    """`--spread`'s times, drawn a block of requests at a time (seeded: the same directory
    each run). A request's TTFT plus its gaps stays below SPREAD_SLOT_S (scaled down in the
    rare draw that would not), so a worker's requests never overlap."""

    def __init__(self) -> None:
        import numpy as np

        self.rng = np.random.default_rng(0)
        self.block: list = []

    def __call__(self) -> tuple[float, list[float]]:
        if not self.block:
            import numpy as np

            k = 4096
            ttft = self.rng.lognormal(math.log(SPREAD_TTFT), SPREAD_TTFT_SIGMA, k)
            gaps = self.rng.lognormal(math.log(SPREAD_ITL), SPREAD_ITL_SIGMA, (k, TOKENS - 1))
            total = ttft + gaps.sum(axis=1)
            scale = np.minimum(1.0, 0.95 * SPREAD_SLOT_S / total)
            self.block = list(zip((ttft * scale).tolist(), (gaps * scale[:, None]).tolist()))
            self.block.reverse()
        return self.block.pop()


async def generate(n: int, out: Path, spread: bool = False, rate: float | None = None):
    """Write the directory (async: the recorder's bucket ends fsync on a worker thread, as in a
    run). `rate`: an open loop at `rate` on its seeded Poisson schedule (`arrivals.schedule`, as
    the runner's `_open` sends), each request's intended_start its arrival and its start 50 µs
    later, so `gate` proves the schedule (`judge/schedproof.py`) at scale; else the closed loop."""
    from soakspec.arrivals import schedule
    from soakspec.evidence.layout import RunLayout
    from soakspec.evidence.manifest import finalize_manifest, new_manifest, write_manifest
    from soakspec.judge.testing import spec_from_text
    from soakspec.lang.simtrace import TRACE_PREFIX
    from soakspec.plan import plan as make_plan
    from soakspec.runner.collect import collect
    from soakspec.runner.ids import IdSequence
    from soakspec.runner.load import LevelRun
    from soakspec.runner.progress import Progress
    from soakspec.runner.records import FOLLOW_UP_BUCKET, ItlSource, Outcome, RequestRecord, TokensSource
    from soakspec.runner.recorder import BackendRecorder, RunStatus

    if rate is None:
        load, duration = f"    mode = closed\n    concurrency = [{CONCURRENCY}]", duration_for(n, spread)
    else:  # an open loop on its seeded Poisson schedule: about n arrivals
        load = f"    mode = open\n    rate = [{rate:g}rps]\n    arrival = poisson\n    seed = {POISSON_SEED}"
        duration = max(BUCKET_S, math.ceil(n / rate / BUCKET_S) * BUCKET_S)
    text = SPEC.format(n=n, c=CONCURRENCY, tokens=TOKENS, duration=duration, bucket=BUCKET_S, load=load)
    spec = spec_from_text(text)
    plan = make_plan(spec)
    bp = plan.backends[0]
    lv = bp.levels[0]
    layout = RunLayout(out)
    t0 = 1_764_500_000.0
    manifest = new_manifest(run_id="soak-scale", spec_text=plan.spec_text, spec_path=None, rehearsal=False,
                            time_scale=1.0, started_at=t0, gpus={"available": False, "reason": "benchmark"},
                            command=["benchmarks/soak_scale.py", "--requests", str(n)], secrets=[])
    write_manifest(layout.root, manifest)
    status = RunStatus()
    rec = BackendRecorder(bp, layout, status)
    rec.prepare(0, None)
    rec.launching(["soakspec", "sim"], "http://127.0.0.1:1", t0)
    rec.ready(t0 + 0.5, "http://127.0.0.1:1")
    ids = IdSequence("soak-5ca1ab1e-0")
    measure_start = t0 + 1.0
    entry = rec.level_started(lv, measure_start)
    run = LevelRun(lv, measure_start, measure_start)

    rnd = random.Random(0)
    jitter = [rnd.random() * 2e-4 for _ in range(4096)]
    digests = [hashlib.sha256(str(k).encode()).hexdigest() for k in range(4096)]  # real hex, as the runner writes
    lat = _latency(spread)
    draw = _Spread() if spread else None
    log = open(rec.server_log, "w", encoding="utf-8")  # noqa: SIM115 - closed below
    log.write("soakspec-sim: listening on 127.0.0.1:1\nNCCL version 2.26.2\n")  # the runtime's banner (log_pattern)
    batch: list[RequestRecord] = []
    bucket_of_start = lambda t: min(len(lv.buckets) - 1, int((t - measure_start) // BUCKET_S))  # noqa: E731
    last_bucket = 0
    busy = 0.0
    trace_lines: list[str] = []
    if rate is None:
        due = (measure_start + (i // CONCURRENCY) * lat * 1.001 + (i % CONCURRENCY) * lat / CONCURRENCY for i in range(n))
    else:  # the level's schedule from its start (no warmup: started_at is measure_start) to its end
        due = schedule(lv.shape.rate, lv.shape.arrival, lv.shape.seed, measure_start, measure_start + lv.duration_s,
                       lv.shape.burstiness)
    i = -1
    for i, intended in enumerate(due):
        _, rid = ids()
        w = i % CONCURRENCY if rate is None else 0
        start = intended if rate is None else intended + 50e-6
        if draw is None:
            itl = [ITL + jitter[(i + k) & 4095] for k in range(TOKENS - 1)]
            first = start + TTFT + jitter[i & 4095]
        else:
            ttft, itl = draw()
            first = start + ttft
        end = first + sum(itl)
        b = bucket_of_start(start)
        if b != last_bucket:  # a bucket closed: what it holds is on disk, fsynced, then its buckets.jsonl line
            rec.write_records(batch)
            batch.clear()
            log.write("".join(trace_lines))
            trace_lines.clear()
            await rec.bucket_closed(entry, last_bucket, measure_start + (last_bucket + 1) * BUCKET_S)
            last_bucket = b
        batch.append(RequestRecord(
            rid, backend=bp.name, workload=lv.workload, level=lv.index, concurrency=lv.concurrency, rate=lv.rate,
            bucket=b, worker=w, intended_start=intended, start=start, first_byte=first, first_token=first, end=end, status=200,
            outcome=Outcome.COMPLETED, finish_reason="length", server_id=f"cmpl-{rid}-0", prompt_tokens=16,
            output_tokens=TOKENS, tokens_source=TokensSource.USAGE, itl_source=ItlSource.EXACT, chunks=TOKENS,
            tpot=(end - first) / (TOKENS - 1), itl=itl, output_sha256=digests[i & 4095], output_chars=5 * TOKENS,
        ))  # fmt: skip
        trace_lines.append(TRACE_PREFIX + json.dumps({
            "request_id": f"cmpl-{rid}-0", "client_request_id": rid, "endpoint": "/v1/completions",
            "arrival_index": i, "stream": True, "queued_at": start + 1e-4, "scheduled_at": start + 2e-4,
            "first_token_at": first, "finished_at": end, "prompt_tokens": 16, "completion_tokens": TOKENS,
            "max_tokens": TOKENS, "finish_reason": "length", "terminal_reason": "completed", "status": 200,
            "fault": None, "active": CONCURRENCY, "pending": 0,
        }, separators=(",", ":")) + "\n")  # fmt: skip
        busy += end - start
        if len(batch) >= 4096:
            rec.write_records(batch)
            batch.clear()
            log.write("".join(trace_lines))
            trace_lines.clear()
    rec.write_records(batch)
    log.write("".join(trace_lines))
    await rec.bucket_closed(entry, last_bucket, measure_start + (last_bucket + 1) * BUCKET_S)
    n = i + 1
    run.sent = n
    run.measure_end = measure_start + lv.duration_s
    run.drained_at = run.measure_end + lat
    run.completed = True
    run.busy_s = busy
    rec.stats.sent = n
    await rec.level_stopped(entry)
    rec.level_finished(entry, run)
    # the clean follow-up request after the level, on a idle server
    _, rid = ids()
    fs = run.drained_at + 0.1
    fitl = [ITL] * (TOKENS - 1)
    ffirst = fs + TTFT
    fend = ffirst + sum(fitl)
    follow = RequestRecord(
        rid, backend=bp.name, workload=lv.workload, level=lv.index, concurrency=lv.concurrency, rate=lv.rate, bucket=FOLLOW_UP_BUCKET,
        intended_start=fs, start=fs, first_byte=ffirst, first_token=ffirst, end=fend, status=200,
        outcome=Outcome.COMPLETED, finish_reason="length", server_id=f"cmpl-{rid}-0", prompt_tokens=16,
        output_tokens=TOKENS, tokens_source=TokensSource.USAGE, itl_source=ItlSource.EXACT, chunks=TOKENS,
        tpot=ITL, itl=fitl, output_sha256="ab" * 32, output_chars=5 * TOKENS,
    )  # fmt: skip
    log.write(TRACE_PREFIX + json.dumps({
        "request_id": f"cmpl-{rid}-0", "client_request_id": rid, "endpoint": "/v1/completions", "arrival_index": n,
        "stream": True, "queued_at": fs, "scheduled_at": fs, "first_token_at": ffirst, "finished_at": fend,
        "prompt_tokens": 16, "completion_tokens": TOKENS, "max_tokens": TOKENS, "finish_reason": "length",
        "terminal_reason": "completed", "status": 200, "fault": None, "active": 1, "pending": 0,
    }, separators=(",", ":")) + "\n")  # fmt: skip
    log.close()
    rec.follow_up_done(follow)
    await rec.make_durable()
    rec.close()
    entries = [collect(plan, rec, Progress(quiet=True))]
    finalize_manifest(layout.root, manifest | {"backends": entries}, status.status, status.reason)
    return spec


def judge_written(out: Path, spec) -> int:
    """results.json and verdict.json, as `soakspec run` writes them once the run lock is released."""
    import contextlib
    import io

    from soakspec.judge.cli_support import judge_run_dir

    with contextlib.redirect_stdout(io.StringIO()):
        return judge_run_dir(out, spec, "text", write=True)


def time_proof(out: Path, repeat: int = 3) -> None:
    """The schedule proof alone, in this process (`--time-proof`): each open-loop level's records'
    intended starts read once, then `schedproof.prove` timed `repeat` times (best and all)."""
    from soakspec.evidence.record import iter_records
    from soakspec.judge import schedproof

    manifest = json.loads((out / "manifest.json").read_text())
    for be in manifest["backends"]:
        rows = [r for _, r in iter_records(out / "backends" / be["safe_name"] / "requests.jsonl.gz")]
        for entry in be["levels"]:
            if entry.get("mode") != "open":
                continue
            import numpy as np

            starts = np.array([r["intended_start"] for r in rows if r["level"] == entry["index"] and r["bucket"] != -2],
                              dtype=np.float64)
            times = []
            for _ in range(repeat):
                t = time.perf_counter()
                proof = schedproof.prove(entry, starts)
                times.append(time.perf_counter() - t)
            print(f"prove: {proof.status} {proof.arrivals:,} arrivals {proof.reason}; best {min(times):.2f} s "
                  f"({min(times) / max(1, len(starts)) * 1e9:,.0f} ns an arrival), all "
                  + ", ".join(f"{x:.2f}" for x in times), flush=True)


def evidence_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def timed(argv: list[str]) -> dict[str, float | int | str]:
    """Run argv under /usr/bin/time -v: (exit code, wall seconds, peak RSS in KiB)."""
    t = shutil.which("time") or "/usr/bin/time"
    proc = subprocess.run([t, "-v", *argv], capture_output=True, text=True)
    err = proc.stderr
    if "Maximum resident set size" not in err:  # killed before /usr/bin/time could report
        return {"rc": proc.returncode, "wall_s": math.nan, "cpu_s": math.nan, "rss_kib": 0, "stdout": err[-2000:]}
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", err).group(1))
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", err).group(1)
    parts = [float(x) for x in wall.split(":")]
    seconds = sum(p * 60 ** k for k, p in enumerate(reversed(parts)))
    cpu = float(re.search(r"User time \(seconds\): ([\d.]+)", err).group(1)) + float(
        re.search(r"System time \(seconds\): ([\d.]+)", err).group(1))
    return {"rc": proc.returncode, "wall_s": seconds, "cpu_s": cpu, "rss_kib": rss, "stdout": proc.stdout}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--out", required=True, help="evidence directory to write (must not exist, unless --measure-only)")
    ap.add_argument("--measure-only", action="store_true", help="time an existing directory, do not write one")
    ap.add_argument("--skip", default="", help="comma-separated commands not to time (gate, verify, report)")
    ap.add_argument("--keep", action="store_true", help="keep the directory (default: removed after timing)")
    ap.add_argument("--spread", action="store_true",
                    help="TTFT and per-token gaps spread as a real server's (lognormal), 128 requests a second: "
                         "many buckets, each with tens of thousands of distinct gaps")
    ap.add_argument("--arrival", choices=("closed", "poisson"), default="closed",
                    help="poisson: an open loop at --rate on its seeded Poisson schedule (about --requests arrivals), "
                         "so `gate` proves the schedule at scale (judge/schedproof.py); closed: concurrency 256")
    ap.add_argument("--rate", type=float, default=1000.0, help="--arrival poisson's rate, requests a second")
    ap.add_argument("--time-proof", action="store_true",
                    help="time the schedule proof alone (`schedproof.prove`) in this process on each open-loop level")
    args = ap.parse_args()
    out = Path(args.out)
    if not args.measure_only:
        if out.exists():
            print(f"{out}: exists", file=sys.stderr)
            return 2
        from soakspec.evidence.io import RunLock

        t = time.perf_counter()
        with RunLock(out):  # as `soakspec run` holds it (and creates the directory)
            spec = trio.run(generate, args.requests, out, args.spread, args.rate if args.arrival == "poisson" else None)
        code = judge_written(out, spec)
        print(f"wrote {out} ({args.requests:,} requests, the run's own verdict exit {code}) in "
              f"{time.perf_counter() - t:.1f} s", flush=True)
    print(out, flush=True)
    from soakspec.evidence.io import iter_raw_lines

    n = sum(1 for _ in iter_raw_lines(next(out.glob("backends/*/requests.jsonl.gz")))) - 1  # less the follow-up
    size = evidence_bytes(out)
    per = {p.name: p.stat().st_size / n for p in sorted(next(out.glob("backends/*")).iterdir())}
    per["run root"] = sum(p.stat().st_size for p in out.iterdir() if p.is_file()) / n  # manifest, results, verdict
    print(f"evidence: {size:,} bytes, {size / n:,.0f} bytes a request ("
          + ", ".join(f"{k} {v:,.1f}" for k, v in per.items()) + ")")
    if args.time_proof:
        time_proof(out)
    py = [sys.executable, "-m", "soakspec"]
    skip = set(filter(None, args.skip.split(",")))
    cmds = {"gate": [*py, "gate", str(out)], "verify": [*py, "verify", str(out)],
            "report": [*py, "report", str(out), "--format", "html"]}
    print("| command | requests | exit | wall (s) | µs / request | CPU (s) | peak RSS (MiB) |")
    for name, argv in cmds.items():
        if name in skip:
            continue
        r = timed(argv)
        print(f"| {name} | {n:,} | {r['rc']} | {r['wall_s']:.1f} | {r['wall_s'] / n * 1e6:.1f} | {r['cpu_s']:.1f} "
              f"| {r['rss_kib'] / 1024:,.0f} |", flush=True)
        if name == "gate" and r["rc"] != 0:
            print(r["stdout"][-3000:])
    if not args.keep and not args.measure_only:
        shutil.rmtree(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
