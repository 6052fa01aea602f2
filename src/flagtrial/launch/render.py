"""Lossless re-rendering of a directive whose words change.

Every physical line an edit does not touch keeps its exact bytes; a line holding a changed
word is rebuilt around it (its other words, gaps, comments and ending kept); new `--flag`
words go on lines of their own in a multi-line directive, indented like its last line.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field

from flagtrial.errors import SpecError
from flagtrial.launch.execwords import WHITESPACE, Word, quote_word
from flagtrial.launch.lexer import Directive, Line, continued


@dataclass
class WordEdits:
    """Edits to one directive's words: by index into its word list."""

    replace: dict[int, str] = field(default_factory=dict)  # new source text
    delete: set[int] = field(default_factory=set)
    after: dict[int, list[str]] = field(default_factory=dict)  # source texts inserted after
    before_first: list[str] = field(default_factory=list)  # inserted before word 0
    drop_if_empty: bool = False


@dataclass
class _Piece:
    text: str
    gap: str  # the text that follows it on the line when something follows


def _starts_group(source: str) -> bool:
    """Whether an appended word opens a new `--flag [value]` line (`-1` is a value)."""
    return source.startswith("--") or (source[:1] == "-" and source[1:2].isalpha())


def _group(sources: list[str]) -> list[list[str]]:
    groups: list[list[str]] = []
    for s in sources:
        if not groups or _starts_group(s):
            groups.append([s])
        else:
            groups[-1].append(s)
    return groups


def _word_spans(d: Directive, words: list[Word], edits: WordEdits) -> list[tuple[int, int, int]]:
    """(line, start col, end col) per word; end col -1 for a word over several lines, which
    an edit may not touch."""
    spans: list[tuple[int, int, int]] = []
    for w in words:
        (l0, c0), (l1, c1) = d.value_pos[w.start], d.value_pos[w.end - 1]
        spans.append((l0, c0, c1 + 1 if l0 == l1 else -1))
    touched = set(edits.replace) | edits.delete | set(edits.after)
    for wi in touched:
        if spans[wi][2] < 0:
            raise SpecError(
                f"line {spans[wi][0] + 1}: cannot edit a quoted word that spans continuation lines"
            )
    return spans


def _edit_lines(
    lines: list[Line],
    d: Directive,
    spans: list[tuple[int, int, int]],
    by_line: dict[int, list[int]],
    edits: WordEdits,
) -> tuple[dict[int, list[_Piece]], set[int], dict[int, list[list[str]]]]:
    """Each line's words after the edits, which lines changed, and the new lines (word
    groups) to put after each one."""
    multiline = len(d.lines) > 1
    new_lines_after: dict[int, list[list[str]]] = {li: [] for li in d.lines}
    pieces: dict[int, list[_Piece]] = {}
    changed: set[int] = set()
    for li in d.lines:
        content = lines[li].content
        on_line = by_line[li]
        row: list[_Piece] = []
        if li == d.lines[0] and edits.before_first:
            row.extend(_Piece(s, " ") for s in edits.before_first)
            changed.add(li)
        for k, wi in enumerate(on_line):
            _, c0, c1 = spans[wi]
            # What separates this word from the next on its line (a lone space after the last).
            gap = content[c1 : spans[on_line[k + 1]][1]] if k + 1 < len(on_line) else " "
            if wi in edits.delete:
                changed.add(li)
            else:
                text = edits.replace.get(wi, content[c0:c1])
                if text != content[c0:c1]:
                    changed.add(li)
                row.append(_Piece(text, gap))
            inserted = edits.after.get(wi, [])
            if not inserted:
                continue
            last_on_line = k + 1 == len(on_line)
            if multiline and last_on_line and _starts_group(inserted[0]):
                new_lines_after[li].extend(_group(inserted))
                continue
            changed.add(li)
            if row:
                row[-1] = _Piece(row[-1].text, " ")
            row.extend(_Piece(s, " ") for s in inserted[:-1])
            row.append(_Piece(inserted[-1], gap))
        pieces[li] = row
    return pieces, changed, new_lines_after


