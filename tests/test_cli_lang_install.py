"""The built wheel works outside the source tree: it carries its grammar.

Builds a wheel from a copy of the sources (offline: no build isolation, no index), installs it
with `--no-deps` into a fresh venv, and runs `soakspec check` / `plan` there from an
unrelated directory.

Dependencies: a venv made from /work/venv's python with `--system-site-packages` sees the
*base* interpreter's site-packages, not /work/venv's, so lark & co. would be missing. Instead
the fresh venv gets them through PYTHONPATH: a directory of symlinks to everything in the
test venv's site-packages except soakspec itself (its editable-install hook and metadata), so
the only soakspec the child can import is the installed wheel.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DSV2LITE = ROOT / "specs" / "dsv2lite.soak"

OFFLINE = {
    "PIP_NO_INDEX": "1",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "PIP_NO_INPUT": "1",
    "PYTHONNOUSERSITE": "1",
}


def _run(cmd, *, env=None, cwd=None, timeout=120) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    assert r.returncode == 0, f"{cmd}\n{r.stdout}\n{r.stderr}"
    return r


def _deps_dir(tmp: pathlib.Path) -> pathlib.Path:
    site = pathlib.Path(sysconfig.get_paths()["purelib"])
    deps = tmp / "deps"
    deps.mkdir()
    for entry in site.iterdir():
        name = entry.name
        if name.startswith(("soakspec", "_editable_impl_soakspec", "__editable__")) or name.endswith(".pth"):
            continue
        (deps / name).symlink_to(entry)
    return deps


@pytest.mark.slow
def test_wheel_install_checks_dsv2lite_outside_the_tree(tmp_path):
    if shutil.which("pip", path=str(pathlib.Path(sys.executable).parent)) is None:
        pytest.skip("the test venv has no pip")
    env = {**os.environ, **OFFLINE}
    env.pop("PYTHONPATH", None)

    # 1. a wheel from a clean copy of the sources (nothing is written into the checkout)
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".hypothesis")
    for name in ("soakspec", "grammar"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", dist, src], env=env)
    wheels = list(dist.glob("soakspec-*.whl"))
    assert len(wheels) == 1

    # 2. a fresh venv with only the wheel (pip runs from the test venv, aimed at the new one)
    venv = tmp_path / "v"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], env=env)
    py = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-index", "-q", wheels[0]], env=env)

    # 3. run it from an unrelated directory, the dependencies (and nothing of soakspec) on the path
    child_env = {**env, "PYTHONPATH": str(_deps_dir(tmp_path))}
    work = tmp_path / "elsewhere"
    work.mkdir()
    probe = (
        "import importlib.resources, json, pathlib, sys, soakspec, soakspec.lang.parser as p\n"
        "res = importlib.resources.files('soakspec').joinpath('_grammar/soak.lark')\n"
        "fallback = pathlib.Path(p.__file__).resolve().parents[2] / 'grammar' / 'soak.lark'\n"
        "print(json.dumps({'file': soakspec.__file__, 'packaged': res.is_file(),\n"
        "                  'same': res.is_file() and p._grammar_text() == res.read_text(),\n"
        "                  'fallback_exists': fallback.exists(), 'path': sys.path}))\n"
    )
    info = json.loads(_run([py, "-c", probe], env=child_env, cwd=work).stdout)
    assert pathlib.Path(info["file"]).resolve().is_relative_to(venv.resolve()), info["file"]
    assert info["packaged"] is True and info["same"] is True
    assert info["fallback_exists"] is False  # the grammar can only have come from the wheel
    assert str(ROOT) not in info["path"]

    soakspec = venv / "bin" / "soakspec"
    r = _run([soakspec, "check", DSV2LITE], env=child_env, cwd=work)
    assert r.stdout.strip() == f"{DSV2LITE}: ok"
    plan = json.loads(_run([soakspec, "plan", "--format", "json", DSV2LITE], env=child_env, cwd=work).stdout)
    assert plan["bucket_count"] == 8 and plan["est_wall_s"] == 504.0
    # a bad spec fails the same way as in the tree
    bad = ROOT / "tests" / "bad_specs" / "unknown_key.soak"
    r = subprocess.run([soakspec, "check", bad], capture_output=True, text=True, env=child_env, cwd=work, timeout=60)
    assert r.returncode == 2 and ":5:3: E101" in r.stdout and "Traceback" not in r.stdout + r.stderr
