"""A replayed Mooncake trace's `hash_ids`: requests that list the same leading ids share that
prefix of their prompts (the trace's prefix-cache reuse), built from deterministic blocks;
`prefix_sharing = false` keeps every prompt unique. Checked, planned, and driven in virtual time
(`trio.testing.MockClock`), the prompts read as the server receives them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from soakspec.lang import check, fmt, load_spec, parse
from soakspec.lang.replay import TraceFileError, parse_trace
from soakspec.plan import plan, render_text, to_json
from soakspec.report.common import workload_line
from soakspec.runner.clock import RunClock
from soakspec.runner.ids import IdSequence
from soakspec.runner.load import LevelContext, Shapes, drive_level
from soakspec.runner.protocol import REQUEST_ID, build_body
from soakspec.runner.records import Outcome, RequestRecord

REPO = Path(__file__).resolve().parents[1]

B = 4  # words a block (hash_block = 4): small enough to read
TRACE = [
    {"timestamp": 0, "input_length": 12, "output_length": 2, "hash_ids": [1, 2, 3]},  # three whole blocks
    {"timestamp": 100, "input_length": 12, "output_length": 2, "hash_ids": [1, 2, 7]},  # shares 1, 2
    {"timestamp": 200, "input_length": 15, "output_length": 2, "hash_ids": [1, 2, 3]},  # 1, 2, 3 and 3 words of its own
    {"timestamp": 300, "input_length": 6, "output_length": 2},  # no hash_ids: unique, as before
    {"timestamp": 400, "input_length": 6, "output_length": 2, "hash_ids": [1, 2, 3]},  # shorter: block 2 partial, 3 unsent
    {"timestamp": 500, "input_length": 12, "output_length": 2, "hash_ids": [9, 2, 3]},  # a different first block: nothing shared
]


def write(tmp_path: Path, load_extra: str = "", rows=TRACE) -> Path:
    (tmp_path / "trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = tmp_path / "r.soak"
    spec.write_text(
        'soak "t" {}\nbackend "a" { url = "http://127.0.0.1:8000" }\n'
        f'workload "w" {{\n  load {{\n    mode = replay\n    trace = "trace.jsonl"\n{load_extra}  }}\n'
        "  bucket = 1s\n  deadline = 30s\n  follow_up = false\n}\n"
    )
    return spec


def level_of(tmp_path: Path, load_extra: str = f"    hash_block = {B}\n    seed = 7\n", rows=TRACE):
    spec, diags, _ = load_spec(write(tmp_path, load_extra, rows))
    assert spec is not None, diags
    p = plan(spec)
    return p, p.backends[0].levels[0]


class Server:
    """Records each request's body as sent (the request id spliced in), by intended start."""

    def __init__(self, clock: RunClock) -> None:
        self.clock, self.sent = clock, {}

    def connect(self):
        return self

    async def send(self, shape, request_id, headers, record: RequestRecord, *, deadline: float) -> None:
        record.start = self.clock.now() if record.start is None else record.start
        self.sent[record.intended_start] = json.loads(build_body(shape, request_id))["prompt"]
        await trio.sleep(0.01)
        record.end, record.outcome = self.clock.now(), Outcome.COMPLETED

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


