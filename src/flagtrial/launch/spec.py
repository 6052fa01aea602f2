"""The launch spec: a server's command line held in a systemd unit (or drop-in) or a command file.

Parsing follows systemd's conf-parser: comment lines (`#`/`;` after optional whitespace) are
skipped everywhere, including inside a continuation; a line ending in an odd number of
backslashes continues on the next one, that backslash counting as a space; keys and values
are stripped of whitespace. Editing is lossless: every physical line an edit does not touch
keeps its exact bytes, and an edit re-renders only the lines holding the words it changes.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Literal

from pydantic import BaseModel, ConfigDict, PrivateAttr, model_validator

from flagtrial.errors import SpecError
from flagtrial.launch.execwords import (
    WHITESPACE,
    Word,
    env_name_is_valid,
    quote_word,
    scan_words,
)

SpecKind = Literal["unit", "command"]


# A spec's text holds the file's exact bytes: UTF-8, any undecodable byte kept as a surrogate
# escape, no newline translation. Every read, write, hash and ledger copy goes through these.
def encode_spec(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def decode_spec(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def printable(text: str) -> str:
    """Spec text for a terminal, whatever its encoding: a non-UTF-8 byte shown as \\xNN."""
    return encode_spec(text).decode("utf-8", "backslashreplace")


def spec_sha256(text: str) -> str:
    """The one hash of spec text: of its exact bytes."""
    return hashlib.sha256(encode_spec(text)).hexdigest()


def byte_difference(expected: str, actual: str) -> str | None:
    """Where two spec texts first differ as bytes, for a message; None when identical."""
    a, b = encode_spec(expected), encode_spec(actual)
    if a == b:
        return None
    at = next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )
    return (
        f"the spec's bytes differ at byte {at} of {len(a)}: "
        f"expected {a[at : at + 12]!r}, found {b[at : at + 12]!r}"
    )


_EOL = re.compile(r"\r\n|\r|\n")


@dataclass
class _Line:
    content: str
    eol: str


def _split_lines(text: str) -> list[_Line]:
    lines: list[_Line] = []
    pos = 0
    for m in _EOL.finditer(text):
        lines.append(_Line(text[pos : m.start()], m.group()))
        pos = m.end()
    if pos < len(text):
        lines.append(_Line(text[pos:], ""))
    return lines


def _continued(content: str) -> bool:
    """systemd's test: the line ends in an odd run of backslashes."""
    return (len(content) - len(content.rstrip("\\"))) % 2 == 1


def _is_comment(content: str) -> bool:
    stripped = content.lstrip(WHITESPACE)
    return stripped[:1] in ("#", ";")


@dataclass
class _Directive:
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


def _logical_lines(lines: list[_Line]) -> Iterable[tuple[list[int], str, list[tuple[int, int]]]]:
    """Join continuations like systemd: (line indices, joined text, position of each char)."""
    pending: list[int] = []
    for idx, line in enumerate(lines):
        # A BOM'd first line that is a comment is ignored by systemd too (as an assignment
        # outside any section).
        if _is_comment(line.content.removeprefix("\ufeff") if idx == 0 else line.content):
            continue
        pending.append(idx)
        if not _continued(line.content):
            yield _join(lines, pending)
            pending = []
    if pending:
        yield _join(lines, pending)


def _join(lines: list[_Line], indices: list[int]) -> tuple[list[int], str, list[tuple[int, int]]]:
    chars: list[str] = []
    pos: list[tuple[int, int]] = []
    for li in indices:
        content = lines[li].content
        if li == 0 and content.startswith("\ufeff"):
            content = " " + content[1:]  # a BOM is not part of the first key
        if _continued(content):
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


def _parse_directives(lines: list[_Line], *, unit: bool) -> list[_Directive]:
    directives: list[_Directive] = []
    section: str | None = None
    for indices, joined, pos in _logical_lines(lines):
        start, end = _strip_span(joined, 0, len(joined))
        if start == end:
            continue
        lineno = indices[0] + 1
        if not unit:
            directives.append(_Directive(None, None, joined[start:end], pos[start:end], indices))
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
            _Directive(
                section, joined[key_start:key_end], joined[vstart:vend], pos[vstart:vend], indices
            )
        )
    return directives


