"""Self-soak: the runner against the simulator at concurrency 64 with faults on, for a long time.

    python benchmarks/self_soak.py                 # 30 minutes (the default)
    python benchmarks/self_soak.py --minutes 3     # a quick check

Runs `python -m soakspec run` on a generated spec: one simulated backend (64 slots, TTFT 50 ms,
ITL 40 ms, 16 tokens) with 1% in-stream errors, 1% disconnects and 1% stalls, closed loop at
concurrency 64, one level of `--minutes`, a short deadline (3 s) so that stalls end as timeouts.
While it runs, the runner's RSS (VmRSS in /proc/<pid>/status) and its open file descriptors
(/proc/<pid>/fd) are sampled every `--sample-every` seconds; the table shows them at the start,
middle and end of the load, and the peak after the load (evidence collection and judging).

Afterwards it checks exact accounting: for every bucket, sent (records started in the bucket)
= completed + failed + timeouts + rejected + disconnected, every record has one of those
outcomes, and the sum over all buckets (warmup included) equals the level's `sent` in the
manifest. Exit status 0 when the accounting is exact, no process outlived the run and the run
completed; 1 otherwise. It stops by itself: the runner is bounded by the level's duration plus
the deadline; this script kills it (and reports a failure) after twice that.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path

from soakspec.evidence.record import iter_records

OUTCOMES = ("completed", "failed", "timeout", "rejected", "disconnected")
MARKER_VAR = "SOAKSPEC_SELF_SOAK_MARKER"

SPEC = """\
soak "self-soak" {{
  issue = "#9"
  description = "The runner against the simulator at concurrency {c} with faults on."
}}

backend "sim" {{
  sim {{
    slots = {c}
    ttft = 50ms
    itl = 40ms
    stream_error_rate = 1%
    disconnect_rate = 1%
    stall_rate = 1%
  }}
  runtime {{
    label = "host-staged"
  }}
}}

workload "short" {{
  prompt_words = 16
  max_tokens = 16
  load {{
    mode = closed
    concurrency = [{c}]
  }}
  duration = {duration}s
  bucket = {bucket}s
  deadline = 3s
  follow_up = false
}}

gate {{
  require completed_run
}}

claims {{
  claim "self-soak of the runner"
}}
"""


def proc_sample(pid: int) -> tuple[int, int, int] | None:
    """(VmRSS in KiB, open fds, VmHWM in KiB: the peak RSS so far) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            got = {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in fh) if k in ("VmRSS", "VmHWM")}
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, ValueError):
        return None
    if len(got) != 2:
        return None
    return got["VmRSS"], fds, got["VmHWM"]


def survivors(marker: str) -> list[int]:
    needle = f"{MARKER_VAR}={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    with open(f"/proc/{entry}/stat", "rb") as st:
                        if st.read().rsplit(b")", 1)[1].split()[0] != b"Z":
                            found.append(int(entry))
        except OSError:
            continue
    return found


def account(run_dir: Path) -> tuple[dict[int, Counter], int, dict]:
    """Per-bucket outcome counts (streamed, one record at a time) and the manifest's level sent."""
    m = json.loads((run_dir / "manifest.json").read_text())
    backend = m["backends"][0]
    per_bucket: dict[int, Counter] = defaultdict(Counter)
    for _, r in iter_records(run_dir / "backends" / backend["safe_name"] / "requests.jsonl.gz"):
        per_bucket[r.bucket][str(r.outcome)] += 1
    sent = sum(level["sent"] for level in backend["levels"])
    return dict(sorted(per_bucket.items())), sent, m


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30.0, help="length of the load (default 30)")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--sample-every", type=float, default=10.0, metavar="S", help="RSS/fd sampling interval (s)")
    p.add_argument("--out", metavar="DIR", help="evidence directory (default: a temporary one, removed unless --keep)")
    p.add_argument("--keep", action="store_true", help="keep the evidence directory")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="self-soak-"))
    try:
        return soak(args, tmp)
    finally:  # every way out, an early one or an exception too
        if not args.keep:  # with --out it holds only the generated spec (the evidence embeds it)
            shutil.rmtree(tmp, ignore_errors=True)


