"""The simulator's option table: SIM_OPTIONS, sim_argv and SimConfig agree with the command line."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from soakspec.cli import build_parser
from soakspec.commands.sim import config_from_args
from soakspec.sim import LAUNCH_OPTIONS, SIM_OPTIONS, SimConfig, sim_argv
from soakspec.sim.config import KINDS, OPTIONS, REPEATABLE


def parse(argv: list[str]) -> SimConfig:
    return config_from_args(build_parser(only="sim").parse_args(["sim", *argv]))


def test_every_option_is_a_config_field_with_the_same_default_and_a_known_kind():
    fields = {f.name: f.default for f in dataclasses.fields(SimConfig)}
    assert set(fields) == set(OPTIONS)
    for name, opt in OPTIONS.items():
        assert opt.kind in KINDS
        assert fields[name] == opt.default, name
    assert set(SIM_OPTIONS) | set(LAUNCH_OPTIONS) == set(OPTIONS)
    assert not set(SIM_OPTIONS) & set(LAUNCH_OPTIONS)
    assert parse([]) == SimConfig(), "no flags = the dataclass defaults"


def test_the_documented_knobs_exist_with_their_kinds():
    expected = {
        "ttft": "duration", "itl": "duration", "prefill_per_token": "duration", "itl_jitter": "ratio",
        "slowdown_per_active": "ratio", "slots": "int", "queue_limit": "int", "tokens_per_chunk": "int",
        "error_rate": "ratio", "stream_error_rate": "ratio", "stall_rate": "ratio", "disconnect_rate": "ratio",
        "omit_done_rate": "ratio", "drift": "ratio", "memory_base": "size", "memory_growth": "size",
        "crash_after_requests": "int", "crash_after": "duration", "startup_delay": "duration",
        "trace_drop_rate": "ratio", "echo_env": "str", "runtime_banner": "str", "zero_latency": "bool",
        "seed": "int", "model": "str",
    }  # fmt: skip
    assert {k: SIM_OPTIONS[k] for k in expected} == expected
    assert {"host", "port", "port_file", "trace_file", "trace_log"} == set(LAUNCH_OPTIONS)


def test_sim_argv_uses_base_units_and_flag_names():
    argv = sim_argv({"ttft": 0.05, "error_rate": 0.05, "memory_growth": 64 * 1024**2, "slots": 4,
                     "zero_latency": True, "trace_log": False, "echo_env": ["A", "B"], "crash_after": None})
    assert argv == [
        "--no-trace-log", "--echo-env=A", "--echo-env=B", "--slots=4", "--ttft=0.05s",
        "--zero-latency", "--error-rate=0.05", "--memory-growth=67108864B",
    ]
    cfg = parse(argv)
    assert (cfg.ttft, cfg.error_rate, cfg.memory_growth, cfg.slots) == (0.05, 0.05, 64 * 1024**2, 4)
    assert cfg.zero_latency and not cfg.trace_log and cfg.echo_env == ("A", "B") and cfg.crash_after is None


@pytest.mark.parametrize("bad", [{"nope": 1}, {"slots": 1.5}, {"slots": True}, {"ttft": "50ms"},
                                 {"zero_latency": 1}, {"itl": float("inf")}, {"model": 3}])
def test_sim_argv_rejects_unknown_names_and_wrong_types(bad):
    with pytest.raises(ValueError):
        sim_argv(bad)


def test_a_value_of_dashdash_is_refused_not_dropped():
    """argparse reads "--" as the end of options even in `--served-model-name=--`, and the
    simulator came up with no extra model name: such a value is refused before any launch."""
    for options in ({"served_model_name": ["a", "--"]}, {"model": "--"}):
        with pytest.raises(ValueError, match="cannot be passed on a command line"):
            sim_argv(options)
        with pytest.raises(ValueError, match="cannot be passed on a command line"):
            SimConfig.from_options(options)


def test_check_refuses_a_dashdash_sim_value_before_anything_runs():
    """The same value in a spec's sim block is a spec error (`check`, exit 2), not a traceback
    from `plan` or a launch."""
    from soakspec.lang import check as check_spec
    from soakspec.lang import parse as parse_spec

    text = ('soak "t" {}\nbackend "s" {\n  sim {\n    served_model_name = "--"\n  }\n}\n'
            'workload "w" {\n  load {\n    concurrency = [1]\n  }\n  duration = 2s\n}\n')
    spec, diags = check_spec(parse_spec(text)[0])
    assert spec is None and [(d.code, d.span.line) for d in diags if d.severity == "error"] == [("E204", 4)], diags


def _value(name: str) -> st.SearchStrategy[object]:
    kind = OPTIONS[name].kind
    if name in REPEATABLE:  # ("--" is refused: test_a_value_of_dashdash_is_refused_not_dropped)
        word = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=8).filter(lambda v: v != "--")
        return st.lists(word, max_size=3)
    if kind == "duration":
        return st.floats(0, 1e4, allow_nan=False)
    if kind == "ratio":
        return st.floats(0, 0.2, allow_nan=False)  # five fault rates must add up to <= 1
    if kind == "size":
        return st.integers(0, 2**40)
    if kind == "bool":
        return st.booleans()
    if kind == "int":
        return st.integers(1, 10_000)
    return st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=12).filter(lambda v: v != "--")


_SAFE = sorted(set(OPTIONS) - {"host", "port_file", "trace_file"})


@settings(max_examples=150, deadline=None)
@given(st.fixed_dictionaries({}, optional={name: _value(name) for name in _SAFE}))
def test_sim_argv_round_trips_through_the_command_line(options):
    """For any valid options, `soakspec sim <sim_argv(options)>` configures exactly those values
    (what the runner relies on when it launches a spec's `sim { ... }` block)."""
    cfg = parse(sim_argv(options))
    expected = SimConfig.from_options(options)
    assert cfg == expected
    for name, value in options.items():
        got = getattr(cfg, name)
        assert got == (tuple(value) if name in REPEATABLE else value), name  # exact: repr round-trips
    assert parse(sim_argv(cfg.options())) == cfg, "options() relaunches the same config"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"host": "0.0.0.0"}, "non-loopback"),
        ({"host": "10.1.2.3"}, "non-loopback"),
        ({"host": "example.com"}, "not an IP address"),
        ({"error_rate": 0.6, "stall_rate": 0.6}, "add up to"),
        ({"itl_jitter": 1.5}, "between 0 and 1"),
        ({"ttft": -0.01}, "must not be negative"),
        ({"slots": 0}, "slots must be at least 1"),
        ({"tokens_per_chunk": 0}, "tokens_per_chunk"),
        ({"port": 70000}, "out of range"),
    ],
)
def test_config_rejects_values_out_of_range(options, message):
    with pytest.raises(ValueError, match=message):
        SimConfig.from_options(options)


def test_loopback_hosts_are_accepted_and_localhost_means_ipv4():
    assert SimConfig(host="localhost").host == "127.0.0.1"
    assert SimConfig(host="::1").host == "::1"
    assert SimConfig(host="127.0.0.2").host == "127.0.0.2"


def test_config_and_package_import_without_trio():
    """The checker imports SIM_OPTIONS in a pure compile stage: no trio, no h11."""
    code = (
        "import sys; from soakspec.sim import SIM_OPTIONS, sim_argv; import soakspec.sim.config, soakspec.sim.model;"
        "import soakspec.sim.protocol; bad = {'trio', 'h11'} & set(sys.modules); assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_serve_is_exported_lazily():
    import soakspec.sim

    from soakspec.sim.server import serve

    assert soakspec.sim.serve is serve
    assert sorted(soakspec.sim.__all__) == ["LAUNCH_OPTIONS", "SIM_OPTIONS", "SimConfig", "serve", "sim_argv"]
