"""The two test lanes: the README's test command runs the default lane (everything but `slow`),
and CI (`.ci/run`) runs that same command and then the slow lane, which must not be empty
(pytest exits 5 when a `-m` selects nothing, which would fail CI)."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _ci_pytest_commands() -> list[str]:
    lines = (REPO / ".ci" / "run").read_text().splitlines()
    return [line.strip().split(" || ")[0] for line in lines if "-m pytest" in line and not line.lstrip().startswith("#")]


def test_ci_runs_the_readme_test_command_and_then_the_slow_lane():
    readme = (REPO / "README.md").read_text()
    quick = re.search(r"Run the tests:\n\n```sh\n(.+)\n```", readme).group(1)
    readme_pytest = quick.rsplit("&& ", 1)[1]  # `.venv/bin/python -m pytest -q`
    assert _ci_pytest_commands() == [readme_pytest, f"{readme_pytest} -m slow"]


def test_the_default_lane_leaves_out_slow_tests():
    ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "-m 'not slow and not realserver'" in ini["addopts"]
    assert any(m.startswith("slow:") for m in ini["markers"])


def _slow_tests() -> list[str]:
    """Test functions marked `@pytest.mark.slow` (the decorator, as written in tests/)."""
    found = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                if any(ast.unparse(d) == "pytest.mark.slow" for d in node.decorator_list):
                    found.append(f"{path.name}::{node.name}")
    return found


def test_the_slow_lane_is_not_empty():
    """Read from the source rather than by a second collection (which imports every module
    again, seconds of the default lane)."""
    assert len(_slow_tests()) >= 5, _slow_tests()
