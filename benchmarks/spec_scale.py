"""Bounded work on any spec under the 1 MB limit: `check`, `fmt --check` and `plan`, each as a
separate process, on specs of just under 1 MB in the shapes that stress the parser, the
checker, the formatter and the planner (issue 15: <= 2 s and <= 200 MB each).

    python benchmarks/spec_scale.py                 # every shape, every command, 3 runs each
    python benchmarks/spec_scale.py --shapes workloads,errors --runs 1
    python benchmarks/spec_scale.py --write /tmp/specs   # only write the specs (for profiling)

Shapes (each just under MAX_SOURCE_BYTES):
  workloads  ~4,900 copied workloads (the realistic large spec): valid, check/plan succeed
  list       one backend whose `launch` is a single list of ~50,000 strings
  nested     workloads each holding an unknown block nested 14 deep (E100 per workload)
  comments   a small valid spec and ~1 MB of full-line and trailing comments
  errors     syntax errors on every line (E001/E003/E002: reported up to the cap, 50)
  tail-errors  ~950 kB of valid workloads, then 60 lines of syntax errors (E005/E002/E003)
  unknown    ~5,000 workloads each with a misspelt key (E101 + did-you-mean per workload)
  strings    a few long strings: a 900 kB description and long claims

Each command runs as `python -m soakspec CMD FILE` with the wall time measured around the
process and its peak RSS from `os.wait4` (that child alone). Prints a Markdown table with the
median wall time and the largest peak RSS of the runs, and the exit code.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LIMIT = 1_000_000
ROOT = Path(__file__).resolve().parents[1]

HEAD = """\
soak "spec-scale" {
  issue = "#15"
  description = "benchmarks/spec_scale.py"
}

backend "sim" {
  sim {
    ttft = 5ms
    itl = 1ms
  }
  runtime {
    label = "host-staged"
  }
}
"""

WORKLOAD = """
workload "w{i}" {{
  endpoint = completions
  stream = true
  prompt_words = {words}
  max_tokens = 64
  load {{
    mode = closed
    concurrency = [1]
  }}
  duration = 60s
  bucket = 60s
  deadline = 30s
}}
"""

TAIL = """
gate {
  require failed == 0
  require p95(ttft) < 2s per bucket
}

