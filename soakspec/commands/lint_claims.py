"""`soakspec lint-claims DOC --spec FILE [--evidence DIR ...] [--compare BASE NEW | --compare COMPARE.json] [--format text|json]`

Checks a review document (PR text, Markdown) against the spec's claim boundary, the workload's
coverage and, optionally, retained evidence. It explains; it never rewrites the document.
Evidence is re-judged (verified and judged with the spec its manifest embeds, like `gate`), not
read from its stored results.json/verdict.json: see `soakspec.claims.adapters.load_evidence_facts`.

`--compare BASE NEW` checks the document's claims of change ("p99 TTFT fell 12% at 8 rps") against
the comparison `soakspec compare BASE NEW` makes -- computed here, in-process, from the two
evidence directories (verified and re-derived as `compare` does; nothing written, nothing
executed). `--compare COMPARE.json` reads that comparison from a file `soakspec compare --format
json` wrote instead (its schema_version checked); it is taken as written, so the directories are
the form to trust (`soakspec.claims.changes`, CB501-CB505).

Exit codes: 0 no errors (warnings may be printed), 1 findings, 2 usage (unreadable document,
invalid spec, unreadable evidence). The result goes to stdout; spec diagnostics to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from soakspec.claims import adapters
from soakspec.claims.engine import lint
from soakspec.claims.facts import ChangeFacts
from soakspec.diagnostics import Severity, has_errors, render_text
from soakspec.exitcodes import ExitCode
from soakspec.lang.parser import MAX_SOURCE_BYTES, Unreadable, read_bounded

JSON_SCHEMA_VERSION = 1


class _Usage(Exception):
    pass


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("document", metavar="DOC", nargs="?", default=None,
                        help="the review document (Markdown or PR text); it may also follow --evidence DIR...")
    parser.add_argument("--spec", required=True, metavar="FILE", help="the .soak spec whose claim boundary applies")
    parser.add_argument(
        "--evidence", action="extend", nargs="+", default=[], metavar="DIR",
        help="retained evidence directories to check stated numbers and hashes against",
    )
    parser.add_argument(
        "--compare", nargs="+", default=None, metavar="BASE NEW | JSON",
        help="check claims of change against `soakspec compare BASE NEW` (two evidence directories, compared here "
             "read-only) or against the file `soakspec compare --format json` wrote",
    )
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")


MAX_DOCUMENT_BYTES = 10_000_000  # a review document; linting is linear, so this bounds the work


def _read(path: str, what: str, limit: int, encoding: str = "utf-8") -> str:
    """The file's text, read once and bounded: never more than `limit` bytes (`/dev/zero`),
    never an unbounded wait on a pipe nobody writes to."""
    try:
        raw = read_bounded(Path(path), limit)
    except OSError as e:
        raise _Usage(f"cannot read {what} {path}: {e.strerror or e}") from e
    except Unreadable as e:
        raise _Usage(f"cannot read {what} {path}: {e}") from e
    if len(raw) > limit:
        raise _Usage(f"{what} {path} is larger than {limit / 1e6:g} MB; refusing to read it")
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as e:
        raise _Usage(f"cannot read {what} {path}: {e}") from e


def _document_after_evidence(args: argparse.Namespace) -> None:
    """`--evidence D1 D2 PR.md`: --evidence takes every word after it, so the document lands in
    its list. Evidence is a directory; a trailing entry that is not one is the document. Likewise
    `--compare BASE NEW PR.md` (but `--compare C.json PR.md`: a JSON file is alone)."""
    if args.document is None and args.evidence and not Path(args.evidence[-1]).is_dir():
        args.document = args.evidence.pop()
    if args.document is None and args.compare and len(args.compare) > 1 and not Path(args.compare[-1]).is_dir():
        args.document = args.compare.pop()
    if args.document is None:
        raise _Usage("no document given (soakspec lint-claims DOC --spec FILE [--evidence DIR...])")


MAX_COMPARISON_BYTES = 200_000_000  # a comparison of many levels; read once, bounded


def _changes(compare: list[str] | None) -> ChangeFacts | None:
    """What `soakspec compare` measured (None without --compare)."""
    if not compare:
        return None
    if len(compare) == 1 and not Path(compare[0]).is_dir():
        return adapters.read_change_facts(compare[0], _read(compare[0], "comparison", MAX_COMPARISON_BYTES))
    if len(compare) != 2:
        raise _Usage("--compare takes two evidence directories (BASE NEW) or one JSON file `soakspec compare --format json` wrote")
    from soakspec.commands.compare import comparison_of
    from soakspec.evidence.io import EvidenceNotFound, require_evidence_dir

    try:
        # two given: a missing or mistyped one is named, as `soakspec compare` names it
        for d in compare:
            require_evidence_dir(d)
        c = comparison_of("lint-claims", compare[0], compare[1], None)
    except EvidenceNotFound as e:
        raise _Usage(str(e)) from None
    if isinstance(c, int):  # said on stderr; a comparison that cannot be made is a usage error here, as evidence is
        raise _Usage(f"cannot compare {compare[0]} with {compare[1]}")
    return adapters.change_facts(c.to_json(), f"{compare[0]} → {compare[1]}")


def main(args: argparse.Namespace) -> int:
    try:
        _document_after_evidence(args)
        text = _read(args.document, "document", MAX_DOCUMENT_BYTES, "utf-8-sig")  # a BOM is not text
        spec_text = _read(args.spec, "spec", MAX_SOURCE_BYTES)  # read once: it may be a pipe
        boundary, coverage, spec_sha, spec_diags = adapters.load_boundary_and_coverage(args.spec, source=spec_text)
        if boundary is None or coverage is None or has_errors(spec_diags):
            print(render_text(spec_diags, {args.spec: spec_text}), file=sys.stderr)
            raise _Usage(f"invalid spec {args.spec}")
        evidence = []
        for d in args.evidence:
            evidence.extend(adapters.load_evidence_facts(d))
        changes = _changes(args.compare)
    except (_Usage, adapters.AdapterError) as e:
        print(f"soakspec lint-claims: error: {e}", file=sys.stderr)
        return ExitCode.USAGE

    if changes is not None and changes.verdict not in (None, "PASS"):  # the rows stand; the reader should know why compare did not pass
        why = "; ".join(changes.reasons) or "see `soakspec compare`"
        print(f"soakspec lint-claims: note: the comparison ({changes.source}) is {changes.verdict}: {why}", file=sys.stderr)
    diags = lint(text, args.document, boundary, coverage, evidence, spec_sha, changes)
    if args.format == "json":
        errors = sum(1 for d in diags if d.severity is Severity.ERROR)
        payload = {
            "schema_version": JSON_SCHEMA_VERSION,
            "document": args.document,
            "spec": args.spec,
            "spec_sha256": spec_sha,
            "evidence": list(args.evidence),
            "compare": list(args.compare or []),
            "diagnostics": [d.as_json() for d in diags],
            "summary": {"errors": errors, "warnings": len(diags) - errors},
        }
        print(json.dumps(payload, indent=2, sort_keys=True))
    elif diags:
        print(render_text(diags, {args.document: text}))
    else:
        print(f"{args.document}: no findings")
    return ExitCode.GATE_FAILED if has_errors(diags) else ExitCode.OK