def _exec_prefix(first: str) -> str:
    """ExecStart='s special prefix characters on a first word, read as config_parse_exec does."""
    seen: set[str] = set()
    k = 0
    for c in first:
        if c in "-@:" and c not in seen:
            seen.add(c)
        elif c == "+" and not seen & {"+", "!", "!!"}:
            seen.add("+")
        elif c == "!" and not seen & {"+", "!", "!!"}:
            seen.add("!")
        elif c == "!" and "!" in seen and not seen & {"+", "!!"}:
            seen.add("!!")
        else:
            break
        k += 1
    return first[:k]


def _check_program(program: str, lineno: int) -> None:
    if program in ("", ";"):
        raise SpecError(f"line {lineno}: the command has no executable")
    if any(c in "\"'\\" or ord(c) < 32 or ord(c) == 127 for c in program):
        raise SpecError(f"line {lineno}: executable name contains special characters: {program!r}")


# ---------------------------------------------------------------------------- parsed form


@dataclass
class _EnvAssign:
    name: str
    directive: int  # index into _Parsed.directives (unit) or -1 (command: word of the command)
    word: int


@dataclass
class _Parsed:
    lines: list[_Line]
    directives: list[_Directive]
    env: dict[str, str]
    env_live: list[_EnvAssign]  # assignments after the last Environment= reset, in order
    env_directives: list[int] = field(default_factory=list)  # Environment= ones, resets too
    environment_files: list[str] = field(default_factory=list)
    exec_index: int | None = None  # the effective ExecStart= / the command file's command
    words: list[Word] = field(default_factory=list)  # the command's words, prefix included
    prefix: str = ""
    env_words: int = 0  # command kind: leading NAME=value words
    service_header: int | None = None  # line index of the last [Service] header
    argv: list[str] = field(default_factory=list)


def _service_header_line(lines: list[_Line]) -> int | None:
    found = None
    for indices, joined, _ in _logical_lines(lines):
        if joined.strip(WHITESPACE) == "[Service]":
            found = indices[0]
    return found


def _parse_unit(text: str, *, dropin: bool) -> _Parsed:
    lines = _split_lines(text)
    directives = _parse_directives(lines, unit=True)
    service = _service_header_line(lines)
    where = "drop-in" if dropin else "unit"
    if service is None:
        stray = next((d for d in directives if d.key == "ExecStart"), None)
        at = stray.lineno if stray else max(len(lines), 1)
        raise SpecError(f"line {at}: {where} has no [Service] section")

    exec_index: int | None = None
    reset_seen = False
    env: dict[str, str] = {}
    live: list[_EnvAssign] = []
    env_directives: list[int] = []
    files: list[str] = []
    for di, d in enumerate(directives):
        if d.section != "Service":
            continue
        if d.key == "ExecStart":
            if not d.value:
                exec_index, reset_seen = None, True
                continue
            if exec_index is not None:
                first = directives[exec_index].lineno
                raise SpecError(
                    f"line {d.lineno}: second ExecStart= (first at line {first}); only one "
                    "command is supported (an empty ExecStart= before it resets the first)"
                )
            if dropin and not reset_seen:
                raise SpecError(
                    f"line {d.lineno}: a drop-in's ExecStart= must follow an empty ExecStart= "
                    "that resets the unit's own"
                )
            exec_index = di
        elif d.key == "Environment":
            env_directives.append(di)
            if not d.value:
                env.clear()
                live.clear()
                continue
            for wi, w in enumerate(d.words(exec_rules=False, relax_escapes=False)):
                name, eq, value = w.text.partition("=")
                if not eq or not env_name_is_valid(name):
                    raise SpecError(f"line {d.lineno}: invalid environment assignment {w.text!r}")
                if any(0xDC80 <= ord(c) <= 0xDCFF for c in value):
                    raise SpecError(f"line {d.lineno}: {name} is not valid UTF-8")
                env[name] = value
                live.append(_EnvAssign(name, di, wi))
        elif d.key == "EnvironmentFile":
            if d.value:
                files.append(d.value)
            else:
                files.clear()

    if exec_index is None:
        if not dropin:
            raise SpecError(f"line {service + 1}: [Service] has no ExecStart=")
        return _Parsed(lines, directives, env, live, env_directives, files, service_header=service)

    d = directives[exec_index]
    words = d.words(exec_rules=True, relax_escapes=True)
    prefix = _exec_prefix(words[0].text)
    argv = [words[0].text[len(prefix) :]] + [w.text for w in words[1:]]
    if "@" in prefix and len(argv) < 2:
        raise SpecError(f"line {d.lineno}: the @ prefix needs an argv[0] word after the path")
    _check_program(argv[0], d.lineno)
    return _Parsed(
        lines,
        directives,
        env,
        live,
        env_directives,
        files,
        exec_index=exec_index,
        words=words,
        prefix=prefix,
        service_header=service,
        argv=argv,
    )


