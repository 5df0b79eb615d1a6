"""Signed evidence (optional): an SSH signature over manifest.json, the mechanism git uses.

    soakspec run SPEC --sign KEY             ssh-keygen -Y sign -f KEY -n soakspec  (manifest.json
                                             on stdin) -> manifest.json.sig next to the manifest
    soakspec verify DIR --allowed-signers F  ssh-keygen -Y find-principals, then -Y verify, against
                                             F (the allowed_signers format of ssh-keygen(1))

What the signature covers: the manifest's bytes, and through the manifest the sha256 of every
artifact (records, traces, telemetry, server logs) -- so no artifact and no manifest field can
change without the signature failing. results.json and verdict.json are written after the
manifest and are not covered (they are conclusions: `gate` re-derives them from the artifacts).
The signature file is not an artifact (like the manifest, it cannot be hashed by the manifest it
signs); `verify` skips it when listing files, and checks it only when given allowed signers.
The namespace `soakspec` keeps a soakspec signature from being replayed as a git or file one.

Without a signature the hashes catch accidents and careless edits, not a determined editor, who
can rewrite the records and recompute every hash.

Running ssh-keygen is this module's own choice of a fixed program (found on PATH, arguments
built here, never from the spec or the evidence): `verify` still never executes anything a spec
names. A key with a passphrase needs ssh-agent (`-f` may then name the public key); ssh-keygen
gets no terminal here, so it cannot prompt. `check_signing_key` signs a fixed test message before
the run, so a key that cannot sign (a passphrase and no agent holding it, not a private key) is a
usage error then, not a failure after a day-long soak.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from soakspec.evidence import layout
from soakspec.evidence.io import EvidenceError, write_bytes_atomic

NAMESPACE = "soakspec"
SIGNATURE = layout.MANIFEST_SIG
TIMEOUT_S = 30.0  # ssh-keygen signs or verifies in milliseconds; a hung one must not hang the command
MAX_SIGNATURE_BYTES = 64 * 1024  # an SSH signature is under 2 KB even for RSA-4096
# what a signed directory's reader must not take as signed: the conclusions written after the manifest
NOT_COVERED = (f"{layout.RESULTS} and {layout.VERDICT} are not signed (the verdict that counts is the one "
               "`soakspec gate` re-derives)")


class SigningError(Exception):
    """The manifest could not be signed, or a signature could not be checked at all."""


def ssh_keygen() -> str:
    exe = shutil.which("ssh-keygen")
    if exe is None:
        raise SigningError("ssh-keygen is not installed (OpenSSH 8.2 or later signs with -Y sign)")
    return exe


def _run(argv: list[str], data: bytes) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, input=data, capture_output=True, timeout=TIMEOUT_S,
                              env={**os.environ, "SSH_ASKPASS_REQUIRE": "never"}, start_new_session=True)
    except subprocess.TimeoutExpired:
        raise SigningError(f"ssh-keygen did not finish within {TIMEOUT_S:g}s") from None
    except OSError as e:
        raise SigningError(f"cannot run ssh-keygen: {e}") from None


def _why(proc: subprocess.CompletedProcess) -> str:
    text = " ".join((proc.stderr or b"").decode("utf-8", "replace").split())
    return text[:500] or f"ssh-keygen exited with status {proc.returncode}"


def _sign_failed(proc: subprocess.CompletedProcess, key: str | os.PathLike) -> str:
    """Why `ssh-keygen -Y sign` failed, said for the user: a key that wants its passphrase was
    not 'supplied an incorrect passphrase' (ssh-keygen's words), it was asked on no terminal."""
    why = _why(proc)
    if "passphrase" in why.lower():
        return (f"the key needs its passphrase and no ssh-agent holds it: load it with `ssh-add {key}` (soakspec gives "
                f"ssh-keygen no terminal to ask on) [{why.replace('Enter passphrase: ', '')}]")
    return why


def _sign(key: str | os.PathLike, data: bytes) -> bytes:
    proc = _run([ssh_keygen(), "-q", "-Y", "sign", "-f", str(key), "-n", NAMESPACE], data)
    sig = proc.stdout or b""
    if proc.returncode != 0 or b"BEGIN SSH SIGNATURE" not in sig:
        raise SigningError(_sign_failed(proc, key))
    return sig


def check_signing_key(key: str | os.PathLike) -> None:
    """Before a run: ssh-keygen is there and signs a test message with the key (a usage error
    otherwise) -- a key with a passphrase no agent holds fails here, not after the run."""
    ssh_keygen()
    p = Path(key)
    if not p.is_file():
        raise SigningError("no such key file")
    if not os.access(p, os.R_OK):
        raise SigningError("the key file is not readable")
    _sign(key, b"soakspec run --sign: can this key sign?\n")


def sign_manifest(run_dir: str | os.PathLike, key: str | os.PathLike) -> Path:
    """Sign `<run_dir>/manifest.json` with `key`; writes manifest.json.sig atomically, returns its path."""
    root = Path(run_dir)
    try:
        data = (root / layout.MANIFEST).read_bytes()
    except OSError as e:
        raise SigningError(f"cannot read {layout.MANIFEST}: {e}") from None
    sig = _sign(key, data)
    try:
        write_bytes_atomic(root / SIGNATURE, sig)
    except EvidenceError as e:
        raise SigningError(str(e)) from None
    return root / SIGNATURE


@dataclasses.dataclass(frozen=True)
class SignatureCheck:
    """status: `unsigned` (no manifest.json.sig), `present` (not checked: no allowed signers
    given), `valid`, or `invalid` (with the reason)."""

    status: str
    principal: str | None = None
    message: str = ""
    run_id: str | None = None  # a valid signature: the run id of the manifest it signs

    @property
    def ok(self) -> bool | None:
        """True valid, False invalid (or unsigned when a signature was required), None unknown."""
        return {"valid": True, "invalid": False}.get(self.status)

    def text(self) -> str:
        if self.status == "unsigned":
            return "not signed: its sha256 hashes catch accidents, not a determined editor (`soakspec run --sign KEY` signs)"
        if self.status == "present":
            return (f"signed ({SIGNATURE}), not checked here: `soakspec verify DIR --allowed-signers FILE` checks it; "
                    f"{NOT_COVERED}")
        if self.status == "valid":
            by = f"signed by {self.principal} ({self.message})" if self.message else f"signed by {self.principal}"
            run = f", run {self.run_id}" if self.run_id else ""
            return f"{by}{run}: manifest.json and every artifact it hashes; {NOT_COVERED}"
        return f"INVALID: {self.message}"

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "principal": self.principal, "message": self.message, "file": SIGNATURE,
                "run_id": self.run_id, "not_covered": [layout.RESULTS, layout.VERDICT]}


