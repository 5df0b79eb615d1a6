"""Diagnostics as a new user meets them: one mistake gives one error, at its own line and
column, with a hint that names something the checker accepts. (Each case also has a file in
tests/bad_specs/, which pins the exact set of errors, lines and columns through the CLI.)"""

from __future__ import annotations

import re

import pytest

from soakspec.diagnostics import Severity
from soakspec.lang import check, parse
from soakspec.lang.metrics import METRICS

BASE = 'soak "x" {}\nbackend "a" { url = "http://127.0.0.1:8000" }\nworkload "w" {\n%s\n}\n'
LOAD = "  load { concurrency = 1 }\n  duration = 60s"


def _errors(text: str) -> list:
    tree, diags = parse(text)
    if tree is not None:
        _, diags = check(tree)
    return [d for d in diags if d.severity is Severity.ERROR]


def _one(text: str):
    errors = _errors(text)
    assert len(errors) == 1, [(d.span.line, d.span.column, d.code, d.message) for d in errors]
    return errors[0]


def _checks_clean(text: str) -> bool:
    return _errors(text) == []


def test_unescaped_quote_is_one_error_at_the_quote():
    d = _one('soak "x" {\n  description = "say "hi" now"\n}\n' + BASE.split("\n", 1)[1] % LOAD)
    assert (d.code, d.span.line, d.span.column) == ("E005", 2, 22)
    assert '\\"' in d.hint


@pytest.mark.parametrize(
    "line, col",
    [('  issue = "a "b" c"', 14), ('  issue = "ok"\n  description = "x "y z"', 20), ('  description = "he said "no""', 26)],
)
def test_unescaped_quote_variants(line, col):
    text = 'soak "x" {\n%s\n}\n' % line + BASE.split("\n", 1)[1] % LOAD
    d = _one(text)
    assert d.code == "E005" and d.span.line == 1 + line.count("\n") + 1 and d.span.column == col


def test_each_unescaped_quote_is_reported_on_its_own_line():
    text = 'soak "x" {\n  issue = "a "b" c"\n  description = "d "e" f"\n}\n' + BASE.split("\n", 1)[1] % LOAD
    tree, diags = parse(text)
    assert tree is None and [(d.code, d.span.line) for d in diags] == [("E005", 2), ("E005", 3)]


def test_a_word_after_a_string_without_a_quote_later_is_not_taken_for_one():
    """`x = "a"b` has no second quote on its line: not an unescaped quote."""
    _, diags = parse('a {\n  x = "a"b\n}\n')
    assert "E005" not in [d.code for d in diags]


def test_endpoint_suggestion_is_what_the_word_begins_with():
    d = _one(BASE % ("  endpoint = chat_completions\n" + LOAD))
    assert (d.code, d.span.line, d.span.column) == ("E109", 4, 14)
    assert d.hint == "did you mean 'chat'?"
    assert _checks_clean(BASE % ("  endpoint = chat\n" + LOAD))


@pytest.mark.parametrize("name", sorted(n for n, m in METRICS.items() if not m.bare_ok))
def test_aggregate_hint_names_only_forms_the_checker_accepts(name):
    """For every metric that needs an aggregate, each form the message suggests checks clean."""
    d = _one(BASE % LOAD + f"gate {{\n  require {name} > 10\n}}\n")
    assert (d.code, d.span.line, d.span.column) == ("E305", 8, 11)
    forms = re.findall(r"\b(\w+\(\w+\))", d.message)
    assert forms, d.message
    for form in forms:
        threshold = {"duration": "1s", "size": "1GiB", "rate": "1rps", "ratio": "1%"}.get(METRICS[name].kind.value, "10")
        assert _checks_clean(BASE % LOAD + f"gate {{\n  require {form} > {threshold}\n}}\n"), form


def test_throughput_hint_does_not_suggest_a_percentile():
    d = _one(BASE % LOAD + "gate {\n  require throughput > 10\n}\n")
    assert "p99" not in d.message and "mean(throughput)" in d.message


def test_mode_poisson_is_one_error_with_the_arrival_hint():
    d = _one(BASE % "  load {\n    mode = poisson\n    rate = [2rps]\n  }\n  duration = 60s")
    assert (d.code, d.span.line, d.span.column) == ("E109", 5, 12)
    assert "mode = open and arrival = poisson" in d.hint
    assert _checks_clean(BASE % "  load {\n    mode = open\n    arrival = poisson\n    rate = [2rps]\n  }\n  duration = 60s")


def test_misspelled_required_key_is_not_also_missing():
    d = _one(BASE % "  load { concurrency = 1 }\n  duraton = 60s")
    assert (d.code, d.span.line, d.span.column) == ("E101", 5, 3)
    assert d.hint == "did you mean 'duration'?"


def test_a_missing_key_with_no_lookalike_is_still_reported():
    errors = _errors(BASE % "  load { concurrency = 1 }\n  xyzzy = 60s")
    assert sorted((e.code, e.span.line, e.span.column) for e in errors) == [("E101", 5, 3), ("E103", 3, 1)]


def test_misspelled_required_key_in_a_load_block():
    d = _one(BASE % "  load {\n    mode = batch\n    concurrency = 4\n    requets = 8\n  }\n  duration = 60s")
    assert (d.code, d.span.line, d.span.column) == ("E101", 7, 5) and "requests" in d.hint


def test_space_between_number_and_unit():
    tree, diags = parse(BASE % "  load {\n    mode = open\n    rate = [2 rps]\n  }\n  duration = 60s")
    assert tree is None and len(diags) == 1
    d = diags[0]
    assert (d.code, d.span.line, d.span.column) == ("E001", 6, 15)
    assert "2rps" in d.hint


