"""The `soakspec` command line.

Each subcommand lives in `soakspec.commands.<module>` and exposes two functions:
`configure(parser)` adds its arguments, `main(args) -> int` runs it and returns an ExitCode.
Modules are imported only when their command runs, so `soakspec check` never imports trio.

Errors: a user mistake prints one clear line (exit 2); an unexpected exception prints one line
naming it as a bug, with the traceback only under `--debug`, and aborts (exit 4). A stdout that
refuses the output (`> /dev/full`) is said as that, not as a bug, and aborts too (exit 4): the
result did not reach the caller, so no result's code may stand for it. A reader that closes the
pipe early (`| head`) is not an error. SIGINT, SIGTERM and SIGHUP stop a command with one
line and exit ABORTED (`_Signals`; `run` and `sim` take them over while they run). Every exit
is an `ExitCode` member.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import errno
import importlib
import os
import signal
import sys
import traceback

from soakspec import __version__, heap
from soakspec.evidence.io import EvidenceChanged, EvidenceUnreadable
from soakspec.evidence.readprogress import reporting
from soakspec.exitcodes import ExitCode, UsageError  # noqa: F401 - UsageError: the commands' import

# name -> (module, one-line help, what it writes to stdout: named when stdout refuses it)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "check": ("soakspec.commands.lang", "check .soak files and report every error at once", "the result"),
    "plan": ("soakspec.commands.lang", "show what a run of a spec would do (nothing runs)", "the plan"),
    "fmt": ("soakspec.commands.lang", "format .soak files canonically (comments kept)", "the formatted spec"),
    "run": ("soakspec.commands.run", "launch the backends, drive the load, judge the evidence", "the verdict"),
    "gate": ("soakspec.commands.gate", "re-judge retained evidence (hashes verified first)", "the verdict"),
    "verify": ("soakspec.commands.verify", "re-hash an evidence directory, check its schemas and its signature", "the result"),
    "combine": ("soakspec.commands.combine", "combine per-backend evidence into one report", "the report"),
    "report": ("soakspec.commands.report", "render a report from an evidence directory", "the report"),
    "compare": ("soakspec.commands.compare", "compare two runs (before/after) with confidence intervals", "the comparison"),
    "lint-claims": ("soakspec.commands.lint_claims", "check a review document against the claim boundary", "the findings"),
    "sim": ("soakspec.commands.sim", "run the embedded OpenAI-compatible inference simulator", "its output"),
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
    for name, (module, help_text, _) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the traceback of an internal error (a bug)")
        if only is None or only == name:
            mod = importlib.import_module(module)
            getattr(mod, "configure_" + name.replace("-", "_"), getattr(mod, "configure", None))(p)
    parser.commands = sub.choices  # type: ignore[attr-defined]  # each command's parser: it reports what it did not recognize
    return parser


def _closest(word: str, choices) -> str | None:
    """The one of `choices` closest to `word` (a typo of it), or None."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return close[0] if close else None


