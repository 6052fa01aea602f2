"""Secrets: which names are secret, and their values replaced by a fixed marker wherever a
person or another tool reads (terminal, JSON, history, show, report, export, diffs).

A name is secret when one of its words (split at `_`, `-`, `.`, spaces and case changes) is
or ends in a secret word (SECRET, PASSWORD, CREDENTIAL, AUTH, ... as in `PGPASSWORD`), when
its last word is or ends in TOKEN or KEY (also PASS, PWD), or when the project file lists it.
Tuning flags must stay readable: `--max-num-batched-tokens`, `--long-prefill-token-threshold`
and `token_capacity` are not secret.

Launch specs are redacted by structure (Environment= assignments, a secret flag's value in
the command, SetCredential=), line for line, so that a diff of two redacted specs has the
shape of the real one; free text is redacted by the secret values already seen and by
`NAME=value`, `--flag value` and `'name': value` patterns. The marker never depends on the
value.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from typing import Any

from flagtrial.errors import SpecError
from flagtrial.launch.execwords import Word, env_name_is_valid

# The spec's own lexer: redaction must split a unit exactly as systemd (and LaunchSpec) does,
# or a secret hidden by a continuation line or quotes would slip through.
from flagtrial.launch.lexer import Directive, Line, parse_directives, split_lines

MARK = "<redacted>"

# Secret wherever they stand in a name, alone or glued to the end of a word (PGPASSWORD).
SECRET_WORDS = (
    "SECRET", "SECRETS", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS", "AUTH",
    "AUTHORIZATION", "BEARER", "COOKIE", "PRIVATE", "APIKEY",
)  # fmt: skip
# Secret only as a name's last word (HF_TOKEN, OPENAI_API_KEY, MYSQL_PWD, HFTOKEN): elsewhere
# they count things (--long-prefill-token-threshold, token_capacity).
LAST_WORDS = ("TOKEN", "KEY", "PASS", "PWD")
_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
# Values shorter than this are not scrubbed from free text (they would match everywhere);
# the structural and pattern rules still redact them.
MIN_VALUE_LEN = 4

# A secret found in a spec: (line, start col, end col) per physical line, value, shown instead.
_Found = tuple[list[tuple[int, int, int]], str, str]

_NAME = r"[A-Za-z_][\w.-]*"
_VALUE = r"""(?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|\[[^\]]*\]|[^\s,;)}\]'"]+)"""
# `--api-key=V`, `--api-key V`, `HF_TOKEN=V`, `'api_key': V`, `"api_key": V`
_FLAG_TEXT = re.compile(rf"(?<![\w-])(?P<key>--?{_NAME})(?P<sep>=|[ \t]+(?!-))(?P<value>{_VALUE})")
_ASSIGN_TEXT = re.compile(rf"(?<![\w.-])(?P<key>{_NAME})(?P<sep>=)(?P<value>{_VALUE})")
_DICT_TEXT = re.compile(rf"(?P<key>(?P<q>['\"]){_NAME}(?P=q))(?P<sep>\s*:\s*)(?P<value>{_VALUE})")


def is_secret_name(name: str, extra: Iterable[str] = ()) -> bool:
    """Whether a variable, flag or setting name looks secret (or is listed in extra)."""
    bare = name.lstrip("-")
    if bare.upper() in {e.lstrip("-").upper() for e in extra}:
        return True
    words = [w.upper() for w in _WORDS.findall(bare)]
    if any(w.endswith(SECRET_WORDS) for w in words):
        return True
    return bool(words) and (words[-1] in LAST_WORDS or words[-1].endswith(("TOKEN", "KEY")))


def _quoted(value: str) -> str:
    """The marker, in the quotes the value was written in."""
    return f"{value[0]}{MARK}{value[0]}" if value[:1] in ("'", '"') else MARK