def soak(args: argparse.Namespace, tmp: Path) -> int:
    """The run, its samples and its tables; `tmp` holds the spec (and the evidence without --out)."""
    duration = max(10, round(args.minutes * 60))
    bucket = 60 if duration >= 600 else max(5, duration // 6)
    duration -= duration % bucket
    run_dir = Path(args.out) if args.out else tmp / "ev"
    spec = tmp / "self_soak.soak"
    spec.write_text(SPEC.format(c=args.concurrency, duration=duration, bucket=bucket))
    marker = uuid.uuid4().hex
    env = dict(os.environ, **{MARKER_VAR: marker})
    cmd = [sys.executable, "-m", "soakspec", "run", str(spec), "--out", str(run_dir), "--quiet"]
    print(f"self-soak: {duration}s at concurrency {args.concurrency}, buckets of {bucket}s; evidence in {run_dir}", flush=True)
    started = dt.datetime.now(dt.timezone.utc)
    runner = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    requests = run_dir / "backends" / "sim" / "requests.jsonl.gz"
    hard_stop = time.monotonic() + 2 * (duration + 60)
    while not (requests.exists() and requests.stat().st_size > 0):
        if runner.poll() is not None or time.monotonic() > hard_stop:
            if runner.poll() is None:  # no load after twice the run's length: it is not left writing into tmp
                runner.kill()
            print("the runner ended before the load started:", runner.communicate(), file=sys.stderr)
            return 1
        time.sleep(0.1)
    t_load = time.monotonic()
    samples: list[tuple[float, int, int, int]] = []  # (seconds into the load, rss KiB, fds, peak rss KiB so far)
    after: list[tuple[float, int, int, int]] = []  # the same, after the load (evidence collection, judging)
    next_sample = t_load
    killed = False
    while runner.poll() is None:
        now = time.monotonic()
        if now > hard_stop:
            runner.send_signal(signal.SIGINT)
            killed = True
            break
        if now >= next_sample:
            s = proc_sample(runner.pid)
            if s is not None:
                (samples if now - t_load < duration else after).append((now - t_load, *s))
            # during the load every --sample-every seconds; from its last seconds on, at every turn (0.05 s)
            next_sample += args.sample_every if now - t_load < duration - args.sample_every else 0.0
        time.sleep(0.05)
    out, err = runner.communicate(timeout=120)
    left = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (left := survivors(marker)):
        time.sleep(0.2)

    per_bucket, sent, m = account(run_dir)
    ok = True
    print()
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, Linux {platform.release()}, Python {platform.python_version()}")
    print(f"started {started:%Y-%m-%d %H:%M} UTC; runner exit {runner.returncode}; manifest status {m['status']}")
    print()
    print("| bucket | sent | completed | failed | timeout | rejected | disconnected | exact |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: |")
    totals: Counter = Counter()
    for b, c in per_bucket.items():
        n = sum(c.values())
        exact = sum(c[o] for o in OUTCOMES) == n
        ok &= exact
        totals.update(c)
        label = "warmup" if b == -1 else str(b)
        print(f"| {label} | {n} | " + " | ".join(str(c[o]) for o in OUTCOMES) + f" | {'yes' if exact else 'NO'} |")
    n = sum(totals.values())
    exact = n == sent and sum(totals[o] for o in OUTCOMES) == n
    ok &= exact
    print(f"| **total** | **{n}** | " + " | ".join(f"**{totals[o]}**" for o in OUTCOMES) + f" | {'yes' if exact else 'NO'} |")
    print(f"\nmanifest level sent = {sent}; records = {n}: {'equal' if sent == n else 'MISMATCH'}")

    def pick(frac: float) -> tuple[float, int, int]:
        return min(samples, key=lambda s: abs(s[0] - frac * duration))

    print()
    print("| runner | t (s) | RSS (MiB) | open fds |")
    print("| --- | ---: | ---: | ---: |")
    for name, s in (("start", samples[0]), ("middle", pick(0.5)), ("end", samples[-1])):
        print(f"| {name} | {s[0]:.0f} | {s[1] / 1024:.1f} | {s[2]} |")
    rss = [s[1] for s in samples]
    fds = [s[2] for s in samples]
    print(f"| min/max during load | | {min(rss) / 1024:.1f} / {max(rss) / 1024:.1f} | {min(fds)} / {max(fds)} |")
    if after:
        # The kernel's high-water mark (VmHWM) read at the last sample after the load: when it rose
        # above the mark at the load's last sample, the after-load peak is that mark exactly (not
        # a sample that could miss a short peak); otherwise the highest sample after the load.
        hwm_load, hwm_end = samples[-1][3], after[-1][3]
        peak = hwm_end if hwm_end > hwm_load else max(s[1] for s in after)
        how = "VmHWM" if hwm_end > hwm_load else "sampled"
        print(f"| peak after the load (collection, judging; {how}) | | {peak / 1024:.1f} | {max(s[2] for s in after)} |")
    print(f"\n{len(samples)} samples; requests/s {n / duration:.0f}")
    if m["status"] != "complete" or killed:
        print(f"the run did not complete: {m.get('incomplete_reason')}; stderr tail:\n{err[-2000:]}")
        ok = False
    if left:
        print(f"processes left behind: {left}")
        ok = False
    print("\nresult:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
