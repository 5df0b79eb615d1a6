"""Redaction: secrets never survive env/argv redaction; ordinary settings stay readable."""

from __future__ import annotations

from hypothesis import assume, given
from hypothesis import strategies as st

from soakspec.evidence.redact import REDACTED, redact_argv, redact_env, redact_text, secret_values
from soakspec.evidence.testing import secrets_strategy

SECRET_ENV_NAMES = st.sampled_from(
    ["HF_TOKEN", "OPENAI_API_KEY", "hf_token", "DB_PASSWORD", "MY_SECRET", "AUTH", "AWS_SECRET_ACCESS_KEY",
     "GOOGLE_APPLICATION_CREDENTIALS", "x_auth_header"]
)


def test_env_examples():
    env = {"HF_TOKEN": "hf_x1", "NCCL_IB_DISABLE": "1", "HTTP_PROXY": "http://bob:pw123@proxy:3128",
           "CUDA_VISIBLE_DEVICES": "0,1", "EXTRA": "sk-abcdefghijklmnopqrstuvwx"}
    out = redact_env(env)
    assert out == {"HF_TOKEN": REDACTED, "NCCL_IB_DISABLE": "1", "HTTP_PROXY": f"http://{REDACTED}@proxy:3128",
                   "CUDA_VISIBLE_DEVICES": "0,1", "EXTRA": REDACTED}
    assert env["HF_TOKEN"] == "hf_x1"  # input untouched


def test_argv_examples():
    argv = ["vllm", "serve", "m", "--api-key", "abc123", "--token=tok456", "--password", "pw789",
            "--max-tokens", "128", "--tokenizer", "tok/path", "--max-num-batched-tokens", "4096",
            "-H", "Authorization: Bearer bear999", "--header=X-API-Key: k000",
            "https://user:pass111@example.com/x?api_key=q222&n=3", "HF_TOKEN=env333",
            "--hf-token", "hf_abcdefghijklmnopqrstuvw"]
    out = redact_argv(argv)
    joined = " ".join(out)
    for s in ["abc123", "tok456", "pw789", "bear999", "k000", "pass111", "q222", "env333", "hf_abcdef"]:
        assert s not in joined
    assert out[:3] == ["vllm", "serve", "m"]
    for keep in ["--max-tokens 128", "--tokenizer tok/path", "--max-num-batched-tokens 4096", "n=3"]:
        assert keep in joined
    assert "--token=<redacted>" in out and "Authorization: <redacted>" in out


@given(SECRET_ENV_NAMES, secrets_strategy(), st.dictionaries(st.sampled_from(["A", "PATH", "NCCL_X"]), st.text(max_size=5)))
def test_a_secret_env_value_never_survives(name, secret, other):
    """Property: the value of any secret-named variable is absent from the redacted env."""
    assume(all(secret not in v and secret not in k for k, v in other.items()))
    out = redact_env({**other, name: secret})
    assert secret not in repr(out)


FLAG_SHAPES = [
    lambda s: ["--api-key", s],
    lambda s: [f"--api-key={s}"],
    lambda s: ["--token", s],
    lambda s: [f"--token={s}"],
    lambda s: ["--password", s],
    lambda s: ["--hf-token", s],
    lambda s: ["-H", f"Authorization: Bearer {s}"],
    lambda s: ["-H", f"authorization: {s}"],
    lambda s: [f"--header=Authorization: Bearer {s}"],
    lambda s: [f"https://user:{s}@host.example/v1"],
    lambda s: [f"https://{s}@host.example/v1"],
    lambda s: [f"http://h/x?token={s}"],
    lambda s: [f"OPENAI_API_KEY={s}"],
    lambda s: [f"hf_{s}abcdefghijklmnop"],
    lambda s: [f"sk-{s}abcdefghijklmnop"],
    lambda s: ["curl", "-sS", "-H", f"Bearer {s}"],
]
CREDENTIAL_SHAPES = (13, 14)


