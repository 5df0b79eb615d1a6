"""`soakspec gate DIR`: re-judge retained evidence.

The evidence is verified first (every artifact re-hashed against the manifest: an artifact edited
after the run FAILs the gate and is named), then judged against the spec embedded in the
manifest -- or against `--spec FILE` (a newer spec; a different sha256 is reported on stderr).
The run's own results.json and verdict.json are part of retained evidence: either missing makes
the verdict INCONCLUSIVE (incomplete evidence), whatever the rest says.
The verdict goes to stdout (text or JSON); the exit code is 0 PASS, 1 FAIL, 3 INCONCLUSIVE,
2 for a usage error (no evidence directory, a spec that does not check). Nothing is written.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from soakspec.exitcodes import ExitCode


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", metavar="DIR", help="an evidence directory (the run's output)")
    p.add_argument("--spec", metavar="FILE", help="judge with this spec instead of the one embedded in the evidence")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")
    p.add_argument("--verbose", action="store_true", help="text: list every instance, not only failures")
    p.add_argument("--backend", action="append", default=[], metavar="NAME",
                   help="judge only this backend (repeatable), as a `run --backend` of it: rules naming other backends are dropped")


def spec_for(evidence, spec_file: str | None, where: str):
    """The spec to judge with: `spec_file` when given, else the manifest's embedded text.
    Returns (spec, messages for stderr). Raises UsageError when the spec does not check."""
    from soakspec.cli import UsageError
    from soakspec.diagnostics import has_errors, render_text
    from soakspec.lang import check, load_spec, parse

    notes: list[str] = []
    if spec_file is not None:
        spec, diags, text = load_spec(spec_file)
        if spec is None:
            raise UsageError(f"{spec_file} does not check:\n{render_text(diags, {spec_file: text})}")
        if evidence.spec_sha256 and spec.sha256 != evidence.spec_sha256:
            notes.append(f"{spec_file} (sha256 {spec.sha256[:12]}) differs from the spec the run used "
                         f"(sha256 {evidence.spec_sha256[:12]}); judging with {spec_file}")
        return spec, notes
    text = evidence.spec_text
    if text is None:
        raise UsageError(f"{where}: the manifest embeds no spec text; pass --spec FILE")
    name = f"{where}/manifest.json#spec"
    tree, diags = parse(text, name)
    spec = None
    if tree is not None and not has_errors(diags):
        spec, more = check(tree, name)
        diags = diags + more
    if spec is None:
        raise UsageError(f"the spec embedded in {where} does not check with this soakspec; pass --spec FILE:\n"
                         f"{render_text(diags, {name: text})}")
    if evidence.spec_sha256 and spec.sha256 != evidence.spec_sha256:
        notes.append(f"the embedded spec's canonical text now hashes to {spec.sha256[:12]}, "
                     f"the manifest recorded {evidence.spec_sha256[:12]}")
    return spec, notes


def load_for_judging(command: str, run_dir: str, spec_file: str | None, *, name_dir: bool = False):
    """Load (and hash-verify) an evidence directory and choose the spec to judge it with.
    Returns (spec, evidence), or an exit code after saying why on stderr. Shared by `gate`
    `report` and `combine`, which all re-judge rather than trust a stored verdict."""
    from soakspec.cli import UsageError
    from soakspec.evidence.io import EvidenceError
    from soakspec.judge.evidence import EvidenceNotFound, load_evidence

    where = str(run_dir).rstrip("/") or "/"
    try:
        evidence = load_evidence(Path(run_dir))
    except EvidenceNotFound as e:
        raise UsageError(str(e)) from None
    except EvidenceError as e:
        print(f"soakspec {command}: {e}: the evidence cannot be judged", file=sys.stderr)
        return ExitCode.INCONCLUSIVE
    spec, notes = spec_for(evidence, spec_file, where)
    for n in notes:
        print(f"soakspec {command}: note: {where + ': ' if name_dir else ''}{n}", file=sys.stderr)
    return spec, evidence


def _stored_outcome(evidence) -> str | None:
    """The outcome the run's verdict.json records (None: none readable)."""
    from soakspec.evidence import layout
    from soakspec.evidence.io import EvidenceError, read_json

    if evidence.root is None:
        return None
    path = Path(evidence.root) / layout.VERDICT
    try:
        doc = read_json(path) if path.is_file() else None
    except (EvidenceError, OSError):
        return None
    out = doc.get("outcome", doc.get("verdict")) if isinstance(doc, dict) else None
    return out if out in ("PASS", "FAIL", "INCONCLUSIVE") else None


def main(args: argparse.Namespace) -> int:
    from soakspec.judge.judge import judge
    from soakspec.judge.verdict import render_text

    loaded = load_for_judging("gate", args.dir, args.spec)
    if isinstance(loaded, int):
        return loaded
    spec, evidence = loaded
    names = {b.name for b in spec.backends}
    unknown = [n for n in args.backend if n not in names]
    if unknown:
        from soakspec.cli import UsageError

        raise UsageError(f"--backend {unknown[0]}: the spec declares no such backend ({', '.join(sorted(names))})")
    # after the fact: the run's results/verdict must be there
    verdict = judge(spec, evidence, retained=True, backends=tuple(args.backend))
    stored = _stored_outcome(evidence)
    if stored is not None and stored != verdict.outcome and not args.backend:
        # the stored verdict is a conclusion like any other: the gate re-judges and says so
        verdict = dataclasses.replace(verdict, notes=verdict.notes + (
            f"the run's own verdict.json says {stored}; re-judged from the evidence: {verdict.outcome}",))
    from soakspec.evidence.signing import signature_status  # says whether the evidence is signed (runs nothing)

    verdict = dataclasses.replace(verdict, notes=verdict.notes + (f"evidence {signature_status(args.dir).text()}",))
    if args.format == "json":
        print(json.dumps(verdict.to_json(), indent=2, sort_keys=True, ensure_ascii=False))
    else:
        print(render_text(verdict, verbose=args.verbose))
    return verdict.exit_code
