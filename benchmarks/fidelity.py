"""Timing fidelity: does soakspec measure what the simulator injects?

Runs `soakspec run` (a real run: the simulator as a launched server process, the h11 load
path, evidence, verdict) against the embedded simulator configured with TTFT 50 ms and ITL
10 ms and enough slots that nothing queues, closed loop at concurrency 32, and prints the
measured TTFT and ITL percentiles minus the injected values. The simulator's trace of each
request (when it wrote the first token, on the wall clock) separates the client's error from the
simulator's own timer error: "client - simulator" is soakspec's first-token time minus the
simulator's, and the simulator's own TTFT error is its first-token time minus when it scheduled
the request, minus the injected TTFT.

    python benchmarks/fidelity.py                 # 3 runs of 20 s
    python benchmarks/fidelity.py --runs 1 --duration 5
    python benchmarks/fidelity.py --hog           # the same, with a CPU hog on every CPU beside it

The gate holds timing rules at 1.5x the injected values (p95 TTFT, p50 ITL), so a starved
client that blamed the server would FAIL them: with `--hog` the verdict must be PASS or
INCONCLUSIVE naming the load generator (the built-in client_healthy), never FAIL. Each run also
prints its verdict, the coalesced share of its ITL gaps and the client's worst event-loop lag.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "loadgen"))
from fixture import percentile as pct  # noqa: E402

from soakspec.evidence.record import iter_records

SPEC = """\
soak "fidelity" {{
  issue = "8"
}}
model {{
  id = "sim-model"
}}
backend "sim" {{
  sim {{
    ttft = {ttft}ms
    itl = {itl}ms
    slots = {slots}
  }}
  runtime {{
    label = "host-staged"
  }}
}}
workload "w" {{
  prompt_words = 16
  max_tokens = {tokens}
  ignore_eos = true
  load {{
    mode = closed
    concurrency = [{concurrency}]
  }}
  warmup = 2s
  duration = {duration}s
  bucket = {duration}s
  deadline = 30s
  follow_up = false
}}
gate {{
  require failed == 0
  require p95(ttft) < {ttft_limit}ms
  require p50(itl) < {itl_limit}ms
}}
claims {{
  claim "timing fidelity benchmark"
}}
"""


def one_run(args, workdir: Path, i: int) -> dict:
    spec = workdir / f"fidelity-{i}.soak"
    spec.write_text(SPEC.format(ttft=args.ttft, itl=args.itl, slots=args.concurrency * 2, tokens=args.tokens,
                                concurrency=args.concurrency, duration=args.duration,
                                ttft_limit=round(args.ttft * 1.5), itl_limit=round(args.itl * 1.5)))  # fmt: skip
    out = workdir / f"ev-{i}"
    cmd = [sys.executable, "-m", "soakspec", "run", str(spec), "--out", str(out), "--quiet", "--format", "json"]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=args.duration + 600)
    try:
        verdict = json.loads(proc.stdout)
    except ValueError:
        verdict = {}
    health = next((r for r in verdict.get("rules", []) if r.get("rule") == "client_healthy"), {})
    client = [json.loads(x) for x in (out / "client.jsonl").read_text().splitlines()] if (out / "client.jsonl").is_file() else []
    manifest = json.loads((out / "manifest.json").read_text())
    if manifest["status"] != "complete":
        raise SystemExit(f"run {i} did not complete (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    level = manifest["backends"][0]["levels"][0]
    from soakspec.evidence import layout
    from soakspec.evidence.io import iter_jsonl
    from soakspec.evidence.record import iter_records
    from soakspec.evidence.traces import TraceSource, collect_traces
    from soakspec.lang import simtrace

    d = out / "backends" / "sim"
    rows = [dict(r) for _, r in iter_records(d / layout.REQUESTS)]  # derived keys (ttft, itl) too
    measured = [r for r in rows if r["bucket"] >= 0]
    rows = [r for r in measured if r["outcome"] == "completed"]
    # the stored rows say which trace matched which request; the payload is the server.log line
    # at the row's offset (traces.jsonl.gz does not copy it)
    matched = {row["offset"]: row["request_id"] for _, row in iter_jsonl(d / layout.TRACES) if row.get("matched")}
    logged, _ = collect_traces(layout.server_log_file(d), 0, TraceSource(kind="log", pattern=simtrace.TRACE_PATTERN))
    traces = {matched[t.offset]: t.payload for t in logged if t.offset in matched and t.payload}
    ttft = [r["ttft"] for r in rows]
    itl = [g for r in rows for g in r["itl"]]
    both = [(r, traces[r["request_id"]]) for r in rows if traces.get(r["request_id"], {}).get("first_token_at")]
    lag = [r["first_token"] - t["first_token_at"] for r, t in both]
    sim_late = [t["first_token_at"] - t["scheduled_at"] - args.ttft / 1e3 for _, t in both if t.get("scheduled_at")]
    return {
        "requests": len(rows), "failed": len(measured) - len(rows),
        "in_flight": level.get("mean_in_flight"),
        "ttft_p50": pct(ttft, 50) - args.ttft / 1e3, "ttft_p99": pct(ttft, 99) - args.ttft / 1e3,
        "itl_p50": pct(itl, 50) - args.itl / 1e3, "itl_p99": pct(itl, 99) - args.itl / 1e3,
        "lag_p50": pct(lag, 50), "lag_p99": pct(lag, 99),
        "sim_p50": pct(sim_late, 50),
        "sim_p99": pct(sim_late, 99),
        "matched": len(lag),
        "verdict": verdict.get("verdict"), "client_healthy": f"{health.get('status')}: {health.get('message')}",
        "coalesced": sum(r.get("coalesced", 0) for r in rows) / max(1, len(itl)),
        "client_lag_max_ms": max((c["lag_max"] for c in client), default=0.0) * 1e3,
        "client_cpu_max": max((c["cpu"] or 0.0 for c in client), default=0.0),
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duration", type=int, default=20)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--ttft", type=int, default=50, help="injected TTFT, ms")
    ap.add_argument("--itl", type=int, default=10, help="injected ITL, ms")
    ap.add_argument("--hog", action="store_true", help="a busy-looping process on every CPU beside each run")
    args = ap.parse_args()
    if not (1 <= args.runs <= 10 and 1 <= args.duration <= 600):
        raise SystemExit("--runs 1..10, --duration 1..600")
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="soakspec-fidelity-") as tmp:
        runs = []
        for i in range(args.runs):
            hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)] if args.hog else []
            try:
                runs.append(one_run(args, Path(tmp), i))
            finally:
                for h in hogs:
                    h.kill()
                    h.wait()
            load.append(os.getloadavg()[0])
            print(f"run {i + 1}: {runs[-1]}", file=sys.stderr)

    def cell(key: str) -> str:
        xs = [r[key] * 1e3 for r in runs]
        m = statistics.median(xs)
        return f"{m:+.3f}" + (f" ({min(xs):+.3f} to {max(xs):+.3f})" if len(xs) > 1 else "")

    print(f"timing fidelity: simulator TTFT {args.ttft} ms, ITL {args.itl} ms, closed loop c={args.concurrency}, "
          f"{args.tokens} tokens, {args.duration} s per run; median of {args.runs} (min to max); "
          f"load average {', '.join(f'{x:.2f}' for x in load)}")  # fmt: skip
    print(f"requests per run: {', '.join(str(r['requests']) for r in runs)}; mean in flight: "
          f"{', '.join(str(r['in_flight']) for r in runs)}")
    print()
    print("| ms | p50 | p99 |")
    print("| --- | ---: | ---: |")
    print(f"| TTFT measured - injected | {cell('ttft_p50')} | {cell('ttft_p99')} |")
    print(f"| ITL measured - injected | {cell('itl_p50')} | {cell('itl_p99')} |")
    print(f"| first token: client's time - simulator's (its trace) | {cell('lag_p50')} | {cell('lag_p99')} |")
    print(f"| simulator's own TTFT - injected (its trace: first token - scheduled) | {cell('sim_p50')} | {cell('sim_p99')} |")
    print()
    for i, r in enumerate(runs):
        print(f"run {i + 1}{' (CPU hog on every CPU)' if args.hog else ''}: verdict {r['verdict']}; coalesced ITL "
              f"{r['coalesced'] * 100:.1f} %; client event-loop lag max {r['client_lag_max_ms']:.1f} ms, CPU max "
              f"{r['client_cpu_max'] * 100:.0f} %; client_healthy {r['client_healthy']}")  # fmt: skip
    failed = [r for r in runs if r["verdict"] == "FAIL"]
    return 1 if failed and args.hog else 0


if __name__ == "__main__":
    sys.exit(main())
