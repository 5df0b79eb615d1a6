"""`check` rejects what a run can never observe, runtime labels without a concrete version,
and runs planned longer than the limit (issues 15 and 16). Each rejection has its own code,
at the position of the offending value (the files in tests/bad_specs/ pin the same through
the CLI); the neighbouring valid forms still check clean."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from soakspec.diagnostics import Severity
from soakspec.lang import check, fmt, parse
from soakspec.lang.check import MAX_TOTAL_LOAD_S
from soakspec.lang.runtime_label import VERSIONED_RUNTIMES, label_versions, unversioned_runtimes
from soakspec.plan import plan

WORKLOAD = 'workload "w" {\n  load { concurrency = 1 }\n  duration = 60s\n}\n'


def _diags(text: str):
    tree, diags = parse(text)
    assert tree is not None, diags
    spec, more = check(tree)
    return spec, diags + more


def _errors(text: str) -> list[tuple[str, int, int]]:
    _, diags = _diags(text)
    return [(d.code, d.span.line, d.span.column) for d in diags if d.severity is Severity.ERROR]


def _backend(body: str, kind: str = "launch") -> str:
    head = {"launch": '  launch = ["./server", "--port", "{port}"]\n', "url": '  url = "http://127.0.0.1:8000"\n', "sim": "  sim {}\n"}[kind]
    return 'soak "x" {}\nbackend "a" {\n' + head + body + "}\n" + WORKLOAD


def _runtime(label: str, kind: str = "launch", extra: str = "") -> str:
    return _backend(f'  runtime {{\n    label = "{label}"\n{extra}  }}\n', kind)


# ---------------------------------------------------------------- what can never be observed


def test_require_env_on_a_url_backend_is_an_error_not_a_warning():
    text = _runtime("NCCL 2.26.2, NCCL_IB_DISABLE=1", "url", '    require_env = ["NCCL_IB_DISABLE"]\n')
    _, diags = _diags(text)
    assert [(d.code, d.span.line, d.span.column) for d in diags] == [("E412", 6, 19)]
    assert "not soakspec's to see" in diags[0].message and "label" in diags[0].hint


def test_require_env_on_a_launched_backend_stays_a_warning():
    _, diags = _diags(_runtime("NCCL 2.26.2", "launch", '    require_env = ["NCCL_IB_DISABLE"]\n'))
    assert [(d.code, d.severity) for d in diags] == [("W502", Severity.WARNING)]


def test_log_pattern_on_a_url_backend():
    text = _runtime("vLLM 0.32.0", "url", '    log_pattern = r"vLLM v(\\d+\\.\\d+\\.\\d+)"\n')
    assert _errors(text) == [("E413", 6, 5)]


def test_version_on_a_url_backend_without_a_pattern_says_there_is_no_log():
    """Not "add log_pattern", which would be the next error."""
    _, diags = _diags(_runtime("vLLM 0.32.0", "url", '    version = "0.32.0"\n'))
    assert [(d.code, d.span.line, d.span.column) for d in diags] == [("E413", 6, 5)]
    assert "log_pattern" not in (diags[0].hint or "")


def test_log_false_with_log_traces_or_runtime_is_e413():
    rt = _runtime("NCCL 2.26.2", "launch", '    log_pattern = r"NCCL version (\\d+\\.\\d+\\.\\d+)"\n')
    assert _errors(rt.replace("  runtime {", "  log = false\n  runtime {")) == [("E413", 4, 9)]
    sim = _backend("  log = false\n", "sim")  # the simulator's traces come from its log by default
    assert _errors(sim) == [("E413", 4, 9)]
    assert _errors(_backend("  log = false\n", "launch")) == []


def test_traces_from_the_log_of_a_url_backend():
    text = _backend('  traces {\n    source = log\n    pattern = r"t (?P<id>\\S+)"\n  }\n', "url")
    assert _errors(text) == [("E413", 5, 14)]


def test_jsonl_traces_with_a_pattern():
    text = _backend('  traces {\n    source = jsonl\n    file = "t.jsonl"\n    pattern = r"t (?P<id>\\S+)"\n  }\n', "url")
    _, diags = _diags(text)
    assert [(d.code, d.span.line, d.span.column) for d in diags] == [("E415", 7, 5)]
    assert "id_field" in diags[0].hint
    assert _errors(text.replace('    pattern = r"t (?P<id>\\S+)"\n', "")) == []


TWO = (
    'soak "x" {}\n'
    'backend "traced" {\n  sim {}\n}\n'
    'backend "plain" {\n  url = "http://127.0.0.1:8000"\n}\n' + WORKLOAD
)


@pytest.mark.parametrize(
    "rule, expected",
    [
        ("require trace_coverage >= 100% per bucket", [("E414", 14, 11)]),
        ("warn trace_coverage >= 90%", [("E414", 14, 8)]),
        ('require trace_coverage >= 100% per bucket on "plain"', [("E414", 14, 11)]),
        ('require trace_coverage >= 100% per bucket on "traced"', []),
    ],
)
def test_trace_coverage_needs_traces_on_every_backend_in_scope(rule, expected):
    text = TWO + "gate {\n  require failed == 0\n" + f"  {rule}\n}}\n"
    assert _errors(text) == expected
    if expected:
        _, diags = _diags(text)
        assert "'plain'" in diags[0].message and "'traced'" not in diags[0].message


def test_trace_coverage_with_jsonl_traces_on_a_url_backend_checks_clean():
    text = _backend('  traces {\n    source = jsonl\n    file = "t.jsonl"\n  }\n', "url")
    assert _errors(text + "gate {\n  require trace_coverage >= 100% per bucket\n}\n") == []


def test_trace_coverage_with_explicit_source_none():
    text = _backend("  traces {\n    source = none\n  }\n", "sim")
    assert _errors(text + "gate {\n  require trace_coverage >= 100%\n}\n") == [("E414", 13, 11)]


# ---------------------------------------------------------------- runtime labels


@pytest.mark.parametrize("label", ["NCCL x.y.z", "nccl 2", "NCCL vX", "NCCL 2.x", "CUDA 12", "vLLM latest", "NCCL P2P off, CUDA 12.4"])
def test_a_versioned_runtime_without_a_concrete_version_is_rejected(label):
    _, diags = _diags(_runtime(label))
    assert [(d.code, d.span.line, d.span.column) for d in diags] == [("E416", 5, 13)]
    assert "major.minor" in diags[0].message


@pytest.mark.parametrize(
    "label",
    ["NCCL 2.26.2, NCCL_IB_DISABLE=1", "host-staged", "NCCL 2.26.2, NCCL_IB_DISABLE=1, NCCL_P2P_DISABLE=1",
     "vLLM 0.32.0 V1 engine, CPU build", "NCCL v2.26", "CUDA 12.4.1+cu124, NCCL 2.21.5", "vllm 0.6.3rc1, tp=2",
     "cuda-graphs on", "torch.compile on", "NCCL_IB_DISABLE=1"],
)  # fmt: skip
def test_specific_labels_stay_valid(label):
    assert _errors(_runtime(label)) == []


def test_generic_label_is_still_e402_not_also_e416():
    assert _errors(_runtime("nccl")) == [("E402", 5, 13)]


PATTERN = '    log_pattern = r"NCCL version (?P<version>\\d+\\.\\d+\\.\\d+)"\n'


def test_label_version_must_equal_the_block_version():
    text = _runtime("NCCL 2.26.2", extra=PATTERN + '    version = "2.18.1"\n')
    _, diags = _diags(text)
    assert [(d.code, d.span.line, d.span.column) for d in diags] == [("E417", 7, 15)]
    assert "2.18.1" in diags[0].message and "2.26.2" in diags[0].message
    assert _errors(_runtime("NCCL 2.26.2", extra=PATTERN + '    version = "2.26.2"\n')) == []
    assert _errors(_runtime("NCCL v2.26.2", extra=PATTERN + '    version = "v2.26.2"\n')) == []
    assert _errors(_runtime("host-staged", extra=PATTERN + '    version = "2.26.2"\n')) == []


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(sorted(VERSIONED_RUNTIMES)),
    st.lists(st.integers(0, 999), min_size=1, max_size=4),
    st.sampled_from(["", "v", "V"]),
    st.sampled_from(["", ", NCCL_IB_DISABLE=1", " (tp=2)", " build"]),
)
def test_a_runtime_is_specific_exactly_when_it_carries_major_minor(name, parts, v, rest):
    """Property: "<runtime> <version>" is specific iff the version has at least major.minor;
    the label's version is what it states, without the 'v'."""
    version = ".".join(map(str, parts))
    label = f"{name.upper()} {v}{version}{rest}"
    if len(parts) >= 2:
        assert unversioned_runtimes(label) == () and label_versions(label)[0] == version
    else:
        assert unversioned_runtimes(label) == (name.upper(),)


