"""`soakspec verify DIR [--allowed-signers FILE]`: re-hash an evidence directory, check it
against its schemas and say whether it is signed.

Exit codes: 0 intact and complete; 1 a changed, missing or unlisted file or a schema error, or
(with `--allowed-signers`) a signature that is missing or does not verify; 3 intact but
incomplete (the run did not finish, or a JSONL file ends in a cut-off line); 2 no such directory,
no manifest.json, or an allowed-signers file that is not there (or no ssh-keygen to check with).

Without `--allowed-signers` nothing is run; with it, `ssh-keygen -Y find-principals` and
`ssh-keygen -Y verify` check manifest.json.sig (soakspec.evidence.signing) -- a fixed program
with arguments built by soakspec, never anything a spec names.
"""

from __future__ import annotations

import argparse
import json
import sys


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="DIR", help="an evidence directory (<out>/<run_id>)")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")
    parser.add_argument("--allowed-signers", metavar="FILE",
                        help="require manifest.json.sig to verify against this ssh-keygen allowed_signers file")


def main(args: argparse.Namespace) -> int:
    from soakspec.cli import UsageError
    from soakspec.evidence.signing import SigningError, signature_status, verify_signature
    from soakspec.evidence.verify import verify_evidence
    from soakspec.exitcodes import ExitCode
    from soakspec.judge.evidence import embedded_spec_sha256

    report = verify_evidence(args.run_dir, spec_sha256=embedded_spec_sha256)  # EvidenceNotFound: a UsageError
    try:
        sig = verify_signature(args.run_dir, args.allowed_signers) if args.allowed_signers else signature_status(args.run_dir)
    except SigningError as e:
        raise UsageError(str(e)) from None
    code = int(report.exit_code)
    if sig.ok is False:
        code = ExitCode.GATE_FAILED
    if args.format == "json":
        doc = report.to_json() | {"signature": sig.to_json(), "exit_code": int(code)}
        if sig.ok is False:
            doc["result"] = "failed"
        json.dump(doc, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        # (a lone surrogate from the evidence is printed as its escape: cli._GuardedStdout)
        print(f"signature: {sig.text()}")  # first: the last line stays the verdict on the files
        print(report.render_text())
    return code
