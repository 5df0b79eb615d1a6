"""Signed evidence under attack (an audit of `run --sign` and `verify --allowed-signers`).

- A key with a passphrase and no ssh-agent holding it is a usage error before the run (a test
  signature is made first), saying to load it with ssh-add -- not a failure after the whole
  soak that says 'incorrect passphrase supplied'.
- A manifest.json.sig that is not a signature (empty, garbage, armored garbage, a symlink, a
  FIFO) fails `verify --allowed-signers` (exit 1) saying what is wrong with the file, not that
  "the signing key is not in" the allowed signers or that the evidence has no signature; an
  allowed-signers path that is a directory is "not a regular file", not "no such file".
- results.json and verdict.json are not signed: a verdict.json edited from FAIL to PASS (its
  manifest_sha256 kept) is re-judged FAIL by `gate`, and `verify` (signature valid, exit 0) and
  `gate` say that verdict.json is not signed, and `verify` names the run the signature is of.
- An allowed_signers file that lists the key for git first (namespaces="git", as a file shared
  with git's commit signing may) and for soakspec on a later line verifies (ssh-keygen's
  find-principals stops at the first line): every principal listed with the key is tried. A
  key allowed only for git, or a signature made for namespace git, is INVALID saying so.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from runner_support import new_marker, run_soakspec, sim_spec, wait_no_survivors
from soakspec.cli import main
from soakspec.evidence.signing import sign_manifest
from soakspec.judge.testing import EvidenceBuilder, small_spec

SSH_KEYGEN = shutil.which("ssh-keygen")
pytestmark = pytest.mark.skipif(SSH_KEYGEN is None, reason="ssh-keygen (OpenSSH) is not installed: signing cannot be tested")

SPEC = sim_spec(duration="1s", load="mode = closed\n    concurrency = [1]")


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def keygen(path: Path, passphrase: str = "") -> Path:
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", passphrase, "-C", "audit", "-f", str(path)], check=True, timeout=60)
    return path


@pytest.fixture(scope="module")
def signed(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(signed evidence, its key, an allowed_signers file naming the key as alice@example.org)."""
    d = tmp_path_factory.mktemp("signed")
    key = keygen(d / "id")
    (d / "allowed_signers").write_text(f"alice@example.org {(d / 'id.pub').read_text().strip()}\n")
    ev = EvidenceBuilder(small_spec()).write(d / "run")
    sign_manifest(ev, key)
    return ev, key, d / "allowed_signers"


