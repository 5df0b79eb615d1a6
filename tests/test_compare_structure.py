"""`soakspec compare` stays a package a newcomer can change: modules by responsibility, one way
down (soakspec/compare/__init__.py names them), none grown back into the 1960-line module it was.

The line budget is 600 a module: the largest part that belongs together is the statistics
(intervals.py, about 550 lines, half of them the design notes the numerics implement); 600
leaves it room for another paragraph or function, not for another responsibility, and is under
a third of the single module compare was."""

from __future__ import annotations

import ast
import pathlib

import pytest

import soakspec.compare

COMPARE = pathlib.Path(soakspec.compare.__file__).parent
MAX_LINES = 600
# each module imports only the soakspec.compare modules before it (no cycles, one way down)
ORDER = ("intervals", "metrics", "sweep", "rules", "samples", "matching", "rows", "judging", "__init__", "render")
# the statistics are pure numerics: of soakspec, only the judge's one percentile and its
# sample-size rule (soakspec.judge.stats, itself pure), never evidence, records or the gate
NUMERICS_MAY_IMPORT = {"soakspec.judge.stats"}
# imports inside a function, as they were before the split (the judge's gate modules); no other
LOCAL_IMPORTS = {("judging", "_client_blocked"), ("judging", "_lag_decided"), ("samples", "_client_health")}


def _modules() -> list[pathlib.Path]:
    return sorted(COMPARE.glob("*.py"))


def _imported(tree: ast.AST) -> set[str]:
    """The soakspec modules a module imports at its top (`from soakspec.judge import stats` is
    soakspec.judge.stats)."""
    out: set[str] = set()
    for n in tree.body:  # type: ignore[attr-defined]
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names if a.name.startswith("soakspec")}
        elif isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("soakspec"):
            if n.module in ("soakspec.judge", "soakspec.compare", "soakspec"):
                out |= {f"{n.module}.{a.name}" for a in n.names} if n.module != "soakspec.compare" else {n.module}
            else:
                out.add(n.module)
    return out


def _sibling(module: str) -> str | None:
    if module == "soakspec.compare":
        return "__init__"
    if module.startswith("soakspec.compare."):
        return module.split(".")[2]
    return None


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.name)
def test_no_module_of_compare_exceeds_the_line_budget(path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{path.name}: {n} lines (budget {MAX_LINES}): split it by responsibility"


def test_every_module_has_its_place_in_the_order():
    """A new module is placed among the others (ORDER), so that its imports are checked."""
    assert {p.stem for p in _modules()} == set(ORDER)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.name)
def test_compare_modules_import_one_way_down_and_at_the_top(path):
    tree = ast.parse(path.read_text())
    mine = ORDER.index(path.stem)
    later = sorted(s for m in _imported(tree) if (s := _sibling(m)) is not None and ORDER.index(s) >= mine)
    assert not later, f"{path.name} imports {later}, which come after it in {ORDER}"
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            local = [n for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))]
            assert not local or (path.stem, fn.name) in LOCAL_IMPORTS, f"{path.name}: {fn.name} imports inside the function"


def test_the_statistics_know_nothing_of_evidence_or_the_judge():
    tree = ast.parse((COMPARE / "intervals.py").read_text())
    assert _imported(tree) <= NUMERICS_MAY_IMPORT, _imported(tree) - NUMERICS_MAY_IMPORT


def test_compare_and_its_result_are_the_package_api():
    """`soakspec.compare.compare` and `Comparison` live in the package itself; every name of
    `__all__` is importable from it."""
    assert soakspec.compare.compare.__module__ == "soakspec.compare"
    assert soakspec.compare.Comparison.__module__ == "soakspec.compare"
    assert [n for n in soakspec.compare.__all__ if not hasattr(soakspec.compare, n)] == []
