"""Checks 1 and 2: the claim-boundary section states every exclusion (CB001, CB002), and no
sentence asserts an excluded item (CB101).

A claim-boundary section starts at a Markdown heading containing "claim boundary", or at a
line that begins with it ("Claim Boundary", "Claim boundary:", "**Claim boundary:** text");
case-insensitive, "claims boundary"/"claim-boundary" too. A heading's section runs to the next
heading of the same or a higher level; a plain line's section runs to the next heading, title
line or bold label ("**Validation:**").
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

from soakspec.claims.document import Block, BlockKind, Document, Sentence
from soakspec.claims.phrases import MENTION_SLACK, STATED_SLACK, Exclusion, content_tokens, windows
from soakspec.claims.polarity import _NEG_DETERMINER, _NEG_VERBAL, Polarity, negates_list, polarity
from soakspec.diagnostics import Diagnostic, Span

_BOUNDARY = re.compile(r"^[\s#>*_•\-]*claims?[-\s]+boundar(?:y|ies)\b[\s*_]*(?::|$|[-—–]\s|\()", re.IGNORECASE)
_BOUNDARY_IN_HEADING = re.compile(r"\bclaims?[-\s]+boundar(?:y|ies)\b", re.IGNORECASE)
_BOLD_LABEL = re.compile(r"^\s*(?:\*\*|__)[^*_\n]{1,40}(?::\s*(?:\*\*|__)|(?:\*\*|__)\s*:)")


def boundary_sections(doc: Document) -> list[tuple[Block, int, int]]:
    """(header block, start offset, end offset) for each claim-boundary section."""
    out: list[tuple[Block, int, int]] = []
    blocks = doc.blocks
    for i, b in enumerate(blocks):
        first = doc.text[b.start : doc.line_starts[b.first_line - 1] + len(doc.lines[b.first_line - 1])]
        if b.kind is BlockKind.HEADING:
            if not _BOUNDARY_IN_HEADING.search(first):
                continue
            end = len(doc.text)
            for nb in blocks[i + 1 :]:
                if nb.kind is BlockKind.HEADING and nb.level <= b.level:
                    end = nb.start
                    break
        elif b.kind in (BlockKind.CODE, BlockKind.QUOTE, BlockKind.TABLE_ROW):
            continue
        elif _BOUNDARY.match(first):
            end = len(doc.text)
            for nb in blocks[i + 1 :]:
                if nb.kind in (BlockKind.HEADING, BlockKind.TITLE) or (
                    nb.kind is BlockKind.PARAGRAPH and _BOLD_LABEL.match(doc.text[nb.start : nb.end])
                ):
                    end = nb.start
                    break
        else:
            continue
        out.append((b, b.start, end))
    return out


def negated_list_blocks(doc: Document) -> frozenset[int]:
    """Indices of list-item blocks governed by a negated introducer or heading."""
    out: set[int] = set()
    intro: tuple[str, bool] | None = None
    for i, b in enumerate(doc.blocks):
        if b.kind is BlockKind.LIST_ITEM:
            if intro is not None and negates_list(*intro):
                out.add(i)
            continue
        if b.kind in (BlockKind.HEADING, BlockKind.TITLE):
            intro = (doc.masked[b.start : b.end].strip("# \t"), True)
        elif b.kind is BlockKind.PARAGRAPH:
            intro = (doc.masked[b.start : b.end], False)
        else:
            intro = None
    return frozenset(out)


def _stated(doc: Document, sentences: Sequence[Sentence], ex: Exclusion) -> bool:
    for s in sentences:
        raw = doc.text[s.start : s.end]
        if any(p.search(raw) for p in ex.patterns):
            return True
        toks = content_tokens(raw)
        if next(windows(toks, ex.slots, len(ex.slots) + STATED_SLACK, ex.stated_needed), None):
            return True
    return False


def check_boundary_section(doc: Document, path: str, excludes: Sequence[Exclusion], has_boundary: bool) -> list[Diagnostic]:
    """CB001 when there is no section; CB002 for each exclusion the section does not state."""
    if not has_boundary:
        return []
    sections = boundary_sections(doc)
    if not sections:
        listed = "; ".join(f'"{e.text}"' for e in excludes) or "none"
        return [
            Diagnostic(
                "CB001",
                "no claim-boundary section (a 'Claim boundary' heading or line); "
                f"the spec excludes: {listed}",
                doc.line_span(1) if doc.text.strip() else Span(1, 1, 1, 1),
                path,
                hint="add a 'Claim boundary' section that states what the evidence shows and every exclusion",
            )
        ]
    sentences = [s for _, start, end in sections for s in doc.sentences_in(start, end)]
    out = []
    header = sections[0][0]
    for ex in excludes:
        if not _stated(doc, sentences, ex):
            out.append(
                Diagnostic(
                    "CB002",
                    f'the claim-boundary section does not state the exclusion "{ex.text}"',
                    doc.line_span(header.first_line),
                    path,
                    hint=f'say what is not claimed, e.g. "It does not claim {ex.text}."',
                )
            )
    return out


def _candidates(doc: Document, s: Sentence, ex: Exclusion) -> Iterator[tuple[int, int]]:
    """(start, end) offsets relative to the sentence where the exclusion is mentioned."""
    text = doc.sentence_text(s)
    found: list[tuple[int, int]] = []
    for p in ex.patterns:
        found.extend((m.start(), m.end()) for m in p.finditer(text) if m.end() > m.start())
    toks = content_tokens(text)
    for i, j in windows(toks, ex.slots, len(ex.slots) + MENTION_SLACK, len(ex.slots)):
        a, b = toks[i].start, toks[j - 1].end
        inner = text[a:b]
        if _NEG_VERBAL.search(inner) or _NEG_DETERMINER.search(inner):
            continue  # "production is not ready" is a negation, not a mention
        found.append((a, b))
    yield from sorted(set(found))


def check_assertions(
    doc: Document, path: str, excludes: Sequence[Exclusion], negated_blocks: frozenset[int]
) -> list[Diagnostic]:
    """CB101: a sentence that asserts an excluded item (not negated, hedged, quoted or asked)."""
    out: list[Diagnostic] = []
    for s in doc.sentences:
        text = doc.sentence_text(s)
        for ex in excludes:
            for a, b in _candidates(doc, s, ex):
                pol = polarity(text, a, b, s.block in negated_blocks)
                if pol is not Polarity.ASSERTED:
                    continue
                phrase = " ".join(text[a:b].split())
                out.append(
                    Diagnostic(
                        "CB101",
                        f'asserts "{phrase}", which the claim boundary excludes ("{ex.text}")',
                        doc.span(s.start + a, s.start + b),
                        path,
                        hint=f'negate it ("does not claim {ex.text}"), hedge it, quote it, or remove it',
                    )
                )
                break
    return out
