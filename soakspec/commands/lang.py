"""`soakspec check`, `soakspec plan` and `soakspec fmt`: pure commands, nothing a spec names runs."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from soakspec.diagnostics import Diagnostic, has_errors, render_text
from soakspec.exitcodes import ExitCode


def _add_format(p: argparse.ArgumentParser, choices=("text", "json")) -> None:
    p.add_argument("--format", choices=choices, default="text", help="output format (default: text)")


def configure_check(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", metavar="FILE", help=".soak files to check; `-` reads one from stdin (shown as <stdin>)")
    _add_format(p)
    p.add_argument("--strict", action="store_true", help="treat warnings as errors")


def configure_plan(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE")
    _add_format(p)
    p.add_argument("--time-scale", type=float, default=1.0, metavar="F", help="shrink every duration by F (rehearsals)")
    p.add_argument("--rehearse", action="store_true", help="plan a rehearsal against the simulator")
    p.add_argument("--backend", action="append", default=[], metavar="NAME", help="only these backends")


def configure_fmt(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", metavar="FILE", help="spec files; `-` reads stdin and writes the formatted spec to stdout")
    p.add_argument("--check", action="store_true", help="exit 1 if a file is not formatted; change nothing")
    p.add_argument("--diff", action="store_true", help="print a diff instead of rewriting")


def _print_diags(diags: list[Diagnostic], sources: dict[str, str]) -> None:
    if diags:
        print(render_text(diags, sources), file=sys.stderr)


STDIN = "<stdin>"  # how `-` is shown, by check and fmt alike


def _read_stdin() -> tuple[str | None, Diagnostic | None]:
    """The spec on stdin, bounded as a file is (1 MB): its text as written, or why not."""
    from soakspec.lang.parser import MAX_SOURCE_BYTES, decode_source

    return decode_source(sys.stdin.buffer.read(MAX_SOURCE_BYTES + 1), STDIN)


def _stdin_once(command: str, files: list[str]) -> None:
    from soakspec.cli import UsageError

    if files.count("-") > 1:
        raise UsageError(f"`-` (stdin) can be given once; {command} got it {files.count('-')} times")


def main_check(args: argparse.Namespace) -> int:
    from soakspec.diagnostics import sort_key
    from soakspec.lang import load_spec, load_text

    _stdin_once("check", args.files)
    all_diags: list[Diagnostic] = []
    sources: dict[str, str] = {}
    results = []
    for f in args.files:
        if f == "-":  # the spec on stdin, shown as <stdin> (as `fmt -` shows it)
            f = STDIN
            text, refused = _read_stdin()
            spec, diags, text = (None, [refused], "") if text is None else load_text(text, STDIN)
        else:
            spec, diags, text = load_spec(f)
        sources[f] = text
        all_diags.extend(diags)
        results.append({"path": f, "ok": spec is not None and not (args.strict and diags), "sha256": spec.sha256 if spec else None})
    failed = has_errors(all_diags) or (args.strict and all_diags)
    if args.format == "json":
        print(
            json.dumps(
                {"schema_version": 1, "ok": not failed, "files": results, "diagnostics": [d.as_json() for d in sorted(all_diags, key=sort_key)]},
                indent=2,
            )
        )
    else:
        if all_diags:
            print(render_text(all_diags, sources))
        else:
            for r in results:
                print(f"{r['path']}: ok")
    return ExitCode.USAGE if failed else ExitCode.OK


def main_plan(args: argparse.Namespace) -> int:
    from soakspec.lang import load_spec
    from soakspec.plan import plan, render_text as render_plan, to_json

    spec, diags, text = load_spec(args.file)
    _print_diags(diags, {args.file: text})
    if spec is None:
        return ExitCode.USAGE
    if not 0 < args.time_scale <= 1:
        print("soakspec plan: error: --time-scale must be in (0, 1]", file=sys.stderr)
        return ExitCode.USAGE
    unknown = [n for n in args.backend if n not in {b.name for b in spec.backends}]
    if unknown:
        print(f"soakspec plan: error: no backend named {', '.join(map(repr, unknown))} in {args.file}", file=sys.stderr)
        return ExitCode.USAGE
    p = plan(spec, time_scale=args.time_scale, rehearse=args.rehearse, only=tuple(args.backend))
    if args.format == "json":
        print(json.dumps(to_json(p), indent=2))
    else:
        print(render_plan(p))
    return ExitCode.OK


def main_fmt(args: argparse.Namespace) -> int:
    import difflib

    from soakspec.lang.parser import read_source

    _stdin_once("fmt", args.files)
    status = ExitCode.OK
    for f in args.files:
        if f == "-":
            status = max(status, _fmt_stdin(args), key=int)
            continue
        text, refused = read_source(f)
        out = _formatted(f, text, refused)
        if out is None:
            status = ExitCode.USAGE
            continue
        if out == text:
            continue
        if args.check or args.diff:
            if args.diff:
                sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), out.splitlines(True), f, f + " (formatted)"))
            else:
                print(f"{f}: would reformat")
            if status == ExitCode.OK:
                status = ExitCode.GATE_FAILED
            continue
        _write_atomic(f, out)
        print(f"{f}: reformatted", file=sys.stderr)
    return status


def _fmt_stdin(args: argparse.Namespace) -> ExitCode:
    """`soakspec fmt -`: the spec on stdin, formatted to stdout (with --check/--diff: as for a file)."""
    import difflib

    name = STDIN
    text, refused = _read_stdin()
    out = _formatted(name, text, refused)
    if out is None:
        return ExitCode.USAGE
    if args.check or args.diff:
        if out == text:
            return ExitCode.OK
        if args.diff:
            sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), out.splitlines(True), name, name + " (formatted)"))
        else:
            print(f"{name}: would reformat")
        return ExitCode.GATE_FAILED
    sys.stdout.write(out)
    return ExitCode.OK


def _formatted(name: str, text: str | None, refused: Diagnostic | None) -> str | None:
    """The canonical form of a spec's text, in the file's own line endings and with its BOM if
    it had one (`in_style_of`); None, after printing why, when it cannot be read or parsed, or
    when the canonical form would be larger than a spec may be (E010: `fmt` would have turned a
    spec every command reads into one none does)."""
    from soakspec.lang import fmt, parse
    from soakspec.diagnostics import Span
    from soakspec.lang.fmt import in_style_of
    from soakspec.lang.parser import MAX_SOURCE_BYTES, source_text

    if text is None:
        _print_diags([refused] if refused is not None else [], {})
        return None
    tree, diags = parse(text, name)
    if tree is None or has_errors(diags):
        _print_diags(diags, {name: source_text(text)})
        return None
    out = in_style_of(fmt(tree), text)
    size = len(out.encode("utf-8"))
    if size > MAX_SOURCE_BYTES:  # indentation and spacing grow a compact spec: never write one no command could read
        _print_diags([Diagnostic("E010", f"formatted, the spec would be {size:,} bytes, over the {MAX_SOURCE_BYTES // 1000} kB "
                                 "a spec may have; it is left as it is", Span(), name)], {})
        return None
    return out


def _write_atomic(path: str, text: str) -> None:
    """Replace the file atomically; a symlink is written through (its target is replaced, the
    link stays a link)."""
    path = os.path.realpath(path)
    d = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".soakfmt-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:  # the line endings as given, on every OS
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.chmod(tmp, os.stat(path).st_mode & 0o777)
        except OSError:
            pass
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