def _unrecognized(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """argparse's "unrecognized arguments" message, with the closest option of the command for
    an option it does not know (`--fromat` -> `--format`)."""
    options = [s for a in parser._actions for s in a.option_strings]
    hints = []
    for w in extras:
        name = w.split("=", 1)[0]
        close = _closest(name, options) if name.startswith("--") else None
        if close:
            hints.append(f"{name}: did you mean {close}?")
    return f"unrecognized arguments: {' '.join(extras)}" + (f" ({'; '.join(hints)})" if hints else "")


def _unknown_command(argv: list[str]) -> str | None:
    """The first word of argv that stands where the command goes and is none, with a suggestion."""
    for a in argv:
        if a in COMMANDS:
            return None
        if not a.startswith("-"):
            close = _closest(a, COMMANDS)
            return f"unknown command {a!r}{f' (did you mean {close}?)' if close else ''}; the commands are {', '.join(COMMANDS)}"
    return None


READS_EVIDENCE = frozenset({"gate", "report", "verify", "combine", "compare"})  # long reads reported on stderr


def _command_from_argv(argv: list[str]) -> str | None:
    for a in argv:
        if a in COMMANDS:
            return a
        if not a.startswith("-"):
            return None
    return None


class StdoutRefused(OSError):
    """stdout refused a command's output (a full disk, `> /dev/full`; EIO; a quota). Not a bug
    of soakspec, and not a result: raised in place of the OSError, so that main can tell it
    from an OSError anywhere else. Still an OSError (same errno), so code that survives a
    failing stdout on purpose (the simulator's trace log) goes on doing so."""

    def __init__(self, error: OSError):
        super().__init__(error.errno, error.strerror or str(error))


class _GuardedStdout:
    """sys.stdout while a command runs: a write or flush that fails raises `StdoutRefused`.
    BrokenPipeError passes as it is: the reader left, which main does not count as a failure."""

    def __init__(self, inner):
        self._inner = inner if inner is not None else _ClosedStdout()

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def write(self, text: str) -> int:
        with _refused_as_error():
            try:
                return self._inner.write(text)
            except UnicodeEncodeError:
                # text the encoding has no bytes for -- a lone surrogate from a server (`\ud800`,
                # kept in evidence as its JSON escape), anything beyond a narrow locale -- is
                # written as its escape, as the reports show it, not an internal error
                enc = getattr(self._inner, "encoding", None) or "utf-8"
                return self._inner.write(text.encode(enc, "backslashreplace").decode(enc))

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        with _refused_as_error():
            self._inner.flush()


class _BestEffortStderr:
    """sys.stderr while `main` runs: a write or flush that fails (the disk under `2> run.log` full,
    `2>&1 | tee` whose tee died, a terminal gone) is dropped. stderr carries progress and
    messages, never the result (stdout and the evidence do): a progress line it refused killed a
    soak before its first request, and an error line it refused let the exception escape `main`,
    so Python exited 1, a failed gate's code, for a usage error or an abort."""

    def __init__(self, inner):
        self._inner = inner if inner is not None else _ClosedStdout()  # `2>&-`: Python's sys.stderr is None

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def write(self, text: str) -> int:
        try:
            return self._inner.write(text)
        except (OSError, ValueError):  # ValueError: the stream was closed under us
            return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._inner.flush()
        except (OSError, ValueError):
            pass


class _ClosedStdout:
    """sys.stdout (or sys.stderr) of a soakspec started with it closed (`>&-`: Python sets it to
    None): every write is refused as a full disk's is (stdout: `StdoutRefused`; stderr: dropped),
    never an AttributeError said as a bug."""

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "stdout is closed")

    def flush(self) -> None:
        """Nothing is buffered: every write was refused."""

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        raise OSError(errno.EBADF, "stdout is closed")


def _occupy_closed_std_fds() -> None:
    """A closed fd 0, 1 or 2 (`soakspec gate DIR >&-`) opened onto /dev/null: otherwise the first
    file soakspec opens (the run's lock, an evidence file) takes that number, and a process it
    starts (the server, the reaper) inherits it as its stdout and writes into the evidence."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            new = os.open(os.devnull, os.O_RDWR)
            if new != fd:
                os.dup2(new, fd)
                os.close(new)


@contextlib.contextmanager
def _refused_as_error():
    """An OSError from stdout as `StdoutRefused`; BrokenPipeError as it is (see `_GuardedStdout`)."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as e:
        raise StdoutRefused(e) from e


def _discard_stdout() -> None:
    """Point stdout's file descriptor at /dev/null. What stdout refused is still in its buffer,
    and the interpreter flushes it at exit: it would fail again there, print "Exception
    ignored" and exit 120 in place of the code main returns (the recipe of Python's docs,
    signal module, "Note on SIGPIPE")."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a test's capture): nothing to flush at exit
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


class Terminated(BaseException):
    """SIGTERM or SIGHUP while a command runs: it stops as Ctrl-C stops it (one line, exit
    ABORTED), where the default action killed it with no word and exit 143 or 129, codes the
    contract does not have. A BaseException, as KeyboardInterrupt is: no `except Exception`
    on the way swallows it."""


class Interrupted(KeyboardInterrupt):
    """SIGINT while a command runs, as `_Signals` raises it: a KeyboardInterrupt (whatever
    catches Ctrl-C catches it), of its own type because CPython (3.11) marks a plain one that
    escapes an `exec` of a string -- a dataclass being made as a module is imported -- as
    unhandled, and then dies by SIGINT at exit (exit 130) after `main` caught it and said
    "interrupted"."""


class _Signals:
    """The handler of SIGINT, SIGTERM and SIGHUP in `main`. While the command line is parsed and
    the command's modules imported (numpy's C extension among them), a signal is held, not
    raised: a KeyboardInterrupt raised inside an import printed the import machinery's
    traceback and died by SIGINT (exit 130), and one cut into numpy's initialization could
    crash the interpreter at exit (SIGSEGV). `release` raises a held one where `main` catches it."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.holding = True
        self.held: int | None = None

    def __call__(self, signum: int, frame) -> None:
        if self.holding:
            self.held = self.held or signum
            return
        self._raise(signum)

    @staticmethod
    def _raise(signum: int) -> None:
        if signum == signal.SIGINT:
            raise Interrupted
        raise Terminated(signal.Signals(signum).name)

    def release(self) -> None:
        self.holding = False
        if self.held is not None:
            self._raise(self.held)

    def install(self) -> dict:
        """Install for the three signals; their old handlers (none where signals cannot be
        handled: a thread that is not the main one)."""
        old = {}
        try:
            for sig in self.SIGNALS:
                old[sig] = signal.signal(sig, self)
        except ValueError:  # not the main thread: signals keep what they had
            pass
        return old


