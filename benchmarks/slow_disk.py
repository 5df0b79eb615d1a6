"""A disk slow to fsync, and what it does to the load generator's own health.

    python benchmarks/slow_disk.py [--spec specs/demo.soak] [--fsync-ms 80] --out DIR

Runs `soakspec run SPEC --out DIR` in this process with every `os.fsync` made `--fsync-ms`
slower (a network volume under write-back pressure takes tens of milliseconds; the simulator
backends are separate processes and do not fsync), then prints the verdict and, from
client.jsonl, the event loop's worst lag and how many stalls (> STALL_S) it recorded.

A run whose fsyncs sit on the event loop holds every send for as long as each takes, at every
bucket end and every telemetry sample, and the client-health rules then (rightly) refuse to
call the run a pass. To compare two versions, run this script from each one's checkout
(`PYTHONPATH=that/checkout python benchmarks/slow_disk.py ...`). benchmarks/README.md, "Slow
disk", has the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default="specs/demo.soak")
    ap.add_argument("--fsync-ms", type=float, default=80.0)
    ap.add_argument("--out", required=True, help="evidence directory (must not exist)")
    args = ap.parse_args()

    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        time.sleep(args.fsync_ms / 1000)
        real_fsync(fd)

    os.fsync = slow_fsync
    from soakspec.cli import main as soakspec

    rc = soakspec(["run", args.spec, "--out", args.out, "--quiet"])
    out = Path(args.out)
    if not (out / "verdict.json").exists():  # the run failed before judging: its own message said why
        print(f"fsync +{args.fsync_ms:g} ms: exit {rc}, no verdict written", file=sys.stderr)
        return rc or 4
    verdict = json.loads((out / "verdict.json").read_text())
    samples = [json.loads(line) for line in (out / "client.jsonl").read_text().splitlines() if line.strip()]
    worst = max((s["lag_max"] for s in samples), default=float("nan"))
    stalls = sum(len(s["stalls"]) for s in samples)
    print(f"fsync +{args.fsync_ms:g} ms: exit {rc}, verdict {verdict['verdict']}, {len(samples)} client windows, "
          f"worst loop lag {worst * 1000:.1f} ms, {stalls} stalls", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
