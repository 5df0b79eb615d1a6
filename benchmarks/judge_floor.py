"""The floor of judging a soak_scale.py directory on one core: what the C calls alone cost.

    python benchmarks/soak_scale.py --requests 1000000 --out /tmp/scale-1e6 --skip gate,verify,report --keep
    python benchmarks/judge_floor.py /tmp/scale-1e6

Two passes, each as `gate` makes it and no more, nothing kept: requests.jsonl.gz through
verification's own reader (`iter_record_batches`: inflate, sha256, one msgspec typed decode a
block, the cross-field check), and server.log.gz inflated with its simulator trace payloads
found and decoded a block at a time (msgspec, to dicts). The cyclic GC is paused, as the gate
pauses it while it reads. Everything else `gate` does per request (typed columns, the trace
times and the match, the rules) is Python on top of this, so this is what one core cannot go
below in the evidence's present format, and half of it what two processes cannot: compare it
with issue 14's 5 µs a request (benchmarks/README.md, "The floor of the present format").
"""

from __future__ import annotations

import argparse
import gc
import gzip
import hashlib
import re
import sys
import time
from pathlib import Path

import msgspec

from soakspec.evidence.record import iter_record_batches

_TRACE = re.compile(rb"soakspec_sim_trace (\{[^\n]*\})")  # soakspec.lang.simtrace's line


def requests_pass(path: Path) -> int:
    errors: list = []
    n = 0
    for _, recs in iter_record_batches(path, errors, hashlib.sha256()):
        n += len(recs)
    if errors:
        raise SystemExit(f"{path}: not a clean requests file ({errors[:3]})")
    return n


def traces_pass(path: Path) -> int:
    decoder = msgspec.json.Decoder()
    n, tail = 0, b""
    with gzip.open(path, "rb") as f:
        while block := f.read(1 << 22):
            block = tail + block
            cut = block.rfind(b"\n") + 1
            block, tail = block[:cut], block[cut:]
            if payloads := _TRACE.findall(block):
                n += len(decoder.decode(b"[" + b",".join(payloads) + b"]"))
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", type=Path, help="a directory soak_scale.py wrote (one backend, 'sim')")
    args = p.parse_args(argv)
    be = args.dir / "backends" / "sim"
    gc.disable()
    t = time.perf_counter()
    n = requests_pass(be / "requests.jsonl.gz")
    a = time.perf_counter() - t
    t = time.perf_counter()
    m = traces_pass(be / "server.log.gz")
    b = time.perf_counter() - t
    for what, s in (("requests.jsonl.gz: inflate, sha256, typed decode, checks", a),
                    ("server.log.gz: inflate, find and decode the trace payloads", b), ("both, one core", a + b)):
        print(f"{what:60s} {s:7.2f} s {s / n * 1e6:6.2f} µs a request")
    print(f"({n:,} requests, {m:,} trace payloads)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
