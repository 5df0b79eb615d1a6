"""Prompt files at run time: nothing to read.

`check` reads and parses a workload's prompt file (`soakspec.lang.datasets`, in its named
format, with errors at the file's own line) and the plan's `RequestTemplate.prompts` carries
the prompts, so the runner acts on the plan alone and never re-reads (or guesses the format of)
a file that may have changed since. `PromptFiles` is kept for the driver's signature.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import random
from pathlib import Path
from typing import Protocol

import httpx

from soakspec import draws
from soakspec.runner.protocol import describe_transport_error

try:  # optional (`pip install 'soakspec[tokenizers]'`): only `tokenizer = "tokenizer.json"` needs it
    from tokenizers import Tokenizer as HfTokenizer
except ImportError:  # pragma: no cover - the default install
    HfTokenizer = None


class RunAborted(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def load_prompts(path: Path | str) -> tuple[str, ...]:
    """A plain-text prompt file: one prompt per non-empty line (no format is guessed here;
    spec prompt files are read by `check`)."""
    with open(path, encoding="utf-8") as fh:
        out = tuple(line.rstrip("\r\n") for line in fh if line.strip())
    if not out:
        raise RunAborted(f"prompt file {path} has no prompts")
    return out


class PromptFiles:
    """The prompts of a template's file: always the plan's (`Shapes` takes them from the
    template), so this returns none and reads nothing."""

    def __call__(self, path: str | None) -> tuple[str, ...]:
        return ()




# ---------------------------------------------------------------- token-exact prompts
#
# A prompt of exactly N tokens is built from a vocabulary of common words whose token counts
# were measured once with the model's own tokenizer (a local tokenizer.json through the optional
# `tokenizers` library, or the server's `/tokenize` endpoint): with a leading space and, for
# the first word, without. Tokenizers split text into pre-tokens at spaces (byte-level BPE,
# SentencePiece's metaspace), so a space-separated prompt counts the sum of its words' tokens;
# the first prompts of each level are re-counted whole to confirm it, and the run aborts if the
# tokenizer disagrees. Special tokens the tokenizer adds (a BOS) count towards N.
#
# Cache control: with `prefix_tokens = 0` the first `id_words(V)` words spell the request's
# index in base V (V one-token words), so no two of the first ID_SPACE requests share even
# their first tokens; with a shared prefix, every request starts with the same `prefix_tokens`
# tokens -- or, with `prefix_groups = G`, with its group's (`prefix_words`: the group's index in
# base V first, so that groups part at their first token when G <= V). The index is the
# request's place in its level (the same prompts on every backend), so
# the `salt_words(V)` words after it spell a hash of the level's salt (`load.drive_level`: its
# first request's id, unique per level, sweep probe, backend and run): a later level, a sweep's
# next probe or the next run against the same server never sends a prompt the server's prefix
# cache holds (vLLM #54227: every cell of a sweep replayed the seed's prompts, 49x lower TTFT). A tokenizer with few one-token words among the vocabulary (a small BPE trained for a
# test model: the real-server lane's has 3) still works: the index takes more words.

MIN_ONE_TOKEN_WORDS = 2  # base 2 still spells distinct indices
ID_SPACE = 10**6  # requests with distinct first tokens (at least the first V**3)
VERIFY_PROMPTS = 4  # re-counted whole, per level


SALT_BITS = 32  # two salts spell the same words with probability 2**-32


def salt_words(v: int) -> int:
    """How many words spell a salt's SALT_BITS-bit hash in base `v`."""
    k = 1
    while v**k < 2**SALT_BITS:
        k += 1
    return k


def id_words(v: int) -> int:
    """How many words spell a request's index in base `v`: the fewest (at least 3) for ID_SPACE."""
    k = 3
    while v**k < ID_SPACE:
        k += 1
    return k


class Tokenizer(Protocol):
    async def count(self, text: str, special: bool) -> int: ...


@dataclasses.dataclass(frozen=True)
class TokenCosts:
    """Tokens per vocabulary word, measured once per tokenizer."""

    words: tuple[str, ...]  # words costing exactly one token after a space and at the start
    overhead: int  # special tokens the tokenizer adds to any prompt (e.g. BOS)


async def measure_costs(tok: Tokenizer, vocabulary: tuple[str, ...]) -> TokenCosts:
    ones = []
    for w in vocabulary:
        if await tok.count(w, False) == 1 and await tok.count(f"{w} {w}", False) == 2:
            ones.append(w)
    if len(ones) < MIN_ONE_TOKEN_WORDS:
        raise RunAborted(f"the tokenizer counts only {len(ones)} of {len(vocabulary)} common words as one token; prompt_tokens cannot be built")
    overhead = await tok.count(ones[0], True) - 1
    return TokenCosts(tuple(ones), max(0, overhead))