def test_a_unit_apart_from_its_number_at_the_end_of_a_value_is_reported_at_the_unit():
    """`duration = 8 s`: the number ended the value and `s` began a statement, so the error
    fell on the next line ("unexpected 'bucket'"), and `< 1 s` at the end of a rule on the
    gate's closing brace plus a false "unexpected end of file" (an audit's finds). Now each is
    one error at its unit, with the fix, and the rest of the file is checked as usual; a rule
    written with '=' says to compare with '=='."""
    text = ('soak "u" {}\nbackend "a" { url = "http://127.0.0.1:8000" }\nworkload "w" {\n'
            "  load {\n    concurrency = [4]\n  }\n  duration = 8 s  # eight\n  bucket = 2s\n}\n"
            "gate {\n  require p95(ttft) < 1 s\n  require failed = 0\n}\n")
    tree, diags = parse(text)
    assert tree is None
    assert [(d.code, d.span.line, d.span.column) for d in diags] == [("E001", 7, 16), ("E001", 11, 25), ("E001", 12, 18)]
    assert diags[0].message == "unit 's' stands apart from its number 8" and diags[0].hint.endswith(": 8s")
    assert diags[1].hint.endswith(": 1s")
    assert "'=='" in diags[2].hint
    fine = text.replace("8 s", "8s").replace("1 s", "1s").replace("failed = 0", "failed == 0")
    assert parse(fine)[1] == []
    quoted = text.replace('soak "u" {}', 'soak "u" {\n  description = "8 s"  # not 8 s\n}')
    # inside a string or a comment it is text: the same three errors, two lines down
    assert [(d.span.line, d.span.column) for d in parse(quoted)[1]] == [(9, 16), (13, 25), (14, 18)]


def test_colon_instead_of_equals():
    tree, diags = parse(BASE % ("  prompt_words: 128\n" + LOAD))
    assert tree is None and len(diags) == 1
    d = diags[0]
    assert (d.code, d.span.line, d.span.column) == ("E003", 4, 15)
    assert "prompt_words = 128" in d.hint


def test_count_compared_with_a_ratio_hints_ratio():
    d = _one(BASE % LOAD + "gate {\n  require timeouts < 1%\n}\n")
    assert (d.code, d.span.line, d.span.column) == ("E305", 8, 22)
    assert "ratio(timeouts) < 1%" in d.hint
    assert _checks_clean(BASE % LOAD + "gate {\n  require ratio(timeouts) < 1%\n}\n")


def test_count_compared_with_a_rate_hints_rate():
    d = _one(BASE % LOAD + "gate {\n  require failed < 2rps\n}\n")
    assert d.code == "E305" and "rate(failed) < 2rps" in d.hint
    assert _checks_clean(BASE % LOAD + "gate {\n  require rate(failed) < 2rps\n}\n")


def test_require_env_warning_is_one_warning_with_a_count(tmp_path, capsys):
    """W502 once per runtime block, counting the unset names, not once per name with the same
    source line repeated."""
    from soakspec.cli import main

    runtime = '  runtime {\n    label = "NCCL 2.26.2"\n    require_env = ["NCCL_A", "NCCL_B", "NCCL_C"]\n  }\n'
    spec = BASE.replace('backend "a" { url = "http://127.0.0.1:8000" }', 'backend "a" {\n  shell = "srv --port {port}"\n  env { NCCL_B = "1" }\n' + runtime + "}") % LOAD
    tree, diags = parse(spec)
    warnings = [d for d in check(tree)[1] if d.code == "W502"]
    assert len(warnings) == 1
    w = warnings[0]
    assert (w.span.line, w.span.column) == (7, 19)
    assert "2 env variables ('NCCL_A', 'NCCL_C')" in w.message and "NCCL_B" not in w.message
    f = tmp_path / "w.soak"
    f.write_text(spec)
    assert main(["check", str(f)]) == 0
    out = capsys.readouterr().out
    assert out.count("W502") == 1 and out.count('require_env = ["NCCL_A"') == 1


def test_misspelled_load_block_is_not_also_missing():
    d = _one(BASE % "  lod { concurrency = 1 }\n  duration = 60s")
    assert (d.code, d.span.line, d.span.column) == ("E100", 4, 3) and d.hint == "did you mean 'load'?"


def test_misspelled_launch_is_not_also_a_backend_without_a_kind():
    text = BASE.replace('backend "a" { url = "http://127.0.0.1:8000" }', 'backend "a" { launh = ["srv", "{port}"] }') % LOAD
    d = _one(text)
    assert (d.code, d.span.line, d.span.column) == ("E101", 2, 15) and d.hint == "did you mean 'launch'?"


def test_misspelled_runtime_label_is_not_also_missing():
    text = BASE.replace('backend "a" { url = "http://127.0.0.1:8000" }', 'backend "a" {\n  url = "http://127.0.0.1:8000"\n  runtime { lable = "host-staged" }\n}') % LOAD
    d = _one(text)
    assert (d.code, d.span.line, d.span.column) == ("E101", 4, 13) and d.hint == "did you mean 'label'?"


def test_a_list_left_open_at_the_end_of_its_line_is_one_error_where_the_line_ends():
    """`max_tokens = [16, 32` followed by more keys: one error, at the end of the list's line,
    saying to close it -- not one "unexpected <key>" per following line."""
    d = _one(BASE % ("  max_tokens = [16, 32  # sizes\n  prompt_words = 8\n" + LOAD))
    assert (d.code, d.span.line, d.span.column) == ("E001", 4, 23)
    assert d.message == "missing ']': the list is not closed at the end of this line"
    assert "']'" in d.hint


