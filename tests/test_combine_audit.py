"""`soakspec combine` audited as a user meets it: one run given twice, children whose specs
differ beyond their workloads and gate."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from soakspec.cli import main
from soakspec.judge.testing import EvidenceBuilder, spec_from_text

SEED = Path(__file__).resolve().parents[1] / "specs" / "dsv2lite.soak"


@pytest.fixture(scope="module")
def spec():
    return spec_from_text(SEED.read_text(), "dsv2lite.soak")


def run_combine(dirs, out, capsys, *extra):
    code = main(["combine", *map(str, dirs), "--out", str(out), *extra])
    return code, capsys.readouterr()


@pytest.mark.parametrize("spelling", ["slash", "symlink", "copy"])
def test_one_run_given_twice_is_a_usage_error_not_a_before_after_series(spec, tmp_path, capsys, spelling):
    # `combine run run/` (or a symlink to it, or a copy of it) passed as a before/after series of
    # the run against itself, exit 0: only the same spelling of a directory was refused
    run = EvidenceBuilder(spec, run_id="run-both").write(tmp_path / "run")
    if spelling == "slash":
        again = f"{run}/"
    elif spelling == "symlink":
        (tmp_path / "link").symlink_to(run)
        again = str(tmp_path / "link")
    else:
        again = str(shutil.copytree(run, tmp_path / "copy"))
    out = tmp_path / "out"
    code, cap = run_combine([run, again], out, capsys)
    assert code == 2, cap.out
    assert "given twice" in cap.err
    assert not out.exists()
