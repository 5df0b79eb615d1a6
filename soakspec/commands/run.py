"""`soakspec run SPEC`: launch the backends, drive the load, write evidence, judge it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from soakspec.diagnostics import render_text
from soakspec.exitcodes import ExitCode


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", metavar="SPEC", help="the .soak file")
    p.add_argument("--out", metavar="DIR", help="evidence directory (default: soak-evidence/<run id>); refused if it holds a run")
    p.add_argument("--backend", action="append", default=[], metavar="NAME", help="run only this backend (repeatable)")
    p.add_argument("--rehearse", action="store_true", help="replace every backend by the embedded simulator (no GPUs needed)")
    p.add_argument(
        "--time-scale", type=float, default=1.0, metavar="F",
        help="shrink every duration, bucket and deadline by F (0 < F <= 1); recorded, and a scaled run never passes a real gate",
    )  # fmt: skip
    p.add_argument(
        "--workers", type=int, default=1, metavar="N",
        help="load processes per level, splitting its concurrency or rate (default 1); records merge into one file",
    )  # fmt: skip
    p.add_argument(
        "--no-preflight", action="store_true",
        help="skip the pre-flight request of each workload's shape before the first level (recorded in the manifest)",
    )  # fmt: skip
    p.add_argument("--format", choices=("text", "json"), default="text", help="verdict format on stdout (reports: soakspec report DIR)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")


def main(args: argparse.Namespace) -> int:
    from soakspec.lang import load_spec
    from soakspec.plan import plan

    spec, diags, text = load_spec(args.spec)
    if diags:
        print(render_text(diags, {args.spec: text}), file=sys.stderr)
    if spec is None:
        return ExitCode.USAGE
    if not 0 < args.time_scale <= 1:
        print("soakspec run: error: --time-scale must be in (0, 1]", file=sys.stderr)
        return ExitCode.USAGE
    if args.workers < 1:
        print("soakspec run: error: --workers must be at least 1", file=sys.stderr)
        return ExitCode.USAGE
    names = {b.name for b in spec.backends}
    unknown = [n for n in args.backend if n not in names]
    if unknown:
        print(f"soakspec run: error: no backend named {', '.join(map(repr, unknown))} in {args.spec}", file=sys.stderr)
        return ExitCode.USAGE
    the_plan = plan(spec, time_scale=args.time_scale, rehearse=args.rehearse, only=tuple(args.backend))

    from soakspec.evidence.io import EvidenceError
    from soakspec.runner.engine import RunOptions, execute
    from soakspec.runner.progress import Progress

    progress = Progress(quiet=args.quiet, secrets=the_plan.spec_secrets)
    options = RunOptions(
        out_dir=Path(args.out) if args.out else None, quiet=args.quiet, argv=tuple(sys.argv), workers=args.workers,
        preflight=not args.no_preflight, sweep_judge=_sweep_judge(spec, args),
    )
    try:
        result = execute(the_plan, options, progress)
    except EvidenceError as e:
        print(f"soakspec run: error: {e}", file=sys.stderr)
        return ExitCode.ABORTED
    print(f"evidence: {result.run_dir}", file=sys.stderr)
    return _judge_and_report(spec, result, args.format)


def _sweep_judge(spec, args: argparse.Namespace):
    """A sweep's per-level predicate for the runner (None without a sweep): the gate's
    performance require rules judged on each probed level (`soakspec.judge.sweep`)."""
    from soakspec.judge.sweep import probe_judge, sweep_workload

    if sweep_workload(spec) is None:
        return None
    return probe_judge(spec, time_scale=args.time_scale, rehearsal=args.rehearse)


def _judge_and_report(spec, result, fmt: str) -> int:
    """Judge the evidence just written (the same code path as `soakspec gate`)."""
    try:
        from soakspec.judge.cli_support import judge_run_dir
    except ImportError:  # the judge is not available: the run itself is the result
        if result.status != "complete":
            print(f"soakspec run: run {result.status}: {result.reason}", file=sys.stderr)
            return ExitCode.ABORTED
        return ExitCode.INCONCLUSIVE
    code = judge_run_dir(result.run_dir, spec, fmt, write=True)
    if result.status == "aborted":
        print(f"soakspec run: run aborted: {result.reason}", file=sys.stderr)
        return ExitCode.ABORTED
    return code