def test_a_missing_comma_in_a_list_laid_out_one_item_a_line_is_not_taken_for_an_open_list():
    d = _one(BASE % ("  max_tokens = [\n    16\n    32\n  ]\n" + LOAD))
    assert (d.code, d.span.line) == ("E001", 6)
    assert "expected ',', ']'" in d.message


def test_a_key_and_a_string_without_equals_is_one_error_on_its_line():
    """`issue "x"` reads like a block header (`backend "b" {`): without a mend the next line
    reported "expected '{'", and every line after it. One error, at the string, with the fix."""
    text = 'soak "x" {\n  issue "#12"  # the issue\n  description = "d"\n}\n' + BASE.split("\n", 1)[1] % LOAD
    d = _one(text)
    assert (d.code, d.span.line, d.span.column) == ("E001", 2, 9)
    assert d.message == "missing '=' between 'issue' and its value"
    assert d.hint == "a key and its value are written with '=': issue = \"#12\""


def test_a_named_block_without_its_brace_is_not_mended_into_a_key():
    tree, diags = parse('backend "a"\n  url = "http://127.0.0.1:8000"\n}\n')
    assert tree is None and diags and all("missing '='" not in d.message for d in diags)


def test_a_key_written_as_a_block_says_so_rather_than_suggesting_itself():
    """`bucket { ... }` in a workload: 'bucket' is a key there; the hint used to be "did you
    mean 'bucket'?" -- the very name written."""
    d = _one(BASE % (LOAD + "\n  bucket { length = 10s }"))
    assert (d.code, d.span.line, d.span.column) == ("E104", 6, 3)
    assert "is a key" in d.message and d.hint == "write bucket = <value>"


def test_a_required_key_written_as_a_block_is_one_error():
    d = _one(BASE % "  load { concurrency = 1 }\n  duration { length = 60s }")
    assert (d.code, d.span.line, d.span.column) == ("E104", 5, 3)


@pytest.mark.parametrize(
    "load, backend",
    [
        ("concurrency = []", "sim { ttft = 20ms  itl = 10ms }"),  # refused: E205
        ("concurrency = [4, 99999999999999999999]", "sim { ttft = 20ms  itl = 10ms }"),  # refused: E204
        ("concurrency = 1", "sim { ttft = 20  itl = 10ms }"),  # the simulator's ttft refused: E201
    ],
)
def test_no_sample_estimate_from_a_value_that_was_refused(load, backend):
    """W509 estimates from the spec's load and latency; where one was refused, the default that
    stands in for it (concurrency 1, the simulator's default ttft) is not what the spec says, and
    a warning "about 15 per level are planned (... at concurrency 1)" would only mislead."""
    text = (f'soak "x" {{}}\nbackend "b" {{ {backend} }}\nworkload "w" {{\n  max_tokens = 10\n'
            f'  load {{ {load} }}\n  duration = 2s\n}}\ngate {{\n  require p99(ttft) < 1s per level\n}}\n')  # fmt: skip
    tree, diags = parse(text)
    _, more = check(tree)
    codes = [d.code for d in diags + more]
    assert any(c.startswith("E") for c in codes) and "W509" not in codes, codes


GATED = BASE % LOAD + "gate {\n%s\n}\nclaims {\n  claim \"a\"\n}\n"


@pytest.mark.parametrize(
    "rules, col, hint",
    [
        ("  require p95(ttft) < 1s per\n  require failed == 0", 29, "per run, backend"),  # the next rule read as the scope
        ("  require p95(ttft) < 1s per", 29, "per run, backend"),  # then '}': no error at '}', none at 'claims {'
        ("  require p95(ttft) <\n  require failed == 0", 22, "write the threshold"),
        ("  require p95(ttft) <", 22, "write the threshold"),
        ("  require p95(ttft) < 1s on", 28, 'on "name"'),
    ],
)
def test_a_rule_cut_short_at_its_line_end_is_one_error_there(rules, col, hint):
    """A rule whose line ends before the rule does is reported at that line's end, with what to
    write -- not at the next line's first token ('}' or the next rule's '=='), and not again at
    every later token the parse could not fit (`claims {` was an error too)."""
    d = _one(GATED % rules)
    assert (d.code, d.span.line, d.span.column) == ("E001", 8, col), d.message
    assert d.hint and hint in d.hint


def test_a_key_without_its_value_is_reported_on_its_own_line():
    """`duration =` then `bucket = 10s`: newlines carry no meaning, so the parse takes `bucket`
    for the value and stops at the next '='; the error belongs at the end of `duration =`."""
    d = _one(BASE % "  load { concurrency = 1 }\n  duration =\n  bucket = 10s")
    assert (d.code, d.span.line, d.span.column) == ("E001", 5, 13)
    assert "same line" in d.hint


def test_a_source_line_with_control_characters_is_shown_not_obeyed():
    """A raw ESC on a line shown under a diagnostic went to the terminal as it was; it is shown
    as U+FFFD, one cell, so the caret stays under the mistake."""
    from soakspec.diagnostics import render_text

    text = BASE % (LOAD + '\n  bucket = "\x1b[31mred" bogus = 1')
    tree, diags = parse(text)
    _, more = check(tree)
    out = render_text(diags + more, {"<string>": text})
    assert "\x1b" not in out and '  bucket = "\ufffd[31mred" bogus = 1' in out
    lines = out.splitlines()
    carets = [lines[i + 1].index("^") for i, ln in enumerate(lines) if ln == '    bucket = "\ufffd[31mred" bogus = 1']
    assert carets == [len("    bucket = "), len('    bucket = "\ufffd[31mred" ')]  # the string (E104), then 'bogus' (E101)