def prompts_sent(level, part=(0, 1), ids="t") -> dict[float, str]:
    """The prompts a (virtual) server received, by arrival offset: from one process, or this one's
    part of a level split over processes (--workers)."""

    async def main():
        clock = RunClock(timer=trio.current_time, epoch=1000.0)
        server = Server(clock)
        ctx = LevelContext("a", clock, server.connect, Shapes(level.request), lambda recs: None, IdSequence(ids), part=part)
        run = await drive_level(level, ctx)
        return {round(t - run.started_at, 6): p for t, p in server.sent.items()}

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def common(a: list[str], b: list[str]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_requests_that_share_leading_hash_ids_share_exactly_those_blocks(tmp_path):
    """Word prompts of a Mooncake trace: each request's prompt is its hash_ids' blocks cut to its
    input_length; two requests share exactly the blocks they both list from the start, then part;
    past its blocks a request's words are its own (its request id first). Before, every prompt
    started with its request id: a trace built for prefix-cache reuse measured no reuse at all."""
    _, lv = level_of(tmp_path)
    sent = prompts_sent(lv)
    w = [sent[k].split(" ") for k in sorted(sent)]
    assert [len(p) for p in w] == [r["input_length"] for r in TRACE]  # input_length respected, in words
    assert common(w[0], w[1]) == 2 * B  # blocks 1 and 2, then 3 against 7: they part at once
    assert w[2][: 3 * B] == w[0]  # the same three blocks, word for word
    assert w[2][3 * B] == "t-0000002" and w[2][3 * B:] != w[0][:3]  # then its own: its request id first
    assert w[3][0] == "t-0000003"  # no hash_ids: today's unique prompt
    assert w[4] == w[0][:6]  # shorter than its blocks: block 2 cut, block 3 unsent
    assert common(w[5], w[0]) == 0  # a different first block shares nothing, even with the same later ids
    assert len({" ".join(p) for p in w}) == len(w)  # no two prompts whole-equal: each is its own request


def test_blocks_are_the_same_in_every_run_and_every_workers_process(tmp_path):
    """A block is a function of its id and the load's seed only: a second run (other request ids),
    the two halves of a level split over two processes (--workers 2), and a process with another
    hash seed all send the shared blocks word for word; another `seed` sends other blocks."""
    _, lv = level_of(tmp_path)
    one = prompts_sent(lv)
    again = prompts_sent(lv, ids="u")  # another run: its own request ids
    split = prompts_sent(lv, part=(0, 2)) | prompts_sent(lv, part=(1, 2))
    assert sorted(split) == sorted(one)
    for k in (0.0, 0.1, 0.2, 0.5):  # the requests with hash_ids (0.3 has none: its own id first)
        shared = one[k].split(" ")[:2 * B]
        assert again[k].split(" ")[:2 * B] == shared and split[k].split(" ")[:2 * B] == shared
    from soakspec.runner.load import shared_prompt_words

    code = ("from soakspec.runner.load import shared_prompt_words as s; "
            f"print(s(3, 12, (1, 2, 3), {B}, 7))")  # fmt: skip
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=str(REPO))
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout.strip()
    assert other == shared_prompt_words(3, 12, (1, 2, 3), B, 7) == one[0.0]
    assert shared_prompt_words(0, 12, (1, 2, 3), B, 8) != other  # the seed names other blocks


def test_prefix_sharing_false_keeps_every_prompt_unique(tmp_path):
    p, lv = level_of(tmp_path, "    prefix_sharing = false\n")
    sent = prompts_sent(lv)
    assert all(sent[k].startswith("t-") for k in sent)  # each starts with its request id, as before hash_ids were read
    assert "hash_block" not in to_json(p)["backends"][0]["levels"][0]["request"]
    assert "prefix_blocks" not in to_json(p)["backends"][0]["levels"][0]["shape"]
    assert "w cache: word prompts, each starting with its request id" in render_text(p)


def test_the_plan_manifest_and_report_state_the_traces_sharing(tmp_path):
    """The plan prints the best-case cache hit rate the trace implies (blocks that repeat an
    earlier request's), the plan's JSON (the manifest's levels) records it, and the report's
    workload line says it."""
    p, lv = level_of(tmp_path)
    # blocks sent: 3 + 3 + 3 + 0 + 2 + 3 = 14; distinct: 1, 2, 3, 7, 9 = 5
    text = render_text(p)
    assert ("w cache: the trace's hash_ids: each names a block of 4 words (seed 7), the same in every request, level and run that "
            "lists it; after its blocks a request's own content; 14 prompt blocks, 5 distinct: 64% repeat an earlier request's "
            "(the best-case prefix-cache hit rate)") in text
    doc = to_json(p)["backends"][0]["levels"][0]
    assert doc["shape"]["prefix_blocks"] == {"block": 4, "unit": "words", "seed": 7, "blocks": 14, "distinct": 5,
                                             "repeat_share": pytest.approx(9 / 14), "requests_outrun": 1}  # the 6-word one
    assert doc["request"]["hash_block"] == 4 and doc["request"]["block_seed"] == 7
    assert lv.to_json()["shape"]["prefix_blocks"]["distinct"] == 5  # the manifest's level entry
    assert ("1 request(s) list more hash_ids than their input_length fills at 4 a block (the later ids are not sent: was the "
            "trace made with smaller blocks? set hash_block)") in text
    spec, _, _ = load_spec(tmp_path / "r.soak")
    line = workload_line(spec.workloads[0])
    assert "prompts from its hash_ids in blocks of 4 words (seed 7): 14 blocks, 5 distinct, 64% repeat an earlier request's" in line


