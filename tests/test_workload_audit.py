"""What users of `vllm bench serve`, GuideLLM and k6 expect of workloads and datasets, where
soakspec did otherwise: a prompt file shorter than a level's requests cycles silently (a
server's prefix cache then serves the repeats and TTFT reads better than it is)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from runner_support import manifest

from soakspec.diagnostics import Severity, render_text
from soakspec.evidence.schema import validate
from soakspec.lang import load_spec
from soakspec.plan import plan
from soakspec.runner.engine import RunOptions, execute
from specs import one_workload_spec


def _write(tmp_path: Path, prompts: int, load: str, after: str = "duration = 1s", extra: str = "") -> Path:
    (tmp_path / "p.txt").write_text("".join(f"question number {i}\n" for i in range(prompts)))
    before = f'prompt_file = "p.txt"\n  max_tokens = 4\n  {extra}'
    text = one_workload_spec(name="audit", issue="1", before_load=before, load=load,
                             after_load=f"{after}\n  deadline = 5s\n  follow_up = false")  # fmt: skip
    path = tmp_path / "w.soak"
    path.write_text(text)
    return path


def _w511(path: Path):
    spec, diags, text = load_spec(path)
    assert spec is not None, diags
    return [d for d in diags if d.code == "W511"], render_text(diags, {str(path): text})


def test_a_prompt_file_shorter_than_an_open_levels_arrivals_warns_with_the_counts(tmp_path):
    """3 prompts for 10 rps over 1 s of warmup and 1 s measured: 20 arrivals, each prompt sent
    about 7 times -- `check` and `plan` say so at the spec's prompt_file (vllm bench serve warns
    as it oversamples), where before nothing did."""
    path = _write(tmp_path, 3, "mode = open\n    rate = [2rps, 10rps]", after="warmup = 1s\n  duration = 1s")
    [w], shown = _w511(path)
    assert w.severity is Severity.WARNING and w.span.line == 11
    assert "about 20 requests in a level (10 rps, warmup included)" in w.message
    assert "holds 3 prompts" in w.message and "6.7 times" in w.message and "prefix cache" in w.message
    assert "W511" in shown and "w.soak:11:" in shown and "prompt_repeats" in shown
    assert not _w511(_write(tmp_path, 25, "mode = open\n    rate = [2rps, 10rps]", after="warmup = 1s\n  duration = 1s"))[0]


def test_closed_and_batch_levels_warn_from_their_concurrency_or_expected_latency(tmp_path):
    [w], _ = _w511(_write(tmp_path, 2, "mode = closed\n    concurrency = [1, 4]"))
    assert "at least 4 requests in a level (concurrency 4" in w.message
    assert not _w511(_write(tmp_path, 4, "mode = closed\n    concurrency = [1, 4]"))[0]  # unknown beyond that: no guess
    [w], _ = _w511(_write(tmp_path, 4, "mode = closed\n    concurrency = [2]", extra="expected_latency = 100ms"))
    assert "about 20 requests" in w.message and "5.0 times" in w.message
    [w], _ = _w511(_write(tmp_path, 4, "mode = batch\n    concurrency = [2]\n    requests = 8"))
    assert "at least 8 requests in a level (concurrency 2, batches of 8" in w.message


def test_the_manifest_records_each_levels_prompt_repeats(tmp_path):
    """A real run on the simulator: a 2-prompt file at concurrency 2 for 1 s sends each prompt
    many times; the level's manifest entry says how many requests repeated one."""
    path = _write(tmp_path, 2, "mode = closed\n    concurrency = [2]")
    spec, diags, _ = load_spec(path)
    assert spec is not None, diags
    result = execute(plan(spec), RunOptions(out_dir=tmp_path / "run", quiet=True))
    assert result.status == "complete", result.reason
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert validate("manifest", manifest) == []
    [lv] = manifest["backends"][0]["levels"]
    assert lv["sent"] > 2 and lv["prompt_repeats"] == lv["sent"] - 2


# ---------------------------------------------------------------- the launched server's open-files limit

RECORD_LIMIT = """\
import os, resource, sys
with open(sys.argv[1], "w") as fh:
    fh.write(str(resource.getrlimit(resource.RLIMIT_NOFILE)[0]))
os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
"""