def test_a_repeated_load_level_is_warned_at_the_repeat_not_at_the_load_block():
    """W504 points at the value it is about: the item of the level list equal to an earlier
    one (rates compared once converted: 1rps and 60rpm are one level)."""
    closed = "  load { concurrency = [4, 8, 4] }"
    opened = "  load {\n    mode = open\n    rate = [1rps, 2rps, 60rpm]\n  }"
    for load, line, col in ((closed, 4, closed.rindex("4") + 1), (opened, 6, opened.splitlines()[2].index("60rpm") + 1)):
        _, diags = check(parse(BASE % f"{load}\n  duration = 60s")[0])
        (w,) = [d for d in diags if d.code == "W504"]
        assert (w.span.line, w.span.column) == (line, col), w


@pytest.mark.parametrize(
    "url",
    ["http://user:hunter2pass@127.0.0.1:8000", "http://user:hunter2pass@host:99999", "http://user:p@hunter2pass@h/x",
     "http://h ost:1/?api_key=hunter2pass"],
)
def test_an_invalid_url_is_quoted_without_its_credentials(url):
    """E406 quotes the URL it refuses, but never its password (or a secret-named query value):
    a diagnostic is printed, logged and pasted into issues. The quoted source line is the
    user's own file and stays as written."""
    text = BASE.replace("http://127.0.0.1:8000", url) % LOAD
    e = _one(text)
    assert e.code == "E406"
    assert "hunter2pass" not in e.message and "hunter2pass" not in (e.hint or ""), e
    assert "***" in e.message
    if "@" in url:
        assert "user:***@" in e.message and "api_key_env" in e.hint


@pytest.mark.parametrize(
    ("body", "line", "hint"),
    [
        ("  concurrency = [4]\n  duration = 60s", 4, "'concurrency' belongs inside load { ... }"),
        ("  load { concurrency = 1 }\n  mode = closed\n  duration = 60s", 5, "'mode' belongs inside load { ... }"),
        ("  load { concurrency = 1 }\n  step = 2\n  duration = 60s", 5, "'step' belongs inside load { ... }"),  # was: 'stream'?
        ("  load { concurrency = 1 }\n  seed = 2\n  duration = 60s", 5, "'seed' belongs inside load { ... } or sampling { ... }"),
        ("  load { concurrency = 1 }\n  top_p = 0.9\n  duration = 60s", 5, "'top_p' belongs inside sampling { ... }"),
        ("  load {\n    concurrency = 1\n    duration = 60s\n  }", 6, "'duration' belongs one level up, in workload"),
        ("  load {\n    concurrency = 1\n    ramp_to = 4\n  }\n  duration = 60s", 6, "'ramp_to' belongs inside a phase, phases { NAME {"),
        ("  load { concurrency = 1 }\n  url = \"http://h:1\"\n  duration = 60s", 5, "'url' belongs inside backend \"name\" { ... }"),
    ],
)
def test_a_key_of_another_block_names_that_block_and_is_one_error(body, line, hint):
    """A key written in the wrong block (`concurrency` at workload level, not in its `load { }`)
    had no hint, or a lookalike of the wrong block's keys; the hint names the block that has
    it, and what follows from the one mistake (the load block's missing concurrency, the
    workload's missing duration, a load block never written) is not reported again."""
    e = _one(BASE % body)
    assert (e.code, e.span.line) == ("E101", line) and e.hint.startswith(hint), e


def test_a_key_of_a_nested_block_at_the_wrong_level_of_a_backend_or_the_top():
    text = 'soak "x" {}\nbackend "a" {\n  ttft = 40ms\n  traces { log_file = "x.log" }\n}\nworkload "w" {\n%s\n}\nbucket = 5s\n' % LOAD
    errors = _errors(text)
    assert [(d.span.line, d.hint) for d in errors] == [
        (10, "'bucket' belongs inside workload \"name\" { ... }"),
        (3, "'ttft' belongs inside sim { ... }"),  # and no "needs one of launch, shell, url or sim"
        (4, "'log_file' belongs one level up, in backend \"name\" { ... }"),
    ]


def test_a_lookalike_key_of_this_block_is_still_suggested_before_a_far_block_that_has_the_key():
    e = _one('soak "x" {}\nmodel { served_model_name = "m" }\nbackend "a" { url = "http://127.0.0.1:8000" }\nworkload "w" {\n%s\n}\n' % LOAD)
    assert e.hint == "did you mean 'served_name'? ('served_model_name' belongs inside sim { ... } of a backend)"


@pytest.mark.parametrize(("rule", "column", "says"), [
    ("p95(ttft) < -1s", 23, "never negative, with a threshold below zero: it never holds"),
    ("p95(ttft) > -1s", 23, "it always holds"),
    ("failed < -1", 20, "compares a count, which is never negative"),
    ("failed == 0.5", 21, "a count is a whole number, so it never holds"),
    ("ratio(failed) < 150%", 27, "a share, which is at most 100%, with 150%: it always holds"),
    ("goodput(ttft < 1s) >= 150%", 33, "it never holds"),
    ("goodput(ttft < -1s) >= 90%", 26, "ttft is never negative, so no request meets a threshold below zero"),
])
def test_a_threshold_the_metric_can_never_reach_is_one_error_at_the_threshold(rule, column, says):
    """`duration = -10s` was refused while `require p95(ttft) < -1s` -- a rule decided before the
    run starts -- checked clean; so did a share beyond 100 % and a count equal to a fraction."""
    d = _one(BASE % LOAD + f"gate {{\n  require {rule}\n}}\n")
    assert (d.code, d.span.line, d.span.column) == ("E204", 8, column), (d.code, d.span.column, d.message)
    assert says in d.message and d.hint