def _parse_command(text: str) -> _Parsed:
    lines = _split_lines(text)
    directives = _parse_directives(lines, unit=False)
    if not directives:
        raise SpecError(f"line {max(len(lines), 1)}: the command file holds no command")
    if len(directives) > 1:
        raise SpecError(
            f"line {directives[1].lineno}: a second command (first at line "
            f"{directives[0].lineno}); end a line with a backslash to continue it"
        )
    d = directives[0]
    words = d.words(exec_rules=True, relax_escapes=True)
    env: dict[str, str] = {}
    live: list[_EnvAssign] = []
    n_env = 0
    for w in words:
        name, eq, value = w.text.partition("=")
        if not eq or not env_name_is_valid(name):
            break
        env[name] = value
        live.append(_EnvAssign(name, 0, n_env))
        n_env += 1
    argv = [w.text for w in words[n_env:]]
    if not argv:
        raise SpecError(f"line {d.lineno}: the command has only environment assignments")
    _check_program(argv[0], d.lineno)
    return _Parsed(
        lines, directives, env, live, exec_index=0, words=words, env_words=n_env, argv=argv
    )


# ---------------------------------------------------------------------------- rendering


@dataclass
class _WordEdits:
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


def _render_directive(
    lines: list[_Line], d: _Directive, words: list[Word], edits: _WordEdits
) -> dict[int, list[str]]:
    """New contents for each physical line of d: [] drops a line, extra entries are new lines."""
    spans: list[tuple[int, int, int]] = []  # (line, start col, end col) per word
    for w in words:
        (l0, c0), (l1, c1) = d.value_pos[w.start], d.value_pos[w.end - 1]
        spans.append((l0, c0, c1 + 1 if l0 == l1 else -1))
    touched = set(edits.replace) | edits.delete | set(edits.after)
    for wi in touched:
        if spans[wi][2] < 0:
            raise SpecError(
                f"line {spans[wi][0] + 1}: cannot edit a quoted word that spans continuation lines"
            )

    multiline = len(d.lines) > 1
    by_line: dict[int, list[int]] = {li: [] for li in d.lines}
    for wi, (li, _, _) in enumerate(spans):
        by_line[li].append(wi)
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
    for k, (li, content) in enumerate(out_rows):
        want_continued = k + 1 < len(out_rows)
        content = _set_continuation(content, want_continued)
        if li is not None:
            owner = li
        result[owner].append(content)
    return result


def _rebuild(
    content: str, spans: list[tuple[int, int, int]], on_line: list[int], row: list[_Piece]
) -> str:
    body_end = len(content) - 1 if _continued(content) else len(content)
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
    if _continued(content) == want:
        return content
    if want:
        return content.rstrip(WHITESPACE) + " \\"
    return content[:-1].rstrip(WHITESPACE)


