"""Load-generator benchmark: soakspec's own load path against a server that costs almost nothing.

nginx (the Debian package; installed with apt-get if missing and we are root) runs as a
non-daemon child on a free loopback port and answers `POST /v1/completions` with a canned
streamed completion -- 64 text events in the vLLM completions layout, one usage event,
`data: [DONE]` -- and `GET /v1/models`. Whatever latency a client measures against it is the
client's own.

For each of `--runs` rounds (default 3), in one process run:

  * soakspec: a generated spec with one `url` backend (nginx), closed loop at each
    `--concurrency` (8, 64, 256), `--warmup` + `--duration` per level, run through
    `soakspec.runner.engine.execute()` -- exactly what `soakspec run` does (evidence written,
    telemetry, progress), minus the verdict at the end, which re-validates every record and
    takes minutes for 100k records -- once per `--workers` value (1 and 2);
  * wrk (`-t1`, a Lua script for the POST) at the same concurrencies for `--duration`: the
    ceiling of a C client that does not parse the stream.

Per level, from the evidence (measured window only): completed requests/s, output tokens/s,
TTFT p50/p99 (against a zero-latency server: what the client itself adds), client CPU seconds
per 1,000 requests (user+system of the client's process tree from /proc, sampled every 50 ms,
interpolated at the window's edges), the manifest's mean requests in flight, nginx's CPU share,
and the ratio to wrk. Median of the rounds, min-max shown. nginx is stopped at the end, also on
an error or a signal.

    python benchmarks/loadgen/run.py                       # the full table (about 8 minutes)
    python benchmarks/loadgen/run.py --runs 1 --duration 4 # a quick look

Two more arms, each in the same rounds against the same nginx:

  * `vllm bench serve` -- the peer a user would pick instead -- when the real-server lane's venv
    is there (`$REALSERVER_DIR/V/bin/vllm`, REALSERVER_DIR defaulting to /work/realserver; or
    `--vllm PATH`; `--no-vllm` skips it): `--backend openai --endpoint /v1/completions
    --dataset-name random --random-input-len 16 --random-output-len 64 --num-prompts N
    --max-concurrency C --ignore-eos`, its tokenizer the lane's tiny model
    ($REALSERVER_DIR/tiny). Its own request throughput (from `--save-result`) is printed beside
    soakspec's, and the ratio of soakspec (1 worker) to it.
  * `--self-check`: soakspec with one worker again, its client-health monitor
    (runner/clienthealth.py: the event-loop lag task and the CPU samples) switched off in the
    client process; the cost of the self-check is 1 - (with / without) of completed req/s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fixture import (  # noqa: E402
    TOKENS, Sampler, ensure_tools, free_port, log, nginx_spec, percentile, start_nginx, stop_nginx, tree_cpu,
)

from soakspec.evidence.record import iter_records  # noqa: E402

# ------------------------------------------------------------------------------------------
# soakspec


def client_main(spec_path: str, out: str, workers: int, self_check: bool = True) -> int:
    """The client process: `soakspec run` up to the verdict (engine.execute). `self_check`
    False: the client-health monitor does nothing (the benchmark's A/B of its cost)."""
    from soakspec.lang import load_spec
    from soakspec.plan import plan
    from soakspec.runner.engine import RunOptions, execute

    if not self_check:
        from soakspec.runner import clienthealth

        async def off(self) -> None:
            return None

        clienthealth.LoopMonitor.run = off  # type: ignore[method-assign]

    spec, diags, _ = load_spec(spec_path)
    if spec is None:
        print("\n".join(map(str, diags)), file=sys.stderr)
        return 2
    result = execute(plan(spec), RunOptions(out_dir=Path(out), quiet=True, workers=workers))
    return 0 if result.status == "complete" else 4


def run_soakspec(args, port: int, nginx_pid: int, workers: int, workdir: Path, round_: int, self_check: bool = True) -> list[dict]:
    spec = workdir / f"spec-w{workers}-r{round_}.soak"
    spec.write_text(nginx_spec("loadgen-benchmark", "load generator benchmark", port, ", ".join(map(str, args.concurrency)),
                               args.duration, args.duration, warmup=args.warmup))  # fmt: skip
    out = workdir / f"ev-w{workers}-r{round_}"
    cmd = [sys.executable, __file__, "_client", str(spec), str(out), str(workers), "1" if self_check else "0"]
    limit = len(args.concurrency) * (args.warmup + args.duration + 40) + 120
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    try:
        with Sampler({"client": proc.pid, "nginx": nginx_pid}) as cpu:
            rc = proc.wait(timeout=limit)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if rc != 0:
        raise SystemExit(f"the soakspec client failed (exit {rc}); evidence in {out}")
    manifest = json.loads((out / "manifest.json").read_text())
    levels = manifest["backends"][0]["levels"]
    by_level: dict[int, list[dict]] = {}
    for _, r in iter_records(out / "backends" / "nginx" / "requests.jsonl.gz"):
        if r.measured:
            by_level.setdefault(r.level, []).append(r)
    results = []
    for lv in levels:
        rows = by_level.get(lv["index"], [])
        done = [r for r in rows if r["outcome"] == "completed"]
        ms, me = lv["measure_start"], lv["measure_end"]
        dur = me - ms
        client_cpu = cpu.at("client", me) - cpu.at("client", ms)
        nginx_cpu = cpu.at("nginx", me) - cpu.at("nginx", ms)
        ttfts = [r["ttft"] for r in done]
        results.append({
            "c": lv["concurrency"], "workers": workers, "requests": len(rows), "completed": len(done),
            "failed": len(rows) - len(done), "rps": len(done) / dur, "tokens_s": sum(r["output_tokens"] for r in done) / dur,
            "ttft_p50_ms": percentile(ttfts, 50) * 1e3, "ttft_p99_ms": percentile(ttfts, 99) * 1e3,
            "latency_p50_ms": percentile([r["latency"] for r in done], 50) * 1e3,
            "cpu_per_1k": client_cpu / max(1, len(rows)) * 1000, "client_cores": client_cpu / dur,
            "in_flight": lv.get("mean_in_flight"), "nginx_cores": nginx_cpu / dur,
        })  # fmt: skip
    shutil.rmtree(out, ignore_errors=True)
    return results


# ------------------------------------------------------------------------------------------
# wrk

WRK_LUA = """\
wrk.method = "POST"
wrk.body = '{"model":"bench","prompt":"time year people way day man thing woman","max_tokens":64,"stream":true}'
wrk.headers["Content-Type"] = "application/json"
"""


def run_wrk(args, wrk: str, port: int, nginx_pid: int, c: int, workdir: Path) -> dict:
    lua = workdir / "post.lua"
    lua.write_text(WRK_LUA)
    cmd = [wrk, f"-t{args.wrk_threads}", f"-c{c}", f"-d{args.duration}s", "--timeout", "10s", "-s", str(lua),
           f"http://127.0.0.1:{port}/v1/completions"]  # fmt: skip
    n0 = tree_cpu(nginx_pid)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=args.duration + 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wall = time.monotonic() - t0
    nginx_cpu = tree_cpu(nginx_pid) - n0
    rps = next((float(line.split()[1]) for line in out.splitlines() if line.startswith("Requests/sec:")), None)
    total = next((int(line.split()[0]) for line in out.splitlines() if "requests in" in line), None)
    errors = next((line.strip() for line in out.splitlines() if "Non-2xx" in line or "Socket errors" in line), None)
    if rps is None:
        raise SystemExit(f"wrk failed:\n{out}")
    return {"c": c, "rps": rps, "tokens_s": rps * TOKENS, "requests": total, "errors": errors,
            "nginx_cores": nginx_cpu / wall}  # fmt: skip


# ------------------------------------------------------------------------------------------
# vllm bench serve


def find_vllm(args) -> str | None:
    if args.no_vllm:
        return None
    if args.vllm:
        return args.vllm
    exe = Path(os.environ.get("REALSERVER_DIR", "/work/realserver")) / "V" / "bin" / "vllm"
    return str(exe) if exe.is_file() and os.access(exe, os.X_OK) else None


def run_vllm_bench(args, vllm: str, port: int, nginx_pid: int, c: int, workdir: Path) -> dict:
    """`vllm bench serve` at max concurrency c against the same nginx; its own throughput."""
    tokenizer = args.vllm_tokenizer or str(Path(os.environ.get("REALSERVER_DIR", "/work/realserver")) / "tiny")
    name = f"vllm-bench-c{c}.json"
    cmd = [vllm, "bench", "serve", "--backend", "openai", "--endpoint", "/v1/completions",
           "--base-url", f"http://127.0.0.1:{port}", "--model", "bench", "--tokenizer", tokenizer,
           "--dataset-name", "random", "--random-input-len", "16", "--random-output-len", str(TOKENS),
           "--num-prompts", str(args.vllm_prompts), "--max-concurrency", str(c), "--ignore-eos",
           "--disable-tqdm", "--save-result", "--result-dir", str(workdir), "--result-filename", name]  # fmt: skip
    n0 = tree_cpu(nginx_pid)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    wall = time.monotonic() - t0
    if proc.returncode != 0 or not (workdir / name).is_file():
        raise SystemExit(f"vllm bench serve failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    res = json.loads((workdir / name).read_text())
    return {"c": c, "rps": res.get("request_throughput"), "tokens_s": res.get("output_throughput"),
            "completed": res.get("completed"), "failed": res.get("failed", 0),
            "ttft_p50_ms": res.get("median_ttft_ms"), "nginx_cores": (tree_cpu(nginx_pid) - n0) / wall}  # fmt: skip


# ------------------------------------------------------------------------------------------
# the table


def med(values: list[float], fmt: str) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    m = statistics.median(values)
    if len(values) == 1:
        return format(m, fmt)
    return f"{format(m, fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def table(args, wrk_runs: dict[int, list[dict]], sk_runs: dict[tuple[int, int], list[dict]]) -> str:
    lines = [
        "| client | c | completed req/s | output tokens/s | TTFT p50 (ms) | TTFT p99 (ms) | latency p50 (ms) "
        "| client CPU s / 1k req | client cores | mean in flight | nginx cores | ratio to wrk |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for c in args.concurrency:
        w = wrk_runs[c]
        if w:
            lines.append(f"| wrk -t{args.wrk_threads} | {c} | {med([r['rps'] for r in w], ',.0f')} | "
                         f"{med([r['tokens_s'] for r in w], ',.0f')} | - | - | - | - | - | - | {med([r['nginx_cores'] for r in w], '.2f')} | 1 |")  # fmt: skip
        wrk_med = statistics.median(r["rps"] for r in w) if w else None
        for workers in args.workers:
            rs = sk_runs[(workers, c)]
            name = f"soakspec, {workers} worker{'s' if workers > 1 else ''}"
            lines.append(
                f"| {name} | {c} | {med([r['rps'] for r in rs], ',.0f')} | {med([r['tokens_s'] for r in rs], ',.0f')} | "
                f"{med([r['ttft_p50_ms'] for r in rs], '.2f')} | {med([r['ttft_p99_ms'] for r in rs], '.1f')} | "
                f"{med([r['latency_p50_ms'] for r in rs], '.1f')} | {med([r['cpu_per_1k'] for r in rs], '.3f')} | "
                f"{med([r['client_cores'] for r in rs], '.2f')} | {med([r['in_flight'] for r in rs], '.1f')} | "
                f"{med([r['nginx_cores'] for r in rs], '.2f')} | {med([r['rps'] / wrk_med for r in rs], '.3f') if wrk_med else '-'} |"
            )
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_client":
        return client_main(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] != "0")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[8, 64, 256])
    ap.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    ap.add_argument("--duration", type=int, default=10, help="measured seconds per level (and per wrk run)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--wrk-threads", type=int, default=1)
    ap.add_argument("--json", metavar="FILE", help="also write every measurement here")
    ap.add_argument("--no-wrk", action="store_true", help="skip the wrk arm")
    ap.add_argument("--vllm", metavar="PATH", help="the vllm executable (default: $REALSERVER_DIR/V/bin/vllm when present)")
    ap.add_argument("--no-vllm", action="store_true", help="skip the vllm bench serve arm")
    ap.add_argument("--vllm-prompts", type=int, default=5000, help="vllm bench serve --num-prompts")
    ap.add_argument("--vllm-tokenizer", metavar="DIR", help="its tokenizer (default: $REALSERVER_DIR/tiny)")
    ap.add_argument("--self-check", action="store_true",
                    help="also run 1 worker with the client-health monitor off: its cost")
    args = ap.parse_args()
    if not (1 <= args.runs <= 10 and 1 <= args.duration <= 600 and all(1 <= c <= 4096 for c in args.concurrency)):
        raise SystemExit("--runs 1..10, --duration 1..600, --concurrency 1..4096")

    def on_signal(signum, frame):
        raise SystemExit(f"interrupted by {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, on_signal)
    nginx_bin, wrk = ensure_tools()
    loads = [os.getloadavg()]
    wrk_runs: dict[int, list[dict]] = {c: [] for c in args.concurrency}
    vllm = find_vllm(args)
    vllm_runs: dict[int, list[dict]] = {c: [] for c in args.concurrency}
    off_runs: dict[int, list[dict]] = {c: [] for c in args.concurrency}
    sk_runs: dict[tuple[int, int], list[dict]] = {(w, c): [] for w in args.workers for c in args.concurrency}
    with tempfile.TemporaryDirectory(prefix="soakspec-loadgen-") as tmp:
        workdir = Path(tmp)
        port = free_port()
        nginx = start_nginx(nginx_bin, workdir / "nginx", port)
        try:
            log(f"nginx pid {nginx.pid} on 127.0.0.1:{port}; {args.runs} rounds")
            for r in range(args.runs):
                for c in args.concurrency if not args.no_wrk else ():
                    res = run_wrk(args, wrk, port, nginx.pid, c, workdir)
                    wrk_runs[c].append(res)
                    log(f"round {r + 1}: wrk c={c}: {res['rps']:,.0f} req/s" + (f" ({res['errors']})" if res["errors"] else ""))
                for c in args.concurrency if vllm else ():
                    res = run_vllm_bench(args, vllm, port, nginx.pid, c, workdir)
                    vllm_runs[c].append(res)
                    log(f"round {r + 1}: vllm bench serve c={c}: {res['rps']:,.0f} req/s")
                if args.self_check:
                    for res in run_soakspec(args, port, nginx.pid, 1, workdir, r, self_check=False):
                        off_runs[res["c"]].append(res)
                        log(f"round {r + 1}: soakspec workers=1, self-check off, c={res['c']}: {res['rps']:,.0f} req/s")
                for workers in args.workers:
                    for res in run_soakspec(args, port, nginx.pid, workers, workdir, r):
                        sk_runs[(workers, res["c"])].append(res)
                        log(f"round {r + 1}: soakspec workers={workers} c={res['c']}: {res['rps']:,.0f} req/s, "
                            f"TTFT p50 {res['ttft_p50_ms']:.1f} ms, in flight {res['in_flight']}, failed {res['failed']}")  # fmt: skip
                loads.append(os.getloadavg())
        finally:
            stop_nginx(nginx)
            log("nginx stopped")
    uname = os.uname()
    print(f"soakspec load generator vs wrk, nginx canned {TOKENS}-token SSE completion, closed loop, "
          f"{args.warmup} s warmup + {args.duration} s per level, median of {args.runs} (min-max)")
    print(f"machine: {os.cpu_count()} CPUs, {uname.sysname} {uname.release}, Python {sys.version.split()[0]}; "
          f"load average (1 min) during the rounds: {', '.join(f'{x[0]:.2f}' for x in loads)}")
    print()
    print(table(args, wrk_runs, sk_runs))
    base_w = args.workers[0]
    for c in args.concurrency:
        if vllm_runs[c]:
            per = [a["rps"] / b["rps"] for a, b in zip(sk_runs[(base_w, c)], vllm_runs[c]) if b["rps"]]
            print(f"\nc={c}: vllm bench serve {med([r['rps'] for r in vllm_runs[c]], ',.0f')} req/s; soakspec {base_w} worker"
                  f"{'s' if base_w > 1 else ''} / vllm bench serve per round {', '.join(f'{x:.2f}x' for x in per)}"
                  + (f", median {statistics.median(per):.2f}x" if per else ""))  # fmt: skip
        if off_runs[c]:
            on = [r["rps"] for r in sk_runs[(1, c)]] if (1, c) in sk_runs else []
            cost = [1 - a / b for a, b in zip(on, (r["rps"] for r in off_runs[c])) if b]
            print(f"\nc={c}: self-check (client-health monitor) cost per round: {', '.join(f'{x * 100:+.1f} %' for x in cost)}"
                  f" of one worker's completed req/s (on {med(on, ',.0f')}, off {med([r['rps'] for r in off_runs[c]], ',.0f')})")
    if len(args.workers) > 1 and 256 in args.concurrency:
        base = statistics.median(r["rps"] for r in sk_runs[(args.workers[0], 256)])
        for w in args.workers[1:]:
            # also per round: both ran back to back, so a round's ratio does not see the machine's
            # speed drift between rounds (other work on a shared VM)
            rounds = [b["rps"] / a["rps"] for a, b in zip(sk_runs[(args.workers[0], 256)], sk_runs[(w, 256)])]
            print(f"\nc=256: {w} workers / {args.workers[0]} = {statistics.median(r['rps'] for r in sk_runs[(w, 256)]) / base:.2f}x"
                  f" (ratio of the medians); per round {', '.join(f'{x:.2f}x' for x in rounds)},"
                  f" median {statistics.median(rounds):.2f}x")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"wrk": wrk_runs, "soakspec": {f"{w}/{c}": v for (w, c), v in sk_runs.items()},
                                               "vllm_bench_serve": vllm_runs, "self_check_off": off_runs,
                                               "load": loads}, indent=1))  # fmt: skip
    failed = sum(r["failed"] for v in sk_runs.values() for r in v)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