claims {
  claim "spec-scale benchmark"
}
"""


def _fill(head: str, tail: str, piece, budget: int = LIMIT - 2_000) -> str:
    """head + piece(0) + piece(1) + ... + tail, as many pieces as stay under `budget` bytes."""
    parts, size, i = [head], len(head) + len(tail), 0
    while True:
        p = piece(i)
        if size + len(p) > budget:
            break
        parts.append(p)
        size += len(p)
        i += 1
    parts.append(tail)
    return "".join(parts)


def shape_workloads() -> str:
    return _fill(HEAD, TAIL, lambda i: WORKLOAD.format(i=i, words=8 + i % 64))


def shape_list() -> str:
    head = HEAD.replace('    label = "host-staged"\n  }\n}\n', '    label = "host-staged"\n  }\n}\n\nbackend "big" {\n  launch = [\n')
    tail = '    "end",\n  ]\n}\n' + WORKLOAD.format(i=0, words=8) + TAIL
    return _fill(head, tail, lambda i: f'    "--flag-{i}",\n')


def shape_nested() -> str:
    depth = 14
    inner = "".join("  " * (d + 1) + f"x{d} {{\n" for d in range(depth)) + "  " * (depth + 1) + "k = 1\n"
    inner += "".join("  " * (d + 1) + "}\n" for d in reversed(range(depth)))
    return _fill(HEAD, TAIL, lambda i: WORKLOAD.format(i=i, words=8).replace("  deadline = 30s\n", "  deadline = 30s\n" + inner))


def shape_comments() -> str:
    base = HEAD + WORKLOAD.format(i=0, words=8) + TAIL
    lines = base.splitlines(keepends=True)
    out = []
    for ln in lines:
        out.append("# " + "c" * 70 + "\n")
        out.append(ln.rstrip("\n") + ("  # trailing\n" if ln.strip() and not ln.strip().startswith("}") else "\n"))
    body = "".join(out)
    return _fill("", body, lambda i: f"# comment {i}: " + "lorem ipsum " * 5 + "\n")


def shape_errors() -> str:
    bad = ["  key 5\n", "  x = @\n", '  s = "open\n', "  }\n", "  a = [1 2]\n", "  ? ? ?\n"]
    return _fill(HEAD + 'workload "w" {\n', "}\n" + TAIL, lambda i: bad[i % len(bad)])


def shape_tail_errors() -> str:
    """~950 kB of valid workloads, then a workload of 60 lines each with a quote inside a
    string, an unterminated string or a stray character: the recovery works near the end."""
    bad = ['  s = "say "hi" now"\n', '  t = "open\n', "  x = @\n"]
    body = _fill(HEAD, "", lambda i: WORKLOAD.format(i=i, words=8), budget=LIMIT - 60_000)
    return body + 'workload "z" {\n' + "".join(bad[i % 3] for i in range(60)) + "}\n" + TAIL


def shape_unknown() -> str:
    return _fill(HEAD, TAIL, lambda i: WORKLOAD.format(i=i, words=8).replace("max_tokens", "max_tokns"))


def shape_strings() -> str:
    desc = "lorem ipsum dolor " * 50_000
    head = HEAD.replace('  description = "benchmarks/spec_scale.py"', f'  description = "{desc}"')
    claims = "".join(f'  exclude """{"x" * 8000} {i}"""\n' for i in range(8))
    return head + WORKLOAD.format(i=0, words=8) + TAIL.replace('  claim "spec-scale benchmark"\n', '  claim "spec-scale benchmark"\n' + claims)


SHAPES = {
    "workloads": shape_workloads,
    "list": shape_list,
    "nested": shape_nested,
    "comments": shape_comments,
    "errors": shape_errors,
    "tail-errors": shape_tail_errors,
    "unknown": shape_unknown,
    "strings": shape_strings,
}
COMMANDS = {"check": ["check"], "fmt": ["fmt", "--check"], "plan": ["plan"]}


def run_once(cmd: list[str], path: Path) -> tuple[int, float, float, int]:
    """(exit code, wall seconds, peak RSS MiB, bytes printed) of one `python -m soakspec` process."""
    with tempfile.TemporaryFile() as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "soakspec", *cmd, str(path)], stdout=out, stderr=out, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        printed = out.tell()
    return proc.returncode, wall, usage.ru_maxrss / 1024, printed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--commands", default=",".join(COMMANDS))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--write", metavar="DIR", help="write the specs to DIR and exit")
    args = ap.parse_args()
    shapes = [s for s in args.shapes.split(",") if s]
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(args.write or tmp)
        d.mkdir(parents=True, exist_ok=True)
        paths = {}
        for s in shapes:
            text = SHAPES[s]()
            assert len(text.encode()) <= LIMIT, (s, len(text.encode()))
            paths[s] = d / f"{s}.soak"
            paths[s].write_text(text)
        if args.write:
            for s, p in paths.items():
                print(f"{p}  {p.stat().st_size:,} bytes")
            return
        print(f"{platform.node()} · {platform.processor() or platform.machine()} · {os.cpu_count()} CPUs · Python {platform.python_version()}")
        print(f"median of {args.runs} runs; peak RSS is the largest of the runs\n")
        print("| shape | bytes | command | exit | wall (s) | peak RSS (MiB) | printed (kB) |")
        print("|---|---:|---|---:|---:|---:|---:|")
        for s in shapes:
            for c in args.commands.split(","):
                runs = [run_once(COMMANDS[c], paths[s]) for _ in range(args.runs)]
                wall = statistics.median(r[1] for r in runs)
                rss = max(r[2] for r in runs)
                size = paths[s].stat().st_size
                print(f"| {s} | {size:,} | {c} | {runs[0][0]} | {wall:.2f} | {rss:.0f} | {runs[0][3] / 1000:,.1f} |", flush=True)


if __name__ == "__main__":
    main()
