"""The language layer is the bottom of the pipeline: `soakspec.lang` imports nothing of
soakspec above it (only `soakspec.lang`, `soakspec.diagnostics`, `soakspec.units`,
`soakspec.lengths`, `soakspec.arrivals`, `soakspec.windows` and `soakspec.draws` -- leaves below it that the runner reads too, which
may not import the language), and no
module in it imports inside a function (its dependencies are all visible at the top)."""

from __future__ import annotations

import ast
import pathlib

import pytest

import soakspec.lang

LANG = pathlib.Path(soakspec.lang.__file__).resolve().parent
MODULES = sorted(LANG.rglob("*.py"))
LEAVES = ("soakspec.diagnostics", "soakspec.units", "soakspec.lengths", "soakspec.arrivals", "soakspec.windows", "soakspec.draws")
ALLOWED = ("soakspec.lang", *LEAVES)


def _imports(tree: ast.AST) -> list[tuple[ast.stmt, str]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node, node.module))
            if node.module == "soakspec":
                out += [(node, f"soakspec.{a.name}") for a in node.names]
    return out


def _is_allowed(name: str) -> bool:
    return not (name == "soakspec" or name.startswith("soakspec.")) or any(
        name == a or name.startswith(a + ".") for a in ALLOWED
    )


def test_there_are_modules_to_scan():
    assert len(MODULES) >= 10 and LANG / "check" / "__init__.py" in MODULES


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(LANG)))
def test_lang_imports_nothing_above_it(path):
    tree = ast.parse(path.read_text())
    bad = [f"{path.name}:{node.lineno} imports {name}" for node, name in _imports(tree) if not _is_allowed(name)]
    assert bad == []


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(LANG)))
def test_lang_has_no_function_local_imports(path):
    tree = ast.parse(path.read_text())
    local = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            local += [f"{path.name}:{n.lineno} in {fn.name}" for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert local == []


def test_the_scan_catches_an_upward_import():
    """The rule itself: an import of the evidence or sim layer is caught, in both forms."""
    for text in ("from soakspec.evidence.runtime import x", "import soakspec.sim.config", "from soakspec import plan"):
        assert not all(_is_allowed(name) for _, name in _imports(ast.parse(text))), text
    for text in ("from soakspec.lang import ast", "from soakspec.units import UNITS", "import re"):
        assert all(_is_allowed(name) for _, name in _imports(ast.parse(text))), text


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(LANG)))
def test_no_function_in_lang_is_longer_than_80_lines(path):
    tree = ast.parse(path.read_text())
    long = [
        f"{fn.name}: {fn.end_lineno - fn.lineno + 1} lines"
        for fn in ast.walk(tree)
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.end_lineno - fn.lineno + 1 > 80
    ]
    assert long == []


@pytest.mark.parametrize("leaf", LEAVES)
def test_the_leaves_import_nothing_of_soakspec(leaf):
    """Each module the language may read below it (`soakspec.arrivals`, where the runner and
    `check` place arrivals; `soakspec.windows`, where both cut buckets; ...) is a leaf: the
    language may read it because it reads no other soakspec module."""
    import importlib

    tree = ast.parse(pathlib.Path(importlib.import_module(leaf).__file__).read_text())
    assert [name for _, name in _imports(tree) if name == "soakspec" or name.startswith("soakspec.")] == []


def test_moved_definitions_keep_their_old_names():
    """evidence.runtime and sim.config still export what they did, now defined in lang."""
    from soakspec.evidence import runtime
    from soakspec.lang import runtime_label, simoptions
    from soakspec.sim import config

    assert runtime.is_generic_label is runtime_label.is_generic_label
    assert runtime.validate_log_regex is runtime_label.validate_log_regex
    assert config.SIM_OPTIONS is simoptions.SIM_OPTIONS and config.OPTIONS is simoptions.OPTIONS
    assert config.SIM_OPTIONS["ttft"] == "duration"