def group_words(costs: TokenCosts, group: int, groups: int) -> list[str]:
    """The first words of group `group`'s prefix (of `groups`): its index in base V, least
    significant digit first, in `draws.digits(groups, V)` words -- so two groups' prefixes differ
    in their first token whenever there are at most V groups (a real model's tokenizer counts most
    of the vocabulary's words as one token), and within the first `digits` tokens otherwise."""
    words, v = costs.words, len(costs.words)
    out = []
    for _ in range(draws.digits(groups, v)):
        out.append(words[group % v])
        group //= v
    return out


def prefix_words(costs: TokenCosts, prefix_tokens: int, seed: int = 0, group: int = 0, groups: int = 1) -> list[str]:
    """The shared prefix of `prefix_tokens` one-token words: with one group the same words as
    always (a function of the seed alone: evidence from before prefix groups was sent exactly
    these); with `groups` > 1, group `group`'s -- its index (`group_words`), then words drawn by
    the seed and the group: two groups' prefixes part at the index, by construction."""
    words, v = costs.words, len(costs.words)
    if groups <= 1:
        rng = random.Random(f"prefix-{seed}")
        return [words[rng.randrange(v)] for _ in range(prefix_tokens)]
    out = group_words(costs, group, groups)[:prefix_tokens]
    rng = random.Random(f"prefix-{seed}-group-{group}")
    return out + [words[rng.randrange(v)] for _ in range(prefix_tokens - len(out))]