def test_the_default_block_is_mooncakes_512(tmp_path):
    p, lv = level_of(tmp_path, "")
    assert lv.request.hash_block == 512 and lv.request.block_seed == 0
    # every input_length fits in the first block: 1 block each but the unhashed line's; the
    # five lines list 3 ids each, more than their length fills at 512
    assert (lv.shape.blocks, lv.shape.distinct_blocks, lv.shape.outrun) == (5, 2, 5)
    assert "5 request(s) list more hash_ids than their input_length fills at 512 a block" in render_text(p)


@pytest.mark.parametrize(
    ("extra", "code", "words"),
    [
        ("    hash_block = 0\n", "E204", "hash_block"),
        ("    prefix_sharing = 3\n", None, "prefix_sharing"),
    ],
)
def test_bad_sharing_keys_fail_check(tmp_path, extra, code, words):
    spec, diags, _ = load_spec(write(tmp_path, extra))
    assert spec is None and any(words in d.message or words in str(d) for d in diags), diags
    if code:
        assert code in [d.code for d in diags]


def test_sharing_keys_belong_to_a_replay():
    text = ('soak "t" {}\nbackend "a" { url = "http://127.0.0.1:8000" }\n'
            'workload "w" {\n load {\n mode = open\n rate = [1rps]\n hash_block = 64\n prefix_sharing = false\n }\n'
            ' duration = 1s\n deadline = 30s\n}\n')  # fmt: skip
    spec, diags = check(parse(text)[0])
    assert spec is None and [d.code for d in diags] == ["E403", "E403"]


@pytest.mark.parametrize(("extra", "rows", "why"), [
    ("    prefix_sharing = false\n    hash_block = 64\n    seed = 3\n", TRACE, "prefix_sharing = false builds every prompt of its own"),
    ("    hash_block = 64\n    seed = 3\n", [{k: v for k, v in r.items() if k != "hash_ids"} for r in TRACE],
     "the trace 'trace.jsonl' lists no hash_ids"),
])
def test_hash_block_and_seed_without_shared_blocks_are_warned(tmp_path, extra, rows, why):
    """W516 at `hash_block` and at `seed` of a replay that builds no shared prefix blocks
    (prefix_sharing = false, or a trace without hash_ids): they change nothing, so a reader is
    not left believing the prompts share prefixes of that size; `soakspec check` prints both,
    each with its caret and hint, and exits 0. With the blocks in use neither is warned."""
    path = write(tmp_path, extra, rows)
    spec, diags, _ = load_spec(path)
    assert spec is not None
    w516 = [d for d in diags if d.code == "W516"]
    assert [d.message.split("'")[1] for d in w516] == ["hash_block", "seed"], diags
    assert all(why in d.message and d.severity == "warning" for d in w516)
    proc = subprocess.run([sys.executable, "-m", "soakspec", "check", str(path)], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO)))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and out.count(": W516 ") == 2 and "^" in out and "hint: remove it" in out, out
    assert not [d for d in load_spec(write(tmp_path, "    hash_block = 64\n    seed = 3\n"))[1] if d.code == "W516"]


@pytest.mark.parametrize("bad", ['"abc"', "[1, -2]", "[1, true]", "[1.5]", "[" + str(2**64) + "]"])
def test_malformed_hash_ids_are_a_trace_error_at_their_line(bad):
    good = '{"timestamp": 0, "input_length": 4, "output_length": 2, "hash_ids": [1]}'
    with pytest.raises(TraceFileError) as e:
        parse_trace(good + "\n" + '{"timestamp": 1, "input_length": 4, "output_length": 2, "hash_ids": ' + bad + "}\n")
    assert e.value.line == 2 and "hash_ids" in e.value.message


