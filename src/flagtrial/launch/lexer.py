"""A unit or command file read as systemd's conf-parser reads it: lines, then directives.

Comment lines (`#`/`;` after optional whitespace) are skipped everywhere, including inside a
continuation; a line ending in an odd number of backslashes continues on the next one, that
backslash counting as a space; keys and values are stripped of whitespace. Every directive
keeps where each character of its value lies, so an edit (render.py) or a redaction
(redact.py) can rewrite just those bytes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from flagtrial.errors import SpecError
from flagtrial.launch.execwords import WHITESPACE, Word, scan_words

_EOL = re.compile(r"\r\n|\r|\n")


@dataclass
class Line:
    """One physical line: its text and its own ending ("" for an unterminated last line)."""

    content: str
    eol: str


def split_lines(text: str) -> list[Line]:
    lines: list[Line] = []
    pos = 0
    for m in _EOL.finditer(text):
        lines.append(Line(text[pos : m.start()], m.group()))
        pos = m.end()
    if pos < len(text):
        lines.append(Line(text[pos:], ""))
    return lines


def continued(content: str) -> bool:
    """systemd's test: the line ends in an odd run of backslashes."""
    return (len(content) - len(content.rstrip("\\"))) % 2 == 1


def _is_comment(content: str) -> bool:
    stripped = content.lstrip(WHITESPACE)
    return stripped[:1] in ("#", ";")


@dataclass
class Directive:
    """One logical `Key=value` (or a command file's command) and where its text lies.

    value_pos[k] is the (line index, column) of value[k]; a continuation's backslash maps to
    the space systemd puts in its place.
    """

    section: str | None
    key: str | None
    value: str
    value_pos: list[tuple[int, int]]
    lines: list[int]  # physical lines holding it, comment lines excluded

    @property
    def lineno(self) -> int:
        return self.lines[0] + 1

    def words(self, *, exec_rules: bool, relax_escapes: bool) -> list[Word]:
        try:
            return scan_words(self.value, exec_rules=exec_rules, relax_escapes=relax_escapes)
        except SpecError as e:
            raise SpecError(f"line {self.lineno}: {e}") from None


def logical_lines(lines: list[Line]) -> Iterable[tuple[list[int], str, list[tuple[int, int]]]]:
    """Join continuations like systemd: (line indices, joined text, position of each char)."""
    pending: list[int] = []
    for idx, line in enumerate(lines):
        # A BOM'd first line that is a comment is ignored by systemd too (as an assignment
        # outside any section).
        if _is_comment(line.content.removeprefix("\ufeff") if idx == 0 else line.content):
            continue
        pending.append(idx)
        if not continued(line.content):
            yield _join(lines, pending)
            pending = []
    if pending:
        yield _join(lines, pending)


def _join(lines: list[Line], indices: list[int]) -> tuple[list[int], str, list[tuple[int, int]]]:
    chars: list[str] = []
    pos: list[tuple[int, int]] = []
    for li in indices:
        content = lines[li].content
        if li == 0 and content.startswith("\ufeff"):
            content = " " + content[1:]  # a BOM is not part of the first key
        if continued(content):
            content = content[:-1] + " "
        chars.extend(content)
        pos.extend((li, col) for col in range(len(content)))
    return list(indices), "".join(chars), pos


def _strip_span(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start] in WHITESPACE:
        start += 1
    while end > start and text[end - 1] in WHITESPACE:
        end -= 1
    return start, end


def parse_directives(lines: list[Line], *, unit: bool) -> list[Directive]:
    """A unit's `Key=value` directives with their sections, or (unit=False) a command
    file's logical lines, each a directive without section or key."""
    directives: list[Directive] = []
    section: str | None = None
    for indices, joined, pos in logical_lines(lines):
        start, end = _strip_span(joined, 0, len(joined))
        if start == end:
            continue
        lineno = indices[0] + 1
        if not unit:
            directives.append(Directive(None, None, joined[start:end], pos[start:end], indices))
            continue
        if joined[start] == "[":
            if joined[end - 1] != "]":
                raise SpecError(f"line {lineno}: invalid section header {joined[start:end]!r}")
            section = joined[start + 1 : end - 1]
            continue
        eq = joined.find("=", start, end)
        if eq < 0:
            raise SpecError(f"line {lineno}: missing '=' in {joined[start:end]!r}")
        key_start, key_end = _strip_span(joined, start, eq)
        vstart, vend = _strip_span(joined, eq + 1, end)
        if section is None:
            raise SpecError(f"line {lineno}: {joined[key_start:key_end]}= outside any section")
        directives.append(
            Directive(
                section, joined[key_start:key_end], joined[vstart:vend], pos[vstart:vend], indices
            )
        )
    return directives