def signature_status(run_dir: str | os.PathLike) -> SignatureCheck:
    """Whether the directory carries a signature (nothing is run)."""
    p = Path(run_dir) / SIGNATURE
    return SignatureCheck("present") if p.is_file() and not p.is_symlink() else SignatureCheck("unsigned")


MAX_PRINCIPALS_TRIED = 16


def _signer_key(armored: bytes) -> str | None:
    """The base64 public key blob an SSHSIG signature carries (PROTOCOL.sshsig), None when it
    does not parse: the form an allowed_signers line gives the key in."""
    import base64
    import binascii
    import struct

    lines = armored.decode("ascii", "replace").split("-----")
    try:
        blob = base64.b64decode("".join(lines[2].split()), validate=True) if len(lines) > 2 else b""
        if blob[:6] != b"SSHSIG":
            return None
        (n,) = struct.unpack(">I", blob[10:14])
        return base64.b64encode(blob[14:14 + n]).decode() if 0 < n <= len(blob) - 14 else None
    except (binascii.Error, struct.error, ValueError):
        return None


def _principals_of(allowed: Path, key: str | None) -> list[str]:
    """The principals field of every allowed_signers line that lists `key` (not a CA's)."""
    if key is None:
        return []
    try:
        text = allowed.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#") or key not in words[1:] or "cert-authority" in line:
            continue
        found.extend(p for p in words[0].strip('"').split(",") if p)  # a line's principals: a comma list
    return found


