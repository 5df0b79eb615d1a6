"""Prompt files at run time: nothing to read.

`check` reads and parses a workload's prompt file (`soakspec.lang.datasets`, in its named
format, with errors at the file's own line) and the plan's `RequestTemplate.prompts` carries
the prompts, so the runner acts on the plan alone and never re-reads (or guesses the format of)
a file that may have changed since. `PromptFiles` is kept for the driver's signature.
"""

from __future__ import annotations

from pathlib import Path


class RunAborted(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def load_prompts(path: Path | str) -> tuple[str, ...]:
    """A plain-text prompt file: one prompt per non-empty line (no format is guessed here;
    spec prompt files are read by `check`)."""
    with open(path, encoding="utf-8") as fh:
        out = tuple(line.rstrip("\r\n") for line in fh if line.strip())
    if not out:
        raise RunAborted(f"prompt file {path} has no prompts")
    return out


class PromptFiles:
    """The prompts of a template's file: always the plan's (`Shapes` takes them from the
    template), so this returns none and reads nothing."""

    def __call__(self, path: str | None) -> tuple[str, ...]:
        return ()


__all__ = ["PromptFiles", "RunAborted", "load_prompts"]