def test_repeated_ids_are_one_object_in_memory():
    """A 10^6-line trace's ids repeat (that is its point): each id is kept once."""
    rows = "".join(json.dumps({"timestamp": i, "input_length": 4, "output_length": 1, "hash_ids": [100000, 100001 + i % 3]}) + "\n"
                   for i in range(50))  # fmt: skip
    tf = parse_trace(rows)
    assert len({id(h) for ids in tf.hash_ids for h in ids}) == 4


def test_the_new_keys_round_trip_through_fmt(tmp_path):
    spec_path = write(tmp_path, "    prefix_sharing = false\n    hash_block = 64\n    seed = 3\n")
    text = spec_path.read_text()
    once = fmt(parse(text)[0])
    assert "prefix_sharing = false" in once and "hash_block = 64" in once
    assert fmt(parse(once)[0]) == once


class CountingTokenizer:
    """Words are tokens (as the simulator's), and a BOS is added with special tokens."""

    async def count(self, text: str, special: bool) -> int:
        return len(text.split(" ")) + (1 if special else 0)


async def test_token_exact_blocks_meet_the_token_boundaries():
    """With token-exact prompts a block is `hash_block` tokens of the sequence the server sees,
    its special tokens included: the first block is the BOS and block - 1 words, each later one
    `block` words, and the whole prompt is exactly its input_length."""
    from soakspec.runner.load import VOCABULARY
    from soakspec.runner.prompts import measure_costs, token_shared_prompt, verify_blocks

    tok = CountingTokenizer()
    costs = await measure_costs(tok, VOCABULARY)
    assert costs.overhead == 1
    a = token_shared_prompt(costs, 0, 20, (1, 2, 3), 8, 0, "salt")
    b = token_shared_prompt(costs, 1, 30, (1, 2, 5), 8, 0, "salt")
    assert await tok.count(a, True) == 20 and await tok.count(b, True) == 30
    assert common(a.split(" "), b.split(" ")) == 2 * 8 - 1  # BOS + 15 words = tokens 0..15: blocks 1 and 2
    await verify_blocks(tok, costs, 8, 0)
    c = token_shared_prompt(costs, 2, 40, (1, 2, 3), 8, 0, "salt")
    assert c.split(" ")[:19] == a.split(" ")  # past its 3 blocks (23 tokens) c's own content; a is all blocks


def test_a_word_prompt_is_never_the_request_id_placeholder_alone_in_a_block():
    from soakspec.runner.load import shared_prompt_words

    assert REQUEST_ID not in shared_prompt_words(0, 8, (1, 2), 4, 0)  # all blocks: no id
    assert shared_prompt_words(0, 9, (1, 2), 4, 0).split(" ")[8] == REQUEST_ID  # one past the blocks: its id


_IDS = st.lists(st.integers(0, 3), max_size=4)


@settings(max_examples=200, deadline=None)
@given(st.tuples(_IDS, st.integers(1, 40)), st.tuples(_IDS, st.integers(1, 40)))
def test_two_prompts_share_exactly_their_common_leading_blocks(a, b):
    """Any two requests of a trace (blocks of 8 words): their prompts agree word for word over the
    blocks both list from the start (as far as both lengths reach) and part within a block's first
    words after it (the words spelling its id); each is exactly its input_length."""
    from soakspec.runner.load import shared_prompt_words
    from soakspec.runner.prompts import salt_words

    block = 8
    (ia, na), (ib, nb) = a, b
    pa = shared_prompt_words(0, na, tuple(ia), block, 5).replace(REQUEST_ID, "r0").split(" ")
    pb = shared_prompt_words(1, nb, tuple(ib), block, 5).replace(REQUEST_ID, "r1").split(" ")
    assert (len(pa), len(pb)) == (na, nb)
    k = common(ia, ib)  # leading ids both list
    same = common(pa, pb)
    assert same >= min(k * block, na, nb)
    reach = k * block + salt_words(198)  # where the next blocks (or a request's own words) have parted
    if same > k * block:  # past the common blocks only where one prompt ends or both blocks are still spelling
        assert same < reach or same == min(na, nb)


