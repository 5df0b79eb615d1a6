"""`soakspec compare BASE NEW [--spec FILE] [--confidence 95%] [--require RULE]... [--format md|html|json]`

Before/after with statistics. Both evidence directories are loaded and verified like `gate`
does (every artifact re-hashed against its manifest; a spec that does not check is a usage
error), matched by backend and level, and compared row by row with a seeded bootstrap interval
(`soakspec.compare` documents the method). `--spec FILE` checks both runs against that spec
instead of the ones embedded in their manifests. Rules gate the comparison: those of the
spec's `compare { require regression(p99(ttft)) <= 5% }` block (`--spec FILE`, else the NEW
run's embedded spec -- the one under review; its `confidence` too unless `--confidence` is
given), then every `--require 'p99(ttft) regression <= 5%'` (repeatable; `warn ...` for a rule
that never decides). The workloads are compared as the runs ran them (their embedded specs,
whatever `--spec` says): a difference is stated, and is INCONCLUSIVE unless
`--allow-workload-change`.

Exit code: 0 PASS (both runs verified, every require rule holds); 1 FAIL (a require rule
failed, an artifact of either run does not match its manifest's hash, or the share of
unsuccessful requests rose significantly and no rule on ratio(errors) says how much rise is
allowed); 3 INCONCLUSIVE (a rule the samples cannot decide; evidence that cannot be read at
all -- a manifest that does not parse, as `gate` says of it; an incomplete run; a row with data
on one side only; a rehearsal or time-scaled run on either side, unless the spec's gate allows
rehearsals and both are scaled alike; runs that sent different requests -- prompt, max_tokens,
endpoint, model, sampling -- unless `--allow-workload-change` says that is the point; nothing
to match); 2 usage error (also an `--out` that is a directory, in no directory or inside either
evidence directory); 4 when `--out` cannot be written.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from soakspec.commands.outpath import out_file, write_out_file
from soakspec.exitcodes import ExitCode


def _confidence(text: str) -> float:
    """95% or 0.95, held to the range the spec's `compare { confidence }` takes (at least 50 %,
    below 100 %: lang/check/walk.py): an alpha given for a confidence (0.05) would make 5 %
    intervals that call two runs of one configuration changed on most rows."""
    t = text.strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a confidence like 95% or 0.95") from None
    if not 0.5 <= v < 1:
        hint = f" (a bare number is a fraction: write {t}%)" if not t.endswith("%") and 50 <= v < 100 else ""
        raise argparse.ArgumentTypeError(f"{text!r}: a confidence must be at least 50% and below 100%, e.g. 95% or 0.95{hint}")
    return v


def configure(p: argparse.ArgumentParser) -> None:
    from soakspec.compare.render import FORMATS

    p.add_argument("base", metavar="BASE", help="the evidence directory before the change")
    p.add_argument("new", metavar="NEW", help="the evidence directory after the change")
    p.add_argument("--spec", metavar="FILE", help="check both runs with this spec instead of their embedded ones")
    p.add_argument("--confidence", type=_confidence, default=None, metavar="C",
                   help="family-wise confidence of the intervals, at least 50%% and below 100%%, e.g. 95%% or 0.99 "
                        "(default: the spec's compare block, else 95%%)")
    p.add_argument("--require", action="append", default=[], metavar="RULE",
                   help="a gating rule, e.g. 'p99(ttft) regression <= 5%%' (or 'warn p50(tpot) regression <= 10%%')")
    p.add_argument("--format", choices=FORMATS, default="md", help="md, html or json (default: md)")
    p.add_argument("--resamples", type=int, default=None, metavar="N",
                   help="bootstrap draws per side, at least 100 (default: 4000); raised, with a note, to what the "
                        "number of rows needs (10 draws beyond each end of every family-wise interval)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default: 0; the output is deterministic)")
    p.add_argument("--allow-workload-change", action="store_true",
                   help="the runs sent different requests on purpose (prompt, max_tokens, endpoint, model, ...): "
                        "compare them, with a note, instead of INCONCLUSIVE")
    p.add_argument("--out", metavar="FILE", type=out_file,
                   help="write the comparison to FILE (atomically) instead of stdout (-: stdout)")


def comparison_of(command: str, base_dir: str, new_dir: str, spec_file: str | None, *, confidence: float | None = None,
                  rules: Sequence[Any] = (), resamples: int | None = None, seed: int = 0,
                  allow_workload_change: bool = False) -> Any:
    """`soakspec compare BASE NEW`'s comparison (a `soakspec.compare.Comparison`), or an exit
    code after saying why on stderr: both runs verified and re-derived as `gate` does, nothing
    written, nothing executed. `lint-claims --compare BASE NEW` checks a document against it.
    The rules are the spec's `compare` block's (`spec_file`, else the new run's), then `rules`."""
    from soakspec.commands.gate import load_for_judging
    from soakspec.compare import compare
    from soakspec.compare.samples import RunSamples
    from soakspec.compare.rules import rules_of

    # The base run is read whole -- its records re-derived as the gate does, every level's
    # samples taken -- and its table let go before the new run is read: two day-long runs'
    # tables together were 1.2 GiB (RunSamples). The new run's samples are read from its
    # table a (level, metric) at a time.
    loaded = load_for_judging(command, base_dir, spec_file, name_dir=True)
    if isinstance(loaded, int):
        return loaded
    base_judge, base_ev = loaded
    base = RunSamples.read(base_ev, dir=str(base_dir), judge=base_judge,  # re-derived with --spec, else its own spec
                           ran=None if spec_file else base_judge, keep=False,  # the spec it ran: its embedded one
                           from_send=_lag_checked(base_judge, rules, None if spec_file else _spec_ahead(new_dir)))
    del loaded, base_ev
    loaded = load_for_judging(command, new_dir, spec_file, name_dir=True)
    if isinstance(loaded, int):
        return loaded
    spec, new_ev = loaded  # --spec, else the new run's own spec: the one under review
    del loaded
    confidence = confidence if confidence is not None else spec.compare.confidence
    return compare(base, new_ev, base_dir=str(base_dir), new_dir=str(new_dir), confidence=confidence,
                   rules=list(rules_of(spec)) + list(rules), resamples=resamples, seed=seed,
                   allow_rehearsal=spec.gate.allow_rehearsal, workload_change=allow_workload_change,
                   new_spec=None if spec_file else spec, judged_with=(base_judge, spec))


def _lag_checked(spec: Any, rules: Sequence[Any], new_spec: Any = None) -> bool:
    """Whether the base run read up front keeps its open-loop levels' lag figures' samples (from
    the send; under max_concurrency, less the client's lateness: a failing ttft or latency
    rule's check, `compare._lag_decided`): where a rule that may be judged is on ttft or latency
    -- --require, the compare block of the spec it is judged with (--spec, else its own), and
    without --spec the new run's (`_spec_ahead`: the rules compare takes, read before the base
    run's table goes, so that a rule only the new run's spec holds is checked too)."""
    from soakspec.compare.rules import rules_of

    named = [*rules_of(spec), *(rules_of(new_spec) if new_spec is not None else ()), *rules]
    return any(r.metric in ("ttft", "latency") for r in named)


def _spec_ahead(new_dir: str) -> Any:
    """The new run's embedded spec from its manifest alone (`bare_evidence`: no table read), or
    None where it cannot be read -- its full load, after the base run's, says why."""
    from soakspec.evidence.io import EvidenceError
    from soakspec.judge.cli_support import bare_evidence
    from soakspec.judge.workload import ran_spec

    try:
        return ran_spec(bare_evidence(new_dir))
    except EvidenceError:
        return None


def main(args: argparse.Namespace) -> int:
    from soakspec.cli import UsageError
    from soakspec.compare.rules import RuleError, parse_rule
    from soakspec.compare.intervals import MIN_RESAMPLES, MIN_TAIL_DRAWS
    from soakspec.compare.render import render
    from soakspec.evidence.io import EvidenceError

    try:
        rules = [parse_rule(r if r.split()[:1] in (["require"], ["warn"]) else "require " + r) for r in args.require]
    except RuleError as e:
        raise UsageError(str(e)) from None
    resamples = args.resamples  # None: the default, or more where the rows need more (soakspec.compare)
    if resamples is not None and resamples < MIN_RESAMPLES:
        raise UsageError(f"--resamples must be at least {MIN_RESAMPLES}")
    from soakspec.evidence.io import require_evidence_dir

    for d in (args.base, args.new):  # both, before either is read (a day-long run's evidence takes minutes)
        require_evidence_dir(d)
    if args.out is not None:  # as `report --out`: a usage error before the minutes of reading, not after
        from soakspec.commands.outpath import check_out_file

        check_out_file(args.out, [args.base, args.new])
    c = comparison_of("compare", args.base, args.new, args.spec, confidence=args.confidence, rules=rules,
                      resamples=resamples, seed=args.seed, allow_workload_change=args.allow_workload_change)
    if isinstance(c, int):
        return c
    if c.resamples_requested is not None:
        print(f"soakspec compare: note: --resamples {c.resamples_requested} raised to {c.resamples}: each end of the "
              f"{len(c.rows)} rows' family-wise intervals needs at least {MIN_TAIL_DRAWS} draws beyond it", file=sys.stderr)
    text = render(c, args.format).encode("utf-8", "backslashreplace").decode("utf-8")
    if args.out is not None:
        try:
            write_out_file(args.out, text.encode("utf-8"))
        except (OSError, EvidenceError) as e:
            print(f"soakspec compare: cannot write {args.out}: {e}", file=sys.stderr)
            return ExitCode.ABORTED
        print(f"soakspec compare: wrote {args.out} ({c.outcome})", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return c.exit_code