def copy_of(signed, tmp_path: Path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(signed[0], out, symlinks=True)
    return out


@pytest.mark.parametrize("kind, says", [
    ("empty", "manifest.json.sig is empty: not an SSH signature"),
    ("garbage", "manifest.json.sig is not an SSH signature (it does not begin with -----BEGIN SSH SIGNATURE-----)"),
    ("armored", "manifest.json.sig is not a valid SSH signature (Couldn't"),
    ("symlink", "manifest.json.sig is not a regular file"),
    ("fifo", "manifest.json.sig is not a regular file"),
])
def test_a_signature_file_that_is_not_a_signature_says_what_it_is(signed, tmp_path, kind, says):
    ev = copy_of(signed, tmp_path)
    sig = ev / "manifest.json.sig"
    real = sig.read_bytes()
    sig.unlink()
    if kind == "empty":
        sig.write_bytes(b"")
    elif kind == "garbage":
        sig.write_bytes(bytes(range(256)) * 2)
    elif kind == "armored":
        sig.write_bytes(b"-----BEGIN SSH SIGNATURE-----\nAAAA\n-----END SSH SIGNATURE-----\n")
    elif kind == "symlink":
        (tmp_path / "real.sig").write_bytes(real)
        sig.symlink_to(tmp_path / "real.sig")
    else:
        os.mkfifo(sig)
    code, out, _ = cli("verify", str(ev), "--allowed-signers", str(signed[2]))
    first = out.splitlines()[0]
    assert code == 1 and first.startswith(f"signature: INVALID: {says}"), first
    assert "signing key is not in" not in first and "not signed" not in first


def test_allowed_signers_that_is_a_directory_is_not_a_regular_file(signed, tmp_path):
    code, _, err = cli("verify", str(signed[0]), "--allowed-signers", str(tmp_path))
    assert code == 2 and "not a regular file" in err and "no such file" not in err


def test_an_edited_verdict_is_re_judged_and_said_to_be_unsigned(tmp_path):
    key = keygen(tmp_path / "id")
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(f"alice@example.org {(tmp_path / 'id.pub').read_text().strip()}\n")
    ev = EvidenceBuilder(small_spec("require p50(ttft) < 1ms")).write(tmp_path / "run")  # a run that fails its gate
    sign_manifest(ev, key)
    assert cli("gate", str(ev), "--write")[0] == 1
    v = json.loads((ev / "verdict.json").read_text())
    run_id = json.loads((ev / "manifest.json").read_text())["run_id"]
    assert v["verdict"] == "FAIL"
    v["verdict"], v["exit_code"] = "PASS", 0  # forged, still bound to the manifest by its manifest_sha256
    v["rules"] = [r | {"status": "pass"} for r in v["rules"]]
    (ev / "verdict.json").write_text(json.dumps(v, indent=2, sort_keys=True) + "\n")
    code, out, _ = cli("verify", str(ev), "--allowed-signers", str(allowed))
    first = out.splitlines()[0]
    assert code == 0, out  # the signature and every artifact hold: only the unsigned conclusion was edited
    assert first.startswith("signature: signed by alice@example.org (ED25519 key SHA256:")
    assert f"run {run_id}: manifest.json and every artifact it hashes" in first
    assert "results.json and verdict.json are not signed" in first
    doc = json.loads(cli("verify", str(ev), "--format", "json", "--allowed-signers", str(allowed))[1])
    assert doc["signature"]["run_id"] == run_id and doc["signature"]["not_covered"] == ["results.json", "verdict.json"]
    code, out, _ = cli("gate", str(ev))
    assert code == 1 and "the run's own verdict.json says PASS; re-judged from the evidence: FAIL" in out
    assert "results.json and verdict.json are not signed" in out


def test_a_key_listed_for_git_first_and_for_soakspec_later_verifies(signed, tmp_path):
    ev, key, _ = signed
    pub = Path(f"{key}.pub").read_text().strip()
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(f'# shared with git\nalice@example.org namespaces="git" {pub}\nsoak-ci@example.org namespaces="soakspec" {pub}\n')
    code, out, _ = cli("verify", str(ev), "--allowed-signers", str(allowed))
    assert code == 0 and out.startswith("signature: signed by soak-ci@example.org (ED25519 key SHA256:"), out
    allowed.write_text(f'alice@example.org namespaces="git" {pub}\n')
    code, out, _ = cli("verify", str(ev), "--allowed-signers", str(allowed))
    assert code == 1 and out.startswith(f"signature: INVALID: {allowed} does not allow alice@example.org's key to sign for "
                                        "namespace soakspec"), out


def test_a_signature_made_for_git_is_not_a_soakspec_one(signed, tmp_path):
    ev = copy_of(signed, tmp_path)
    proc = subprocess.run([SSH_KEYGEN, "-q", "-Y", "sign", "-f", str(signed[1]), "-n", "git"],
                          input=(ev / "manifest.json").read_bytes(), capture_output=True, timeout=60, check=True)
    (ev / "manifest.json.sig").write_bytes(proc.stdout)
    code, out, _ = cli("verify", str(ev), "--allowed-signers", str(signed[2]))
    assert code == 1 and out.startswith("signature: INVALID: the signature was not made for namespace soakspec"), out


def test_a_key_with_a_passphrase_and_no_agent_is_a_usage_error_before_the_run(tmp_path, monkeypatch):
    key = keygen(tmp_path / "locked", passphrase="secret phrase")
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    spec = tmp_path / "t.soak"
    spec.write_text(SPEC)
    marker = new_marker()
    try:
        proc = run_soakspec(["run", str(spec), "--out", str(tmp_path / "ev"), "--sign", str(key), "--quiet"], marker, tmp_path)
    finally:
        assert wait_no_survivors(marker) == []
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and not (tmp_path / "ev").exists()  # nothing ran
    assert "passphrase" in proc.stderr and f"ssh-add {key}" in proc.stderr and "Enter passphrase:" not in proc.stderr
