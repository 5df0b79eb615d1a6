"""What a bucket's end costs the load: its buckets.jsonl line's p50/p95 over every ITL gap.

    python benchmarks/bucket_close.py

For two buckets -- 6,000 requests of 256 tokens (100 req/s in a 60 s bucket) and 200,000 of
64 (the simulator at ~3,300 req/s) -- fills the runner's `BucketTally` with synthetic records
and makes the line's figures two ways, in the same process:

  reference  every gap sorted as Python numbers, then the ranks read (what the runner did
             before, on the event loop);
  runner     `BucketValues.figures` (two ranks selected by numpy over the compact array) the
             way the recorder calls it: `off_loop`, on a worker thread, while the event loop
             goes on.

For each it prints the wall time, the memory the computation allocated at its peak
(tracemalloc: Python objects and numpy buffers), and the event loop's longest stall while it
ran (a 1 ms ticker task). The figures of the two must be equal.
"""

from __future__ import annotations

import math
import random
import time
import tracemalloc

import trio

from soakspec.evidence.buckets import BucketTally
from soakspec.runner.recorder import off_loop


def _reference(tally_records: list[tuple[float, tuple[int, ...]]]) -> dict:
    def quantiles(xs: list[float]) -> dict:
        n = len(xs)
        q = lambda p: round(xs[min(n - 1, max(0, math.ceil(p * n) - 1))], 6)  # noqa: E731
        return {"n": n, "p50": q(0.5), "p95": q(0.95)}

    ttft = sorted(t for t, _ in tally_records)
    itl = [g / 1e6 for g in sorted(g for _, gaps in tally_records for g in gaps)]
    return {"ttft": quantiles(ttft), "itl": quantiles(itl)}


async def _timed(fn, on_loop: bool) -> tuple[object, float, float, int]:
    """(result, wall s, longest stall s, peak allocated bytes): timed without tracemalloc
    (it slows allocation-heavy code several-fold), then run again under it for the peak."""
    out, wall, stall = await _run(fn, on_loop)
    tracemalloc.start()
    await _run(fn, on_loop)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return out, wall, stall, peak


async def _run(fn, on_loop: bool) -> tuple[object, float, float]:
    stall = 0.0
    done = trio.Event()

    async def ticker() -> None:
        nonlocal stall
        last = time.perf_counter()
        while not done.is_set():
            await trio.sleep(0.001)
            now = time.perf_counter()
            stall = max(stall, now - last)
            last = now

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        await trio.sleep(0.01)
        t = time.perf_counter()
        out = fn() if on_loop else await off_loop(fn)
        wall = time.perf_counter() - t
        await trio.sleep(0.005)
        done.set()
    return out, wall, stall


async def main() -> None:
    print("| bucket | gaps | way | wall (ms) | peak allocated (MiB) | longest loop stall (ms) |")
    print("| --- | ---: | --- | ---: | ---: | ---: |")
    rnd = random.Random(0)
    for requests, tokens in ((6_000, 256), (200_000, 64)):
        base = tuple(rnd.randint(900, 1300) for _ in range(4096))
        recs = [(0.005 + rnd.random() * 0.01, base[k % 3000:k % 3000 + tokens - 1]) for k in range(requests)]
        tally = BucketTally()
        for ttft, gaps in recs:
            tally.add({"bucket": 0, "outcome": "completed", "output_tokens": tokens, "ttft": ttft, "itl_us": gaps})
        values = tally.take(0)
        label = f"{requests:,} x {tokens} tokens"
        ref, w1, s1, p1 = await _timed(lambda: _reference(recs), on_loop=True)
        got, w2, s2, p2 = await _timed(values.figures, on_loop=False)
        assert {k: got[k] for k in ("ttft", "itl")} == ref, (got, ref)  # type: ignore[index]
        gaps_n = requests * (tokens - 1)
        print(f"| {label} | {gaps_n:,} | reference (sorted, on the loop) | {w1 * 1e3:,.0f} | {p1 / 2**20:,.1f} | {s1 * 1e3:,.1f} |")
        print(f"| {label} | {gaps_n:,} | runner (selected, off the loop) | {w2 * 1e3:,.0f} | {p2 / 2**20:,.1f} | {s2 * 1e3:,.1f} |")


if __name__ == "__main__":
    trio.run(main)
