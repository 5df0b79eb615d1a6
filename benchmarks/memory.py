"""Long-run memory of the load process: its RSS after 10k, 100k and 500k requests against nginx.

The load process is `soakspec run`'s engine (`engine.execute()`, as in `loadgen/run.py`): one
`url` backend (nginx serving the canned 64-token stream, see `loadgen/fixture.py`), closed loop
at `--concurrency` (64) for a level long enough for every checkpoint, writing requests.jsonl as
any run does. This script watches it from outside: it counts the records as they are appended
and reads the process's VmRSS from /proc when the count passes each checkpoint. After the last
one (or `--max-seconds`) the load process is killed -- what it would do after the level (read
its whole requests.jsonl back for trace matching) is not the load path -- and nginx is stopped.

    python benchmarks/memory.py                                  # 10k, 100k, 500k (about 6 min)
    python benchmarks/memory.py --checkpoints 10000,50000        # a quick look
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "loadgen"))
from fixture import ensure_tools, free_port, log, nginx_spec, rss_kib, start_nginx, stop_nginx  # noqa: E402

class GzipLines:
    """Counts the lines of a growing gzip stream of members (requests.jsonl.gz) from the bytes
    appended since the last call, decompressing each byte once."""

    def __init__(self) -> None:
        self._d = zlib.decompressobj(31)
        self.count = 0

    def feed(self, data: bytes) -> int:
        while data:
            self.count += self._d.decompress(data).count(b"\n")
            if not self._d.eof:
                break
            data, self._d = self._d.unused_data, zlib.decompressobj(31)
        return self.count


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoints", type=lambda s: [int(x) for x in s.split(",")], default=[10_000, 100_000, 500_000])
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--max-seconds", type=int, default=1800, help="stop even if the last checkpoint is not reached")
    args = ap.parse_args()
    if not (1 <= args.max_seconds <= 7200 and all(0 < c <= 10_000_000 for c in args.checkpoints)):
        raise SystemExit("--max-seconds 1..7200, checkpoints 1..10,000,000")

    def on_signal(signum, frame):
        raise SystemExit(f"interrupted by {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, on_signal)
    nginx_bin, _ = ensure_tools()
    checkpoints = sorted(args.checkpoints)
    readings: list[tuple[int, float, int]] = []  # (records, seconds since the first, RSS KiB)
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="soakspec-memory-") as tmp:
        work = Path(tmp)
        port = free_port()
        nginx = start_nginx(nginx_bin, work / "nginx", port)
        client = None
        try:
            duration = max(60, args.max_seconds)
            spec = work / "memory.soak"
            spec.write_text(nginx_spec("memory-benchmark", "memory benchmark", port, args.concurrency, duration, 60))
            out = work / "ev"
            client = subprocess.Popen([sys.executable, str(HERE / "loadgen" / "run.py"), "_client", str(spec), str(out), "1", "1"],  # one worker, self-check on
                                      stdout=subprocess.DEVNULL)  # fmt: skip
            requests = out / "backends" / "nginx" / "requests.jsonl.gz"
            lines = GzipLines()
            count, offset, t_first = 0, 0, None
            deadline = time.monotonic() + args.max_seconds + 60
            todo = list(checkpoints)
            while todo and time.monotonic() < deadline:
                if client.poll() is not None:
                    raise SystemExit(f"the load process exited early (exit {client.returncode})")
                time.sleep(0.1)
                if not requests.exists():
                    continue
                with open(requests, "rb") as f:  # count the new whole lines
                    f.seek(offset)
                    chunk = f.read()
                offset += len(chunk)
                count = lines.feed(chunk)
                if count and t_first is None:
                    t_first = time.monotonic()
                    readings.append((count, 0.0, rss_kib(client.pid)))
                while todo and count >= todo[0]:
                    todo.pop(0)
                    readings.append((count, time.monotonic() - t_first, rss_kib(client.pid)))
                    log(f"{count:,} requests: RSS {readings[-1][2]:,} KiB")
            load.append(os.getloadavg()[0])
        finally:
            if client is not None and client.poll() is None:
                client.kill()  # the load path is measured; the end-of-run evidence pass is not
                client.wait()
            stop_nginx(nginx)
    print(f"RSS of the load process (soakspec engine, closed loop c={args.concurrency}, nginx canned 64-token stream); "
          f"load average {', '.join(f'{x:.2f}' for x in load)}")
    print()
    print("| requests | seconds | RSS (KiB) | RSS (MiB) |")
    print("| ---: | ---: | ---: | ---: |")
    for n, t, rss in readings:
        print(f"| {n:,} | {t:.0f} | {rss:,} | {rss / 1024:.1f} |")
    marks = readings[1:]
    if len(marks) >= 2:
        print(f"\ngrowth from {marks[0][0]:,} to {marks[-1][0]:,} requests: {marks[-1][2] - marks[0][2]:+,} KiB "
              f"({(marks[-1][2] - marks[0][2]) / 1024:+.2f} MiB)")
    return 0 if len(readings) == len(checkpoints) + 1 else 1


if __name__ == "__main__":
    sys.exit(main())
