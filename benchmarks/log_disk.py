"""server.log on disk while a soak runs: is it bounded, or does it grow with the request count?

    python benchmarks/log_disk.py                   # 3 minutes (the default)
    python benchmarks/log_disk.py --minutes 1 --keep

Runs `python -m soakspec run` (from the current directory: run it from another checkout, or
with PYTHONPATH, to measure another version) on a generated spec: one simulated backend with
no token delay (TTFT 1 ms, ITL 0, 4 tokens), closed loop at concurrency 32, buckets of 10 s --
a fast soak whose server.log is mostly the simulator's trace lines (~475 bytes a request, one
per request). Every second it reads, from outside, the disk blocks allocated (`st_blocks`, not
the apparent size: a punched-out range takes none) to the backend's server.log, to the moved
part (server.log.moved.gz) and to the whole evidence directory, and prints the peaks during
the run, the bytes on disk a request at the peak and at the end, and the run's request count.
Exit 0 when the run completed and the evidence verifies (`soakspec verify`), 1 otherwise. The
run is bounded by its level (`--minutes`) plus the deadline; the script interrupts it after
twice that.
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
from pathlib import Path

SPEC = """\
soak "log-disk" {{
  issue = "#14"
}}

backend "sim" {{
  sim {{
    slots = 64
    ttft = 1ms
    itl = 0ms
  }}
  runtime {{
    label = "host-staged"
  }}
}}

workload "fast" {{
  prompt_words = 8
  max_tokens = 4
  load {{
    mode = closed
    concurrency = [32]
  }}
  duration = {duration}s
  bucket = 10s
  deadline = 5s
  follow_up = false
}}

gate {{
  # the load generator runs flat out on purpose (server.log's growth is what is measured), so
  # its health is not judged: saturated on a 2-core machine it made the run INCONCLUSIVE
  client_healthy = false
  require completed_run
  require trace_coverage >= 100%
}}

claims {{
  claim "server.log stays bounded on disk while the soak runs"
}}
"""


def allocated(path: Path) -> int:
    try:
        return os.stat(path).st_blocks * 512
    except FileNotFoundError:
        return 0


def tree_allocated(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            total += allocated(Path(dirpath) / f)
    return total


def requests_in(out: Path) -> int:
    m = json.loads((out / "manifest.json").read_text())
    return sum(lv.get("sent") or 0 for be in m.get("backends", []) for lv in be.get("levels", []))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--keep", action="store_true", help="keep the evidence directory (printed)")
    args = ap.parse_args()
    seconds = max(10, int(args.minutes * 60))
    work = Path(tempfile.mkdtemp(prefix="log-disk-"))
    spec = work / "log-disk.soak"
    spec.write_text(SPEC.format(duration=seconds))
    out = work / "ev"
    backend = out / "backends" / "sim"
    cmd = [sys.executable, "-m", "soakspec", "run", str(spec), "--out", str(out), "--quiet"]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    peak_log = peak_moved = peak_dir = 0
    peak_at = 0.0
    try:
        while proc.poll() is None:
            if time.monotonic() - started > 2 * (seconds + 60):
                os.killpg(proc.pid, signal.SIGINT)
                proc.wait(60)
                print("interrupted: the run outlived twice its length", file=sys.stderr)
                return 1
            log, moved, whole = allocated(backend / "server.log"), allocated(backend / "server.log.moved.gz"), tree_allocated(out)
            peak_moved = max(peak_moved, moved)
            if log > peak_log:
                peak_log, peak_at = log, time.monotonic() - started
            peak_dir = max(peak_dir, whole)
            time.sleep(1.0)
        err = proc.stderr.read() if proc.stderr else ""
        n = requests_in(out)
        end_dir = tree_allocated(out)
        verify = subprocess.run([sys.executable, "-m", "soakspec", "verify", str(out)], capture_output=True, text=True)
        manifest = json.loads((out / "manifest.json").read_text())
        entry = manifest["backends"][0]
        mib = 1 << 20
        print(f"# log_disk.py, {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
              f"{os.cpu_count()} CPUs, Python {platform.python_version()}, {seconds} s level")
        print(f"run exit {proc.returncode}; verify exit {verify.returncode}; requests {n:,}")
        print(f"server.log on disk, peak during the run: {peak_log / mib:.1f} MiB (at {peak_at:.0f} s)")
        print(f"server.log.moved.gz, peak: {peak_moved / mib:.1f} MiB")
        print(f"evidence directory on disk, peak during the run: {peak_dir / mib:.1f} MiB "
              f"({peak_dir / max(n, 1):.0f} bytes a request of the whole run)")
        print(f"evidence directory on disk at the end: {end_dir / mib:.1f} MiB ({end_dir / max(n, 1):.0f} bytes a request)")
        print(f"server_log_cut: {json.dumps(entry.get('server_log_cut'))}")
        print(f"server_log_moved: {json.dumps(entry.get('server_log_moved'))}")
        if proc.returncode != 0:
            print(err[-2000:], file=sys.stderr)
        ok = proc.returncode == 0 and verify.returncode == 0
        return 0 if ok else 1
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        if args.keep:
            print(f"evidence: {out}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