def test_a_launched_server_starts_with_the_open_files_limit_soakspec_was_started_with(tmp_path):
    """`soakspec run` lifts its own soft RLIMIT_NOFILE (100 here) to the hard limit; the server
    it launched inherited the lifted one, so it ran otherwise than the user runs it without
    soakspec (and a server that leaks descriptors failed later, or not at all), with nothing in
    the evidence saying so. The server now starts with the soft limit soakspec was started with,
    through the real subprocess path, and the manifest records it (`servers_soft`)."""
    from test_faults import launch_spec, misbehaving
    from test_fdlimit import _hard, _run

    hard = _hard()
    if hard < 1024:
        pytest.skip(f"the hard open-files limit here is {hard}")
    wrapper, seen = tmp_path / "record_limit.py", tmp_path / "server_nofile.txt"
    wrapper.write_text(RECORD_LIMIT)
    spec = tmp_path / "t.soak"
    spec.write_text(launch_spec([sys.executable, str(wrapper), str(seen), *misbehaving("ok")[1:]]))
    proc, out = _run(tmp_path, spec, (100, hard))
    assert proc.returncode in (0, 3), proc.stdout + proc.stderr
    assert seen.read_text() == "100"
    m = manifest(out)
    assert validate("manifest", m) == []
    assert m["host"]["open_files_limit"] == {"soft": hard, "hard": hard, "raised_from": 100, "servers_soft": 100}


# ---------------------------------------------------------------- --workers: a load process killed as it starts

