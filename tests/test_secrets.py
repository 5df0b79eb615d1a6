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
every planted value: none may appear anywhere, server.log.gz included. The values the *server
itself* printed (HF_TOKEN and MY_SECRET via `--echo-env`) are in server.log.gz as as many `*`
bytes (`Redactor.log_mask`: the log's byte offsets stay), which shows the search is not vacuous.
The API key is sent to the server but never printed by it.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import urllib.parse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from soakspec.evidence.testing import secrets_strategy
from runner_support import manifest, new_marker, run_env, run_spec, server_log_bytes, sim_spec, soakspec_cmd, wait_no_survivors

HF_TOKEN = "hf_plantedHfTokenValue0123456789"
MY_SECRET = "planted-my-secret-4b1d"
ARGV_KEY = "planted-argv-api-key-77c2"
BEARER = "planted-bearer-token-91ae"
API_KEY = "planted-endpoint-api-key-5e3f"
PLANTED = {"HF_TOKEN": HF_TOKEN, "MY_SECRET": MY_SECRET, "--api-key": ARGV_KEY, "Bearer": BEARER, "api_key_env": API_KEY}


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


def _plain(path) -> bytes:
    """A file of the evidence as its text: a compressed artifact (server.log.gz, requests) decompressed."""
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def _masked(secret: str) -> bytes:
    """What server.log.gz holds where the server printed `secret`: as many `*` bytes."""
    return b"=" + b"*" * len(secret.encode())


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

    # the server did print what it was asked to (masked in its log): the search below is not vacuous
    logs = {b: server_log_bytes(out / "backends" / b) for b in ("b0", "b1")}
    assert b"HF_TOKEN" + _masked(HF_TOKEN) in logs["b0"], logs["b0"][-2000:]
    assert b"HF_TOKEN" + _masked(HF_TOKEN) in logs["b1"] and b"MY_SECRET" + _masked(MY_SECRET) in logs["b1"]

    found: dict[str, set[str]] = {}
    for path in sorted(out.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            hits = _grep(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)  # compressed artifacts: their text
            if hits:
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
    log = server_log_bytes(out / "backends" / "b1")
    assert _grep(log) == set() and b"MY_SECRET" + _masked(MY_SECRET) in log, "printed, and masked in server.log.gz"


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

    env = f'  env {{\n    HF_TOKEN = "{HF_TOKEN}"\n  }}\n'
    text = sim_spec(duration="1s", bucket="1s", extra_backend=env)
    run, out = run_spec(tmp_path, text)
    assert run.returncode == 0, run.stdout + run.stderr
    spec = manifest(out)["spec"]
    assert HF_TOKEN not in spec["text"] and 'HF_TOKEN = "<redacted>"' in spec["text"]
    assert spec["text_sha256"] != spec["sha256"]
    verify = subprocess.run(soakspec_cmd("verify", str(out)), capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    gate = subprocess.run(soakspec_cmd("gate", str(out)), capture_output=True, text=True, timeout=60)
    assert gate.returncode == 0 and "now hashes to" not in gate.stderr + gate.stdout, gate.stdout + gate.stderr

    m = json.loads((out / "manifest.json").read_text())
    m["spec"]["text"] = m["spec"]["text"].replace("require failed == 0", "warn failed == 0")
    (out / "manifest.json").write_text(json.dumps(m))
    verify = subprocess.run(soakspec_cmd("verify", str(out)), capture_output=True, text=True, timeout=60)
    assert verify.returncode == 1 and "V109" in verify.stdout, verify.stdout + verify.stderr


def test_a_redacted_spec_judged_from_the_manifest_is_the_runs_own_spec(tmp_path, capsys):
    """A spec with a secret env value is stored redacted (its text hashes to `text_sha256`,
    not to the real spec's `sha256`): gate and report judge with that text and say nothing of
    "a spec other than the run's"; --spec with the file the run ran is no other spec either,
    and a genuinely different --spec still is."""
    from soakspec.cli import main

    env = '  env {\n    SECRET_PASSWORD = "pw123456"\n  }\n'
    run, out = run_spec(tmp_path, sim_spec(duration="1s", bucket="1s", extra_backend=env))
    assert run.returncode == 0, run.stdout + run.stderr
    spec = manifest(out)["spec"]
    assert "pw123456" not in spec["text"] and spec["text_sha256"] != spec["sha256"]
    other = tmp_path / "other.soak"
    other.write_text((tmp_path / "t.soak").read_text().replace("require failed == 0", "warn failed == 0"))
    for argv in (["gate", str(out)], ["gate", str(out), "--format", "json"], ["report", str(out), "--format", "md"],
                 ["gate", str(out), "--spec", str(tmp_path / "t.soak")]):
        code = main(argv)
        cap = capsys.readouterr()
        assert code == 0 and "other than the run's" not in cap.out + cap.err, (argv, cap.out + cap.err)
    assert main(["gate", str(out), "--spec", str(other)]) == 0
    cap = capsys.readouterr()
    assert f"other than the run's (sha256 {spec['sha256'][:12]})" in cap.out, cap.out


# ------------------------------------------------------------------ the server's own text

LEAK_TOKEN = "lt-9f3a7c1e5b2d4680aa"
LEAK_PASSWORD = "lp-0b7e4d2a9c6f1358cc"
LEAK_API_KEY = "ak-4e8b2f6d0c1a3957bb"
SERVER_CREDENTIAL = "hf_serverOwnTokenNobodyToldSoakspec0123"  # tests/misbehaving/server.py: a pattern's catch
LEAKED = (LEAK_TOKEN, LEAK_PASSWORD, LEAK_API_KEY, SERVER_CREDENTIAL)


def _record(timed: list[bytes], status: int = 200, ctype: str = "text/event-stream"):
    """The request record the protocol makes of a response (the bytes, one read each)."""
    from soakspec.runner.protocol import Endpoint, RequestShape, StreamAccumulator
    from soakspec.runner.records import RequestRecord

    acc = StreamAccumulator(RequestShape(Endpoint.COMPLETIONS, "m", "p", max_tokens=8))
    acc.on_response(status, ctype)
    for i, data in enumerate(timed):
        acc.on_body(data, 1.0 + i / 10)
    acc.on_end(1.0 + len(timed) / 10)
    rec = RequestRecord("soak-1-0-0000001", backend="b", workload="w", intended_start=0.0, start=0.0)
    acc.finish(rec, 2.0)
    return rec


def test_the_servers_text_is_redacted_when_the_record_is_frozen():
    """In-process, each way server text enters a record: an HTTP 500 body (a JSON body: the
    secret JSON-escaped as the server wrote it), an error event, a secret cut off by the error
    limit, the response id. `freeze` -- every path's way to the disk -- redacts the run's
    secrets and the credential patterns, in the builder too (a reason made from it later)."""
    from soakspec.evidence.redact import redacting

    quoted = 'quo"ted-secret-77aa'  # a JSON body carries it as quo\"ted-secret-77aa
    event = b'data: {"id": "cmpl-1", "choices": [{"index": 0, "text": "a"}]}\n\n'
    cases = {
        "500 body": ([json.dumps({"error": f"bad key {LEAK_API_KEY}, {quoted}, {SERVER_CREDENTIAL}"}).encode()], 500, "application/json"),
        "error event": ([event, f"event: error\ndata: token {LEAK_TOKEN} rejected\n\n".encode()], 200, "text/event-stream"),
        "json error event": ([event, b"data: " + json.dumps({"error": {"message": f"auth {LEAK_TOKEN}"}}).encode() + b"\n\n"],
                             200, "text/event-stream"),
        "cut by the limit": ([("x" * 485 + LEAK_PASSWORD).encode()], 500, "text/plain"),
        "response id": ([event.replace(b"cmpl-1", f"cmpl-{LEAK_API_KEY}".encode()), b"data: [DONE]\n\n"], 200, "text/event-stream"),
    }
    with redacting({LEAK_API_KEY, LEAK_TOKEN, LEAK_PASSWORD, quoted}):
        for name, (body, status, ctype) in cases.items():
            rec = _record(body, status, ctype)
            line = rec.to_line()
            assert _leaks(line) == set() and b"quo" not in line, (name, line)
            assert b"<redacted>" in line, (name, line)
            assert _leaks(repr(rec).encode()) == set(), name  # the builder too
            assert rec.error is None or len(rec.error) <= 500
    # outside a run: no secrets known, the credential patterns still apply
    rec = _record(cases["500 body"][0], 500, "application/json")
    assert rec.freeze().error == f'HTTP 500: {{"error": "bad key {LEAK_API_KEY}, quo\\"ted-secret-77aa, <redacted>"}}'


def test_a_secret_the_server_escaped_or_url_encoded_is_redacted_from_the_record():
    """A server's JSON encoder may escape any character (`\\u007a...`; .NET writes `+` as
    `\\u002B`), and a URL it quotes carries a secret percent-encoded (`p%40ss`): the record
    kept both whole (only the plain value and `json.dumps`'s own form were known)."""
    from soakspec.evidence.redact import redacting

    password = "p@ss/w0rd+Secret!"
    escaped = json.dumps({"error": f"bad key {LEAK_TOKEN}"}).replace(LEAK_TOKEN[0], "\\u%04x" % ord(LEAK_TOKEN[0]), 1)
    dotnet = json.dumps({"error": f"bad password {password}"}).replace("+", "\\u002B")
    quoted = "GET /v1/models?x=" + urllib.parse.quote(password, safe="") + " failed, " + urllib.parse.quote(password, safe="").replace("%2F", "%2f")
    with redacting({LEAK_TOKEN, password}):
        for body in (escaped, dotnet, quoted):
            line = _record([body.encode()], 500, "text/plain").to_line()
            assert LEAK_TOKEN[1:].encode() not in line and b"w0rd" not in line, line
            assert b"<redacted>" in line, line


def test_a_secret_the_server_broke_across_two_log_lines_is_redacted_in_both():
    """A secret wrapped onto a second log line: each piece is replaced (the text keeps its lines)."""
    from soakspec.evidence.redact import Redactor

    red = Redactor({LEAK_TOKEN})
    cut = 9
    text = f"ERROR auth failed: {LEAK_TOKEN[:cut]}\r\n{LEAK_TOKEN[cut:]} rejected\nnext"
    assert red.text(text) == "ERROR auth failed: <redacted>\r\n<redacted> rejected\nnext"


def test_the_bare_credential_of_a_bearer_header_value_is_a_secret_too():
    """`header_env { Authorization = "MY_AUTH" }` with MY_AUTH="Bearer X": the server that says
    "invalid token X" quoted X alone, which was not redacted (only "Bearer X" was known)."""
    from soakspec.evidence.redact import Redactor

    red = Redactor({f"Bearer {LEAK_TOKEN}", f"basic {LEAK_PASSWORD}"})
    assert red.text(f"HTTP 401: invalid token {LEAK_TOKEN}, or {LEAK_PASSWORD}") == "HTTP 401: invalid token <redacted>, or <redacted>"
    assert red.ident(f"cmpl-{LEAK_TOKEN}") == "cmpl-<redacted>"
    # a secret of several words is not cut into words (a common word would go everywhere)
    assert Redactor({"correct horse battery"}).text("a horse") == "a horse"


def test_short_values_and_our_own_text_are_left_alone():
    """A "secret" under MIN_SECRET_CHARS (`USE_AUTH=1`) garbles no message; in a response id
    a value must be MIN_ID_SECRET_CHARS long (`MAX_TOTAL_TOKENS=4096` is in random ids)."""
    from soakspec.evidence.redact import Redactor

    red = Redactor({"1", "4096", LEAK_TOKEN})
    assert red.text("HTTP 401: max 4096 tokens") == "HTTP 401: max <redacted> tokens"
    assert red.ident("cmpl-a4096b") == "cmpl-a4096b" and red.ident(f"cmpl-{LEAK_TOKEN}") == "cmpl-<redacted>"
    assert red.ident("stop") == "stop"


def test_progress_lines_are_redacted_as_evidence_is():
    """Progress (stderr, even with --quiet for errors) redacts as the records do: the secret,
    its JSON-escaped form, one cut off at the line's end, and credential-looking text the
    server quoted -- not only the plain value (it had its own replace loop that missed those)."""
    import io

    from soakspec.runner.progress import Progress

    secret = 'pa"ss-' + LEAK_TOKEN
    out = io.StringIO()
    p = Progress(stream=out, secrets=[secret])
    p.log(f"[b] HTTP 401: {json.dumps({'detail': secret})}")
    p.error(f"[b] crashed: token {secret[:-3]}")
    p.log("[b] HTTP 401: Authorization: Bearer " + "z" * 24)
    text = out.getvalue()
    assert LEAK_TOKEN[:8] not in text and "z" * 24 not in text, text
    assert text.count("<redacted>") == 3 and "HTTP 401" in text and "crashed: token" in text


CREDENTIALS = ["hf_" + "A" * 20, "sk-proj-" + "B" * 20, "ghp_" + "C" * 24, "github_pat_" + "D" * 22, "glpat-" + "E" * 20,
               "xoxb-" + "F" * 12, "AKIA" + "G" * 16, "eyJ" + "h" * 10 + ".eyJ" + "i" * 10 + ".j", "bearer kkk",
               "https://u:pw@host/x", "/v1?api_key=qqq", "Basic dXNlcjpwYXNzd29yZA=="]  # one of each pattern `redact_text` knows  # fmt: skip
_PIECES = st.sampled_from(["x", " ", "=", "://", "u:p@", "?api_key=", "&token=", "Bearer ", "hf_", "sk-", "AKIA", "eyJ",
                           ".eyJ", "abc", '"', "\\", "é", *CREDENTIALS])  # fmt: skip


@pytest.mark.parametrize("credential", CREDENTIALS)
def test_every_credential_pattern_passes_the_fast_paths_search(credential):
    """The one search that lets a clean text through untouched finds each pattern's credential."""
    from soakspec.evidence.redact import Redactor, redact_text

    text = f"id {credential} x"
    assert redact_text(text) != text
    assert Redactor().ident(text) == Redactor().text(text) == redact_text(text)


@given(st.lists(secrets_strategy(), max_size=4), st.lists(st.one_of(_PIECES, secrets_strategy()), max_size=12), st.data())
def test_the_redactors_fast_path_is_exact(secrets, pieces, data):
    """Property: the one-search fast path (`Redactor`) gives what `redact_text` gives, and no
    secret survives it, whole or cut off at the end."""
    from soakspec.evidence.redact import MIN_ID_SECRET_CHARS, Redactor, redact_text

    if secrets:
        pieces = pieces + [data.draw(st.sampled_from(secrets))]
        pieces = data.draw(st.permutations(pieces))
    text = "".join(pieces)
    red = Redactor(secrets)
    assert red.ident(text) == redact_text(text, [s for s in red.secrets if len(s) >= MIN_ID_SECRET_CHARS])
    shown = red.text(text)
    assert all(s not in shown for s in secrets)
    full = redact_text(text, red.secrets)
    assert shown == full or (shown.endswith("<redacted>") and full.startswith(shown[: -len("<redacted>")]))
    for s in secrets:
        cut = text + s[: len(s) // 2 + 4]  # a secret cut by the error limit
        assert not red.text(cut).endswith(s[: len(s) // 2 + 4])


@given(st.lists(st.sampled_from(["x", "ab", "<redacted>"]), max_size=80), st.integers(0, 200))
def test_clipping_a_redacted_text_never_cuts_a_marker(parts, limit):
    """Property: a redacted error kept to the error limit is at most that long, and ends with a
    whole "<redacted>" where the limit fell inside one."""
    from soakspec.evidence.redact import REDACTED, clip

    text = "".join(parts)
    out = clip(text, limit)
    head = out
    while head.endswith(REDACTED):
        head = head.removesuffix(REDACTED)
    assert len(out) <= limit and text.startswith(head)  # what it keeps of the text, then whole markers
    assert out == text or len(text) > limit
    assert not any(out.endswith(REDACTED[:k]) for k in range(1, len(REDACTED)))


def _leaks(data: bytes) -> set[str]:
    """The leaked values found, whole or in part: the first 8 characters of each (a secret cut
    off by the error limit leaks its start)."""
    return {v for v in LEAKED if v[:8].encode() in data}


def _leak_spec() -> str:
    from pathlib import Path

    server = Path(__file__).resolve().parent / "misbehaving" / "server.py"
    argv = [sys.executable, str(server), "--port", "{port}", "--mode", "leak-secrets"]
    launch = (f"launch = {json.dumps(argv)}\n  ready {{\n    timeout = 10s\n    interval = 100ms\n  }}\n"
              f'  shutdown_grace = 2s\n  env {{\n    LEAK_TOKEN = "{LEAK_TOKEN}"\n    LEAK_PASSWORD = "{LEAK_PASSWORD}"\n  }}\n'
              '  api_key_env = "SOAKSPEC_LEAK_API_KEY"')  # fmt: skip
    text = sim_spec(duration="1s", bucket="1s", deadline="3s", follow_up=False,
                    gate="require failed == 0\n  abort_default = false")  # fmt: skip
    sim = "sim {\n    ttft = 20ms\n    itl = 5ms\n  }"
    assert sim in text
    return text.replace(sim, launch, 1)


def _run_leaky(tmp_path, *flags: str) -> tuple[subprocess.CompletedProcess, object, dict]:
    spec = tmp_path / "t.soak"
    spec.write_text(_leak_spec())
    marker = new_marker()
    out = tmp_path / "ev"
    env = run_env(marker) | {"SOAKSPEC_LEAK_API_KEY": LEAK_API_KEY}
    run = subprocess.run(soakspec_cmd("run", str(spec), "--out", str(out), *flags), cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert wait_no_survivors(marker) == []
    return run, out, env


def _evidence_leaks(out) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted(out.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            hits = _leaks(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
            if hits:
                found[str(path.relative_to(out))] = hits
    return found


@pytest.mark.parametrize("workers", ["1", "2"], ids=["one-process", "workers"])
def test_secrets_a_server_quotes_in_its_errors_reach_no_record_result_or_report(tmp_path, workers):
    """A server that quotes the run's secrets -- its secret-named env values, the API key soakspec
    sends as `Authorization: Bearer` -- and a credential of its own in an HTTP 500 body, a JSON
    error event, an `event: error`, a 500 body cut by the error limit mid-secret, and its
    response id: the records say what happened with those values redacted, the evidence still
    verifies, and results.json, verify, gate and every report format are clean."""
    from runner_support import requests_of

    run, out, env = _run_leaky(tmp_path, "--no-preflight", "--quiet", "--workers", workers)  # workers: records made in other processes
    assert run.returncode in (0, 1, 3), run.stdout + run.stderr
    assert manifest(out)["status"] == "complete"
    rows = requests_of(out)
    assert len(rows) >= 5, rows
    errors = [r["error"] for r in rows if r["outcome"] == "failed"]
    # every way of leaking happened, and says what happened, with the values redacted
    assert any(e.startswith("HTTP 500: {") and "LEAK_TOKEN=<redacted>" in e and "Bearer <redacted>" in e for e in errors), errors
    assert any(e.startswith("error event: engine misconfigured") and "LEAK_PASSWORD=<redacted>" in e for e in errors), errors
    assert any(e.startswith("HTTP 500: xxxx") and e.endswith("<redacted>") for e in errors), errors
    assert any("cache <redacted>" in e for e in errors), errors
    assert {r["server_id"] for r in rows if r["outcome"] == "completed"} == {"cmpl-<redacted>"}, rows
    assert _evidence_leaks(out) == {}

    outputs = {"run": run.stdout + run.stderr}
    for command in [["verify", str(out)], ["gate", str(out)]] + [["report", str(out), "--format", f] for f in ("md", "html", "json", "junit")]:
        p = subprocess.run(soakspec_cmd(*command), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert "Traceback" not in p.stderr, p.stderr
        if command[0] == "verify":
            assert p.returncode in (0, 3), p.stdout + p.stderr  # the redacted records are valid evidence
        outputs[" ".join(command[:1] + command[2:])] = p.stdout + p.stderr
    assert {name: _leaks(text.encode()) for name, text in outputs.items() if _leaks(text.encode())} == {}


def test_a_pre_flight_that_quotes_secrets_aborts_without_them(tmp_path):
    """The pre-flight request gets the leaking 500: the run aborts with the server's answer as
    its reason (manifest, stderr), redacted like the record it came from."""
    run, out, _ = _run_leaky(tmp_path)
    assert run.returncode == 4, run.stdout + run.stderr
    m = manifest(out)
    assert m["status"] == "aborted" and "pre-flight request" in m["incomplete_reason"], m["incomplete_reason"]
    assert "HTTP 500" in m["incomplete_reason"] and "<redacted>" in m["incomplete_reason"], m["incomplete_reason"]
    assert _leaks((run.stdout + run.stderr).encode()) == set(), run.stderr
    assert _evidence_leaks(out) == {}


# ------------------------------------------------------------------ a server that crashes quoting secrets

CRASH_TOKEN = "tok_CRASH_ABCDEF99"  # the spec's env: a secret name, a value no credential pattern knows
INHERITED_TOKEN = "hfenv_SECRET_777777"  # soakspec's own environment, which the server inherits


CRASH_CODE = ("import os; print('ERROR: auth failed for token', os.environ['MY_TOKEN'], 'and', "
              "os.environ.get('HF_TOKEN', '-'), flush=True); raise RuntimeError('bad credential ' + os.environ['MY_TOKEN'])")  # fmt: skip


def _crash_spec(code: str = CRASH_CODE) -> str:
    """A launched backend running the Python `code` (with MY_TOKEN = CRASH_TOKEN in its env):
    by default it prints its secrets in an error line and dies before it is ready."""
    argv = [sys.executable, "-c", code, "{port}"]
    launch = (f"launch = {json.dumps(argv)}\n  ready {{\n    timeout = 5s\n    interval = 100ms\n  }}\n"
              f'  env {{\n    MY_TOKEN = "{CRASH_TOKEN}"\n  }}')  # fmt: skip
    sim = "sim {\n    ttft = 20ms\n    itl = 5ms\n  }"
    text = sim_spec(duration="1s", bucket="1s")
    assert sim in text
    return text.replace(sim, launch, 1)


def _run_spec(tmp_path, text: str, name: str, returncode: int, **environ: str):
    """`soakspec run` of the spec `text` into tmp_path/name (with `environ` over the test's
    environment, less HF_TOKEN): (the process, the evidence directory, the environment)."""
    spec = tmp_path / f"{name}.soak"
    spec.write_text(text)
    marker = new_marker()
    out = tmp_path / name
    env = {k: v for k, v in run_env(marker).items() if k != "HF_TOKEN"} | environ
    run = subprocess.run(soakspec_cmd("run", str(spec), "--out", str(out)), cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert wait_no_survivors(marker) == []
    assert run.returncode == returncode, run.stdout + run.stderr
    return run, out, env


def _run_crash(tmp_path, **environ: str):
    return _run_spec(tmp_path, _crash_spec(), "cr", 4, **environ)


def _reports(out, cwd, env) -> dict[str, str]:
    outputs = {}
    for command in [["gate", str(out)]] + [["report", str(out), "--format", f] for f in ("md", "html", "json", "junit")]:
        p = subprocess.run(soakspec_cmd(*command), cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
        assert "Traceback" not in p.stderr, p.stderr
        outputs[" ".join(command[:1] + command[2:])] = p.stdout + p.stderr
    return outputs


def test_a_crashing_servers_diagnosis_in_the_manifest_and_reports_is_redacted(tmp_path):
    """The server-log lines kept as the cause of a crash (`crash_diagnosis`) are the server's
    text: a server that quotes its spec-set token while dying has it redacted in the manifest,
    and so in every report that shows the diagnosis."""
    run, out, env = _run_crash(tmp_path)
    diagnosis = manifest(out)["backends"][0]["crash_diagnosis"]
    assert "ERROR: auth failed for token <redacted> and -" in diagnosis, diagnosis
    assert "RuntimeError: bad credential <redacted>" in diagnosis, diagnosis
    log = server_log_bytes(out / "backends" / "b0")
    assert b"*" * len(CRASH_TOKEN) in log and CRASH_TOKEN.encode() not in log, "the server did print it, masked in server.log.gz"
    found = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()
             and CRASH_TOKEN.encode() in _plain(p)}  # fmt: skip
    assert found == set()
    outputs = {"run": run.stdout + run.stderr} | _reports(out, tmp_path, env)
    assert "crash diagnosis" in outputs["report --format md"], outputs["report --format md"]
    assert {name for name, text in outputs.items() if CRASH_TOKEN in text} == set()


def test_a_secret_a_crashing_server_broke_across_two_lines_is_redacted_in_its_diagnosis(tmp_path):
    """A dying server's log wraps its token onto the next line: both lines are kept as the crash
    diagnosis, and each kept its piece of the token (each line was redacted alone), in the
    manifest, on stderr and in every report."""
    code = ("import os; t = os.environ['MY_TOKEN']; print('ERROR auth failed for token', t[:8], flush=True); "
            "print(t[8:], 'rejected: the engine died', flush=True); raise SystemExit(3)")  # fmt: skip
    run, out, env = _run_spec(tmp_path, _crash_spec(code), "wr", 4)
    diagnosis = manifest(out)["backends"][0]["crash_diagnosis"]
    assert diagnosis == ["ERROR auth failed for token <redacted>", "<redacted> rejected: the engine died"], diagnosis
    outputs = {"run": run.stdout + run.stderr, "manifest": (out / "manifest.json").read_text()} | _reports(out, tmp_path, env)
    assert {name for name, text in outputs.items() if CRASH_TOKEN[8:] in text or CRASH_TOKEN[:8] in text} == set()


def test_secrets_the_server_inherits_from_soakspecs_environment_are_redacted(tmp_path):
    """A launched server inherits soakspec's environment: the value of a secret-named variable
    there (HF_TOKEN) is a secret of the run too, redacted from progress output, the crash
    diagnosis and every evidence file and report, though the spec never names it. A switch
    (TOKENIZERS_PARALLELISM=true) is no credential: the text that holds the word stays whole."""
    run, out, env = _run_crash(tmp_path, HF_TOKEN=INHERITED_TOKEN, TOKENIZERS_PARALLELISM="true")
    log = server_log_bytes(out / "backends" / "b0")
    assert b"*" * len(INHERITED_TOKEN) in log and INHERITED_TOKEN.encode() not in log, "the server did print it, masked in server.log.gz"
    assert "ERROR: auth failed for token <redacted> and <redacted>" in run.stderr, run.stderr
    m = manifest(out)
    assert "ERROR: auth failed for token <redacted> and <redacted>" in m["backends"][0]["crash_diagnosis"]
    assert "follow_up = true" in m["spec"]["text"]
    found = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()
             and INHERITED_TOKEN.encode() in _plain(p)}  # fmt: skip
    assert found == set()
    outputs = {"run": run.stdout + run.stderr} | _reports(out, tmp_path, env)
    assert {name for name, text in outputs.items() if INHERITED_TOKEN in text} == set()


def test_inherited_secret_values_are_the_credentials_the_server_gets():
    from soakspec.evidence.redact import inherited_secret_values

    environ = {"HF_TOKEN": INHERITED_TOKEN, "MY_API_KEY": "k-12345678", "PATH": "/usr/bin", "USE_AUTH": "1",
               "TOKENIZERS_PARALLELISM": "false", "MAX_TOTAL_TOKENS": "4096", "SPEC_SET_TOKEN": "overridden-by-spec",
               # no credentials, though their names hold a secret word: a name that would be
               # replaced wherever it occurs (the stored spec text's "soakspec" too), a socket, a path
               "GIT_AUTHOR_NAME": "soakspec", "SSH_AUTH_SOCK": "/tmp/ssh-x/agent.1", "HF_TOKEN_PATH": "/root/.cache/hf/token"}  # fmt: skip
    assert inherited_secret_values(environ, {"SPEC_SET_TOKEN"}) == {INHERITED_TOKEN, "k-12345678"}


def test_the_stored_spec_text_is_redacted_of_the_specs_own_secrets_only():
    """A secret the run only inherited is not in the spec's text: replacing its value there
    (a common word) could change what the stored spec says, and gate judges by that text."""
    from soakspec.evidence.manifest import new_manifest

    text = 'soak "soakspec-demo" {}\n'
    m = new_manifest(run_id="r", spec_text=text, spec_path=None, host={}, secrets={"soakspec-demo", "tok_SPEC_12345"},
                     spec_secrets={"tok_SPEC_12345"}, command=["soakspec", "run", "soakspec-demo"])
    assert m["spec"]["text"] == text and m["command"] == ["soakspec", "run", "<redacted>"]


# ------------------------------------------------------------------ a secret outside its own variable

ELSEWHERE_TOKEN = "tok_ABCDEFG12345"


def test_a_secret_given_outside_its_variable_is_redacted_in_the_manifest_and_plan(tmp_path):
    """A secret-named variable's value is redacted wherever else the spec gives it: quoted in
    another variable (`OTHER_SETTING`) and as a plain argument of the launch command (no
    secret flag before it). The manifest's argv and env, every evidence file, and `plan` in
    both formats say "<redacted>" there."""
    argv = [sys.executable, "-m", "soakspec", "sim", "--host", "127.0.0.1", "--port", "{port}", "--model", "default",
            "--ttft", "20ms", "--itl", "5ms", "--echo-env", ELSEWHERE_TOKEN]  # fmt: skip
    launch = (f"launch = {json.dumps(argv)}\n  env {{\n    MY_TOKEN = \"{ELSEWHERE_TOKEN}\"\n"
              f'    OTHER_SETTING = "see {ELSEWHERE_TOKEN} here"\n  }}')  # fmt: skip
    sim = "sim {\n    ttft = 20ms\n    itl = 5ms\n  }"
    run, out, env = _run_spec(tmp_path, sim_spec(duration="1s", bucket="1s").replace(sim, launch, 1), "ev", 0)
    b0 = manifest(out)["backends"][0]
    assert b0["argv"][-2:] == ["--echo-env", "<redacted>"], b0["argv"]
    assert b0["env"] == {"MY_TOKEN": "<redacted>", "OTHER_SETTING": "see <redacted> here"}, b0["env"]
    found = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()
             and ELSEWHERE_TOKEN.encode() in _plain(p)}  # fmt: skip
    assert found == set()
    outputs = {"run": run.stdout + run.stderr}
    for fmt in ("text", "json"):
        p = subprocess.run(soakspec_cmd("plan", str(tmp_path / "ev.soak"), "--format", fmt), cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=60)  # fmt: skip
        assert p.returncode == 0, p.stdout + p.stderr
        outputs[f"plan {fmt}"] = p.stdout + p.stderr
    launched = json.loads(outputs["plan json"])["backends"][0]["launch"]
    assert launched["argv"][-1] == "<redacted>" and launched["env"]["OTHER_SETTING"] == "see <redacted> here", launched
    assert {name for name, text in outputs.items() if ELSEWHERE_TOKEN in text} == set()


def test_redact_argv_and_env_take_the_runs_secrets():
    from soakspec.evidence.redact import redact_argv, redact_env

    secrets = {ELSEWHERE_TOKEN, "1"}  # "1" (USE_AUTH=1) is too short to be a credential: left alone
    assert redact_argv(["srv", "--port", "1", ELSEWHERE_TOKEN, f"x={ELSEWHERE_TOKEN}"], secrets) == \
        ["srv", "--port", "1", "<redacted>", "x=<redacted>"]  # fmt: skip
    assert redact_env({"A": f"a {ELSEWHERE_TOKEN}", "N": "1", "USE_AUTH": "1"}, secrets) == \
        {"A": "a <redacted>", "N": "1", "USE_AUTH": "<redacted>"}  # fmt: skip


# ------------------------------------------------------------------ a secret in a URL's query

QUERY_SECRET = "qsecret12345"


def test_a_secret_query_parameter_in_a_probe_path_is_redacted_in_evidence_plan_and_reports(tmp_path):
    """A readiness path with `?access_token=X` on a `url` backend that never answers: the run
    aborts saying which URL it probed, and neither the manifest (the backend's aborted_reason,
    the stored spec text), the verdict, the run's output, `gate`, `report` nor `plan` shows X.
    The stored spec text keeps its closing quote, so the evidence still checks and judges."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = (f'url = "http://127.0.0.1:{port}"\n  ready {{\n    path = "/health?access_token={QUERY_SECRET}"\n'
           "    timeout = 1s\n    interval = 100ms\n  }")  # fmt: skip
    sim = "sim {\n    ttft = 20ms\n    itl = 5ms\n  }"
    spec = tmp_path / "t.soak"
    spec.write_text(sim_spec(duration="1s", bucket="1s").replace(sim, url, 1))
    out = tmp_path / "ev"
    env = run_env(new_marker())
    run = subprocess.run(soakspec_cmd("run", str(spec), "--out", str(out)), cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 4, run.stdout + run.stderr
    m = manifest(out)
    reason = m["backends"][0]["aborted_reason"]
    assert "not ready" in reason and "/health?access_token=<redacted>" in reason, reason
    assert 'path = "/health?access_token=<redacted>"' in m["spec"]["text"]
    found = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and QUERY_SECRET.encode() in _plain(p)}
    assert found == set()
    outputs = {"run": run.stdout + run.stderr} | _reports(out, tmp_path, env)
    assert "/health?access_token=<redacted>" in outputs["gate"], outputs["gate"]
    assert not any("does not check" in text for text in outputs.values()), outputs
    for fmt in ("text", "json"):
        p = subprocess.run(soakspec_cmd("plan", str(spec), "--format", fmt), cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=60)  # fmt: skip
        assert p.returncode == 0, p.stdout + p.stderr
        outputs[f"plan {fmt}"] = p.stdout + p.stderr
    assert json.loads(outputs["plan json"])["backends"][0]["ready"]["path"] == "/health?access_token=<redacted>"
    assert {name for name, text in outputs.items() if QUERY_SECRET in text} == set()


@pytest.mark.parametrize(("text", "shown"), [
    ('path = "/health?access_token=qs12345"', 'path = "/health?access_token=<redacted>"'),
    ("(GET http://h:9/health?Api_Key=qs12345: ConnectError)", "(GET http://h:9/health?Api_Key=<redacted>: ConnectError)"),
    ("http://h/?a=1&password=p,q.r&b=2", "http://h/?a=1&password=<redacted>&b=2"),
])  # fmt: skip
def test_a_secret_query_value_ends_where_the_url_does(text, shown):
    from soakspec.evidence.redact import scrub

    assert scrub(text) == shown
