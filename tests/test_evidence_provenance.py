"""Provenance: git state of a real temp repo, model fingerprints, server binary hashes, host."""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest

from soakspec.evidence.io import sha256_file
from soakspec.evidence.provenance import binary_sha256, git_state, host_info, model_fingerprint, model_revision


def _git(repo, *args):
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t", GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout


@pytest.fixture
def repo(tmp_path):
    r = tmp_path / "repo"
    r.mkdir()
    _git(r, "init", "-q")
    (r / "server.py").write_text("print('v1')\n")
    _git(r, "add", "server.py")
    _git(r, "commit", "-q", "-m", "v1")
    return r


def test_git_state_clean_then_dirty(repo):
    head = _git(repo, "rev-parse", "HEAD").strip()
    assert git_state(repo) == {"commit": head, "dirty": False, "reason": None}
    (repo / "evidence.json").write_text("{}")  # untracked files (e.g. evidence) do not count
    assert git_state(repo)["dirty"] is False
    (repo / "server.py").write_text("print('v2')\n")
    assert git_state(repo) == {"commit": head, "dirty": True, "reason": None}


def test_git_state_outside_a_repository_has_a_reason(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    s = git_state(plain)
    assert s["commit"] is None and s["dirty"] is None and "not a git repository" in s["reason"]
    s = git_state(tmp_path / "missing")
    assert s["commit"] is None and "not a directory" in s["reason"]


def test_git_state_of_an_empty_repository(tmp_path):
    r = tmp_path / "empty"
    r.mkdir()
    _git(r, "init", "-q")
    s = git_state(r)
    assert s["commit"] is None and s["reason"]


def _model_dir(d):
    d.mkdir(parents=True)
    (d / "config.json").write_text('{"hidden_size": 8}')
    (d / "tokenizer.json").write_text('{"vocab": {}}')
    (d / "tokenizer_config.json").write_text("{}")
    (d / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    (d / "model-00001-of-00002.safetensors").write_bytes(b"\0" * 1024)  # weights: never hashed
    (d / "README.md").write_text("readme")
    return d


def test_model_fingerprint_covers_config_and_tokenizer_never_weights(tmp_path):
    d = _model_dir(tmp_path / "m")
    fp = model_fingerprint(d)
    assert sorted(fp["files"]) == ["config.json", "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json"]
    expected = hashlib.sha256("".join(f"{n}\0{fp['files'][n]}\n" for n in sorted(fp["files"])).encode()).hexdigest()
    assert fp["sha256"] == expected and fp["reason"] is None
    (d / "model-00001-of-00002.safetensors").write_bytes(b"\1" * 1024)
    assert model_fingerprint(d)["sha256"] == fp["sha256"]
    (d / "tokenizer_config.json").write_text('{"eos": 2}')
    assert model_fingerprint(d)["sha256"] != fp["sha256"]


def test_model_fingerprint_missing_or_empty(tmp_path):
    assert model_fingerprint(tmp_path / "nope")["sha256"] is None
    (tmp_path / "empty").mkdir()
    fp = model_fingerprint(tmp_path / "empty")
    assert fp["sha256"] is None and "no config or tokenizer" in fp["reason"]


def test_model_revision_from_a_hub_snapshot_path(tmp_path):
    rev = "0123456789abcdef0123456789abcdef01234567"
    assert model_revision(f"/hf/models--org--m/snapshots/{rev}") == rev
    assert model_revision(tmp_path) is None


def test_binary_sha256_by_path_and_by_name_on_path(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "my-server"
    exe.write_bytes(b"#!/bin/sh\necho hi\n")
    exe.chmod(0o755)
    by_path = binary_sha256([str(exe), "--port", "1"])
    assert by_path["sha256"] == sha256_file(exe)
    rel = binary_sha256(["./bin/my-server"], cwd=tmp_path)
    assert rel["sha256"] == by_path["sha256"]
    by_name = binary_sha256(["my-server"], env={"PATH": str(bindir)})
    assert by_name["sha256"] == by_path["sha256"] and by_name["path"] == str(exe)
    assert binary_sha256(["no-such-binary-xyz"], env={"PATH": str(bindir)}) is None
    assert binary_sha256([]) is None


def test_host_info_fields():
    h = host_info()
    assert set(h) == {"hostname", "cpu_model", "cpu_cores", "memory_total", "kernel", "os", "python_version", "soakspec_version"}
    assert h["memory_total"] > 0 and h["cpu_cores"] >= 1 and h["python_version"].startswith("3.")