@contextlib.contextmanager
def _installed(signals: _Signals | None):
    """`signals` as the handler of SIGINT, SIGTERM and SIGHUP while `main` runs; the old
    handlers back after."""
    old = signals.install() if signals is not None else {}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _occupy_closed_std_fds()
    command = _command_from_argv(argv)
    # `sim` keeps the signals' defaults until its own receiver takes them: it is a server the
    # runner stops with SIGTERM, and reads its death by that signal as such
    signals = _Signals() if command != "sim" else None
    with _installed(signals), contextlib.redirect_stderr(_BestEffortStderr(sys.stderr)):
        # Configure only the command being run: keeps start-up fast and imports minimal.
        parser = build_parser(only=command or "")
        unknown = _unknown_command(argv)
        if unknown is not None:
            parser.error(unknown)
        args, extras = parser.parse_known_args(argv)
        if extras:  # said by the command's parser, with its usage (not `soakspec`'s), and what was meant
            said_by = parser.commands.get(args.command, parser) if args.command else parser
            said_by.error(_unrecognized(said_by, extras))
        if not args.command:
            parser.print_help(sys.stderr)
            return ExitCode.USAGE
        heap.limit_retention()  # large temporaries (the judge's, the load's) go back to the system when freed
        module = importlib.import_module(COMMANDS[args.command][0])
        fn = getattr(module, "main_" + args.command.replace("-", "_"), getattr(module, "main", None))
        code: ExitCode | None = None
        try:
            if signals is not None:
                signals.release()  # one that came while starting: raised here, where it is caught
            # minutes for a day-long soak's evidence: say how far a read has got
            with (
                contextlib.redirect_stdout(_GuardedStdout(sys.stdout)),
                reporting(sys.stderr, args.command) if args.command in READS_EVIDENCE else contextlib.nullcontext(),
            ):
                code = ExitCode(int(fn(args)))
                sys.stdout.flush()  # output still buffered fails here, where it is reported, not at exit
            return ExitCode(code)
        except StdoutRefused as e:
            # ABORTED, whatever the command decided: its result did not reach the caller whole, and
            # a gate's "pass" must not stand for a verdict nobody received
            _discard_stdout()
            what = COMMANDS[args.command][2]
            print(f"soakspec {args.command}: cannot write {what} to stdout: {e.strerror} (stdout holds at most part of it)", file=sys.stderr)
            return ExitCode.ABORTED
        except UsageError as e:
            print(f"soakspec {args.command}: error: {e}", file=sys.stderr)
            return ExitCode.USAGE
        except KeyboardInterrupt:
            print(f"soakspec {args.command}: interrupted", file=sys.stderr)
            return ExitCode.ABORTED
        except Terminated as e:
            print(f"soakspec {args.command}: terminated ({e})", file=sys.stderr)
            return ExitCode.ABORTED
        except BrokenPipeError:  # the reader closed the pipe (`| head`)
            _discard_stdout()
            # the command's own code once it had finished; cut off before it did, its output (a
            # verdict, a report) was not delivered whole, which is no pass (`set -o pipefail` CI
            # took 0 for `gate DIR | head` of a failed gate)
            return ExitCode(ExitCode.ABORTED if code is None else code)
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


def entry() -> int:
    """The `soakspec` program (console script, `python -m soakspec`): `main`, then SIGINT,
    SIGTERM and SIGHUP ignored on the way out. The command has decided its exit code by then:
    a Ctrl-C still arriving (one held down since `run` was interrupted) or a second SIGTERM must
    not turn it into a death by that signal (exit 130 or 143, not the command's 4). Tests call
    `main` in-process, keeping Ctrl-C."""
    code = main()
    for sig in _Signals.SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(entry())