def test_label_helpers():
    assert label_versions("CUDA 12.4, NCCL v2.26.2-1") == ("12.4", "2.26.2")
    assert unversioned_runtimes("NCCL x.y.z") == ("NCCL",)
    assert unversioned_runtimes("NCCL 2.26.2, NCCL_IB_DISABLE=1") == ()


# ---------------------------------------------------------------- total planned load time


def _long(levels: int, duration: str, backends: int = 1, parallel: bool = False, warmup: str = "0s") -> str:
    head = 'soak "x" {\n  parallel = %s\n}\n' % ("true" if parallel else "false")
    bks = "".join(f'backend "b{i}" {{ url = "http://127.0.0.1:{8000 + i}" }}\n' for i in range(backends))
    conc = ", ".join(str(i + 1) for i in range(levels))
    return head + bks + f'workload "w" {{\n  load {{ concurrency = [{conc}] }}\n  duration = {duration}\n  bucket = 1h\n  warmup = {warmup}\n}}\n'


def test_1000_levels_of_720h_is_an_error():
    """Issue 15: this passed check with warnings only."""
    text = 'soak "x" {}\nbackend "a" { url = "http://127.0.0.1:8000" }\n' + (
        'workload "w" {\n  load { concurrency = [%s] }\n  duration = 720h\n  bucket = 1h\n}\n' % ", ".join(str(i) for i in range(1, 1001))
    )
    spec, diags = _diags(text)
    assert spec is None
    assert [(d.code, d.span.line, d.span.column) for d in diags if d.severity is Severity.ERROR] == [("E418", 3, 1)]