@pytest.mark.parametrize("rule", ["drift(p95(ttft)) >= -10%", "mean(schedule_lag) > -5ms", "failed < 0.5",
                                  "max(cpu) < 250%", 'max(server("vllm:x")) > -1', "ratio(failed) <= 100%"])
def test_thresholds_a_metric_can_reach_check_clean(rule):
    """A drift is signed, the open loop's schedule lag can be negative (a request sent early), a
    count below a fraction is a count below the next whole number, CPU is a share of one core
    (several cores: beyond 100 %), a server's own metric has the server's range."""
    assert _checks_clean(BASE % LOAD + f"gate {{\n  require {rule}\n}}\n"), _errors(BASE % LOAD + f"gate {{\n  require {rule}\n}}\n")


def test_a_duplicate_blocks_body_is_checked_too():
    """All errors at once: a second workload 'w' (E106) or a second gate (E105) hid its own
    mistakes until it was renamed or removed -- then they appeared, one fix later."""
    dup = BASE % LOAD + 'workload "w" {\n  prompt_words = 4\n  prompt_tokens = 4\n  load { concurrency = 1 }\n  duration = 6\n}\n'
    got = [(d.code, d.span.line) for d in _errors(dup)]
    assert ("E106", 7) in got and ("E403", 9) in got and ("E201", 11) in got, got
    twice = BASE % LOAD + "gate {\n  require failed == 0\n}\ngate {\n  require p95(tttf) < 1s\n}\n"
    got = [(d.code, d.span.line) for d in _errors(twice)]
    assert got == [("E105", 10), ("E302", 11)], got
# ---------------------------------------------------------------- a word after a number

GATE = BASE % LOAD + "gate {\n%s\n}\n"  # the gate's first line is line 8
UNITS_HINT = "us ms s m h (durations); B KiB MiB GiB TiB KB MB GB (sizes); % (ratios); rps rpm (rates)"


def _seen(text: str) -> list[tuple]:
    """Every diagnostic as the user reads it: code, line, column, end column, message, hint."""
    tree, diags = parse(text)
    if tree is not None:
        _, diags = check(tree)
    return [(d.code, d.span.line, d.span.column, d.span.end_column, d.message, d.hint) for d in diags if d.severity is Severity.ERROR]


def test_a_word_after_a_threshold_is_one_error_at_the_word_not_one_per_following_line():
    """`< 100 tokens`: the parse took `tokens` to start a statement, and reported the next
    four rules' `require` (never the word); now the word alone, with what a value is."""
    rules = "  require p95(ttft) < 100 tokens\n" + "".join(f"  require p{p}(ttft) < 1s\n" for p in (99, 50, 90)) + "  require failed == 0"
    assert _seen(GATE % rules) == [
        ("E001", 8, 27, 33, "unexpected 'tokens' after the number 100: it is not a unit",
         "a value is one word: a count is a plain number (100), a quantity is a number with its unit right after it (100ms); "
         "the units are " + UNITS_HINT),
    ]


@pytest.mark.parametrize(
    ("value", "word", "unit"),
    [("10 seconds", "seconds", "s"), ("10 sec", "sec", "s"), ("10 minutes", "minutes", "m"), ("10 MS", "MS", "ms")],
)
def test_a_unit_word_apart_from_its_number_is_reported_with_the_unit_it_means(value, word, unit):
    """`duration = 10 seconds` was `unexpected 'bucket'` on the next line, with no hint: the
    unit-apart repair knew only real units (`10 s`)."""
    text = BASE % f"  load {{ concurrency = 1 }}\n  duration = {value}\n  bucket = 5s"
    assert _seen(text) == [
        ("E001", 5, 17, 17 + len(word), f"unexpected {word!r} after the number 10", f"write the unit right after the number, without a space: 10{unit}"),
    ]


def test_an_underscore_in_a_number_is_one_error_at_the_underscore():
    """`1_000_000` lexes as the number 1 and the name `_000_000`: it gave three errors on
    other lines (the closing brace, the next key, the end of the file), none at the number."""
    text = BASE % "  load { mode = batch  concurrency = [2]  requests = 1_000_000 }\n  duration = 60s"
    assert _seen(text) == [
        ("E001", 4, 55, 63, "'_' does not group digits: 1_000_000 is read as the number 1 and the name '_000_000'",
         "write the number without '_': 1000000"),
    ]


@pytest.mark.parametrize(
    ("rules", "col"),
    [
        ("  require p95(ttft) < 100 tokens per level\n  require failed == 0", 27),  # goes on with the rule
        ("  require p95(ttft) < 100 tokens }\ngate {\n  require failed == 0", 27),  # closes the block
        ("  require failed == 0 require p95(ttft) < 100 tokens", 47),
    ],
)
def test_a_word_after_a_number_ends_its_line_s_errors(rules, col):
    assert [(d[0], d[1], d[2], d[4]) for d in _seen(GATE % rules)] == [
        ("E001", 8, col, "unexpected 'tokens' after the number 100: it is not a unit"),
    ]


def test_a_unit_word_inside_a_list_gets_the_same_hint():
    text = BASE % "  load { mode = open\n    rate = [2 seconds, 3rps] }"
    assert _seen(text)[0][:6] == ("E001", 5, 15, 22, "unexpected 'seconds' after the number 2", "write the unit right after the number, without a space: 2s")
    assert len(_seen(text)) == 1


def test_a_word_after_a_number_that_is_a_statement_is_not_an_error():
    """One-line blocks: `concurrency = 2 requests = 5` is two statements."""
    assert _checks_clean(BASE % "  load { mode = batch  concurrency = [2]  requests = 5 }\n  duration = 60s")


