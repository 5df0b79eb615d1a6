"""Request customisation: extra body fields and headers per workload, secrets from env variables.

`check` rejects a body field or header soakspec sets itself, and a secret written in a plain
header; a real run sends the fields and headers (to a tiny HTTP server of this test's own, also
on the clean follow-up request), and a header_env value is in no evidence file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from soakspec.lang import load_spec
from soakspec.plan import plan
from soakspec.runner.load import Shapes
from soakspec.runner.protocol import build_body

SPEC = """\
soak "requests" {{
  issue = "18"
}}
backend "b" {{
  {backend}
  runtime {{
    label = "host-staged"
  }}
}}
workload "w" {{
  prompt_words = 3
  max_tokens = 2
  stream = false
  {extra}
  load {{
    mode = closed
    concurrency = [1]
  }}
  duration = 300ms
  deadline = 5s
}}
gate {{
  require failed == 0
}}
claims {{
  claim "test"
}}
"""

CUSTOM = """\
body {
    min_tokens = 1
    stop = ["END", "\\n\\n"]
    vendor = null
    chat_template_kwargs {
      enable_thinking = false
    }
  }
  headers {
    X-Team = "perf"
  }
  header_env {
    Authorization = "SOAK_TEST_AUTH"
  }"""


def _check(tmp_path: Path, extra: str, backend: str = "sim {}"):
    path = tmp_path / "r.soak"
    path.write_text(SPEC.format(extra=extra, backend=backend))
    return load_spec(path)


def test_body_fields_and_headers_reach_the_plan_and_the_body(tmp_path):
    spec, diags, _ = _check(tmp_path, CUSTOM)
    assert spec is not None, diags
    req = plan(spec).backends[0].levels[0].request
    j = req.to_json()
    assert j["body"] == {"min_tokens": 1, "stop": ["END", "\n\n"], "vendor": None, "chat_template_kwargs": {"enable_thinking": False}}
    assert j["headers"] == {"X-Team": "perf"} and j["header_env"] == {"Authorization": {"env": "SOAK_TEST_AUTH"}}
    body = json.loads(build_body(Shapes(req).make(0), "rid-1"))
    assert body["min_tokens"] == 1 and body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["request_id"] == "rid-1" and body["max_tokens"] == 2 and body["model"] == "default"
    shapes = Shapes(req)
    assert shapes.headers({"SOAK_TEST_AUTH": "Bearer s3cret"}) == (("X-Team", "perf"), ("Authorization", "Bearer s3cret"))
    assert shapes.headers({}) == (("X-Team", "perf"),)  # an unset variable sends no header


def test_a_surrogate_escape_in_a_body_string_is_a_character_or_an_error(tmp_path):
    """`\\ud83d\\ude00` (a pair, as JSON writes a character beyond the BMP) is that one
    character; a lone `\\ud800` is no character: E006 at the escape, as any escape the
    language does not define. It used to become a lone surrogate that passed `check` and
    crashed `run` when the body was encoded (found by an audit), then was kept as written."""
    spec, diags, _ = _check(tmp_path, 'body {\n    stop = ["a", "\\ud83d\\ude00"]\n  }')
    assert spec is not None, diags
    req = plan(spec).backends[0].levels[0].request
    body = json.loads(build_body(Shapes(req).make(0), "rid-1"))
    assert body["stop"] == ["a", "\U0001F600"]
    spec, diags, _ = _check(tmp_path, 'body {\n    stop = ["a\\ud800", "\\ud83d\\ude00"]\n  }')
    assert spec is None and [d.code for d in diags] == ["E006"] and "surrogate" in diags[0].message


@pytest.mark.parametrize(
    ("extra", "code", "match"),
    [
        ("body {\n    model = \"other\"\n  }", "E420", "body field 'model' is set by soakspec"),
        ("body {\n    stream_options {\n      include_usage = false\n    }\n  }", "E420", "stream_options"),
        ("body {\n    temperature = 0.5\n  }", "E420", "sampling block"),
        ("body {\n    timeout = 5s\n  }", "E104", "must be a string, number"),
        ("body {\n    n = 2\n  }", "E424", "body field 'n' = 2 asks for several answers"),
        ("body {\n    n = 1.5\n  }", "E424", "body field 'n' = 1.5"),
        ("body {\n    a = 1\n    a = 2\n  }", "E102", "duplicate field 'a'"),
        ("headers {\n    Content-Type = \"text/plain\"\n  }", "E420", "header 'Content-Type' is set by soakspec"),
        ("headers {\n    Authorization = \"Bearer abc\"\n  }", "E421", "looks like a secret"),
        ("headers {\n    X-Api-Key = \"abc\"\n  }", "E421", "looks like a secret"),
        ("headers {\n    X-Team = 3\n  }", "E104", "must be a string"),
        ("header_env {\n    Authorization = \"Bearer abc\"\n  }", "E411", "names an environment variable"),
        ("headers {\n    X-A = \"1\"\n  }\n  header_env {\n    x-a = \"ENV\"\n  }", "E403", "both in headers and in header_env"),
    ],
)
def test_check_rejects_what_would_make_the_evidence_lie_or_leak(tmp_path, extra, code, match):
    spec, diags, _ = _check(tmp_path, extra)
    assert spec is None
    assert [d.code for d in diags] == [code], diags
    assert match in diags[0].message


def test_a_secret_header_error_says_how_to_pass_it(tmp_path):
    _, diags, _ = _check(tmp_path, 'headers {\n    Authorization = "Bearer abc"\n  }')
    assert 'header_env { Authorization = "MY_ENV_VAR" }' in diags[0].hint


class _Capture(BaseHTTPRequestHandler):
    seen: list[tuple[str, dict[str, str], dict]] = []

    def log_message(self, *args) -> None:  # quiet
        pass

    def _json(self, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._json({"object": "list", "data": [{"id": "default", "object": "model"}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        self._json({
            "id": "cmpl-" + body["request_id"], "object": "text_completion", "model": "default",
            "choices": [{"index": 0, "text": " a b", "finish_reason": "length", "logprobs": None}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        })  # fmt: skip


def test_a_run_sends_the_fields_and_headers_and_records_no_secret(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Capture)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    secret = "Bearer tok-7f3a9c1e-do-not-record"
    try:
        path = tmp_path / "r.soak"
        path.write_text(SPEC.format(extra=CUSTOM, backend=f'url = "http://127.0.0.1:{server.server_port}"'))
        env = dict(os.environ, SOAK_TEST_AUTH=secret)
        out = tmp_path / "ev"
        proc = subprocess.run([sys.executable, "-m", "soakspec", "run", str(path), "--out", str(out), "-q"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert (out / "manifest.json").exists(), proc.stderr
    assert len(_Capture.seen) >= 2  # the level's requests and the clean follow-up
    for route, headers, body in _Capture.seen:
        assert route == "/v1/completions"
        assert headers["authorization"] == secret and headers["x-team"] == "perf"
        assert body["chat_template_kwargs"] == {"enable_thinking": False} and body["stop"] == ["END", "\n\n"]
        assert body["max_tokens"] == 2 and body["stream"] is False
    leaked = [p for p in out.rglob("*") if p.is_file() and secret.split()[1].encode() in p.read_bytes()]
    assert leaked == []
    manifest = (out / "manifest.json").read_text()
    assert "SOAK_TEST_AUTH" in manifest and "X-Team" in manifest  # the names are recorded, never the value
    assert secret not in proc.stdout + proc.stderr


def test_a_body_that_asks_for_one_answer_is_fine(tmp_path):
    """n = 1 is what soakspec measures (E424 is for more): the body keeps it as written."""
    spec, diags, _ = _check(tmp_path, "body {\n    n = 1\n  }")
    assert spec is not None and not [d for d in diags if d.code.startswith("E")], diags