@pytest.mark.slow
def test_a_real_run_sends_the_same_blocks_from_one_process_and_from_two(tmp_path):
    """`soakspec run` against the simulator, with --workers 1 and --workers 2: the server logs each
    prompt's sha256 and first characters; a request whose prompt is all blocks sends the same
    prompt (sha256) in both runs whichever process sent it, and one with words of its own past its
    blocks starts the same (its blocks) and differs as a whole (its request id)."""
    import gzip

    from runner_support import manifest, new_marker, read_jsonl, run_soakspec, wait_no_survivors

    rows = [{"timestamp": i * 50, "input_length": 8 + (i % 2) * 8, "output_length": 2, "hash_ids": [1, 2 + i % 3]}
            for i in range(12)]  # fmt: skip  (odd rows: 8 words of their own past 2 blocks of 4)
    (tmp_path / "trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = ('soak "t" {\n  issue = "test"\n}\nbackend "b0" {\n  sim {\n    ttft = 5ms\n    itl = 1ms\n  }\n'
            '  runtime {\n    label = "host-staged"\n  }\n}\n'
            'workload "w" {\n  load {\n    mode = replay\n    trace = "trace.jsonl"\n    hash_block = 4\n  }\n'
            '  bucket = 1s\n  deadline = 5s\n  follow_up = false\n}\ngate {\n  require failed == 0\n}\nclaims {\n  claim "test"\n}\n')
    (tmp_path / "r.soak").write_text(text)
    seen = {}
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        marker = new_marker()
        proc = run_soakspec(["run", str(tmp_path / "r.soak"), "--out", str(out), "--quiet", "--workers", str(workers)], marker, tmp_path)
        assert wait_no_survivors(marker) == []
        assert proc.returncode == 0, proc.stderr[-3000:]
        level = manifest(out)["backends"][0]["levels"][0]
        assert level["shape"]["prefix_blocks"]["distinct"] == 4
        logged = {}
        with gzip.open(out / "backends" / "b0" / "server.log.gz", "rt") as fh:
            for line in fh:
                if "soakspec_sim_trace" in line:
                    t = json.loads(line.split(" ", 1)[1])
                    logged[t["client_request_id"]] = (t["prompt_sha256"], t["prompt_head"])
        recs = [r for r in read_jsonl(out / "backends" / "b0" / "requests.jsonl.gz") if r["bucket"] >= 0]
        seen[workers] = {round((r["intended_start"] - level["started_at"]) * 20): logged[r["request_id"]] for r in recs}
    assert sorted(seen[1]) == sorted(seen[2]) == list(range(12))
    for i in range(12):
        (sha1, head1), (sha2, head2) = seen[1][i], seen[2][i]
        if i % 2 == 0:  # all blocks
            assert sha1 == sha2
        else:  # its blocks, then its own words (its request id first: another in each run)
            assert sha1 != sha2 and head1.split(" ")[:8] == head2.split(" ")[:8]
    assert seen[1][0][0] == seen[1][6][0] != seen[1][2][0]  # [1, 2] twice; [1, 4] another prompt


def test_the_report_says_a_replays_lengths_are_its_traces(tmp_path):
    """A replay's requests take their lengths from their trace lines: the report's workload line
    said `prompt_words=64, max_tokens=...` (the workload's unused defaults, words no request sent)."""
    spec, diags, _ = load_spec(write(tmp_path))
    assert spec is not None, diags
    line = workload_line(spec.workloads[0])
    assert "prompt_words" not in line and "max_tokens=output_length" in line, line
    assert "prompt of input_length words" in line
    spec, diags, _ = load_spec(write(tmp_path, "    input_lengths = tokens\n"))
    assert spec is not None, diags
    assert "prompt of input_length tokens" in workload_line(spec.workloads[0])