def test_per_after_on_says_the_scope_comes_first_and_the_next_rules_are_not_reported():
    """The grammar reads `... per SCOPE on "backend"`; `on "a" per level` was the right error
    with an expected-list and no hint, then `unexpected 'require'` on the next line (the
    left-over `level` taken to start a statement)."""
    rules = '  require p95(ttft) < 1s on "a" per level\n  require failed == 0\n  require p50(itl) < 100ms per level'
    assert _seen(GATE % rules) == [
        ("E001", 8, 33, 36, "'per' after 'on \"a\"': a rule's scope comes before its backend",
         'write require p95(ttft) < 1s per level on "a"'),
    ]
    one_line = BASE % LOAD + 'gate { require p95(ttft) < 1s on "a" per window 30s }\n'
    assert _seen(one_line) == [
        ("E001", 7, 38, 41, "'per' after 'on \"a\"': a rule's scope comes before its backend",
         'write require p95(ttft) < 1s per window 30s on "a"'),
    ]  # and the '}' after the dropped words still closes the gate: no "unexpected end of file"
    assert _checks_clean(GATE % '  require p95(ttft) < 1s per level on "a"')


def test_or_between_goodput_conditions_is_one_error_that_names_and():
    """It was `unexpected 'or' (expected ')', slo_and)` -- a grammar name -- and every rule
    after it on the next lines was 'unexpected'."""
    rules = "  require goodput(ttft < 1s or tpot < 5ms) >= 90%\n  require failed == 0\n  require p95(ttft) < 1s"
    assert _seen(GATE % rules) == [
        ("E001", 8, 29, 31, "goodput's conditions cannot be joined with 'or'",
         "goodput counts the requests that meet every condition, joined with 'and'; there is no 'or' "
         "(a rule for each condition checks each on its own)"),
    ]
    assert _checks_clean(GATE % "  require goodput(ttft < 1s and tpot < 5ms) >= 90%")


def test_an_expected_token_is_never_named_by_its_grammar_name():
    from soakspec.lang.parser import _TERMINAL_NAMES, _parser

    assert {t.name for t in _parser().terminals} - {"WS", "COMMENT"} <= set(_TERMINAL_NAMES)
    e = _one(GATE % "  require goodput(ttft < 1s tpot < 5ms) >= 90%")
    assert e.message == "unexpected 'tpot' (expected ')', 'and')"


# ---------------------------------------------------------------- hints that name what is meant


@pytest.mark.parametrize(
    ("written", "hint", "fixed"),
    [
        ("median(ttft) <= 1s", "write p50(ttft) (the median is the 50th percentile)", "p50(ttft) <= 1s"),  # was: did you mean 'mean'?
        ("avg(ttft) <= 1s", "write mean(ttft)", "mean(ttft) <= 1s"),  # was: no hint
        ("average(latency) <= 1s", "write mean(latency)", "mean(latency) <= 1s"),
    ],
)
def test_another_name_for_an_aggregate_is_answered_with_the_one_that_means_it(written, hint, fixed):
    e = _one(GATE % f"  require {written}")
    assert (e.code, e.span.line, e.span.column, e.message.split(" '")[0], e.hint) == ("E303", 8, 11, "unknown function", hint)
    assert _checks_clean(GATE % f"  require {fixed}")


@pytest.mark.parametrize(
    ("written", "hint", "fixed"),
    [
        ("request_throughput >= 1rps", "completed requests per second is 'qps': write mean(qps) ('throughput' is output tokens per second)",
         "mean(qps) >= 1rps"),  # was: did you mean 'throughput'? (output tokens per second)
        ("min(request_throughput) >= 1rps", "completed requests per second is 'qps': write min(qps) ('throughput' is output tokens per second)",
         "min(qps) >= 1rps"),
        ("mean(output_throughput) >= 100",
         # the nearest other name is now the total, prompt + output: the figure vLLM prints beside it
         "output tokens per second is 'throughput': write mean(throughput) ('total_throughput' is prompt + output tokens per second)",
         "mean(throughput) >= 100"),
        ("p95(e2el) <= 1s", "end-to-end request latency is 'latency': write p95(latency)", "p95(latency) <= 1s"),
        # vLLM's --goodput e2el:1000: inside an SLO set the same name had no hint at all
        ("goodput(e2el < 1s) >= 90%", "end-to-end request latency is 'latency': write latency < 1s",
         "goodput(latency < 1s) >= 90%"),
        ("goodput(ttft < 1s and time_per_output_token <= 50ms) >= 90%",
         "time per output token after the first is 'tpot': write tpot <= 50ms", "goodput(ttft < 1s and tpot <= 50ms) >= 90%"),
    ],
)
def test_another_benchmark_s_metric_name_is_answered_with_the_metric_that_measures_it(written, hint, fixed):
    e = _one(GATE % f"  require {written}")
    assert (e.code, e.span.line, e.hint) == ("E302", 8, hint)
    assert _checks_clean(GATE % f"  require {fixed}")


@pytest.mark.parametrize(
    ("placeholder", "hint"),
    [("{modelpath}", "did you mean '{model_path}'?"), ("{prot}", "did you mean '{port}'?"),
     ("{model}", "did you mean '{model_id}'?"), ("{x}", "write '{{' and '}}' for literal braces")],
)
def test_an_unknown_placeholder_is_answered_with_the_nearest_one(placeholder, hint):
    """`{modelpath}` was told to write '{{' and '}}' for literal braces: it meant `{model_path}`."""
    text = BASE.replace('url = "http://127.0.0.1:8000"', f'launch = ["srv", "--port", "{{port}}", "{placeholder}"]') % LOAD
    e = _one(text)
    assert (e.code, e.span.line, e.span.column, e.hint) == ("E404", 2, 52, hint)
    assert e.message.startswith(f"unknown placeholder '{placeholder}'")


