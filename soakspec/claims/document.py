"""A review document as the linter sees it: lines, blocks, sentences, and masked text.

`parse_document(text)` is pure. Offsets index the original text; `Document.span(start, end)`
turns them into a 1-based `Span` (a tab counts as one column, like the renderer).

Masking: `Document.masked` has the same length as `text`, with quoted material blanked to
spaces (newlines kept): fenced code blocks (``` / ~~~), blockquote lines (`>`), inline code
(`…`), and double-quoted text ("…", “…”, ‘…’) closed on the same line. Quoted text is never an
assertion; checks that look for assertions read `masked`, checks that look for stated values
(numbers, hashes, the boundary section) read `text`.

What a reader never sees is blank in both `text` and `masked` (offsets kept): HTML comments
outside fenced code, and a leading byte-order mark. YAML front matter (`---` on line 1 to the
next `---`) is read like fenced code: metadata, never an assertion. URLs and link reference
definitions (`[x]: https://…`) are masked: an address is not prose.

Blocks: a Markdown heading (ATX `#`, or setext: a paragraph underlined with `===` / `---`), a table row (tab- or pipe-separated), a list item (`-`, `*`, `+`,
`•`, `1.`; with its continuation lines), or a paragraph (consecutive other lines). A paragraph
that is one short line without closing punctuation, standing alone between blank lines, is a
*title* (a plain-text heading, as in PR bodies pasted from GitHub: "Summary", "Validation").
Sentences split blocks at `.`, `!`, `?` followed by whitespace (not after e.g./i.e./etc./vs.).
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import re

from soakspec.diagnostics import Span


class BlockKind(enum.StrEnum):
    HEADING = "heading"
    TITLE = "title"
    PARAGRAPH = "paragraph"
    LIST_ITEM = "list_item"
    TABLE_ROW = "table_row"
    CODE = "code"
    QUOTE = "quote"


@dataclasses.dataclass(frozen=True, slots=True)
class Block:
    kind: BlockKind
    start: int  # offset of the first character (after the line's indentation)
    end: int  # offset just past the last character of the last line
    first_line: int  # 1-based
    last_line: int
    level: int = 0  # heading level (titles: 0)


@dataclasses.dataclass(frozen=True, slots=True)
class Sentence:
    start: int
    end: int
    block: int  # index into Document.blocks


_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+\S")
_LIST = re.compile(r"^\s*(?:[-*+•◦▪‣]|\d{1,3}[.)])\s+")
_QUOTE = re.compile(r"^\s{0,3}>")
_SETEXT = re.compile(r"^\s{0,3}(=+|-+)\s*$")
_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.S)
_FRONT_MATTER_END = re.compile(r"^(?:---|\.\.\.)\s*$")
_LINK_DEF = re.compile(r"^\s{0,3}\[[^\]\n]+\]:\s*\S")
_URL = re.compile(r"<?\b(?:https?|ftp)://[^\s<>)\]]+>?|\]\([^)\s]*\)")
_TABLE_SEP = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(?:\|\s*:?-{3,}:?\s*)*\|?\s*$")
_INLINE_QUOTES = re.compile(r"`[^`\n]*`|\"[^\"\n]*\"|“[^”\n]*”|‘[^’\n]*’")
_SENT_END = re.compile(r"[.!?]+(?=[\s\"')\]]*(?:\s|$))")
_ABBREV = re.compile(r"(?:\b(?:[eE]\.g|[iI]\.e|etc|vs|cf|approx|[fF]ig|al|incl)|\b[A-Z])\.$")


def is_table_row(line: str) -> bool:
    if line.count("\t") >= 2 and len([c for c in line.split("\t") if c.strip()]) >= 3:
        return True
    s = line.strip()
    return s.count("|") >= 2 and (s.startswith("|") or s.count("|") >= 3)


@dataclasses.dataclass(frozen=True)
class Document:
    text: str
    masked: str
    lines: tuple[str, ...]
    line_starts: tuple[int, ...]
    blocks: tuple[Block, ...]
    sentences: tuple[Sentence, ...]
    code_lines: frozenset[int]  # 1-based lines inside fenced code (fences included)
    quote_lines: frozenset[int]

    def position(self, offset: int) -> tuple[int, int]:
        i = bisect.bisect_right(self.line_starts, offset) - 1
        return i + 1, offset - self.line_starts[i] + 1

    def span(self, start: int, end: int) -> Span:
        line, col = self.position(start)
        eline, ecol = self.position(max(start, end))
        return Span(line, col, eline, ecol)

    def line_span(self, line: int) -> Span:
        """The whole text of a 1-based line, without leading whitespace."""
        start = self.line_starts[line - 1]
        text = self.lines[line - 1]
        lead = len(text) - len(text.lstrip())
        return self.span(start + lead, start + len(text.rstrip()))

    def line_offset(self, line: int) -> int:
        return self.line_starts[line - 1]

    def sentence_text(self, s: Sentence, masked: bool = True) -> str:
        src = self.masked if masked else self.text
        return src[s.start : s.end]

    def sentences_in(self, start: int, end: int) -> list[Sentence]:
        return [s for s in self.sentences if s.start >= start and s.end <= end]

    def block_of(self, s: Sentence) -> Block:
        return self.blocks[s.block]


def _fenced(lines: list[str], skip: set[int] = frozenset()) -> set[int]:
    """The indices of the lines of fenced code blocks, their fences included (an unclosed fence
    runs to the end); lines numbered (from 1) in `skip` -- front matter -- are not read."""
    fenced: set[int] = set()
    fence: str | None = None
    for i, line in enumerate(lines):
        if i + 1 in skip:
            continue
        m = _FENCE.match(line)
        if fence is not None:
            fenced.add(i)
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
        elif m:
            fence = m.group(1)
            fenced.add(i)
    return fenced


def _hidden(text: str, lines: list[str], line_starts: list[int]) -> tuple[str, set[int]]:
    """`text` with what a reader never sees blanked to spaces (newlines and offsets kept): HTML
    comments outside fenced code (`<!-- … -->`, an unclosed one to the end). Also the lines of
    a YAML front matter block (`---` on line 1 to the next `---` / `...`): metadata, read like
    fenced code (never an assertion; values and hashes still count)."""
    front: set[int] = set()
    if lines and lines[0].rstrip() == "---":
        for i in range(1, len(lines)):
            if _FRONT_MATTER_END.match(lines[i]):
                front = set(range(1, i + 2))
                break
    if "<!--" not in text:
        return text, front
    fenced = _fenced(lines)
    chars = list(text)
    pos = 0
    while (m := _COMMENT.search(text, pos)) is not None:
        line = bisect.bisect_right(line_starts, m.start()) - 1
        if line in fenced or line + 1 in front:
            pos = m.start() + 4
            continue
        for k in range(m.start(), m.end()):
            if chars[k] != "\n":
                chars[k] = " "
        pos = m.end()
    return "".join(chars), front


def _mask(text: str, lines: list[str], line_starts: list[int], front: set[int] = frozenset()) -> tuple[str, set[int], set[int]]:
    chars = list(text)
    code: set[int] = set(front)
    quote: set[int] = set()
    fenced = _fenced(lines, skip=front)
    for i, line in enumerate(lines):
        lineno = i + 1
        if lineno in front:
            for k in range(line_starts[i], line_starts[i] + len(line)):
                chars[k] = " "
            continue
        if i in fenced:
            code.add(lineno)
        elif _QUOTE.match(line):
            quote.add(lineno)
        if lineno in code or lineno in quote:
            for k in range(line_starts[i], line_starts[i] + len(line)):
                chars[k] = " "
            continue
        if _LINK_DEF.match(line):  # "[label]: https://…": a link's target, not prose
            for k in range(line_starts[i], line_starts[i] + len(line)):
                chars[k] = " "
            continue
        for rx in (_INLINE_QUOTES, _URL):  # a URL ("…/issues/vllm-parity") is an address, not prose
            for q in rx.finditer(line):
                for k in range(line_starts[i] + q.start(), line_starts[i] + q.end()):
                    chars[k] = " "
    return "".join(chars), code, quote


def _split_sentences(masked: str, start: int, end: int, block: int) -> list[Sentence]:
    out: list[Sentence] = []
    seg = masked[start:end]
    cur = 0
    for m in _SENT_END.finditer(seg):
        if m.group(0).startswith(".") and len(m.group(0)) == 1 and _ABBREV.search(seg[max(0, m.start() - 8) : m.end()]):
            continue
        if seg[cur : m.end()].strip():
            out.append(Sentence(start + cur, start + m.end(), block))
        cur = m.end()
    if seg[cur:].strip():
        out.append(Sentence(start + cur, end, block))
    # trim leading whitespace so spans start on a word
    trimmed = []
    for s in out:
        st = s.start
        while st < s.end and masked[st].isspace():
            st += 1
        trimmed.append(Sentence(st, s.end, s.block))
    return trimmed


def parse_document(text: str) -> Document:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if text.startswith("\ufeff"):  # a byte-order mark is not part of line 1's text
        text = " " + text[1:]
    line_starts: list[int] = []
    pos = 0
    for line in text.split("\n"):
        line_starts.append(pos)
        pos += len(line) + 1
    text, front = _hidden(text, text.split("\n"), line_starts)
    lines = text.split("\n")
    masked, code, quote = _mask(text, lines, line_starts, front)

    # (kind, first_line, last_line, level)
    raw: list[list] = []
    prev_blank = True
    for i, line in enumerate(lines):
        lineno = i + 1
        if lineno in code:
            if raw and raw[-1][0] is BlockKind.CODE and raw[-1][2] == lineno - 1:
                raw[-1][2] = lineno
            else:
                raw.append([BlockKind.CODE, lineno, lineno, 0])
            prev_blank = False
            continue
        if lineno in quote:
            raw.append([BlockKind.QUOTE, lineno, lineno, 0])
            prev_blank = False
            continue
        if not line.strip():
            prev_blank = True
            continue
        setext = _SETEXT.match(line)
        if setext and not prev_blank and raw and raw[-1][0] is BlockKind.PARAGRAPH and raw[-1][2] == lineno - 1:
            # "Title\n=====" / "Title\n-----": the paragraph above is a heading (level 1 / 2)
            raw[-1][0] = BlockKind.HEADING
            raw[-1][3] = 1 if setext.group(1)[0] == "=" else 2
            prev_blank = True  # the underline ends the heading
            continue
        if _HEADING.match(line):
            level = len(line.lstrip().split()[0])
            raw.append([BlockKind.HEADING, lineno, lineno, level])
        elif _TABLE_SEP.match(line) and "-" in line:
            pass  # a Markdown table's separator row carries nothing
        elif is_table_row(line):
            raw.append([BlockKind.TABLE_ROW, lineno, lineno, 0])
        elif _LIST.match(line):
            raw.append([BlockKind.LIST_ITEM, lineno, lineno, 0])
        elif not prev_blank and raw and raw[-1][0] in (BlockKind.PARAGRAPH, BlockKind.LIST_ITEM) and raw[-1][2] == lineno - 1:
            raw[-1][2] = lineno
        else:
            raw.append([BlockKind.PARAGRAPH, lineno, lineno, 0])
        prev_blank = False

    blocks: list[Block] = []
    for idx, (kind, first, last, level) in enumerate(raw):
        line = lines[first - 1]
        if kind is BlockKind.PARAGRAPH and first == last:
            before_blank = first == 1 or not lines[first - 2].strip()
            after_blank = last == len(lines) or not lines[last].strip()
            words = line.split()
            closing = re.search(r"[.!?,;:]\s*$", line.rstrip().rstrip("*_"))
            if before_blank and after_blank and 0 < len(words) <= 6 and not closing:
                kind = BlockKind.TITLE
        start = line_starts[first - 1] + (len(line) - len(line.lstrip()))
        end = line_starts[last - 1] + len(lines[last - 1].rstrip())
        blocks.append(Block(kind, start, end, first, last, level))

    sentences: list[Sentence] = []
    for bi, b in enumerate(blocks):
        if b.kind in (BlockKind.CODE, BlockKind.QUOTE):
            continue
        if b.kind in (BlockKind.HEADING, BlockKind.TITLE, BlockKind.TABLE_ROW):
            if masked[b.start : b.end].strip():
                sentences.append(Sentence(b.start, b.end, bi))
            continue
        sentences.extend(_split_sentences(masked, b.start, b.end, bi))
    return Document(
        text=text,
        masked=masked,
        lines=tuple(lines),
        line_starts=tuple(line_starts),
        blocks=tuple(blocks),
        sentences=tuple(sentences),
        code_lines=frozenset(code),
        quote_lines=frozenset(quote),
    )


# vLLM `bench serve`'s (and SGLang `bench_serving`'s) result block: an opening "===== Serving
# Benchmark Result =====" line, "Label:   value" lines and "-----Section-----" lines, a closing line
# of "=" (vllm/benchmarks/serve.py: `"{:<40} {:<10.2f}".format(label, value)`)
_BENCH_OPEN = re.compile(r"^\s*={3,}\s*Serving\s+Benchmark\s+Result\s*={3,}\s*$", re.I)
_BENCH_CLOSE = re.compile(r"^\s*={10,}\s*$")
# a line of a block: "Label:   value", "-----Section-----", or blank. A block pasted without its
# closing line ends before the first other line: the prose after it is read as prose
_BENCH_BODY = re.compile(r"^\s*(?:[^:\s][^:]{0,79}:(?:\s.*)?|-{3,}.*-{3,}|-{3,})?\s*$")
_BENCH_MAX_LINES = 200  # a block longer than any bench serve prints ends here: linting stays linear


def bench_blocks(doc: Document) -> list[tuple[int, int]]:
    """(first, last) line numbers of each bench serve result block, whoever wrote it."""
    out: list[tuple[int, int]] = []
    n, i = len(doc.lines), 0
    while i < n:
        if not _BENCH_OPEN.match(doc.lines[i]):
            i += 1
            continue
        j = i + 1
        while j < n and j - i < _BENCH_MAX_LINES and not _BENCH_CLOSE.match(doc.lines[j]) and not _BENCH_OPEN.match(doc.lines[j]) \
                and not doc.lines[j].lstrip().startswith(("```", "~~~")):
            j += 1
        if j < n and _BENCH_CLOSE.match(doc.lines[j]):
            last = j
        else:  # no closing line: the block is its `Label: value` / `---Section---` / blank lines
            last = next((k - 1 for k in range(i + 1, j) if not _BENCH_BODY.match(doc.lines[k])), j - 1)
        out.append((i + 1, last + 1))
        i = last + 1
    return out


def bench_lines(doc: Document) -> frozenset[int]:
    """Every line of every bench serve result block (`bench_blocks`): a block is figures in
    bench serve's layout, never prose. `figures` reads soakspec's blocks (their figures and
    `Verdict:`), and the checks that read prose (the counts, the verdict, the scope) skip them all
    -- bench serve's own block ("Maximum request concurrency: 64") states another run's settings."""
    return frozenset(ln for first, last in bench_blocks(doc) for ln in range(first, last + 1))
