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


NCCL_LABEL = 'label = "NCCL 2.26.2, NCCL_IB_DISABLE=1, NCCL_P2P_DISABLE=1"'
NCCL_ENV = 'require_env = ["NCCL_IB_DISABLE", "NCCL_P2P_DISABLE"]'


@pytest.mark.parametrize("edit", [
    # nccl run with P2P left on, its runtime block asking for less
    lambda t: t.replace('    NCCL_P2P_DISABLE = "1"\n', "").replace(NCCL_ENV, 'require_env = ["NCCL_IB_DISABLE"]')
                .replace(NCCL_LABEL, 'label = "NCCL 2.26.2, NCCL_IB_DISABLE=1"'),
    # another model revision declared and recorded (model_provenance compares recorded values)
    lambda t: t.replace('  revision = "604d5664dddd88a0433dbae533b7fe9472482de0"\n', ""),
], ids=["backend", "model"])
def test_children_whose_specs_differ_beyond_workloads_and_gate_do_not_pass(spec, tmp_path, capsys, edit):
    # one child ran a spec whose nccl backend (or model block) differs: combine PASSED (same
    # workloads and gate) and wrote an evidence directory judged with the first child's spec,
    # whose own `gate` then FAILED (runtime_boundary_specific, provenance) -- or the other way
    other = spec_from_text(edit(SEED.read_text()), "dsv2lite.soak")
    assert other.sha256 != spec.sha256 and other.workloads == spec.workloads and other.gate == spec.gate
    a = EvidenceBuilder(spec, only=("host-staged",), run_id="A", t0=1_747_000_000.0).write(tmp_path / "a")
    b = EvidenceBuilder(other, only=("nccl",), run_id="B", t0=1_747_001_000.0).write(tmp_path / "b")
    out = tmp_path / "out"
    code, cap = run_combine([a, b], out, capsys)
    doc = json.loads((out / "combined.json").read_text())
    same = next(c for c in doc["checks"] if c["name"] == "same_workload")
    assert code == 1 and same["status"] == "fail", cap.out
    assert f"differ from {a} in {b}" in same["message"]
    assert not (out / "manifest.json").exists()


def test_a_child_run_without_preflight_is_said_by_the_combined_run(spec, tmp_path, capsys):
    # the nccl child ran `--no-preflight`: its own gate notes it, the combined directory's
    # manifest took the first child's `preflight` and its gate and report said nothing
    a = EvidenceBuilder(spec, only=("host-staged",), run_id="A", t0=1_747_000_000.0)
    a.manifest["preflight"] = True
    b = EvidenceBuilder(spec, only=("nccl",), run_id="B", t0=1_747_001_000.0)
    b.manifest["preflight"] = False
    dirs = [a.write(tmp_path / "a"), b.write(tmp_path / "b")]
    assert main(["gate", str(dirs[1])]) == 0
    assert "pre-flight skipped" in capsys.readouterr().out
    out = tmp_path / "out"
    code, cap = run_combine(dirs, out, capsys)
    assert code == 0, cap.out
    assert json.loads((out / "manifest.json").read_text())["preflight"] is False
    assert main(["gate", str(out)]) == 0
    assert "pre-flight skipped" in capsys.readouterr().out


def test_a_rehearsal_beside_a_real_run_does_not_combine_into_one_run(tmp_path, capsys):
    # with allow_rehearsal = true both children pass: combine PASSED (exit 0) a real host-staged
    # run and a rehearsal of nccl against the simulator, and wrote one directory marked a
    # rehearsal throughout, whose gate FAILED (completed_run: host-staged recorded as a launch in
    # a rehearsal, its log traces unmatched)
    text = SEED.read_text().replace("gate {\n", "gate {\n  allow_rehearsal = true\n")
    sp = spec_from_text(text, "dsv2lite.soak")
    a = EvidenceBuilder(sp, only=("host-staged",), run_id="A", t0=1_747_000_000.0).write(tmp_path / "a")
    b = EvidenceBuilder(sp, only=("nccl",), run_id="B", t0=1_747_001_000.0, rehearsal=True).write(tmp_path / "b")
    out = tmp_path / "out"
    code, cap = run_combine([a, b], out, capsys)
    assert code == 1, cap.out
    doc = json.loads((out / "combined.json").read_text())
    same = next(c for c in doc["checks"] if c["name"] == "same_workload")
    assert same["status"] == "fail" and f"a rehearsal beside a real run: {b} is a rehearsal, {a} is not" in same["message"]
    assert not (out / "manifest.json").exists()
    # two rehearsals still combine, and the combined directory gates as combine judged
    c = EvidenceBuilder(sp, only=("host-staged",), run_id="C", t0=1_747_000_000.0, rehearsal=True).write(tmp_path / "c")
    out2 = tmp_path / "out2"
    code, cap = run_combine([c, b], out2, capsys)
    assert code == 0, cap.out
    assert main(["gate", str(out2)]) == 0


