"""`soakspec verify DIR`: re-hash an evidence directory and check it against its schemas.

Exit codes: 0 intact and complete; 1 a changed, missing or unlisted file or a schema error;
3 intact but incomplete (the run did not finish, or a JSONL file ends in a cut-off line);
2 no such directory or no manifest.json.
"""

from __future__ import annotations

import argparse
import json
import sys



def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="DIR", help="an evidence directory (<out>/<run_id>)")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")


def main(args: argparse.Namespace) -> int:
    from soakspec.cli import UsageError
    from soakspec.evidence.verify import EvidenceNotFound, verify_evidence
    from soakspec.judge.evidence import embedded_spec_sha256

    try:
        report = verify_evidence(args.run_dir, spec_sha256=embedded_spec_sha256)
    except EvidenceNotFound as e:
        raise UsageError(str(e)) from None
    if args.format == "json":
        json.dump(report.to_json(), sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        print(report.render_text())
    return int(report.exit_code)
