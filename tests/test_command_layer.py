"""The commands are the top of the pipeline: `soakspec.cli` and `soakspec.commands` parse the
command line and call the layers below, and no module below imports them back (not even
inside a function). What a lower layer needs of the CLI contract -- exit codes and
`UsageError` -- lives in `soakspec.exitcodes`."""

from __future__ import annotations

import ast
import pathlib

import pytest
from test_lang_layers import _imports

import soakspec

ROOT = pathlib.Path(soakspec.__file__).resolve().parent
TOP = ("soakspec.cli", "soakspec.commands", "soakspec.__main__")
BELOW = sorted(p for p in ROOT.rglob("*.py")
               if p.parent.name != "commands" and p.name not in ("cli.py", "__main__.py"))  # fmt: skip


def _upward(text: str) -> list[str]:
    return [f"{node.lineno} imports {name}" for node, name in _imports(ast.parse(text))
            if any(name == t or name.startswith(t + ".") for t in TOP)]


def test_there_are_modules_below_the_commands():
    assert len(BELOW) >= 50 and ROOT / "claims" / "adapters.py" in BELOW and ROOT / "judge" / "cli_support.py" in BELOW


@pytest.mark.parametrize("path", BELOW, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_below_the_commands_imports_them(path):
    assert _upward(path.read_text()) == []


def test_the_scan_catches_an_import_of_the_commands():
    """The rule itself: a function-local import of the CLI or a command is caught, in each form."""
    for text in ("def f():\n    from soakspec.cli import UsageError\n", "import soakspec.commands.gate\n",
                 "from soakspec import cli\n", "from soakspec.commands.gate import spec_for\n"):
        assert _upward(text), text
    assert _upward("from soakspec.exitcodes import UsageError\n") == []