@pytest.mark.parametrize(("written", "meant"), [("=<", "<="), ("=>", ">=")])
def test_a_comparison_written_backwards_is_answered_with_the_right_one(written, meant):
    """`p95(ttft) =< 1s` was told that '=' gives a key its value."""
    rules = f"  require p95(ttft) {written} 1s\n  require failed == 0"
    assert _seen(GATE % rules) == [
        ("E001", 8, 21, 23, f"unexpected {written!r}", f"write {meant!r}: a comparison is written with '=' second (<=, >=)"),
    ]
    assert _seen(GATE % f"  require goodput(ttft {written} 1s) >= 90%")[0][1:5] == (8, 24, 26, f"unexpected {written!r}")


# ---------------------------------------------------------------- messages that say what is wrong


@pytest.mark.parametrize(
    ("body", "col", "key", "written", "fixed"),
    [
        ("  prompt_words = 1e1\n" + LOAD, 18, "prompt_words", "1e1", "10"),
        ("  max_tokens = 1e3\n" + LOAD, 16, "max_tokens", "1e3", "1000"),
        ("  prompt_words = 2.0\n" + LOAD, 18, "prompt_words", "2.0", "2"),
        ("  load { mode = batch  concurrency = 1  requests = 1e6 }\n  duration = 60s", 52, "requests", "1e6", "1000000"),
    ],
)
def test_a_whole_number_written_as_a_float_says_so_and_how_to_write_it(body, col, key, written, fixed):
    """It was "must be a whole number, not the number 10.0" -- a whole number."""
    e = _one(BASE % body)
    assert (e.code, e.span.line, e.span.column) == ("E104", 4, col)
    assert e.message == f"'{key}' takes a whole number, written in digits without a decimal point or an exponent"
    assert e.hint == f"write {fixed}"
    assert _checks_clean(BASE % body.replace(written, fixed))


def test_a_fraction_is_still_not_a_whole_number():
    e = _one(BASE % ("  max_tokens = 2.5\n" + LOAD))
    assert (e.code, e.message, e.hint) == ("E104", "'max_tokens' must be a whole number, not the number 2.5", None)


def test_a_duration_in_two_units_is_one_error_that_writes_it_in_one():
    """`duration = 1h30m` was "unexpected '30m' (expected 'claim' or 'exclude', 'require', ...)"."""
    text = BASE % "  load { concurrency = 1 }\n  duration = 1h30m\n  bucket = 5m"
    assert _seen(text) == [
        ("E001", 5, 14, 19, "compound duration '1h30m' is not supported: a duration is one number and one unit", "write 90m"),
    ]
    assert _seen(BASE % "  load { concurrency = 1 }\n  duration = 1m 30s")[0][1:] == (
        5, 14, 20, "compound duration '1m 30s' is not supported: a duration is one number and one unit", "write 90s")
    assert _checks_clean(BASE % "  load { concurrency = 1 }\n  duration = 90m\n  bucket = 5m")


def test_a_compound_duration_too_large_to_sum_is_an_error_not_a_crash():
    """`3600m1e999s` (found by the mutated-spec property): its sum is infinite, and rounding it
    for the hint raised OverflowError out of `parse`."""
    ((code, line, *_),) = _seen(BASE % "  load { concurrency = 1 }\n  duration = 3600m1e999s")
    assert (code, line) == ("E001", 5)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (BASE % (LOAD + "\n  5"), "(expected a key = value, a block or '}' in workload)"),
        (BASE % LOAD + "gate {\n  5\n}\n", "(expected a rule -- require, warn or abort --, a key = value or '}' in gate)"),
        (BASE % LOAD + 'claims {\n  5\n}\n', "(expected claim \"...\", exclude \"...\" or '}' in claims)"),
        (BASE % LOAD + "5\n", "(expected a block)"),
    ],
)
def test_where_a_statement_was_expected_the_message_names_what_this_block_holds(text, expected):
    """Every block was told it could hold 'claim' or 'exclude', 'require', 'warn' or 'abort'."""
    e = _one(text)
    assert e.code == "E001" and e.message == f"unexpected '5' {expected}"


def test_a_quoted_key_is_told_to_drop_the_quotes():
    text = BASE.replace('url = "http://127.0.0.1:8000"', 'url = "http://127.0.0.1:8000"\n  env { "WEIRD" = "1" }') % LOAD
    assert _seen(text) == [
        ("E001", 3, 9, 16, "unexpected '\"WEIRD\"' (expected a key = value, a block or '}' in env)", "a key is written without quotes: WEIRD = ..."),
    ]


def test_the_blocks_the_parser_says_hold_rules_or_claims_are_the_checker_s():
    from soakspec.lang import ast as A
    from soakspec.lang.check.claims import CLAIMS
    from soakspec.lang.check.compare import COMPARE
    from soakspec.lang.check.gate import GATE
    from soakspec.lang.parser import CLAIM_BLOCKS, RULE_BLOCKS

    import importlib
    import pkgutil

    from soakspec.lang.check.core import Table

    package = importlib.import_module("soakspec.lang.check")
    modules = [importlib.import_module(f"soakspec.lang.check.{m.name}") for m in pkgutil.iter_modules(package.__path__)]
    with_statements = {id(t) for mod in modules for t in vars(mod).values() if isinstance(t, Table) and t.statements}
    assert with_statements == {id(GATE), id(COMPARE), id(CLAIMS)}  # a new one: name it in the parser's lists
    assert (RULE_BLOCKS, CLAIM_BLOCKS) == (("gate", "compare"), ("claims",))
    assert GATE.statements == COMPARE.statements == (A.Rule,) and CLAIMS.statements == (A.Claim,)


