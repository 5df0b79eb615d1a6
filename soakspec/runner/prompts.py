"""Prompts from a workload's prompt file (read once per file and run)."""

from __future__ import annotations

import json
from pathlib import Path


class RunAborted(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def load_prompts(path: Path | str) -> tuple[str, ...]:
    """Prompts from a file: JSONL (`prompt`/`text` field, or ShareGPT `conversations`), or
    one prompt per non-empty line of plain text."""
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            if line.startswith("{"):
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError:
                    out.append(line)
                    continue
                if isinstance(obj.get("prompt"), str):
                    out.append(obj["prompt"])
                elif isinstance(obj.get("text"), str):
                    out.append(obj["text"])
                elif isinstance(obj.get("conversations"), list) and obj["conversations"]:
                    first = obj["conversations"][0]
                    out.append(str(first.get("value") or first.get("content") or ""))
            else:
                out.append(line)
    if not out:
        raise RunAborted(f"prompt file {path} has no prompts")
    return tuple(out)


class PromptFiles:
    """Each prompt file read once, the first time a level needs it."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[str, ...]] = {}

    def __call__(self, path: str | None) -> tuple[str, ...]:
        if path is None:
            return ()
        if path not in self._cache:
            self._cache[path] = load_prompts(path)
        return self._cache[path]


__all__ = ["PromptFiles", "RunAborted", "load_prompts"]
