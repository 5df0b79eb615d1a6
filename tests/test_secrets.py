"""Secrets never reach the evidence, the reports or the progress output.

A real run plants secrets everywhere a spec can carry them:

* `env { HF_TOKEN = "hf_…" }` on a simulated backend (a secret *name* and a credential-looking
  value), and the simulator is asked to print it (`echo_env`);
* a `shell` backend wrapping the simulator whose command line carries `--api-key X`,
  `Authorization: Bearer X` and `MY_SECRET=X` (the simulator takes no `--api-key`, so the
  flags go to a no-op `true` in front of it), and which echoes HF_TOKEN and MY_SECRET too;
* `api_key_env = "SOAKSPEC_TEST_API_KEY"`: the endpoint's API key, read from the runner's
  environment and sent as `Authorization: Bearer`.

Then every file of the evidence directory, the run's stdout and stderr (with progress on),
and the output of `verify`, `gate` and `report` are searched for
every planted value. The one place a planted value may appear is `server.log`, and only the
values the *server itself* printed (HF_TOKEN and MY_SECRET via `--echo-env`): server.log is the
server's raw output and soakspec does not rewrite it (README, "Secrets"). The API key is sent
to the server but never printed by it, so it must be found nowhere at all.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from runner_support import manifest, new_marker, run_env, server_log_bytes, sim_spec, soakspec_cmd, wait_no_survivors

HF_TOKEN = "hf_plantedHfTokenValue0123456789"
MY_SECRET = "planted-my-secret-4b1d"
ARGV_KEY = "planted-argv-api-key-77c2"
BEARER = "planted-bearer-token-91ae"
API_KEY = "planted-endpoint-api-key-5e3f"
PLANTED = {"HF_TOKEN": HF_TOKEN, "MY_SECRET": MY_SECRET, "--api-key": ARGV_KEY, "Bearer": BEARER, "api_key_env": API_KEY}
PRINTED_BY_THE_SERVER = {HF_TOKEN, MY_SECRET}


def _spec() -> str:
    shell = (
        f"true --api-key {ARGV_KEY} -H 'Authorization: Bearer {BEARER}'; "
        f"MY_SECRET={MY_SECRET} exec {sys.executable} -m soakspec sim --host 127.0.0.1 --port {{port}} "
        f"--model default --ttft 20ms --itl 5ms --echo-env HF_TOKEN --echo-env MY_SECRET"
    )
    text = sim_spec(backends=2, duration="1s", bucket="1s", follow_up=True)
    env = f'  env {{\n    HF_TOKEN = "{HF_TOKEN}"\n  }}\n  api_key_env = "SOAKSPEC_TEST_API_KEY"\n'
    text = text.replace('backend "b0" {\n  sim {\n    ttft = 20ms\n    itl = 5ms\n',
                        'backend "b0" {\n' + env + '  sim {\n    echo_env = "HF_TOKEN"\n    ttft = 20ms\n    itl = 5ms\n', 1)
    text = text.replace('backend "b1" {\n  sim {\n    ttft = 20ms\n    itl = 5ms\n  }\n',
                        'backend "b1" {\n' + env + f"  shell = {json.dumps(shell)}\n", 1)
    assert text.count(HF_TOKEN) == 2 and ARGV_KEY in text, text
    return text


def _grep(data: bytes) -> set[str]:
    return {v for v in PLANTED.values() if v.encode() in data}


@pytest.mark.slow
def test_planted_secrets_are_found_nowhere_but_in_what_the_server_printed(tmp_path):
    spec = tmp_path / "t.soak"
    spec.write_text(_spec())
    marker = new_marker()
    out = tmp_path / "ev"
    env = run_env(marker) | {"SOAKSPEC_TEST_API_KEY": API_KEY}
    run = subprocess.run(soakspec_cmd("run", str(spec), "--out", str(out)), cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert wait_no_survivors(marker) == []
    assert run.returncode == 0, run.stdout + run.stderr  # redacting the spec never costs its verification
    m = manifest(out)
    assert m["status"] == "complete", m["incomplete_reason"]

    # the server did print what it was asked to: the search below is not vacuous
    logs = {b: server_log_bytes(out / "backends" / b) for b in ("b0", "b1")}
    assert _grep(logs["b0"]) == {HF_TOKEN}
    assert _grep(logs["b1"]) == {HF_TOKEN, MY_SECRET}

    found: dict[str, set[str]] = {}
    for path in sorted(out.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            hits = _grep(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)  # compressed artifacts: their text
            if hits and not (path.name in ("server.log", "server.log.gz") and hits <= PRINTED_BY_THE_SERVER):
                found[str(path.relative_to(out))] = hits
    assert found == {}, f"planted secrets in the evidence: {found}"

    # what the manifest says instead
    b0, b1 = m["backends"]
    assert b0["env"]["HF_TOKEN"] == "<redacted>" and b1["env"]["HF_TOKEN"] == "<redacted>"
    command_line = b1["argv"][-1]
    assert "--api-key <redacted>" in command_line and "MY_SECRET=<redacted>" in command_line, command_line
    assert "Authorization: <redacted>" in command_line and "--echo-env HF_TOKEN" in command_line, command_line

    outputs = {"run stdout": run.stdout, "run stderr": run.stderr}
    assert "[b1] starting:" in run.stderr, "progress was on"
    commands = [["verify", str(out)], ["gate", str(out)]]
    commands += [["report", str(out), "--format", fmt] for fmt in ("md", "html", "json", "junit")]
    for command in commands:
        p = subprocess.run(soakspec_cmd(*command), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert "Traceback" not in p.stderr, p.stderr
        assert p.returncode == 0, p.stdout + p.stderr
        outputs[" ".join(command[:1] + command[2:])] = p.stdout + p.stderr  # "report --format md", ...
    leaks = {name: _grep(text.encode()) for name, text in outputs.items() if _grep(text.encode())}
    assert leaks == {}, f"planted secrets in the output: {leaks}"


def test_a_crashing_servers_log_tail_on_stderr_is_redacted(tmp_path):
    """When a server dies, soakspec shows the last lines of its log on stderr. That is
    progress output, not server.log: the secrets the server echoed there are redacted."""
    text = _spec().replace("--echo-env MY_SECRET", "--echo-env MY_SECRET --crash-after-requests 2")
    spec = tmp_path / "t.soak"
    spec.write_text(text)
    marker = new_marker()
    out = tmp_path / "ev"
    env = run_env(marker) | {"SOAKSPEC_TEST_API_KEY": API_KEY}
    run = subprocess.run(soakspec_cmd("run", str(spec), "--out", str(out), "--backend", "b1"), cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert wait_no_survivors(marker) == []
    assert run.returncode == 4, run.stderr
    assert "last lines of b1's log:" in run.stderr, run.stderr
    tail = run.stderr.split("last lines of b1's log:", 1)[1]
    assert "HF_TOKEN=<redacted>" in tail and "MY_SECRET=<redacted>" in tail, tail
    assert _grep((run.stdout + run.stderr).encode()) == set()
    assert _grep(server_log_bytes(out / "backends" / "b1")) == {HF_TOKEN, MY_SECRET}


def test_a_shell_command_line_is_redacted_word_by_word():
    """A `shell` backend's argv is `sh -c "<one command line>"`: secret flags, secret-named
    assignments and secret headers inside it are redacted; the rest stays readable."""
    from soakspec.evidence.redact import redact_argv, secret_values

    cmd = (f"true --api-key {ARGV_KEY} -H 'Authorization: Bearer {BEARER}'; MY_SECRET={MY_SECRET} "
           f"exec server --max-tokens 5 --no-auth --port 1 --token={API_KEY} HF_TOKEN='a b' PATH=/bin")  # fmt: skip
    red = redact_argv(["/bin/sh", "-c", cmd])[-1]
    assert red == ("true --api-key <redacted> -H 'Authorization: <redacted>'; MY_SECRET=<redacted> "
                   "exec server --max-tokens 5 --no-auth --port 1 --token=<redacted> HF_TOKEN=<redacted> PATH=/bin")  # fmt: skip
    assert {ARGV_KEY, BEARER, MY_SECRET, API_KEY, "a b"} <= secret_values({}, ["/bin/sh", "-c", cmd])


def test_the_manifest_keeps_the_spec_hash_but_not_the_secrets_in_its_text():
    from soakspec.evidence.io import sha256_text
    from soakspec.evidence.manifest import new_manifest

    text = _spec()
    m = new_manifest(run_id="r", spec_text=text, spec_path="t.soak", host={}, secrets={HF_TOKEN, MY_SECRET, ARGV_KEY, BEARER})
    assert m["spec"]["sha256"] == sha256_text(text), "the hash names the spec that ran"
    assert _grep(m["spec"]["text"].encode()) == set()
    assert 'HF_TOKEN = "<redacted>"' in m["spec"]["text"]


def test_a_redacted_spec_still_verifies_and_an_edit_of_it_is_still_caught(tmp_path):
    """The manifest keeps the spec text redacted; verification re-hashes what is stored
    (`spec.text_sha256`), not the real text's hash (`spec.sha256`, which the redacted copy
    can never reproduce): a run whose spec carries a secret passes verification, and an edit
    of the stored text is caught as before."""
    import json

    from runner_support import run_spec

    env = f'  env {{\n    HF_TOKEN = "{HF_TOKEN}"\n  }}\n'
    text = sim_spec(duration="1s", bucket="1s", extra_backend=env)
    run, out = run_spec(tmp_path, text)
    assert run.returncode == 0, run.stdout + run.stderr
    spec = manifest(out)["spec"]
    assert HF_TOKEN not in spec["text"] and 'HF_TOKEN = "<redacted>"' in spec["text"]
    assert spec["text_sha256"] != spec["sha256"]
    verify = subprocess.run(soakspec_cmd("verify", str(out)), capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0, verify.stdout + verify.stderr

    m = json.loads((out / "manifest.json").read_text())
    m["spec"]["text"] = m["spec"]["text"].replace("require failed == 0", "warn failed == 0")
    (out / "manifest.json").write_text(json.dumps(m))
    verify = subprocess.run(soakspec_cmd("verify", str(out)), capture_output=True, text=True, timeout=60)
    assert verify.returncode == 1 and "V109" in verify.stdout, verify.stdout + verify.stderr
