"""Check 4: scope creep (CB301) -- a claim about a shape the workload did not cover.

Only asserted phrases count (see `polarity`): "not tested at concurrency 64" and "a 24-hour
soak would be needed" are fine. One overclaim is one finding: patterns of one rule that read
overlapping words ("32k-token prompts" and "32k-token"; "for 3 hours" and "3 hours of sustained
load") report it once, and the engine drops a finding here where a CB101 or a sustain finding
(`sustain`: "sustains concurrency 32", above a sweep's range) covers the same words. Rules, each
against `Coverage`:

- concurrency: "concurrency 64", "concurrency levels 4, 8 and 16", "c=64", "64 concurrent
  requests/users/streams", "64-way concurrency": every number must be a covered level.
- rate: "at 100 rps", "rate 5 req/s": must be a covered open-loop rate.
- duration: a duration in soak context -- "for/over/across/during/lasted/lasting/spanned N <unit>",
  "N-hour soak/run/test", "N hours of sustained load", "duration_s=N", "overnight",
  "multi-day", "24/7", "indefinitely" -- must not exceed max(duration_s, total_duration_s).
  Unknown coverage (both 0) skips the rule.
- prompt shape: "long prompts"/"long-context"/"large inputs" need max(prompt_words) >=
  `LONG_PROMPT_WORDS`; "mixed prompts"/"variable-length prompts" need two prompt lengths; a
  prompt file covers both (its lengths are unknown here). "N-word prompts"/"prompt_words=N"
  need N among prompt_words; "N-token prompts"/"8k context" need N <= 2 x max(prompt_words)
  (words are not tokens; only a clearly longer shape is flagged). "max_tokens=N"/"N output
  tokens" need N among max_tokens.
- backend: a known inference engine (vLLM, SGLang, TGI, TensorRT-LLM, llama.cpp, …) named as
  where something runs ("on/with/against/under/using vLLM", "the SGLang backend") must be one
  of the spec's backends.
- runtime version: a runtime the spec's runtime boundary labels with a version ("NCCL 2.26.2")
  named with another version ("NCCL 2.27"); a shorter form of it ("NCCL 2.26") is fine.
- model: a model of a known family ("Llama-3-70B", "DeepSeek-V3", "Qwen2.5 7B") named as what a
  result is about ("on/for/with/validates …") must be the spec's model (`model { id }`); a
  shorter or longer name of it ("DeepSeek-V2" for DeepSeek-V2-Lite) is not flagged.
- hardware: a GPU name ("H100", "8x H100", "RTX 4090", "MI300X", …) or "N GPUs" must match the
  recorded hardware (name and, when stated, count). Unknown hardware gives a warning.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from soakspec.claims.document import Document, Sentence, bench_lines
from soakspec.claims.facts import Coverage
from soakspec.claims.polarity import Polarity, polarity
from soakspec.diagnostics import Diagnostic, Severity
from soakspec.units import format_duration

LONG_PROMPT_WORDS = 1024

_NUM_WORDS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
    "seven": 7, "eight": 8, "nine": 9, "ten": 10, "twelve": 12, "twenty-four": 24,
}
_UNITS = {
    "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
    "w": 604800, "wk": 604800, "week": 604800, "weeks": 604800,
}
_UNIT_RX = r"(?:seconds?|secs?|minutes?|mins?|hours?|hrs?|days?|weeks?|wks?|s|m|h|d|w)"
_QTY = rf"(?P<n>\d+(?:\.\d+)?|(?:an?|one|two|three|four|five|six|seven|eight|nine|ten|twelve|twenty-four)(?=[\s-]))(?:\s+|-)?(?P<u>{_UNIT_RX})\b"

_DURATION = [
    re.compile(rf"\b(?:for|over|across|during|last(?:s|ed|ing)|spann(?:ed|ing)|spans?|through(?:out)?)\s+(?:(?:at\s+least|more\s+than|over|about|roughly|nearly|almost|a\s+full|the\s+full|full)\s+)?{_QTY}", re.I),
    re.compile(rf"\b{_QTY}[-\s]+(?:long\s+)?(?:soaks?|runs?|tests?|burn[-\s]?ins?|endurance|stability|uptime|sessions?)\b", re.I),
    re.compile(rf"\b{_QTY}\s+of\s+(?:sustained\s+|continuous\s+|constant\s+|steady\s+)?(?:load|traffic|soak(?:ing)?|operation|uptime|running|serving)\b", re.I),
    re.compile(r"\bduration(?:_s)?\s*[:=]\s*(?P<n>\d+(?:\.\d+)?)\s*(?P<u>" + _UNIT_RX + r")?\b", re.I),
]
_VAGUE_DURATION = re.compile(
    r"\b(?P<w>overnight|multi[-\s]?day|multi[-\s]?hour|hours?[-\s]long|days?[-\s]long|weeks?[-\s]long|24/7|indefinitely|around\s+the\s+clock)\b",
    re.I,
)
_VAGUE_SECONDS = {
    "overnight": 8 * 3600, "multiday": 2 * 86400, "multihour": 2 * 3600, "hourlong": 3600,
    "hourslong": 2 * 3600, "daylong": 86400, "dayslong": 2 * 86400, "weeklong": 604800,
    "weekslong": 2 * 604800, "24/7": float("inf"), "indefinitely": float("inf"),
    "aroundtheclock": float("inf"),
}

_UNIT_AFTER = r"(?!\d|\.\d|\s*(?:ms|s|m|h|min|mins|sec|secs|seconds?|minutes?|hours?|rps|qps|req|%|x|GiB|GB|words?|tokens?)\b)"
# a later item of a list is not one when a count's noun follows it ("At concurrency 4, 37 requests
# completed": 37 starts the next clause)
_NEXT_AFTER = _UNIT_AFTER + r"(?!\s*(?:requests?|responses?|completions?|errors?|failures?|timeouts?|samples?|prompts?|buckets?|gaps?)\b)"
NUMBER_LIST = rf"\d+{_UNIT_AFTER}(?:\s*(?:,|/|&)\s*\d+{_NEXT_AFTER})*(?:\s*,?\s*\b(?:and|or)\s+\d+{_NEXT_AFTER})?"
_NUMLIST = rf"(?P<list>{NUMBER_LIST})"
_CONCURRENCY = [
    re.compile(rf"\bconcurrenc(?:y|ies)(?:\s+levels?)?(?:\s+of)?\s*(?:[:=]\s*|\s+)(?:(?:up\s+to|as\s+high\s+as|of)\s+)?{_NUMLIST}", re.I),
    re.compile(r"\bc\s*=\s*(?P<list>\d+)\b"),
    re.compile(r"\b(?:up\s+to\s+)?(?P<list>\d+)\s+(?:concurrent|parallel|simultaneous|in-flight)\s+(?:requests?|users?|streams?|clients?|connections?|sessions?|sequences?)\b", re.I),
    re.compile(r"\b(?P<list>\d+)[-\s]way\s+concurren", re.I),
]
_RATE = re.compile(
    r"\b(?:at|rate(?:s)?\s*(?:of|[:=])?)\s*(?P<n>\d+(?:\.\d+)?)\s*(?:rps|req/s|requests?\s*(?:per|/)\s*s(?:ec(?:ond)?)?|qps)\b",
    re.I,
)

_LONG = re.compile(r"\b(?:long(?:er)?|large|huge|big)[-\s]+(?:context|prompts?|inputs?|sequences?)\b|\blong[-\s]?context\b", re.I)
_LONG_IN_LIST = re.compile(r"\blong\s*(?:/|or|and)\s*mixed[-\s]+prompts?\b|\bmixed\s*(?:/|or|and)\s*long[-\s]+prompts?\b", re.I)
_MIXED = re.compile(
    r"\b(?:mixed|varied|variable|varying)(?:[-\s]+(?:length|size|shape))?[-\s]+(?:prompts?|workloads?|shapes?|traffic|inputs?)\b"
    r"|\b(?:real[-\s]world|realistic|production)\s+(?:traffic|prompts?|workloads?)\b",
    re.I,
)
_PROMPT_WORDS = [
    re.compile(r"\bprompt_words\s*[:=]\s*(?P<n>\d+)", re.I),
    re.compile(r"\b(?P<n>\d[\d,]*)[-\s]words?[-\s]+(?:prompts?|inputs?)\b", re.I),
    re.compile(r"\b(?:prompts?|inputs?)\s+(?:of\s+)?(?:up\s+to\s+)?(?P<n>\d[\d,]*)\s+words\b", re.I),
]
_PROMPT_TOKENS = [
    re.compile(r"\b(?P<n>\d[\d,]*)(?P<k>k)?[-\s]tokens?[-\s]+(?:prompts?|inputs?|context)\b", re.I),
    re.compile(r"\b(?:prompts?|inputs?|context)\s+(?:of\s+|length\s+)?(?:up\s+to\s+)?(?P<n>\d[\d,]*)(?P<k>k)?\s*tokens\b", re.I),
    re.compile(r"\b(?P<n>\d+)(?P<k>k)[-\s]+(?:context|tokens?)\b", re.I),
]
_MAX_TOKENS = [
    re.compile(r"\bmax_tokens\s*[:=]\s*(?P<n>\d+)", re.I),
    re.compile(r"\b(?P<n>\d+)\s+(?:output|generated|completion|new)\s+tokens\b", re.I),
]

ENGINES = {
    "vllm": "vLLM", "sglang": "SGLang", "tgi": "TGI", "text-generation-inference": "TGI",
    "tensorrt-llm": "TensorRT-LLM", "trt-llm": "TensorRT-LLM", "trtllm": "TensorRT-LLM",
    "llama.cpp": "llama.cpp", "ollama": "Ollama", "lmdeploy": "LMDeploy", "mlc-llm": "MLC-LLM",
    "exllamav2": "ExLlamaV2", "deepspeed-mii": "DeepSpeed-MII", "aphrodite": "Aphrodite",
    "mistral.rs": "mistral.rs", "triton": "Triton",
}
_ENGINE_RX = r"(?P<e>" + "|".join(re.escape(k) for k in sorted(ENGINES, key=len, reverse=True)) + r")"
_BACKEND = [
    re.compile(rf"\b(?:on|with|against|under|using|via|across|behind)\s+(?:the\s+)?{_ENGINE_RX}(?![\w-]|\.\w)", re.I),
    re.compile(rf"(?<![\w.-]){_ENGINE_RX}\s+(?:backends?|servers?|engines?|deployments?)\b", re.I),
]

_MODEL_FAMILY = (
    r"(?:Meta-)?Llama|CodeLlama|Mistral|Mixtral|Codestral|Qwen|QwQ|DeepSeek|Gemma|Phi|Falcon|GPT|OPT|Yi|Baichuan|"
    r"ChatGLM|GLM|InternLM|Granite|OLMo|StarCoder|Vicuna|Kimi|Nemotron|Command-R|Jamba|MiniCPM|Hunyuan|ERNIE"
)
# a model named as what a result is about: "on Llama-3-70B", "validates DeepSeek-V3", "for Qwen2.5 7B"
_MODEL = re.compile(
    r"\b(?:on|with|for|using|against|under|via|across|serving|serves?|served|runs?|ran|validates?|validated|"
    r"covers?|covered|supports?|supported|tested|verified|benchmarked|soaked)\s+(?:the\s+)?"
    rf"(?P<name>(?:[\w.-]+/)?(?:{_MODEL_FAMILY})(?![a-z])(?:[-_.]?[A-Za-z0-9]+)*(?:\s+\d(?:\w|\.(?=\w))*(?:[-_.][A-Za-z0-9]+)*)*)"
    r"(?![\w-]|\.\w|\s+(?:prompts?|datasets?|data|tokenizers?|outputs?|responses?|traces?|conversations?|format|style|templates?)\b)",
    re.I,
)


_RUNTIME_VERSION = re.compile(r"(?<![\w.-])(?P<name>[A-Za-z][\w.+-]*[A-Za-z])\s+v?(?P<v>\d+(?:\.\d+)+)")


def _model_key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.rsplit("/", 1)[-1].lower())


_GPU_NAME = (
    r"(?:NVIDIA\s+)?(?:GeForce\s+)?(?:RTX\s*(?:PRO\s*)?\d{4}(?:\s*Ti)?|RTX\s*A\d{4}|[HAB]\d{2,3}|GB\d{3}|GH\d{3}|"
    r"L40S?|L4|A10G?|A30|A40|V100|P100|T4|MI\d{3}X?|TPU\s*v\d\w*|Gaudi\s*\d)"
)
_GPU = re.compile(rf"(?:\b(?P<count>\d+)\s*[x×]\s*|\b(?P<count2>\d+)\s+)?\b(?P<name>{_GPU_NAME})s?\b")
_GPU_COUNT = re.compile(r"\b(?P<count>\d+)\s*(?:x\s*)?GPUs?\b")


def _norm_gpu(name: str) -> str:
    n = re.sub(r"\s+", "", name.upper())
    return n.replace("NVIDIA", "").replace("GEFORCE", "")


def _hardware(coverage: Coverage) -> list[tuple[str, int | None]]:
    out = []
    for h in coverage.hardware:
        for m in _GPU.finditer(h):
            count = m.group("count") or m.group("count2")
            out.append((_norm_gpu(m.group("name")), int(count) if count else None))
    return out


def _num(text: str) -> float:
    t = text.lower().replace(",", "")
    return float(_NUM_WORDS[t]) if t in _NUM_WORDS else float(t)


def _asserted(doc: Document, rx: re.Pattern[str], negated_blocks: frozenset[int]) -> Iterator[tuple[Sentence, re.Match[str]]]:
    """Each asserted match of `rx`, outside bench serve result blocks (`bench_lines`: a block's
    "Maximum request concurrency: 64" is a run's setting, not a claim of scope)."""
    skip = bench_lines(doc)
    for s in doc.sentences:
        text = doc.sentence_text(s)
        for m in rx.finditer(text):
            if skip and doc.position(s.start + m.start())[0] in skip:
                continue
            if polarity(text, m.start(), m.end(), s.block in negated_blocks) is Polarity.ASSERTED:
                yield s, m


def check_scope(doc: Document, path: str, coverage: Coverage, negated_blocks: frozenset[int]) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    found: list[tuple[str, int, int]] = []  # (rule, start, end) in the document: one finding per overclaim

    def add(rule: str, s: Sentence, a: int, b: int, message: str, hint: str | None = None, severity: Severity = Severity.ERROR) -> None:
        # two patterns of one rule reading the same words ("32k-token prompts" and "32k-token") are one overclaim
        start, end = s.start + a, s.start + b
        if any(r == rule and start < e and x < end for r, x, e in found):
            return
        found.append((rule, start, end))
        out.append(Diagnostic("CB301", message, doc.span(start, end), path, severity, hint))

    # concurrency
    levels = set(coverage.concurrency_levels)
    covered_c = ", ".join(map(str, sorted(levels))) or "none (no closed-loop levels)"
    for rx in _CONCURRENCY:
        for s, m in _asserted(doc, rx, negated_blocks):
            base = m.start("list")
            for nm in re.finditer(r"\d+", m.group("list")):
                n = int(nm.group(0))
                if n not in levels:
                    add("concurrency", s, base + nm.start(), base + nm.end(), f"claims concurrency {n}, which the workload did not cover (levels: {covered_c})")

    # rates
    for s, m in _asserted(doc, _RATE, negated_blocks):
        n = float(m.group("n"))
        if not any(abs(n - r) < 1e-9 for r in coverage.rates):
            covered = ", ".join(f"{r:g} rps" for r in coverage.rates) or "none (closed loop only)"
            add("rate", s, m.start("n"), m.end("n"), f"claims a request rate of {n:g} rps, which the workload did not cover (rates: {covered})")

    # durations
    limit = max(coverage.duration_s, coverage.total_duration_s)
    if limit > 0:
        covered_d = f"{format_duration(coverage.duration_s)} per level, {format_duration(coverage.total_duration_s)} in total"
        for rx in _DURATION:
            for s, m in _asserted(doc, rx, negated_blocks):
                unit = (m.group("u") or "s").lower()
                seconds = _num(m.group("n")) * _UNITS.get(unit, 1)
                if seconds > limit + 1e-9:
                    add("duration", s, m.start(), m.end(), f'claims a duration of {format_duration(seconds)} ("{m.group(0).strip()}"); the workload covered {covered_d}')
        for s, m in _asserted(doc, _VAGUE_DURATION, negated_blocks):
            key_word = re.sub(r"[-\s]", "", m.group("w").lower())
            seconds = _VAGUE_SECONDS.get(key_word, 0)
            if seconds > limit:
                add("duration", s, m.start(), m.end(), f'claims "{m.group(0)}" duration; the workload covered {covered_d}')

    # prompt shape
    pw = coverage.prompt_words
    pw_text = ", ".join(map(str, pw)) or "unknown"
    if not coverage.prompt_file:
        if pw and max(pw) < LONG_PROMPT_WORDS:
            for rx in (_LONG, _LONG_IN_LIST):
                for s, m in _asserted(doc, rx, negated_blocks):
                    add("long", s, m.start(), m.end(), f'claims "{m.group(0)}", but the workload used prompt_words = {pw_text} (long means >= {LONG_PROMPT_WORDS} words)')
        if len(set(pw)) < 2:
            for rx in (_MIXED, _LONG_IN_LIST):
                for s, m in _asserted(doc, rx, negated_blocks):
                    add("mixed", s, m.start(), m.end(), f'claims "{m.group(0)}", but the workload used one prompt shape (prompt_words = {pw_text})')
        if pw:
            for rx in _PROMPT_WORDS:
                for s, m in _asserted(doc, rx, negated_blocks):
                    n = int(m.group("n").replace(",", ""))
                    if n not in pw:
                        add("prompt_words", s, m.start("n"), m.end("n"), f"claims {n}-word prompts; the workload used prompt_words = {pw_text}")
            for rx in _PROMPT_TOKENS:
                for s, m in _asserted(doc, rx, negated_blocks):
                    n = int(m.group("n").replace(",", "")) * (1000 if m.group("k") else 1)
                    if n > 2 * max(pw):
                        add("prompt_tokens", s, m.start(), m.end(), f"claims {n}-token prompts; the workload used prompt_words = {pw_text}")
    if coverage.max_tokens:
        mt = ", ".join(map(str, coverage.max_tokens))
        for rx in _MAX_TOKENS:
            for s, m in _asserted(doc, rx, negated_blocks):
                n = int(m.group("n"))
                if n not in coverage.max_tokens:
                    add("max_tokens", s, m.start("n"), m.end("n"), f"claims {n} output tokens; the workload used max_tokens = {mt}")

    # backends
    names = {re.sub(r"[^a-z0-9]", "", b.lower()) for b in coverage.backends}
    for rx in _BACKEND:
        for s, m in _asserted(doc, rx, negated_blocks):
            engine = m.group("e")
            if re.sub(r"[^a-z0-9]", "", engine.lower()) not in names:
                covered = ", ".join(coverage.backends) or "none"
                add("backend", s, m.start("e"), m.end("e"), f"claims a result on {ENGINES[engine.lower()]}, which is not a backend of this spec (backends: {covered})")

    # runtime versions: "NCCL 2.27" where the runtime boundary is "NCCL 2.26.2"
    versions: dict[str, set[str]] = {}
    for label in coverage.runtime_boundaries:
        for vm in _RUNTIME_VERSION.finditer(label):
            versions.setdefault(vm.group("name").lower(), set()).add(vm.group("v"))
    if versions:
        names_rx = "|".join(re.escape(n) for n in sorted(versions, key=len, reverse=True))
        rx = re.compile(rf"(?<![\w.-])(?P<name>{names_rx})\s+v?(?P<v>\d+(?:\.\d+)+)(?![\w]|\.\d)", re.I)
        for s, m in _asserted(doc, rx, negated_blocks):
            known = versions[m.group("name").lower()]
            said = m.group("v")
            if not any(k == said or k.startswith(said + ".") for k in known):
                add("runtime", s, m.start("v"), m.end("v"),
                    f'claims {m.group("name")} {said}, which the runtime boundary does not cover '
                    f'({", ".join(b for b in coverage.runtime_boundaries if m.group("name").lower() in b.lower())})')

    # models: a result claimed for a model other than the spec's (a shorter or longer name of the
    # same model -- "DeepSeek-V2" for DeepSeek-V2-Lite, "…-Lite-Chat" -- is not flagged)
    ids = [_model_key(m) for m in coverage.model_ids]
    if ids:
        for s, m in _asserted(doc, _MODEL, negated_blocks):
            name = m.group("name")
            key = _model_key(name)
            if any(c.isdigit() for c in key) and not any(k.startswith(key) or key.startswith(k) for k in ids if k):
                add("model", s, m.start("name"), m.end("name"),
                    f'claims a result for model "{name}", which is not the spec\'s model ({", ".join(coverage.model_ids)})')

    # hardware
    hw = _hardware(coverage)
    hw_text = ", ".join(coverage.hardware) or "unknown"
    for s, m in _asserted(doc, _GPU, negated_blocks):
        name = _norm_gpu(m.group("name"))
        count_s = m.group("count") or m.group("count2")
        count = int(count_s) if count_s else None
        said = m.group(0).strip()
        if not coverage.hardware:
            add("hardware", s, m.start(), m.end(), f'claims hardware "{said}", but the spec records no hardware', severity=Severity.WARNING,
                hint="record the hardware so claims about it can be checked")
        elif not any(name == h and (count is None or c is None or count == c) for h, c in hw):
            add("hardware", s, m.start(), m.end(), f'claims hardware "{said}"; the evidence covered {hw_text}')
    if hw:
        total = sum(c or 1 for _, c in hw)
        for s, m in _asserted(doc, _GPU_COUNT, negated_blocks):
            n = int(m.group("count"))
            if n > total:
                add("gpu_count", s, m.start(), m.end(), f'claims "{m.group(0)}"; the evidence covered {hw_text}')
    return out
