"""How few bytes a soak_scale.py directory's request records could take: what they hold.

    python benchmarks/soak_scale.py --requests 100000 --spread --out /tmp/spread-1e5 --skip gate,verify,report --keep
    python benchmarks/record_bytes.py /tmp/spread-1e5

Issue 14 asks for at most 150 bytes of evidence a request at 64 output tokens. The fixed
profile meets it (128); `--spread` (a real server's lognormal gaps at microsecond resolution)
does not (319). This prints, for the first `--records` records of requests.jsonl.gz, the
bytes a request of the file as written (gzip of JSON lines), the same lines without their
per-token gaps and without their output hash, the gaps alone held as a column of uint32
microseconds compressed by zlib and by xz (the best a general-purpose codec does on them),
and the gaps' information content: the entropy of their microsecond values (the empirical
plug-in estimate over the sample, and the lognormal's own, from the sample's log mean and
spread). No encoding of the same microseconds can average fewer bytes than the entropy; the
output hash of a server whose outputs differ is 32 bytes of its own.
"""

from __future__ import annotations

import argparse
import gzip
import json
import lzma
import math
import zlib
from pathlib import Path

import numpy as np


def _gz(lines: list[dict]) -> int:
    z = zlib.compressobj(6, zlib.DEFLATED, 31)  # the runner's writer: gzip level 6
    data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in lines).encode()
    return len(z.compress(data) + z.flush())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--records", type=int, default=50_000)
    args = ap.parse_args()
    (path,) = args.run_dir.glob("backends/*/requests.jsonl.gz")
    with gzip.open(path, "rt") as fh:
        rows = [json.loads(line) for _, line in zip(range(args.records), fh)]
    n = len(rows)
    # format 3: the gaps are hex of little-endian uint32 microseconds (evidence/record.py)
    gaps = np.concatenate([np.frombuffer(bytes.fromhex(r["itl_us"]), "<u4") for r in rows if r.get("itl_us")])
    logs = np.log(gaps[gaps > 0].astype(np.float64))
    lognormal_bits = (logs.mean() + 0.5 * math.log(2 * math.pi * math.e * logs.var())) / math.log(2)
    _, counts = np.unique(gaps, return_counts=True)
    p = counts / counts.sum()
    plug_in_bits = float(-(p * np.log2(p)).sum())
    per = len(gaps) / n
    lines = [
        ("records as written (gzip of JSON lines)", _gz(rows) / n),
        ("  without itl_us", _gz([{k: v for k, v in r.items() if k != "itl_us"} for r in rows]) / n),
        ("  without output_sha256", _gz([{k: v for k, v in r.items() if k != "output_sha256"} for r in rows]) / n),
        ("gaps alone, a uint32 column, zlib -9", len(zlib.compress(gaps.tobytes(), 9)) / n),
        ("gaps alone, a uint32 column, xz -9e", len(lzma.compress(gaps.tobytes(), preset=9 | lzma.PRESET_EXTREME)) / n),
        (f"gaps' entropy, plug-in ({plug_in_bits:.2f} bits a gap, {per:.0f} gaps)", plug_in_bits * per / 8),
        (f"gaps' entropy, lognormal ({lognormal_bits:.2f} bits a gap, sigma {logs.std():.3f})", lognormal_bits * per / 8),
    ]
    print(f"{n:,} records of {path}")
    print("| what | bytes a request |\n| --- | ---: |")
    for what, b in lines:
        print(f"| {what} | {b:.1f} |")


if __name__ == "__main__":
    main()