def _gpus(name: str) -> dict:
    return {"available": True, "cuda_version": "12.8", "driver_version": "570.86", "cuda_visible_devices": None,
            "devices": [{"index": i, "name": name, "uuid_sha256": str(i) * 64, "memory_total": 80 << 30} for i in (0, 1)]}


def test_children_on_different_hardware_are_each_shown_by_the_combined_report(spec, tmp_path, capsys):
    # host-staged ran on H100s, nccl on A100s: the combined report's hardware line said
    # '2x NVIDIA H100' (the first child's) for both, and the host line the first child's CPU
    a = EvidenceBuilder(spec, only=("host-staged",), run_id="A", t0=1_747_000_000.0)
    a.manifest["gpus"] = _gpus("NVIDIA H100")
    b = EvidenceBuilder(spec, only=("nccl",), run_id="B", t0=1_747_001_000.0)
    b.manifest["gpus"] = _gpus("NVIDIA A100")
    b.manifest["host"] = dict(b.manifest["host"], cpu_model="EPYC", cpu_cores=64)
    out = tmp_path / "out"
    code, cap = run_combine([a.write(tmp_path / "a"), b.write(tmp_path / "b")], out, capsys)
    assert code == 0, cap.out
    assert main(["report", str(out)]) == 0
    md = capsys.readouterr().out
    assert ("- hardware: host-staged: 2x NVIDIA H100, CUDA 12.8, driver 570.86; "
            "nccl: 2x NVIDIA A100, CUDA 12.8, driver 570.86") in md, md
    assert "host-staged: cpu, 2 cores; nccl: EPYC, 64 cores" in md
    # one machine: one line, as before
    c = EvidenceBuilder(spec, only=("nccl",), run_id="C", t0=1_747_001_000.0)
    c.manifest["gpus"] = _gpus("NVIDIA H100")
    out2 = tmp_path / "out2"
    assert run_combine([tmp_path / "a", c.write(tmp_path / "c")], out2, capsys)[0] == 0
    assert main(["report", str(out2)]) == 0
    assert "- hardware: 2x NVIDIA H100, CUDA 12.8, driver 570.86\n" in capsys.readouterr().out


def test_a_before_after_series_may_change_a_backends_declaration(spec, tmp_path, capsys):
    # no directory is written for a series, so nothing is judged with the first child's spec:
    # the change between its runs may be the backend's env (here NCCL_P2P_DISABLE dropped)
    other = spec_from_text(SEED.read_text().replace('    NCCL_P2P_DISABLE = "1"\n', "").replace(NCCL_ENV, 'require_env = ["NCCL_IB_DISABLE"]')
                           .replace(NCCL_LABEL, 'label = "NCCL 2.26.2, NCCL_IB_DISABLE=1"'), "dsv2lite.soak")
    a = EvidenceBuilder(spec, run_id="before", t0=1_747_000_000.0).write(tmp_path / "before")
    b = EvidenceBuilder(other, run_id="after", t0=1_747_010_000.0).write(tmp_path / "after")
    out = tmp_path / "out"
    code, cap = run_combine([a, b], out, capsys)
    assert code == 0, cap.out
    assert "same_workload — specs differ in text but have identical workloads and gate (a before/after series)" in cap.out