def render_directive(
    lines: list[Line], d: Directive, words: list[Word], edits: WordEdits
) -> dict[int, list[str]]:
    """New contents for each physical line of d: [] drops a line, extra entries are new lines."""
    spans = _word_spans(d, words, edits)
    by_line: dict[int, list[int]] = {li: [] for li in d.lines}
    for wi, (li, _, _) in enumerate(spans):
        by_line[li].append(wi)
    pieces, changed, new_lines_after = _edit_lines(lines, d, spans, by_line, edits)

    had_words = {li for li in d.lines if by_line[li]}
    # A directive whose words are all gone is removed whole (an empty Environment= would
    # reset the environment; an empty ExecStart= would reset the command).
    if (
        edits.drop_if_empty
        and not any(pieces[li] for li in d.lines)
        and not any(new_lines_after.values())
    ):
        return {li: [] for li in d.lines}

    indent = _continuation_indent(lines, d, by_line)
    out_rows: list[tuple[int | None, str]] = []  # (original line or None for new, content)
    for li in d.lines:
        row = pieces[li]
        is_first = li == d.lines[0]
        if li in changed and not row and not is_first and li in had_words:
            pass  # the line held only removed words: drop it
        elif li in changed:
            out_rows.append((li, _rebuild(lines[li].content, spans, by_line[li], row)))
        else:
            out_rows.append((li, lines[li].content))
        for group in new_lines_after[li]:
            out_rows.append((None, indent + " ".join(group)))

    result: dict[int, list[str]] = {li: [] for li in d.lines}
    owner = d.lines[0]
    for k, (source_line, content) in enumerate(out_rows):
        want_continued = k + 1 < len(out_rows)
        if source_line is not None:
            owner = source_line
        result[owner].append(_set_continuation(content, want_continued))
    return result


def _rebuild(
    content: str, spans: list[tuple[int, int, int]], on_line: list[int], row: list[_Piece]
) -> str:
    body_end = len(content) - 1 if continued(content) else len(content)
    if on_line:
        head = content[: spans[on_line[0]][1]]
        tail = content[spans[on_line[-1]][2] :]
    else:
        head = content[:body_end].rstrip(WHITESPACE)
        tail = content[len(head) :]
        if row and not head.endswith("="):
            head += " "
    middle = "".join(p.text + p.gap for p in row[:-1]) + (row[-1].text if row else "")
    return head + middle + tail


def _set_continuation(content: str, want: bool) -> str:
    if continued(content) == want:
        return content
    if want:
        return content.rstrip(WHITESPACE) + " \\"
    return content[:-1].rstrip(WHITESPACE)


def _continuation_indent(lines: list[Line], d: Directive, by_line: dict[int, list[int]]) -> str:
    for li in reversed(d.lines[1:]):
        if by_line[li]:
            content = lines[li].content
            return content[: len(content) - len(content.lstrip(WHITESPACE))]
    return "    "


def _dominant_eol(lines: list[Line]) -> str:
    return next((line.eol for line in lines if line.eol), "\n")


def assemble(
    lines: list[Line], replaced: Mapping[int, list[str]], appended: Mapping[int, list[str]]
) -> str:
    """The file's text with some lines' contents replaced and new lines after others."""
    eol = _dominant_eol(lines)
    out: list[str] = []
    for li, line in enumerate(lines):
        contents = replaced.get(li, [line.content])
        extra = appended.get(li, [])
        rows = contents + extra
        # Rows rendered for this line keep its own ending (an unterminated last line takes
        # the file's for all rows but its last).
        for k, content in enumerate(rows):
            last = k + 1 == len(rows)
            out.append(content + (line.eol if last else line.eol or eol))
        if not rows and line.eol == "" and out:
            # The dropped line was the file's unterminated last line: keep the file's ending.
            out[-1] = out[-1].rstrip("\r\n")
    return "".join(out)


def argv_edits(old: list[str], new: list[str], base: int) -> WordEdits:
    """Word edits turning old into new (indices offset by base into the directive's words)."""
    edits = WordEdits()
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            continue
        paired = min(i2 - i1, j2 - j1)
        for k in range(paired):
            edits.replace[base + i1 + k] = quote_word(new[j1 + k])
        edits.delete.update(base + i for i in range(i1 + paired, i2))
        extra = [quote_word(w) for w in new[j1 + paired : j2]]
        if not extra:
            continue
        anchor = base + i1 + paired - 1
        if anchor < 0:
            edits.before_first.extend(extra)
        else:
            edits.after.setdefault(anchor, []).extend(extra)
    return edits