def test_the_limit_counts_backends_one_after_another_but_once_when_parallel():
    assert _errors(_long(5, "100h", backends=2)) == [("E418", 6, 1)]
    assert _errors(_long(5, "100h", backends=2, parallel=True)) == []
    assert _errors(_long(2, "359h", warmup="1h")) == []  # exactly 30 days
    assert _errors(_long(2, "359h", warmup="2h")) == [("E418", 5, 1)]


def test_an_accepted_spec_plans_no_more_than_the_limit():
    spec, _ = _diags(_long(2, "359h", warmup="1h"))
    assert spec is not None and plan(spec).est_wall_s <= MAX_TOTAL_LOAD_S


# ---------------------------------------------------------------- source { allow_dirty }


def test_allow_dirty_defaults_to_false_and_round_trips():
    base = 'soak "x" {}\nsource {\n  repo = "."\n%s}\nbackend "a" { url = "http://127.0.0.1:8000" }\n' + WORKLOAD
    spec, _ = _diags(base % "")
    assert spec.source.allow_dirty is False
    text = base % "  allow_dirty = true\n"
    spec, diags = _diags(text)
    assert diags == [] and spec.source.allow_dirty is True and spec.source.repo == "."
    canonical = fmt(parse(text)[0])
    assert fmt(parse(canonical)[0]) == canonical and "allow_dirty = true" in canonical
    assert _diags(canonical)[0].source.allow_dirty is True
    assert _errors(base % '  allow_dirty = "yes"\n') == [("E104", 4, 17)]