class Redactor:
    """Redacts secret values: by name (pattern and the project's list) and by the values it
    has learnt from launch specs and changes."""

    def __init__(self, names: Iterable[str] = ()) -> None:
        self.names = frozenset(names)
        self.values: set[str] = set()

    def secret(self, name: str) -> bool:
        return is_secret_name(name, self.names)

    def add_names(self, names: Iterable[str]) -> None:
        self.names = self.names | frozenset(names)

    # learning values

    def learn(self, *values: str | None) -> None:
        self.values.update(v for v in values if v and len(v) >= MIN_VALUE_LEN)

    def learn_spec(self, text: str) -> None:
        """Remember the secret values a launch spec holds (Environment=, flags, credentials)."""
        self.learn(*(value for _, value, _ in self._secret_spans(split_lines(text))))

    def learn_change(self, edits: Iterable[Any]) -> None:
        """Remember the values of a change's edits that name a secret (Edit models or dicts)."""
        for e in edits:
            name, value = (e["name"], e.get("value")) if isinstance(e, dict) else (e.name, e.value)
            if self.secret(name):
                self.learn(value)

    # redacting

    def text(self, s: str) -> str:
        """Free text (a log line, a reason, an error) with every secret value replaced."""
        for value in sorted(self.values, key=len, reverse=True):
            s = s.replace(value, MARK)
        for pattern in (_DICT_TEXT, _FLAG_TEXT, _ASSIGN_TEXT):
            s = self._scrub(pattern, s)
        return s

    def _scrub(self, pattern: re.Pattern[str], s: str) -> str:
        out: list[str] = []
        pos = 0
        while m := pattern.search(s, pos):
            if self.secret(m["key"].strip("'\"")) and m["value"].strip("'\"") != MARK:
                out += [s[pos : m.start("value")], _quoted(m["value"])]
                pos = m.end()
            else:
                # Search on inside the value: `Environment=HF_TOKEN=v` holds a second key.
                out.append(s[pos : m.end("sep")])
                pos = m.end("sep")
        return "".join(out) + s[pos:]

    def spec(self, text: str) -> str:
        """A launch spec's text with secret values replaced, line for line: the same lines,
        each changed only where it holds a secret."""
        return "".join(self._spec_lines(text))

    def _spec_lines(self, text: str) -> list[str]:
        lines = split_lines(text)
        located = self._locate(lines)
        out: list[str] = []
        for li, line in enumerate(lines):
            content = line.content
            for c0, c1, new in sorted(located.get(li, []), reverse=True):
                content = content[:c0] + new + content[c1:]
            out.append(self.text(content) + line.eol)
        return out

    def data(self, obj: Any) -> Any:
        """JSON-like data with secrets replaced: values under secret keys, the value of a
        `{"name": SECRET, "value": ...}` edit or setting change, spec texts, every string."""
        if isinstance(obj, dict):
            named = isinstance(obj.get("name"), str) and self.secret(obj["name"])
            out: dict[str, Any] = {}
            for key, value in obj.items():
                hidden = (named and key in ("value", "before", "after")) or (
                    isinstance(key, str) and self.secret(key)
                )
                if hidden and value is not None and not isinstance(value, int | float):
                    out[key] = MARK
                elif key == "spec_text" and isinstance(value, str):
                    out[key] = self.spec(value)
                else:
                    out[key] = self.data(value)
            return out
        if isinstance(obj, list | tuple):
            return [self.data(v) for v in obj]
        if isinstance(obj, str):
            return self.text(obj)
        return obj

    def diff(self, old: str, new: str, old_name: str, new_name: str, context: int = 3) -> str:
        """A unified diff of two specs, laid out by their real lines (a changed secret shows
        as a changed line) and showing only redacted ones."""
        a_raw, b_raw = _physical(old), _physical(new)
        a, b = self._spec_lines(old), self._spec_lines(new)
        out: list[str] = []
        for group in difflib.SequenceMatcher(None, a_raw, b_raw).get_grouped_opcodes(context):
            if not out:
                out += [f"--- {old_name}\n", f"+++ {new_name}\n"]
            first, last = group[0], group[-1]
            out.append(f"@@ -{_range(first[1], last[2])} +{_range(first[3], last[4])} @@\n")
            for tag, i1, i2, j1, j2 in group:
                if tag == "equal":
                    out += [" " + line for line in a[i1:i2]]
                    continue
                out += ["-" + line for line in a[i1:i2]]
                out += ["+" + line for line in b[j1:j2]]
        return "".join(line if line.endswith("\n") else line + "\n" for line in out)

    # finding secrets in a spec

    def _secret_spans(self, lines: list[Line]) -> list[_Found]:
        """Each secret value in a spec: where its source lies, (line, start col, end col) per
        physical line, the value, and what to show in its place."""
        try:
            directives = parse_directives(lines, unit=True)
        except SpecError:
            directives = parse_directives(lines, unit=False)  # a command file
        found: list[_Found] = []
        for d in directives:
            try:
                secrets = self._in_directive(d)
            except SpecError:
                # Words systemd would refuse: hide a whole Environment= value; a command
                # (`;` in ExecStartPre=) is left to the free-text rules.
                secrets = [(0, len(d.value), d.value, MARK)] if d.key == "Environment" else []
            found += [(_columns(lines, d, s, e), value, shown) for s, e, value, shown in secrets]
        return found

    def _locate(self, lines: list[Line]) -> dict[int, list[tuple[int, int, str]]]:
        """Replacements per line: (start col, end col, new text)."""
        by_line: dict[int, list[tuple[int, int, str]]] = {}
        for spans, _, shown in self._secret_spans(lines):
            for k, (li, c0, c1) in enumerate(spans):
                by_line.setdefault(li, []).append((c0, c1, shown if k == 0 else ""))
        return by_line

    def _in_directive(self, d: Directive) -> list[tuple[int, int, str, str]]:
        """(start, end, value, shown instead) of each secret in a directive's value text."""
        if d.key == "Environment":
            return self._assignments(_words(d, exec_rules=False))
        if d.key in ("SetCredential", "SetCredentialEncrypted"):
            name, sep, value = d.value.partition(":")
            return [(len(name) + 1, len(d.value), value, MARK)] if sep and value else []
        if d.key is None or d.key.startswith("Exec"):
            words = _words(d, exec_rules=True)
            # A command file starts with NAME=value words (its environment).
            k = 0
            while d.key is None and k < len(words) and _is_assignment(words[k].text):
                k += 1
            return self._assignments(words[:k]) + self._flags(words[k:], d.value)
        return []

    def _assignments(self, words: Sequence[Word]) -> list[tuple[int, int, str, str]]:
        found = []
        for w in words:
            name, _, value = w.text.partition("=")
            if self.secret(name):
                # The whole source word goes (its quotes may hold the name too).
                found.append((w.start, w.end, value, f"{name}={MARK}"))
        return found

    def _flags(self, words: Sequence[Word], source: str) -> list[tuple[int, int, str, str]]:
        found = []
        for k, w in enumerate(words):
            name, eq, value = w.text.partition("=")
            if not w.text.startswith("-") or not self.secret(name):
                continue
            if eq:
                found.append((w.start, w.end, value, f"{name}={MARK}"))
            elif k + 1 < len(words) and not words[k + 1].text.startswith("-"):
                found.append((words[k + 1].start, words[k + 1].end, words[k + 1].text, MARK))
        return found


