"""The `soakspec` command line.

Each subcommand lives in `soakspec.commands.<module>` and exposes two functions:
`configure(parser)` adds its arguments, `main(args) -> int` runs it and returns an ExitCode.
Modules are imported only when their command runs, so `soakspec check` never imports trio.

Errors: a user mistake prints one clear line (exit 2); an unexpected exception prints one line
naming it as a bug, with the traceback only under `--debug`, and aborts (exit 4). Every exit
is an `ExitCode` member.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
import traceback

from soakspec import __version__, heap
from soakspec.evidence.io import EvidenceChanged, EvidenceUnreadable
from soakspec.evidence.readprogress import reporting
from soakspec.exitcodes import ExitCode, UsageError  # noqa: F401 - UsageError: the commands' import

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "check": ("soakspec.commands.lang", "check .soak files and report every error at once"),
    "plan": ("soakspec.commands.lang", "show what a run of a spec would do (nothing runs)"),
    "fmt": ("soakspec.commands.lang", "format .soak files canonically (comments kept)"),
    "run": ("soakspec.commands.run", "launch the backends, drive the load, judge the evidence"),
    "gate": ("soakspec.commands.gate", "re-judge retained evidence (hashes verified first)"),
    "verify": ("soakspec.commands.verify", "re-hash an evidence directory, check its schemas and its signature"),
    "combine": ("soakspec.commands.combine", "combine per-backend evidence into one report"),
    "report": ("soakspec.commands.report", "render a report from an evidence directory"),
    "compare": ("soakspec.commands.compare", "compare two runs (before/after) with confidence intervals"),
    "lint-claims": ("soakspec.commands.lint_claims", "check a review document against the claim boundary"),
    "sim": ("soakspec.commands.sim", "run the embedded OpenAI-compatible inference simulator"),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 already; keep its format
        self.print_usage(sys.stderr)
        self.exit(ExitCode.USAGE, f"{self.prog}: error: {message}\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = _Parser(prog="soakspec", description="Declarative HTTP soak tests for inference servers.")
    parser.add_argument("--version", action="version", version=f"soakspec {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for internal errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        if only is None or only == name:
            mod = importlib.import_module(module)
            getattr(mod, "configure_" + name.replace("-", "_"), getattr(mod, "configure", None))(p)
    return parser


READS_EVIDENCE = frozenset({"gate", "report", "verify", "combine", "compare"})  # long reads reported on stderr


def _command_from_argv(argv: list[str]) -> str | None:
    for a in argv:
        if a in COMMANDS:
            return a
        if not a.startswith("-"):
            return None
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Configure only the command being run: keeps start-up fast and imports minimal.
    parser = build_parser(only=_command_from_argv(argv) or "")
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help(sys.stderr)
        return ExitCode.USAGE
    heap.limit_retention()  # large temporaries (the judge's, the load's) go back to the system when freed
    module = importlib.import_module(COMMANDS[args.command][0])
    fn = getattr(module, "main_" + args.command.replace("-", "_"), getattr(module, "main", None))
    try:
        # minutes for a day-long soak's evidence: say how far a read has got
        with reporting(sys.stderr, args.command) if args.command in READS_EVIDENCE else contextlib.nullcontext():
            return ExitCode(int(fn(args)))
    except UsageError as e:
        print(f"soakspec {args.command}: error: {e}", file=sys.stderr)
        return ExitCode.USAGE
    except KeyboardInterrupt:
        print(f"soakspec {args.command}: interrupted", file=sys.stderr)
        return ExitCode.ABORTED
    except BrokenPipeError:
        return ExitCode.OK
    except (EvidenceChanged, EvidenceUnreadable) as e:  # a file changed under the judge, or one it cannot read
        print(f"soakspec {args.command}: {e}: the evidence cannot be judged", file=sys.stderr)
        return ExitCode.INCONCLUSIVE
    except Exception as e:  # noqa: BLE001 - the one place that turns a crash into one line
        # --debug adds the traceback and changes nothing else: a bare `raise` here left the exit
        # code to the interpreter (1, which means "a gate rule failed")
        debug = getattr(args, "debug", False)
        if debug:
            traceback.print_exc(file=sys.stderr)
        print(
            f"soakspec {args.command}: internal error: {type(e).__name__}: {e} "
            + ("(this is a bug)" if debug else "(this is a bug; rerun with --debug for the traceback)"),
            file=sys.stderr,
        )
        return ExitCode.ABORTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
