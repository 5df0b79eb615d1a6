"""`soakspec combine DIR... --out DIR`: one report across per-backend evidence directories.

Each child is verified (artifacts re-hashed) and re-judged with the spec embedded in it; nothing
a child says about itself (its verdict.json, results.json) is trusted. The combination checks
are in `soakspec.judge.combine`. Writes `<out>/combined.json` atomically (sorted keys) and
`<out>/combined.json.sha256` (`<sha256>  combined.json`), prints the report to stdout and exits
0 PASS, 1 FAIL, 3 INCONCLUSIVE, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from soakspec.exitcodes import ExitCode

COMBINED = "combined.json"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("dirs", nargs="+", metavar="DIR", help="evidence directories, one per backend run")
    p.add_argument("--out", required=True, metavar="DIR", help="where to write combined.json")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")


def main(args: argparse.Namespace) -> int:
    from soakspec.cli import UsageError
    from soakspec.commands.gate import load_for_judging
    from soakspec.evidence.io import EvidenceError, write_bytes_atomic, write_json_atomic
    from soakspec.judge.combine import Child, combine, render_text
    from soakspec.judge.judge import judge

    if len(set(args.dirs)) != len(args.dirs):
        raise UsageError("the same directory is given twice")
    out = Path(args.out)
    children = []
    for d in args.dirs:
        where = str(d).rstrip("/") or "/"
        loaded = load_for_judging("combine", d, None, name_dir=True)
        if isinstance(loaded, int):
            return loaded
        spec, evidence = loaded
        children.append(Child(where, spec, evidence, judge(spec, evidence)))
    result = combine(children)
    doc = result.to_json()
    try:
        out.mkdir(parents=True, exist_ok=True)
        sha = write_json_atomic(out / COMBINED, doc)
        write_bytes_atomic(out / (COMBINED + ".sha256"), f"{sha}  {COMBINED}\n".encode())
    except (OSError, EvidenceError) as e:
        print(f"soakspec combine: cannot write {out / COMBINED}: {e}", file=sys.stderr)
        return ExitCode.ABORTED
    if args.format == "json":
        print(json.dumps(dict(doc, combined_sha256=sha), indent=2, sort_keys=True, ensure_ascii=False))
    else:
        print(render_text(result))
        print(f"wrote {out / COMBINED} (sha256 {sha})", file=sys.stderr)
    return result.exit_code
