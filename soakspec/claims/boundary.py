"""Checks 1 and 2: the claim-boundary section states every exclusion (CB001, CB002), and no
sentence asserts an excluded item (CB101).

A claim-boundary section starts at a Markdown heading containing "claim boundary", or at a
line that begins with it ("Claim Boundary", "Claim boundary:", "**Claim boundary:** text");
case-insensitive, "claims boundary"/"claim-boundary" too. A heading's section runs to the next
heading of the same or a higher level; a plain line's section runs to the next heading, title
line or bold label ("**Validation:**"; labels about the boundary itself, such as "**Does not
claim:**" or "**Shows:**", stay in the section).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

from soakspec.claims.document import Block, BlockKind, Document, Sentence
from soakspec.claims.phrases import MENTION_SLACK, STATED_SLACK, Exclusion, Token, content_tokens, windows
from soakspec.claims.polarity import NEGATION_DETERMINERS, NEGATION_CUES, Polarity, negates_list, polarity
from soakspec.diagnostics import Diagnostic, Span

_BOUNDARY = re.compile(r"^[\s#>*_•\-]*claims?[-\s]+boundar(?:y|ies)\b[\s*_]*(?::|$|[-—–]\s|\()", re.IGNORECASE)
_BOUNDARY_IN_HEADING = re.compile(r"\bclaims?[-\s]+boundar(?:y|ies)\b", re.IGNORECASE)
_BOUNDARY_WORDS = re.compile(r"claim|exclu|\bnot\b|\bno\b|scope|shows?\b|limit|caveat|non-?goal", re.IGNORECASE)
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
                label = _BOLD_LABEL.match(doc.text[nb.start : nb.end]) if nb.kind is BlockKind.PARAGRAPH else None
                if nb.kind in (BlockKind.HEADING, BlockKind.TITLE) or (label and not _BOUNDARY_WORDS.search(label.group(0))):
                    end = nb.start
                    break
        else:
            continue
        out.append((b, b.start, end))
    return out


def _plain(text: str) -> str:
    """Text without Markdown emphasis and heading marks."""
    return re.sub(r"[*_#]+", "", text).strip()


def unasserted_blocks(doc: Document) -> frozenset[int]:
    """Blocks whose sentences never assert (polarity NEGATED for everything in them):

    - list items governed by a negated introducer ("It does not claim:", "**Not claimed:**")
      or directly under a negated heading;
    - every block in a section whose heading is negated or forward-looking ("Non-goals",
      "Out of scope", "Limitations", "Not claimed", "Future work", "Next steps", "Follow-ups",
      "Roadmap", "TODO", "Open questions"), up to the next heading of the same or a higher
      level (a title line's section ends at the next heading or title).
    """
    out: set[int] = set()
    intro: tuple[str, bool] | None = None
    quiet_level: int | None = None  # heading level of the current quiet section; 99 for a title
    for i, b in enumerate(doc.blocks):
        if b.kind in (BlockKind.HEADING, BlockKind.TITLE):
            level = b.level if b.kind is BlockKind.HEADING else 99
            if quiet_level is not None and (level <= quiet_level or b.kind is BlockKind.HEADING and quiet_level == 99):
                quiet_level = None
            text = _plain(doc.masked[b.start : b.end])
            if quiet_level is None and (negates_list(text, True) or _FORWARD_HEADING.search(text)):
                quiet_level = level
                out.add(i)
            intro = (text, True)
            continue
        if quiet_level is not None:
            out.add(i)
        if b.kind is BlockKind.LIST_ITEM:
            if intro is not None and negates_list(*intro):
                out.add(i)
            continue
        if b.kind is BlockKind.PARAGRAPH:
            intro = (_plain(doc.masked[b.start : b.end]), False)
        else:
            intro = None
    return frozenset(out)


_FORWARD_HEADING = re.compile(
    r"^(?:future\s+work|next\s+steps?|follow[-\s]?ups?|roadmap|todo|to\s+do|open\s+questions|later)\b",
    re.IGNORECASE,
)


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


def _candidates(text: str, toks: Sequence[Token], ex: Exclusion) -> Iterator[tuple[int, int]]:
    """(start, end) offsets in the sentence `text` where the exclusion is mentioned."""
    found: list[tuple[int, int]] = []
    for p in ex.patterns:
        found.extend((m.start(), m.end()) for m in p.finditer(text) if m.end() > m.start())
    for i, j in windows(toks, ex.slots, len(ex.slots) + MENTION_SLACK, len(ex.slots)):
        a, b = toks[i].start, toks[j - 1].end
        inner = text[a:b]
        if NEGATION_CUES.search(inner) or NEGATION_DETERMINERS.search(inner):
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
        if not text.strip():
            continue
        toks = content_tokens(text)
        for ex in excludes:
            for a, b in _candidates(text, toks, ex):
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