# ---------------------------------------------------------------- a raw string's quote


def test_a_backslash_quote_in_a_raw_string_is_one_error_at_the_quote_with_a_pattern_that_works():
    """`r"v(?P<version>\\d+)\\"?"`: the raw string ends at the `\\"`; it was `'{' is never
    closed` two lines up (the braces are balanced) and `unexpected character '?'`."""
    backend = 'backend "a" {\n  url = "http://127.0.0.1:8000"\n  log_file = "s.log"\n  runtime { label = "x" log_pattern = %s }\n}\n'
    text = 'soak "x" {}\n' + backend % r'r"v(?P<version>\d+)\"?"' + 'workload "w" {\n%s\n}\n' % LOAD
    assert _seen(text) == [
        ("E005", 5, 59, 60, "a raw string ends at this '\"': the backslash before it does not escape it",
         r'''match a quote with \x22 in a pattern: r"v(?P<version>\d+)\x22?" (a raw string takes every character as written, '''
         r'''up to its first '"'; in a plain string \" is a quote and \\ a backslash)'''),
    ]
    assert [d[0] for d in _seen('soak "x" {}\n' + backend % r'r"v(?P<version>\d+)\x22?"' + 'workload "w" {\n%s\n}\n' % LOAD)] == []
    assert [d[0] for d in _seen('soak "x" {}\n' + backend % r'"v(?P<version>\\d+)\"?"' + 'workload "w" {\n%s\n}\n' % LOAD)] == []


def test_a_raw_string_may_still_end_in_a_backslash():
    for value in (r'r"C:\dir\"', r'[r"a\", "b"]'):
        _, diags = parse(f'soak "x" {{\n  issue = {value}\n}}\n')
        assert diags == [], value


@pytest.mark.parametrize(("written", "hint"), [("10sec", "write 10s"), ("10seconds", "write 10s"), ("250MS", "write 250ms"),
                                               ("2mins", "write 2m")])
def test_a_unit_spelled_another_way_right_after_its_number_is_answered_with_the_unit(written, hint):
    """`10 seconds` (apart) was answered with `10s`; `10sec` (together) got E202 with no hint."""
    d = _one(BASE % f"  load {{ concurrency = 1 }}\n  duration = {written}")
    assert d.code == "E202" and d.hint == hint, (d.code, d.hint)


@pytest.mark.parametrize(
    ("mode", "phase", "key", "hint"),
    [
        ("open", "rate = 2rps\n        concurrency = 4", "concurrency",
         "'concurrency' belongs in a closed-loop phase (load mode = closed; its workers: concurrency); this is an open-loop phase"),
        ("closed", "concurrency = 4\n        rate = 2rps", "rate",
         "'rate' belongs in an open-loop phase (load mode = open; its arrivals: rate); this is a closed-loop phase"),
    ],
)
def test_a_key_of_the_other_loops_phase_says_which_phase_has_it(mode, phase, key, hint):
    """`concurrency` in an open-loop phase was hinted "belongs one level up, in load { ... }",
    where a load with phases refuses it in turn ("set per phase"): following the hint gave a
    second error. The hint names the phase of the other loop, which the load's mode picks."""
    body = f"  load {{\n    mode = {mode}\n    phases {{\n      up {{\n        {phase}\n        duration = 4s\n      }}\n    }}\n  }}"
    e = _one(BASE % body)
    assert (e.code, e.span.line) == ("E101", 9) and key in e.message and e.hint.startswith(hint), e


def _warnings(text: str, code: str) -> list:
    tree, diags = parse(text)
    assert tree is not None
    _, diags = check(tree)
    return [d for d in diags if d.code == code]


@pytest.mark.parametrize(
    ("load", "warned"),
    [
        ("mode = open\n    arrival = constant\n    seed = 7\n    rate = [2rps]", True),
        ("mode = open\n    arrival = poisson\n    seed = 7\n    rate = [2rps]", False),
        ("mode = open\n    seed = 7\n    rate = [2rps]", True),  # constant, the default (vLLM's bench serve: Poisson)
        ("mode = open\n    arrival = constant\n    rate = [2rps]", False),
        ("mode = open\n    arrival = constant\n    seed = 7\n    phases {\n      a { rate = 2rps\n duration = 4s }\n    }", True),
        ("mode = open\n    arrival = constant\n    seed = 7\n    phases {\n      a { rate = 2rps\n arrival = poisson\n duration = 4s }\n    }", False),
        ("mode = open\n    phases {\n      a { rate = 2rps\n arrival = constant\n seed = 3\n duration = 4s }\n    }", True),
    ],
)
def test_a_seed_that_seeds_nothing_is_warned(load, warned):
    """`seed` in a load block seeds random arrivals only: with `arrival = constant` (i / rate)
    (the default) it changed nothing, silently -- a user who meant the server's sampling seed,
    or expected Poisson arrivals as `bench serve` sends, believed them seeded. W514 says so at the seed, with the sampling block's seed as the hint; a
    seed that some phase's random arrivals use is not warned."""
    text = BASE % (f"  load {{\n    {load}\n  }}" + ("" if "phases" in load else "\n  duration = 4s"))
    got = _warnings(text, "W514")
    assert _checks_clean(text)
    assert bool(got) == warned, got
    if warned:
        assert got[0].span.line == text.splitlines().index(next(l for l in text.splitlines() if "seed" in l)) + 1
        assert "sampling { seed" in got[0].hint