def _is_assignment(word: str) -> bool:
    name, eq, _ = word.partition("=")
    return bool(eq) and env_name_is_valid(name)


def _words(d: Directive, *, exec_rules: bool) -> list[Word]:
    # Environment= refuses unknown escapes (as systemd does), ExecStart= keeps them.
    return d.words(exec_rules=exec_rules, relax_escapes=exec_rules)


def _columns(lines: list[Line], d: Directive, start: int, end: int) -> list[tuple[int, int, int]]:
    """Where value[start:end] of a directive lies: (line, start col, end col) per physical
    line, a continuation's backslash left out (it must stay, or the next line joins)."""
    spans: dict[int, list[int]] = {}
    for li, col in d.value_pos[start:end]:
        content = lines[li].content
        if col == len(content) - 1 and content.endswith("\\") and li != d.lines[-1]:
            continue
        spans.setdefault(li, []).append(col)
    return [(li, min(cols), max(cols) + 1) for li, cols in sorted(spans.items())]


def _physical(text: str) -> list[str]:
    return [line.content + line.eol for line in split_lines(text)]


def _range(start: int, stop: int) -> str:
    """A unified diff's line range, as difflib writes it."""
    length = stop - start
    beginning = start + 1 if length else start
    return str(beginning) if length == 1 else f"{beginning},{length}"
