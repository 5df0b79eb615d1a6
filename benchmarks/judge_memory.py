"""How much memory the judge holds per request record once the evidence is loaded.

    python benchmarks/judge_memory.py                 # 50,000 records of 16 tokens
    python benchmarks/judge_memory.py --records 200000 --tokens 64

Writes synthetic records exactly as the runner does (`RequestRecord.to_line`) to a temporary
requests.jsonl, reads them back through the judge's reader (`soakspec.judge.evidence`: each
row into the backend's typed columns, `soakspec.judge.table`, then dropped), and reports the
bytes held per record (tracemalloc, which numpy reports to) and the process's peak RSS.
Nothing runs against a server; it stops by itself.
"""

from __future__ import annotations

import argparse
import gc
import random
import resource
import tempfile
import time
import tracemalloc
from pathlib import Path

from soakspec.judge import evidence
from soakspec.runner.records import Outcome, RequestRecord


def write(path: Path, n: int, tokens: int) -> None:
    rnd = random.Random(0)
    from soakspec.evidence.io import GzipJsonlWriter

    with GzipJsonlWriter(path) as f:
        for i in range(n):
            t = 1_764_500_000.0 + i * 0.01
            rec = RequestRecord(
                f"soak-1a2b3c4d-0-{i:07d}", backend="sim", workload="chat", level=0, concurrency=64,
                bucket=i // 5000, worker=i % 64, start=t, intended_start=t, first_byte=t + 0.05, first_token=t + 0.05,
                end=t + 0.05 + 0.04 * tokens, status=200, outcome=Outcome.COMPLETED, finish_reason="length",
                server_id=f"cmpl-{i:032x}", prompt_tokens=16, output_tokens=tokens, chunks=tokens, tpot=0.04,
                itl=[0.04 + rnd.random() * 1e-3 for _ in range(tokens - 1)], output_sha256="ab" * 32, output_chars=5 * tokens,
            )  # fmt: skip
            f.write_lines(rec.to_line())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--tokens", type=int, default=16)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "requests.jsonl.gz"
        write(path, args.records, args.tokens)
        size = path.stat().st_size
        gc.collect()
        tracemalloc.start()
        t0 = time.perf_counter()
        rows, _ = evidence._read_requests(path, "", [], [], {})
        seconds = time.perf_counter() - t0
        held, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    print(f"{len(rows):,} records of {args.tokens} tokens ({size / len(rows):,.0f} bytes a line on disk): "
          f"{held / len(rows):,.0f} bytes held a record, read in {seconds:.1f} s (traced); "
          f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