def _continuation_indent(lines: list[_Line], d: _Directive, by_line: dict[int, list[int]]) -> str:
    for li in reversed(d.lines[1:]):
        if by_line[li]:
            content = lines[li].content
            return content[: len(content) - len(content.lstrip(WHITESPACE))]
    return "    "


def _dominant_eol(lines: list[_Line]) -> str:
    return next((line.eol for line in lines if line.eol), "\n")


def _assemble(
    lines: list[_Line], replaced: Mapping[int, list[str]], appended: Mapping[int, list[str]]
) -> str:
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


def _argv_edits(old: list[str], new: list[str], base: int) -> _WordEdits:
    """Word edits turning old into new (indices offset by base into the directive's words)."""
    edits = _WordEdits()
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


# ---------------------------------------------------------------------------- the model


class LaunchSpec(BaseModel):
    """A server's launch command as written in a unit file, drop-in or command file.

    Only `kind`, `text` and `dropin` are stored; everything else is derived from the text,
    which stays the single source of truth (and what gets hashed, stored and deployed).
    Words (argv, env values) are systemd words: quotes and escapes removed, specifiers
    and `$` references as written (see execwords).
    """

    model_config = ConfigDict(frozen=True)

    kind: SpecKind
    text: str
    dropin: bool = False

    _parsed: _Parsed = PrivateAttr()

    @model_validator(mode="after")
    def _parse(self) -> LaunchSpec:
        if self.kind == "command" and self.dropin:
            raise SpecError("a command file cannot be a drop-in")
        self._parsed = (
            _parse_unit(self.text, dropin=self.dropin)
            if self.kind == "unit"
            else _parse_command(self.text)
        )
        return self

    @property
    def argv(self) -> list[str]:
        """The command's words, prefix characters stripped; [] for a drop-in without ExecStart=."""
        return list(self._parsed.argv)

    @property
    def prefix(self) -> str:
        """ExecStart='s special prefix characters (`-@:+!`), "" when none."""
        return self._parsed.prefix

    @property
    def program_words(self) -> int:
        """How many leading argv words come before the engine's own arguments.

        1 for a plain program; one more with the `@` prefix (path, then argv[0]); two more
        for `python -m module` (how SGLang and vLLM servers are usually started).
        """
        argv = self._parsed.argv
        n = 2 if "@" in self._parsed.prefix else 1
        if re.fullmatch(r"python[0-9.]*", PurePath(argv[0]).name if argv else "") and (
            argv[n : n + 1] == ["-m"] and len(argv) > n + 1
        ):
            n += 2
        return n

    @property
    def program(self) -> list[str]:
        """The words that start the engine, runnable as a command (`@`'s argv[0] dropped)."""
        words = self.argv[: self.program_words]
        return [words[0], *words[2:]] if "@" in self.prefix else words

    @property
    def env(self) -> dict[str, str]:
        """Environment= assignments (or a command's leading NAME=value words), later wins."""
        return dict(self._parsed.env)

    @property
    def environment_files(self) -> list[str]:
        """EnvironmentFile= values as written; a leading `-` marks an optional file."""
        return list(self._parsed.environment_files)

    @property
    def sha256(self) -> str:
        return spec_sha256(self.text)

    def _derive(self, text: str) -> LaunchSpec:
        return LaunchSpec(kind=self.kind, text=text, dropin=self.dropin)

    def with_argv(self, new_argv: list[str]) -> LaunchSpec:
        """This spec with the command's words replaced, re-rendering only the lines that change."""
        p = self._parsed
        if p.exec_index is None:
            raise SpecError("the drop-in has no ExecStart= to edit")
        if not new_argv:
            raise SpecError("the new command is empty")
        if new_argv == p.argv:
            return self
        d = p.directives[p.exec_index]
        old = [w.text for w in p.words[p.env_words :]]
        new = [p.prefix + new_argv[0], *new_argv[1:]]
        edits = _argv_edits(old, new, p.env_words)
        replaced = _render_directive(p.lines, d, p.words, edits)
        spec = self._derive(_assemble(p.lines, replaced, {}))
        if spec.argv != new_argv:
            raise SpecError(f"rendering the command changed it: {spec.argv!r} != {new_argv!r}")
        return spec

    def with_env(self, set: Mapping[str, str], unset: Iterable[str] = ()) -> LaunchSpec:
        """This spec with environment variables set or removed.

        Values are words as Environment= holds them (`%%` for a literal `%`; see
        execwords.literal_env_value).

        A set variable is rewritten where it is defined, or appended as a new
        `Environment="K=V"` line after the last Environment= (else after ExecStart=) in a
        unit, or as a NAME=value word before a command's program.
        """
        unset = frozenset(unset)
        for name in [*set, *unset]:
            if not env_name_is_valid(name):
                raise SpecError(f"invalid environment variable name {name!r}")
        both = unset & frozenset(set)
        if both:
            raise SpecError(f"{sorted(both)[0]} is both set and unset")
        if all(self._parsed.env.get(k) == v for k, v in set.items()) and not (
            unset & self._parsed.env.keys()
        ):
            return self
        p = self._parsed
        text = (
            self._with_env_command(set, unset)
            if self.kind == "command"
            else self._with_env_unit(set, unset)
        )
        spec = self._derive(text)
        want = {k: v for k, v in {**p.env, **set}.items() if k not in unset}
        if spec.env != want or spec.argv != p.argv:
            raise SpecError("rendering the environment changed something else")
        return spec

    def _with_env_command(self, set: Mapping[str, str], unset: frozenset[str]) -> str:
        p = self._parsed
        d = p.directives[0]
        edits = _WordEdits()
        last = {a.name: a.word for a in p.env_live}
        for a in p.env_live:
            if a.name in unset:
                edits.delete.add(a.word)
        for name, value in set.items():
            source = quote_word(f"{name}={value}")
            if name in last:
                edits.replace[last[name]] = source
            elif p.env_words:
                edits.after.setdefault(p.env_words - 1, []).append(source)
            else:
                edits.before_first.append(source)
        return _assemble(p.lines, _render_directive(p.lines, d, p.words, edits), {})

    def _with_env_unit(self, set: Mapping[str, str], unset: frozenset[str]) -> str:
        p = self._parsed
        per_directive: dict[int, _WordEdits] = {}

        def edits_for(a: _EnvAssign) -> _WordEdits:
            return per_directive.setdefault(a.directive, _WordEdits(drop_if_empty=True))

        last: dict[str, _EnvAssign] = {a.name: a for a in p.env_live}
        for a in p.env_live:
            if a.name in unset:
                edits_for(a).delete.add(a.word)
        new_lines: list[str] = []
        for name, value in set.items():
            source = quote_word(f"{name}={value}", always=True)
            if name in last:
                edits_for(last[name]).replace[last[name].word] = source
            else:
                new_lines.append(f"Environment={source}")
        replaced: dict[int, list[str]] = {}
        for di, edits in per_directive.items():
            d = p.directives[di]
            words = d.words(exec_rules=False, relax_escapes=False)
            replaced.update(_render_directive(p.lines, d, words, edits))
        appended = {self._env_anchor(): new_lines} if new_lines else {}
        return _assemble(p.lines, replaced, appended)

    def _env_anchor(self) -> int:
        """The physical line new Environment= lines go after."""
        p = self._parsed
        if p.env_directives:
            return p.directives[p.env_directives[-1]].lines[-1]
        if p.exec_index is not None:
            return p.directives[p.exec_index].lines[-1]
        assert p.service_header is not None  # a unit always has [Service] once parsed
        return p.service_header


def parse_unit(text: str, *, dropin: bool = False) -> LaunchSpec:
    """A unit file (or, with dropin=True, a drop-in that may lack ExecStart=)."""
    return LaunchSpec(kind="unit", text=text, dropin=dropin)


def parse_command(text: str) -> LaunchSpec:
    """A command file: one command over one or more lines, systemd word rules, no shell."""
    return LaunchSpec(kind="command", text=text)


def parse(text: str, kind: SpecKind) -> LaunchSpec:
    return LaunchSpec(kind=kind, text=text)