def token_prompt(costs: TokenCosts, index: int, n: int, prefix_tokens: int, seed: int = 0, salt: str = "",
                 group: int = 0, groups: int = 1) -> str:
    """The index-th prompt of exactly `n` tokens (special tokens included); with a `salt`, the
    words after the index spell its hash (see "Cache control" above); with `groups` > 1, it
    starts with prefix group `group`'s prefix (`prefix_words`)."""
    words, v = costs.words, len(costs.words)
    content = n - costs.overhead
    if content < 1:
        raise RunAborted(f"prompt_tokens = {n} leaves no room after the tokenizer's {costs.overhead} special tokens")
    out = prefix_words(costs, min(prefix_tokens, content), seed, group, groups)
    mark, i = [], index
    for _ in range(id_words(v)):
        mark.append(words[i % v])
        i //= v
    if salt:
        h = int.from_bytes(hashlib.sha256(salt.encode()).digest()[: SALT_BITS // 8], "big")
        for _ in range(salt_words(v)):
            mark.append(words[h % v])
            h //= v
    rng = random.Random(f"{seed}-{index}")
    out += mark[: content - len(out)]
    out += [words[rng.randrange(v)] for _ in range(content - len(out))]
    return " ".join(out)


# ---------------------------------------------------------------- shared blocks (a replay's hash_ids)
#
# A Mooncake trace names each request's prompt blocks by `hash_ids`: requests that list the same
# leading ids share that prefix (a prefix cache's hits). Block `h` is a function of `h` and the
# load's seed alone -- its first words spell a hash of (seed, h) in base V, so two ids' blocks
# part at once, then words drawn from a generator seeded by the same hash -- so it is the same
# string in every request, level, run and --workers process that lists it. A prompt is its blocks
# in order, cut to the request's input length (the last block partial), and past its blocks the
# request's own content (`load.shared_prompt_words`, `token_shared_prompt`), so nothing after the
# shared blocks is shared by accident.

BLOCK_CACHE = 1024  # blocks kept per process (a tuple of the vocabulary's own strings: 8 bytes a word)
BLOCK_CACHE_WORDS = 8192  # longer blocks are rebuilt each time (1024 of 8192 words: 64 MB)


def block_words(vocab: tuple[str, ...], seed: int, h: int, n: int) -> tuple[str, ...]:
    """Block `h`'s `n` words (its first n: the same words for any n, so a partial block is a prefix
    of the whole one)."""
    return _block(vocab, seed, h, n) if n <= BLOCK_CACHE_WORDS else _make_block(vocab, seed, h, n)


@functools.lru_cache(maxsize=BLOCK_CACHE)
def _block(vocab: tuple[str, ...], seed: int, h: int, n: int) -> tuple[str, ...]:
    return _make_block(vocab, seed, h, n)


def _make_block(vocab: tuple[str, ...], seed: int, h: int, n: int) -> tuple[str, ...]:
    v = len(vocab)
    digest = hashlib.sha256(f"soakspec-block/{seed}/{h}".encode()).digest()
    mark, x = [], int.from_bytes(digest[: SALT_BITS // 8], "big")
    for _ in range(salt_words(v)):
        mark.append(vocab[x % v])
        x //= v
    rng = random.Random(digest)
    out = mark[:n]
    out += [vocab[rng.randrange(v)] for _ in range(n - len(out))]
    return tuple(out)


def shared_words(vocab: tuple[str, ...], seed: int, hash_ids: tuple[int, ...], block: int, n: int, first: int | None = None) -> list[str]:
    """The first `n` words (at most) of the blocks of `hash_ids`, `block` words each (`first`: the
    first block's, where special tokens take the rest of it)."""
    out: list[str] = []
    for p, h in enumerate(hash_ids):
        size = block if p or first is None else first
        if len(out) + size > n:
            size = n - len(out)
        out.extend(block_words(vocab, seed, h, size))
        if len(out) >= n:
            break
    return out


def token_shared_prompt(costs: TokenCosts, index: int, n: int, hash_ids: tuple[int, ...], block: int, seed: int, salt: str = "") -> str:
    """A prompt of exactly `n` tokens (special tokens included) whose first tokens are its
    `hash_ids`' blocks of `block` tokens each: the boundaries fall at multiples of `block` in the
    token sequence the server sees (the first block is `block` less the tokenizer's special tokens
    in words), and past the blocks the request's own index and salt (as `token_prompt`)."""
    content = n - costs.overhead
    if content < 1:
        raise RunAborted(f"a {n}-token prompt leaves no room after the tokenizer's {costs.overhead} special tokens")
    out = shared_words(costs.words, seed, hash_ids, block, content, first=max(0, block - costs.overhead))
    if len(out) < content:
        out += token_prompt(costs, index, n - len(out), 0, seed, salt).split(" ")
    return " ".join(out)


class LocalTokenizer:
    """A tokenizer.json through the `tokenizers` library (`pip install soakspec[tokenizers]`)."""

    def __init__(self, path: str):
        if HfTokenizer is None:
            raise RunAborted("tokenizer = ... needs the tokenizers library: pip install 'soakspec[tokenizers]'")
        try:
            self._tok = HfTokenizer.from_file(path)
        except Exception as e:  # noqa: BLE001 - the library raises its own exception types
            raise RunAborted(f"cannot load the tokenizer {path}: {e}") from None

    async def count(self, text: str, special: bool) -> int:
        return len(self._tok.encode(text, add_special_tokens=special).ids)


class ServerTokenizer:
    """The server's `/tokenize` endpoint (vLLM, SGLang, the simulator): `{"count": n}`."""

    def __init__(self, base_url: str, model: str, client):
        self._url, self._model, self._client = base_url.rstrip("/") + "/tokenize", model, client

    async def count(self, text: str, special: bool) -> int:
        """The server's count of `text`'s tokens. Whatever the server does -- refuses the
        connection, answers an error, HTML, a JSON array, `{"count": true}` -- the run stops
        with `RunAborted` naming it, never an internal error."""
        hint = 'set tokenizer = "tokenizer.json"'
        try:
            r = await self._client.post(self._url, json={"model": self._model, "prompt": text, "add_special_tokens": special})
        except httpx.HTTPError as e:
            raise RunAborted(f"prompt_tokens needs the server's /tokenize endpoint: {self._url}: {describe_transport_error(e)}; {hint}") from None
        if r.status_code != 200:
            raise RunAborted(f"prompt_tokens needs the server's /tokenize endpoint: it answered {r.status_code}; {hint}")
        try:
            body = r.json()
        except (ValueError, RecursionError):  # not JSON (JSONDecodeError, bad UTF-8 are ValueErrors), or nested past reading
            raise RunAborted(f"the server's /tokenize answer is not JSON: {r.text[:120]!r}; {hint}") from None
        count = body.get("count") if isinstance(body, dict) else None
        if type(count) is not int or count < 0:
            raise RunAborted(f"the server's /tokenize answer has no integer 'count': {r.text[:120]!r}; {hint}")
        return count


async def verify(tok: Tokenizer, costs: TokenCosts, n: int, prefix_tokens: int, groups: int = 1) -> None:
    """Re-counts the first prompts of `n` tokens whole (with `groups`, each of a group of its own)."""
    for i in range(VERIFY_PROMPTS):
        got = await tok.count(token_prompt(costs, i, n, prefix_tokens, group=i % groups, groups=groups), True)
        if got != n:
            raise RunAborted(f"a {n}-token prompt counts {got} tokens with this tokenizer (it joins words across spaces); prompt_tokens cannot be exact")


async def verify_blocks(tok: Tokenizer, costs: TokenCosts, block: int, seed: int) -> None:
    """Block boundaries are token-exact: the first one and the first two of a shared prompt
    count `block` and 2·`block` tokens (so a server's cache pages meet the blocks where the
    trace's do)."""
    for k in (1, 2):
        n = k * block
        if n <= costs.overhead:
            continue
        got = await tok.count(token_shared_prompt(costs, 0, n, tuple(range(k)), block, seed), True)
        if got != n:
            raise RunAborted(f"{k} shared block(s) of {block} tokens count {got} tokens with this tokenizer (it joins words across "
                             "spaces); hash_block cannot be exact")


__all__ = ["LocalTokenizer", "PromptFiles", "RunAborted", "ServerTokenizer", "TokenCosts", "block_words", "load_prompts", "measure_costs",
           "shared_words", "token_prompt", "token_shared_prompt", "verify", "verify_blocks"]