def verify_signature(run_dir: str | os.PathLike, allowed_signers: str | os.PathLike) -> SignatureCheck:
    """Check manifest.json.sig against `allowed_signers`: the signer must be one of its
    principals (found with `ssh-keygen -Y find-principals`) and the signature must verify for
    namespace `soakspec`. Raises SigningError when the check cannot be made at all (no
    ssh-keygen, no such allowed-signers file)."""
    root = Path(run_dir)
    allowed = Path(allowed_signers)
    if not allowed.exists():
        raise SigningError(f"--allowed-signers {allowed_signers}: no such file")
    if not allowed.is_file():
        raise SigningError(f"--allowed-signers {allowed_signers}: not a regular file")
    sig = root / SIGNATURE
    if not sig.exists() and not sig.is_symlink():
        return SignatureCheck("invalid", message=f"no {SIGNATURE}: the evidence is not signed")
    if not sig.is_file() or sig.is_symlink():
        return SignatureCheck("invalid", message=f"{SIGNATURE} is not a regular file (a symlink or special file is not read)")
    if sig.stat().st_size > MAX_SIGNATURE_BYTES:
        return SignatureCheck("invalid", message=f"{SIGNATURE} is over {MAX_SIGNATURE_BYTES // 1024} KB: not an SSH signature")
    try:
        data = (root / layout.MANIFEST).read_bytes()
        head = sig.read_bytes()[:64].lstrip()
    except OSError as e:
        return SignatureCheck("invalid", message=f"cannot read {layout.MANIFEST} or {SIGNATURE}: {e}")
    if not head.startswith(b"-----BEGIN SSH SIGNATURE-----"):
        return SignatureCheck("invalid", message=f"{SIGNATURE} is not an SSH signature (it does not begin with "
                              "-----BEGIN SSH SIGNATURE-----)" if head else f"{SIGNATURE} is empty: not an SSH signature")
    exe = ssh_keygen()
    found = _run([exe, "-Y", "find-principals", "-s", str(sig), "-f", str(allowed)], b"")
    principals = [x.strip() for x in (found.stdout or b"").decode("utf-8", "replace").splitlines() if x.strip()]
    if found.returncode != 0 or not principals:
        why = _why(found)
        if "Couldn't" in why:  # ssh-keygen could not parse the signature itself, before looking for its key
            return SignatureCheck("invalid", message=f"{SIGNATURE} is not a valid SSH signature ({why})")
        return SignatureCheck("invalid", message=f"the signing key is not in {allowed_signers} ({why})")
    # find-principals stops at the first line with the key and ignores its namespaces: a file
    # that lists the key for git first (namespaces="git") and for soakspec after would fail on
    # the git line, so every principal listed with the signing key is tried, in the file's order
    candidates = list(dict.fromkeys(principals + _principals_of(allowed, _signer_key(head + sig.read_bytes()[64:]))))
    first = None
    for principal in candidates[:MAX_PRINCIPALS_TRIED]:
        proc = _run([exe, "-Y", "verify", "-f", str(allowed), "-I", principal, "-n", NAMESPACE, "-s", str(sig)], data)
        if proc.returncode == 0:
            break
        first = first or (principal, proc)
    else:
        principal, proc = first
        said = " ".join((proc.stdout or b"").decode("utf-8", "replace").split())
        why = _why(proc) or said
        if "namespace" in why and "not permitted" in why:
            return SignatureCheck("invalid", principal, f"{allowed_signers} does not allow {principal}'s key to sign "
                                  f"for namespace {NAMESPACE} ({why})")
        if "namespace does not match" in why:  # a git or file signature replayed as a soakspec one
            return SignatureCheck("invalid", principal, f"the signature was not made for namespace {NAMESPACE} "
                                  f"(`ssh-keygen -Y sign -n {NAMESPACE}`): {why}")
        return SignatureCheck("invalid", principal, f"the signature does not match manifest.json for {principal} ({why})")
    said = " ".join((proc.stdout or b"").decode("utf-8", "replace").split())
    key = said.split(" with ", 1)[-1].rstrip(".") if " with " in said else ""
    try:
        run_id = json.loads(data).get("run_id")
    except (ValueError, AttributeError):
        run_id = None
    return SignatureCheck("valid", principal, key, run_id if isinstance(run_id, str) else None)


__all__ = ["NAMESPACE", "SIGNATURE", "SignatureCheck", "SigningError", "check_signing_key", "sign_manifest",
           "signature_status", "verify_signature"]
