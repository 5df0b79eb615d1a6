"""`soakspec report DIR --format md|html|json|junit|bench [--spec FILE] [--out FILE] [--percentiles 50,90,99]`

Loads the evidence directory, verifying it first (every artifact re-hashed against the
manifest), re-judges it with the spec embedded in the manifest -- or with `--spec FILE` -- and
renders the report (`soakspec.report.render`). A stored verdict.json or results.json is never
read: the report says what the evidence says now. A run whose manifest was never finalized
(still going, or killed) is read as `gate --partial` reads it: what it recorded up to its last
closed bucket, INCONCLUSIVE, with a note saying how far.

The report goes to stdout, or to `--out FILE` (written atomically; nothing on stdout). Notes
(a different spec) go to stderr. Exit code: 0 when the report was rendered, whatever the
verdict it shows (so `set -e` publishing of a FAIL report works; the verdict's exit code stays
with `soakspec gate` and `soakspec run`); 2 for a usage error (no evidence directory, a spec
that does not check, an `--out` that is a directory, in no directory or inside the evidence
directory, a `--percentiles` list that is not percentiles results.json stores); 3 when the evidence cannot be read at all; 4 when `--out` cannot be written.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from soakspec.commands.outpath import out_file
from soakspec.commands.percentiles import PERCENTILES_HELP, percentiles_arg
from soakspec.exitcodes import ExitCode
from soakspec.report import FORMATS


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", metavar="DIR", help="an evidence directory (the run's output)")
    p.add_argument("--format", choices=FORMATS, default="md",
                   help="md: PR-ready section; html: self-contained page with charts; json; junit; "
                        "bench: each level as vLLM bench serve's result block (default: md)")
    p.add_argument("--spec", metavar="FILE", help="judge with this spec instead of the one embedded in the evidence")
    p.add_argument("--out", metavar="FILE", type=out_file,
                   help="write the report to FILE (atomically) instead of stdout (-: stdout)")
    p.add_argument("--percentiles", metavar="LIST", type=percentiles_arg, default=None,
                   help=PERCENTILES_HELP + "; md, html and bench (json carries every stored figure)")


def _printable(text: str) -> str:
    """Text any UTF-8 stream can take (a lone surrogate from the evidence becomes \\udcxx)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _partial(args: argparse.Namespace):
    """A run whose manifest was never finalized (still going, or killed: its manifest lists no
    backend) read as `gate --partial` reads it -- (spec, evidence, note) -- so that the report
    shows what was recorded, up to the last closed bucket, and says the run is incomplete;
    None for a finished run; an exit code when the manifest cannot be read."""
    from soakspec.commands.gate import load_partial, unfinished
    from soakspec.evidence import layout
    from soakspec.evidence.io import EvidenceError, read_json, require_evidence_dir

    root = require_evidence_dir(args.dir)
    try:
        manifest = read_json(root / layout.MANIFEST)
    except EvidenceError as e:
        print(f"soakspec report: {e}: the evidence cannot be judged", file=sys.stderr)
        return ExitCode.INCONCLUSIVE
    if not unfinished(manifest):
        return None
    where = str(args.dir).rstrip("/") or "/"
    try:
        return load_partial("report", root, args.spec, where)
    except EvidenceError as e:
        print(f"soakspec report: {e}: the evidence cannot be judged", file=sys.stderr)
        return ExitCode.INCONCLUSIVE


def main(args: argparse.Namespace) -> int:
    from soakspec.commands.gate import load_for_judging, with_retained_notes
    from soakspec.commands.outpath import check_out_file, write_out_file
    from soakspec.evidence.io import EvidenceError
    from soakspec.report import prepare

    if args.out is not None:
        check_out_file(args.out, [args.dir])
    partial = _partial(args)
    if isinstance(partial, int):
        return partial
    if partial is not None:  # a run still going, or killed: what it recorded, up to its last closed bucket
        spec, evidence, note = partial
    else:
        loaded = load_for_judging("report", args.dir, args.spec)
        if isinstance(loaded, int):
            return loaded
        spec, evidence = loaded
    inputs = prepare(spec, evidence)
    verdict = inputs.verdict
    if partial is not None:
        verdict = dataclasses.replace(verdict, outcome="INCONCLUSIVE", notes=verdict.notes + (note,))
    # what `gate` says of retained evidence (its stored verdict, its signature), the report says too
    inputs = dataclasses.replace(inputs, verdict=with_retained_notes(verdict, evidence, args.dir))
    text = _printable(inputs.render(args.format, args.percentiles))
    if args.out is not None:
        try:
            write_out_file(args.out, text.encode("utf-8"))
        except EvidenceError as e:
            print(f"soakspec report: cannot write {args.out}: {e}", file=sys.stderr)
            return ExitCode.ABORTED
        print(f"soakspec report: wrote {args.out} ({inputs.verdict.outcome})", file=sys.stderr)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    return ExitCode.OK  # rendered; the verdict's code is `gate`'s
