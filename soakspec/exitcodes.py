"""Process exit codes, in one place (the CLI contract; see README "Exit codes")."""

from __future__ import annotations

import enum


class UsageError(Exception):
    """A command-line mistake: printed as one line, exit 2 (`ExitCode.USAGE`). Defined here, the
    bottom of the CLI contract, so that layers below the commands (the claims linter re-judging
    evidence, the judge's command helpers) can raise it without importing the CLI."""


class ExitCode(enum.IntEnum):
    """What `soakspec` returns to its caller.

    OK            -- the command succeeded; for `run`/`gate`, the gate passed.
    GATE_FAILED   -- the evidence was judged and a `require` rule failed
                     (`verify`: an artifact does not match its hash; `lint-claims`: findings).
    USAGE         -- bad command line or an invalid spec; nothing ran.
    INCONCLUSIVE  -- the evidence is incomplete or has too few samples to judge.
    ABORTED       -- the run was aborted: interrupt, a backend could not start or died;
                     an internal error (a bug); or stdout refused the command's output (a
                     full disk): whatever the command decided did not reach its caller, so
                     no other code may stand for it (a PASS nobody received is not a pass).
                     A reader that closes the pipe early (`| head`) is not a failure: the
                     command's own code, or OK when it was cut off before it finished.
    """

    OK = 0
    GATE_FAILED = 1
    USAGE = 2
    INCONCLUSIVE = 3
    ABORTED = 4
