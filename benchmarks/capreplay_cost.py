"""What replaying a capped level's slot queue costs when a failing rule asks for it.

    python benchmarks/capreplay_cost.py [--requests N]

`judge/capreplay.py` replays a `max_concurrency` level's queue as an on-time load generator
would have driven it, only when a ttft or latency instance there fails (or an abort fired) and
the judge asks whether the client's lateness carried it. This builds one process's records of N
requests through a FIFO queue of 1 and of 4 slots (each request sent up to 50 ms late after its
slot, the slots nearly always full) and times `gains` on them, then measures its peak traced
allocation (tracemalloc, a separate call: tracing slows the heap path's Python floats). The
one-slot reference is the vectorised recursion; the 4-slot path is a heap walked a chunk at a
time. Memory is bytes a request; the result itself is 8.
"""

from __future__ import annotations

import argparse
import heapq
import time
import tracemalloc

import numpy as np

from soakspec.judge.capreplay import gains


def _queue(n: int, share: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Intended starts, starts and ends of `n` requests through a FIFO queue of `share` slots."""
    rng = np.random.default_rng(seed)
    intended = np.arange(n) * 0.5 / share
    service, late = rng.uniform(0.3, 0.52, n) * share, rng.uniform(0.0, 0.05, n)
    free = [-np.inf] * share
    start, end = np.empty(n), np.empty(n)
    for j, (i, s, lt) in enumerate(zip(intended.tolist(), service.tolist(), late.tolist())):
        start[j] = max(i, heapq.heappop(free)) + lt
        end[j] = start[j] + s
        heapq.heappush(free, end[j])
    return intended, start, end


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=1_000_000)
    n = p.parse_args().requests
    print(f"| slots | requests | time (s) | µs / request | peak traced (bytes / request) |\n| ---: | ---: | ---: | ---: | ---: |")
    for share in (1, 4):
        intended, start, end = _queue(n, share)
        worker, server_ended = np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool)
        t = time.perf_counter()
        gains(worker, intended, start, end, server_ended, share, 1)
        took = time.perf_counter() - t
        tracemalloc.start()
        gains(worker, intended, start, end, server_ended, share, 1)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(f"| {share} | {n:,} | {took:.2f} | {took / n * 1e6:.2f} | {peak / n:.1f} |")


if __name__ == "__main__":
    main()