@given(st.sampled_from(range(len(FLAG_SHAPES))), secrets_strategy(),
       st.lists(st.sampled_from(["serve", "--port", "8000", "--max-tokens", "64", "-v"]), max_size=4))
def test_a_secret_in_argv_never_survives(shape, secret, around):
    """Property: whatever common shape carries a secret on the command line, redaction removes it."""
    assume(not any(secret in a for a in around))
    if shape in CREDENTIAL_SHAPES:  # well-known token formats are alphanumeric
        assume(secret.isalnum())
    argv = [*around, *FLAG_SHAPES[shape](secret), *around]
    out = redact_argv(argv)
    assert len(out) == len(argv)
    assert not any(secret in a for a in out)
    # the raw command line echoed as text is cleaned by the values redaction collected
    assert secret not in redact_text(" ".join(argv), secret_values(argv=argv))


@given(secrets_strategy(), st.text(max_size=30), st.text(max_size=30))
def test_redact_text_removes_known_secrets(secret, before, after):
    """Property: a known secret value never survives in text that embeds it."""
    out = redact_text(before + secret + after, {secret})
    assert secret not in out


def test_secret_values_collects_what_redaction_hides():
    env = {"HF_TOKEN": "hf_val", "PLAIN": "x"}
    argv = ["srv", "--api-key", "k-123", "-H", "Authorization: Bearer b-456"]
    got = secret_values(env, argv)
    assert {"hf_val", "k-123", "b-456"} <= got and "x" not in got
    line = "started with key k-123 and token hf_val; auth b-456"
    assert redact_text(line, got) == f"started with key {REDACTED} and token {REDACTED}; auth {REDACTED}"


def test_secret_named_switches_do_not_swallow_the_next_flag():
    assert redact_argv(["srv", "--no-auth", "--port", "8000", "--api-key", "k1"]) == \
        ["srv", "--no-auth", "--port", "8000", "--api-key", REDACTED]


def test_a_short_secret_is_redacted_where_it_is_given_and_the_stored_spec_still_reads():
    """`USE_AUTH = "1"`: a value too short to look for everywhere (it replaced every "1" of the
    stored spec text, `concurrency = [<redacted>6]`, and gate refused the evidence) is redacted
    at its secret-named key only; a long secret is replaced wherever it occurs."""
    from pathlib import Path
    import tempfile

    from soakspec.evidence.manifest import spec_entry
    from soakspec.lang import load_spec

    text = (Path(__file__).resolve().parents[1] / "specs" / "demo.soak").read_text()
    text = text.replace('NCCL_IB_DISABLE = "1"', 'NCCL_IB_DISABLE = "1"\n    USE_AUTH = "1"\n    HF_TOKEN = "hf_abcdefgh"', 1)
    text = text.replace("concurrency = [4, 8]", "concurrency = [4, 16]", 1)
    stored = spec_entry("demo.soak", text, {"1", "hf_abcdefgh"})["text"]
    assert 'USE_AUTH = "<redacted>"' in stored and 'HF_TOKEN = "<redacted>"' in stored
    assert "hf_abcdefgh" not in stored and 'NCCL_IB_DISABLE = "1"' in stored and "[4, 16]" in stored
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "stored.soak"
        p.write_text(stored)
        spec, diags, _ = load_spec(p)
        assert spec is not None, diags


def test_a_basic_authorization_credential_is_redacted_and_the_word_basic_is_not():
    """`Authorization: Basic <base64 of user:password>` a server echoes is a credential, as
    `Bearer X` is; it was kept whole. The word "basic" before a plain word stays as it is."""
    import base64

    cred = base64.b64encode(b"user:pw-0b7e4d2a9c").decode()
    assert redact_text(f"HTTP 401: Authorization: Basic {cred} rejected") == f"HTTP 401: Authorization: Basic {REDACTED} rejected"
    assert redact_text(f"basic {cred}") == f"basic {REDACTED}"
    for keep in ("basic usage of this tool", "a basic test", "Basic dGVzdA=="):  # "test": no user:password
        assert redact_text(keep) == keep
