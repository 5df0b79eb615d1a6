"""`soakspec run SPEC`: launch the backends, drive the load, write evidence, judge it.

stdout: the verdict's rule lines, then the end-of-run summary (`soakspec.report.runsummary`: a
per-level table of rates, percentiles and outcome counts, read from results.json's document)
and the `soakspec report DIR --format html` line; with `--format json`, one JSON document (the
verdict, plus `run_summary` with the same table). stderr: progress, the spec's warnings, the
evidence directory, errors. `--quiet` keeps stdout as it is and leaves on stderr only errors
(no progress, no warnings, no `evidence: DIR` line; the summary's last line names the directory).

Exit codes: the verdict's (0 PASS, 1 FAIL, 3 INCONCLUSIVE); 2 when nothing ran (a spec that does
not check, a bad option, `--out` onto a directory that already holds a run or is in use, a
`--sign` key that is not there or cannot sign: a test signature is made first); 4 when the run aborted or its evidence could not be written,
or the manifest could not be signed.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

from soakspec.diagnostics import render_text
from soakspec.commands.percentiles import PERCENTILES_HELP, percentiles_arg
from soakspec.exitcodes import ExitCode


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", metavar="SPEC", help="the .soak file")
    p.add_argument("--out", metavar="DIR", help="evidence directory (default: soak-evidence/<run id>); one that holds a run is refused (exit 2)")
    p.add_argument("--backend", action="append", default=[], metavar="NAME", help="run only this backend (repeatable)")
    p.add_argument("--rehearse", action="store_true", help="replace every backend by the embedded simulator (no GPUs needed)")
    p.add_argument(
        "--time-scale", type=float, default=1.0, metavar="F",
        help="shrink every duration, bucket and deadline by F (0 < F <= 1); recorded, and a scaled run never passes a real gate",
    )  # fmt: skip
    p.add_argument(
        "--workers", type=int, default=1, metavar="N",
        help="load processes per level, splitting its concurrency or rate (default 1; a batch level runs in one, "
             "its barrier spans the batch); records merge into one file",
    )  # fmt: skip
    p.add_argument(
        "--no-preflight", action="store_true",
        help="skip the pre-flight request of each workload's shape before the first level (recorded in the manifest)",
    )  # fmt: skip
    p.add_argument("--format", choices=("text", "json"), default="text", help="the verdict and the per-level summary on stdout (reports: soakspec report DIR)")
    p.add_argument("--percentiles", metavar="LIST", type=percentiles_arg, default=None,
                   help=PERCENTILES_HELP + "; the text summary (json's run_summary carries every stored figure)")
    p.add_argument("--quiet", "-q", action="store_true",
                   help="stdout unchanged (verdict, summary); stderr: errors only (no progress, warnings or notes)")
    p.add_argument(
        "--sign", metavar="KEY",
        help="sign manifest.json with this SSH private key (ssh-keygen -Y sign, namespace soakspec) into manifest.json.sig",
    )  # fmt: skip


def main(args: argparse.Namespace) -> int:
    from soakspec.lang import load_spec
    from soakspec.plan import plan

    from soakspec.diagnostics import has_errors

    spec, diags, text = load_spec(args.spec)
    if diags and (not args.quiet or has_errors(diags) or spec is None):
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
    if args.sign is not None:
        from soakspec.evidence.signing import SigningError, check_signing_key

        try:
            check_signing_key(args.sign)
        except SigningError as e:
            print(f"soakspec run: error: --sign {args.sign}: {e}", file=sys.stderr)
            return ExitCode.USAGE
    the_plan = plan(spec, time_scale=args.time_scale, rehearse=args.rehearse, only=tuple(args.backend))
    _warn_capped_workers(the_plan, args.workers)

    from soakspec.evidence.io import EvidenceError, EvidenceInUseError
    from soakspec.runner.engine import RunOptions, execute
    from soakspec.runner.progress import Progress

    progress = Progress(quiet=args.quiet, secrets=the_plan.spec_secrets)
    options = RunOptions(
        out_dir=Path(args.out) if args.out else None, quiet=args.quiet, argv=tuple(sys.argv), workers=args.workers,
        preflight=not args.no_preflight, sweep_judge=_sweep_judge(spec, args),
    )
    stop = _Stop()
    # SIGINT too: with Python's default handler (which trio's own replaces during the run), a
    # Ctrl-C held down past the run's own watch (engine._signals) was a KeyboardInterrupt as the
    # watch closed (`soakspec run: interrupted`, the evidence's directory unsaid) or, later, a
    # death by SIGINT (exit 130, not 4) while soakspec said where the evidence is or exited
    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        try:
            result = execute(the_plan, options, progress)
        except EvidenceInUseError as e:  # taken before anything ran: --out names another run's directory
            print(f"soakspec run: error: {e}", file=sys.stderr)
            return ExitCode.USAGE
        except EvidenceError as e:
            print(f"soakspec run: error: {e}", file=sys.stderr)
            return ExitCode.ABORTED
        if not args.quiet:
            print(f"evidence: {result.run_dir}", file=sys.stderr)
        left, unjudged = _left(result.run_dir, result.status, judged=True), _left(result.run_dir, result.status, judged=False)
        if result.late_signal is not None:  # one came after the load, as the evidence was finished (engine._signals)
            print(f"soakspec run: {result.late_signal} after the load ended: not judged; {unjudged}", file=sys.stderr)
            return ExitCode.ABORTED
        if stop.signal is not None:  # one came as the run ended, after its own watch (engine._signals)
            print(f"soakspec run: {stop.signal} as the run ended: not judged; {unjudged}", file=sys.stderr)
            return ExitCode.ABORTED
        stop.raising = True
        try:
            signed = _sign(result.run_dir, args.sign, args.quiet) if args.sign is not None else True
            code = _judge_and_report(spec, result, args.format, args.percentiles)
        except (KeyboardInterrupt, _Stopped):  # the evidence is final; only its judging was cut short
            stop.raising = False  # more of them (Ctrl-C held down) are noted, not raised, from here
            print(f"soakspec run: interrupted while judging; {left}", file=sys.stderr)
            return ExitCode.ABORTED
        stop.raising = False
        return code if signed else ExitCode.ABORTED
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


class _Stopped(BaseException):
    """A SIGTERM or SIGHUP while judging (`_Stop`): not KeyboardInterrupt, whose uncaught
    escape Python turns into an exit by SIGINT (CI once saw exit -2 after it was handled)."""


class _Stop:
    """SIGINT, SIGTERM and SIGHUP outside the run's own watch (`engine._signals`, which takes them over
    while it runs): as the run ends, noted (raising there would break trio's shutdown), and
    judging is then skipped; while judging, they stop it as Ctrl-C does (`_Stopped`).
    Either way soakspec says what is left and exits 4, where the default action killed it
    with no word (exit 143; an audit saw it 3 times in 3)."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self.raising = False

    def __call__(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.raising:
            raise _Stopped(name)
        self.signal = self.signal or name


def _left(run_dir: Path, status: str, *, judged: bool) -> str:
    """Where the run left its evidence and how to judge it: `soakspec gate`, or, where the run
    was not judged (results.json and verdict.json not written), `gate --write`, which writes them."""
    if status == "complete":
        where = f"the evidence in {run_dir} is complete"
    else:  # an aborted run's evidence is final but incomplete: never "complete"
        where = f"the evidence so far is in {run_dir}, marked {status}"
    how = f"`soakspec gate {run_dir}` judges it" if judged else f"`soakspec gate --write {run_dir}` judges it and writes its verdict"
    return f"{where} ({how})"


def _sign(run_dir: Path, key: str, quiet: bool) -> bool:
    """Sign the final manifest (before results.json and verdict.json, which are bound to it)."""
    from soakspec.evidence.signing import SigningError, sign_manifest

    try:
        sig = sign_manifest(run_dir, key)
    except SigningError as e:
        print(f"soakspec run: error: the evidence in {run_dir} is not signed: {e}; once the key can sign, "
              f"`ssh-keygen -Y sign -f {key} -n soakspec {run_dir / 'manifest.json'}` writes the signature", file=sys.stderr)
        return False
    if not quiet:
        print(f"signed: {sig}", file=sys.stderr)
    return True


def _warn_capped_workers(the_plan, workers: int) -> None:
    """An open loop's `max_concurrency` below `--workers`: its slots are split over the processes
    (each holds one at least), so its levels run in fewer processes (`workers.processes_for`).
    Said on stderr once per workload, with what to do about it."""
    seen = set()
    for b in the_plan.backends:
        for lv in b.levels:
            cap = lv.max_concurrency
            if cap is not None and cap < workers and lv.workload not in seen:
                seen.add(lv.workload)
                procs = f"{cap} load process{'es' if cap != 1 else ''}"
                print(f"soakspec run: warning: workload '{lv.workload}' sets max_concurrency = {cap}, fewer than --workers "
                      f"{workers}: its levels run in {procs}, one slot each (a process with no slot could send nothing); "
                      f"hint: pass --workers {cap} or fewer for it, or raise max_concurrency", file=sys.stderr)


def _sweep_judge(spec, args: argparse.Namespace):
    """A sweep's per-level predicate for the runner (None without a sweep): the gate's
    performance require rules judged on each probed level (`soakspec.judge.sweep`)."""
    if all(w.load.search is None for w in spec.workloads):  # `sweep_workload`, without importing the judge
        return None  # (the judge and numpy would otherwise sit in the runner's memory through the whole load)
    from soakspec.judge.sweep import probe_judge

    return probe_judge(spec, time_scale=args.time_scale, rehearsal=args.rehearse)


def _judge_and_report(spec, result, fmt: str, percentiles=None) -> int:
    """Judge the evidence just written (the same code path as `soakspec gate`), then print the
    verdict and the end-of-run summary."""
    import json

    from soakspec.evidence.io import EvidenceWriteError
    from soakspec.judge.cli_support import judge_and_write
    from soakspec.judge.verdict import render_text
    from soakspec.report.runsummary import summary_json, summary_lines

    try:
        verdict, results = judge_and_write(result.run_dir, spec, write=True)
    except EvidenceWriteError as e:  # the disk refused results.json or verdict.json: the manifest is final, the evidence kept
        print(f"soakspec run: error: {e}; the evidence is kept: `soakspec gate --write {result.run_dir}` judges it and "
              "writes what is missing", file=sys.stderr)
        if result.status == "aborted":
            print(f"soakspec run: run aborted: {result.reason}", file=sys.stderr)
        return ExitCode.ABORTED
    if fmt == "json":
        doc = verdict.to_json() | {"run_summary": summary_json(results, result.run_dir, verdict)}
        if result.status == "aborted":  # the process exits 4 whatever the evidence so far judged: say so
            doc |= {"exit_code": int(ExitCode.ABORTED), "aborted_reason": result.reason}
        print(json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False))
    else:
        shown = {} if percentiles is None else {"percentiles": percentiles}
        print("\n".join([render_text(verdict), *summary_lines(results, result.run_dir, verdict, **shown)]))
    if result.status == "aborted":
        print(f"soakspec run: run aborted: {result.reason}", file=sys.stderr)
        return ExitCode.ABORTED
    return int(verdict.exit_code)