KILL_ONE_WORKER = """\
import os, signal, sys
if "soakspec.runner.workers" in getattr(sys, "orig_argv", ()) and os.environ.get("KILL_ONE_WORKER"):
    try:
        os.close(os.open(os.environ["KILL_ONE_WORKER"], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        pass
    else:
        os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_load_process_killed_while_it_starts_is_named_with_how_it_ended(tmp_path):
    """`run --workers 2` whose first load process to start is SIGKILLed before it says READY (the
    OOM killer, a stray kill): the user read 'worker 1 of 2 did not start: no READY' -- numbered
    from 0 where the mid-run message numbers from 1, no pid, no cause. It now names the process
    as the mid-run message does and says how it ended; the run aborts (exit 4, the manifest says
    why) and no process is left behind."""
    from runner_support import new_marker, run_env, sim_spec, soakspec_cmd, wait_no_survivors

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(KILL_ONE_WORKER)
    spec = tmp_path / "t.soak"
    spec.write_text(sim_spec(load="mode = closed\n    concurrency = [4]", duration="1s", bucket="1s", deadline="3s", follow_up=False))
    marker, out = new_marker(), tmp_path / "ev"
    env = run_env(marker)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH", "")]))
    env["KILL_ONE_WORKER"] = str(tmp_path / "killed")
    proc = subprocess.run(soakspec_cmd("run", str(spec), "--out", str(out), "--quiet", "--workers", "2"),
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert wait_no_survivors(marker) == []
    assert (tmp_path / "killed").exists()  # the hook did kill one
    assert proc.returncode == 4, proc.stdout + proc.stderr
    said = r"load process [12] of 2 \(--workers, pid \d+\) did not start: killed by SIGKILL"
    assert re.search(r"run aborted: " + said, proc.stderr), proc.stderr
    assert "Traceback" not in proc.stderr
    m = manifest(out)
    assert m["status"] == "aborted" and re.fullmatch(said, m["incomplete_reason"] or ""), m["incomplete_reason"]
    assert isinstance(m["aborted_at"], float)


# ---------------------------------------------------------------- huge prompts: what the load generator keeps


def test_request_bodies_kept_for_reuse_are_bounded_in_bytes_not_only_in_count():
    """Token-exact prompts make a new shape per request, and each body was kept for reuse up to
    4096 of them: at `prompt_tokens = 131072` (~0.7 MB a body, its prompt as much again) the
    load generator grew by gigabytes of bodies it never sent again. Bodies are now kept up to a
    byte bound too (here 300 distinct 300 kB prompts: 90 MB before, now at most the bound)."""
    from soakspec.runner import protocol as P

    P._templates.clear()
    if hasattr(P, "_held"):
        P._held[0] = 0
    word = "x" * 299_990
    for i in range(300):
        shape = P.RequestShape(endpoint=P.Endpoint.COMPLETIONS, model="m", prompt=f"{i:08d} {word}", max_tokens=4,
                               sampling=P.Sampling(), ignore_eos=False, stream=True)  # fmt: skip
        body = P.build_body(shape, f"rid-{i}")
        assert word.encode() in body and b'"request_id":"rid-%d"' % i in body  # the body itself is whole
        held = sum(len(b) for _, parts in P._templates.values() for b in parts)
        assert held <= 64 * 1024 * 1024, (i, held)
    P._templates.clear()


def test_word_prompt_shapes_kept_for_reuse_are_bounded_in_characters():
    """`prompt_words = N` keeps one shape per start word (198 of them), each holding its N-word
    prompt: at a million words, 1.2 GB in every load process. They are kept up to a bound in
    characters now, and the shapes past it are built again, the same prompt each time."""
    from soakspec.plan import RequestTemplate
    from soakspec.runner.load import Shapes

    t = RequestTemplate(endpoint="completions", model="m", stream=True, prompt_words=60_000, prompt_file=None, max_tokens=(4,),
                        temperature=1.0, top_p=1.0, top_k=None, seed=None, ignore_eos=False, api_key_env=None)  # fmt: skip
    shapes = Shapes(t)
    first = [shapes.make(i).prompt for i in range(198)]  # 198 prompts of ~400 kB: 80 MB kept before
    kept = sum(len(s.prompt) for s in shapes._cache.values())
    assert kept <= 64 * 1024 * 1024, kept
    assert [shapes.make(i).prompt for i in range(198)] == first  # the same prompts, kept or not


# ---------------------------------------------------------------- blank prompts


def test_a_whitespace_only_prompt_is_empty_in_every_format(tmp_path):
    """A text file's blank line is no prompt, but a JSONL `"prompt": "   "`, a chat message of
    only a newline and a ShareGPT human turn of spaces were sent as prompts (a server answers a
    near-empty prompt fastest: it pulled TTFT down; vllm bench serve prunes such records). They
    are now what an empty one is: an error at the record's line, or a skipped ShareGPT record."""
    from soakspec.lang.datasets import DatasetError, read_dataset

    def read(name: str, text: str, chat: bool = False):
        path = tmp_path / name
        path.write_text(text)
        return read_dataset(str(path), None, chat=chat, lengths=False, turns=False)

    for name, text, chat in (("p.jsonl", '{"prompt": "fine"}\n{"prompt": "  \\t "}\n', False),
                             ("m.jsonl", '{"prompt": "fine"}\n{"messages": [{"role": "user", "content": "\\n"}]}\n', True)):  # fmt: skip
        with pytest.raises(DatasetError) as e:
            read(name, text, chat)
        assert e.value.line == 2, name
    conv = [{"conversations": [{"from": "human", "value": "real question"}]},
            {"conversations": [{"from": "human", "value": "   "}, {"from": "gpt", "value": "an answer"}]}]  # fmt: skip
    parsed = read("s.json", json.dumps(conv))
    assert parsed.prompts == ("real question",) and parsed.skipped == 1


def test_the_plan_and_manifest_say_a_prompt_files_prompts_are_resent_by_every_level(tmp_path):
    """The cache regime of a prompt file was 'the prompt file's prompts, cycling': nothing said
    that every level (a sweep's every probe) starts again at the first prompt, so a later level
    sends what the server's prefix cache holds from an earlier one (vLLM #54227's regime, which
    token prompts avoid with their salt). The plan and the manifest now say it, with the count."""
    spec, diags, _ = load_spec(_write(tmp_path, 3, "mode = closed\n    concurrency = [1, 2]"))
    assert spec is not None, diags
    p = plan(spec)
    policy = p.backends[0].levels[1].request.to_json()["prefix_cache"]
    assert "3 prompts in order from the first in every level" in policy and "prefix cache may hold" in policy
    from soakspec.plan import render_text as render_plan

    assert "from the first in every level" in render_plan(p)
