"""What systemd reads from a unit's directives (or a command file's command): the effective
ExecStart= with its prefix characters, Environment= after its last reset, EnvironmentFile=.

The directives come from lexer.py; LaunchSpec (spec.py) holds the result.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flagtrial.errors import SpecError
from flagtrial.launch.execwords import WHITESPACE, Word, env_name_is_valid
from flagtrial.launch.lexer import Directive, Line, logical_lines, parse_directives, split_lines


@dataclass
class EnvAssign:
    name: str
    directive: int  # index into Parsed.directives (0 in a command file: its one command)
    word: int


@dataclass
class Parsed:
    lines: list[Line]
    directives: list[Directive]
    env: dict[str, str]
    env_live: list[EnvAssign]  # assignments after the last Environment= reset, in order
    env_directives: list[int] = field(default_factory=list)  # Environment= ones, resets too
    environment_files: list[str] = field(default_factory=list)
    exec_index: int | None = None  # the effective ExecStart= / the command file's command
    words: list[Word] = field(default_factory=list)  # the command's words, prefix included
    prefix: str = ""
    env_words: int = 0  # command kind: leading NAME=value words
    service_header: int | None = None  # line index of the last [Service] header
    argv: list[str] = field(default_factory=list)


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


def _service_header_line(lines: list[Line]) -> int | None:
    found = None
    for indices, joined, _ in logical_lines(lines):
        if joined.strip(WHITESPACE) == "[Service]":
            found = indices[0]
    return found


def _check_exec_start(d: Directive, first: Directive | None, *, dropin: bool, reset: bool) -> None:
    """Refuse an ExecStart= systemd would add as a second command, and a drop-in's that
    would add to the unit's own instead of replacing it."""
    if first is not None:
        raise SpecError(
            f"line {d.lineno}: second ExecStart= (first at line {first.lineno}); only one "
            "command is supported (an empty ExecStart= before it resets the first)"
        )
    if dropin and not reset:
        raise SpecError(
            f"line {d.lineno}: a drop-in's ExecStart= must follow an empty ExecStart= "
            "that resets the unit's own"
        )


def _read_environment(d: Directive, di: int, env: dict[str, str], live: list[EnvAssign]) -> None:
    """A non-empty Environment='s assignments, added to env and live in order."""
    for wi, w in enumerate(d.words(exec_rules=False, relax_escapes=False)):
        name, eq, value = w.text.partition("=")
        if not eq or not env_name_is_valid(name):
            raise SpecError(f"line {d.lineno}: invalid environment assignment {w.text!r}")
        if any(0xDC80 <= ord(c) <= 0xDCFF for c in value):
            raise SpecError(f"line {d.lineno}: {name} is not valid UTF-8")
        env[name] = value
        live.append(EnvAssign(name, di, wi))


def _exec_command(d: Directive) -> tuple[list[Word], str, list[str]]:
    """The effective ExecStart='s words, prefix characters and argv, checked."""
    words = d.words(exec_rules=True, relax_escapes=True)
    prefix = _exec_prefix(words[0].text)
    argv = [words[0].text[len(prefix) :]] + [w.text for w in words[1:]]
    if "@" in prefix and len(argv) < 2:
        raise SpecError(f"line {d.lineno}: the @ prefix needs an argv[0] word after the path")
    _check_program(argv[0], d.lineno)
    return words, prefix, argv


def read_unit(text: str, *, dropin: bool) -> Parsed:
    lines = split_lines(text)
    directives = parse_directives(lines, unit=True)
    service = _service_header_line(lines)
    where = "drop-in" if dropin else "unit"
    if service is None:
        stray = next((d for d in directives if d.key == "ExecStart"), None)
        at = stray.lineno if stray else max(len(lines), 1)
        raise SpecError(f"line {at}: {where} has no [Service] section")

    exec_index: int | None = None
    reset_seen = False
    env: dict[str, str] = {}
    live: list[EnvAssign] = []
    env_directives: list[int] = []
    files: list[str] = []
    # One pass in file order, so the first bad line is the one reported.
    for di, d in enumerate(directives):
        if d.section != "Service":
            continue
        if d.key == "ExecStart":
            if not d.value:
                exec_index, reset_seen = None, True
                continue
            first = directives[exec_index] if exec_index is not None else None
            _check_exec_start(d, first, dropin=dropin, reset=reset_seen)
            exec_index = di
        elif d.key == "Environment":
            env_directives.append(di)
            if not d.value:
                env.clear()
                live.clear()
                continue
            _read_environment(d, di, env, live)
        elif d.key == "EnvironmentFile":
            if d.value:
                files.append(d.value)
            else:
                files.clear()

    if exec_index is None:
        if not dropin:
            raise SpecError(f"line {service + 1}: [Service] has no ExecStart=")
        return Parsed(lines, directives, env, live, env_directives, files, service_header=service)

    words, prefix, argv = _exec_command(directives[exec_index])
    return Parsed(
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


def read_command(text: str) -> Parsed:
    lines = split_lines(text)
    directives = parse_directives(lines, unit=False)
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
    live: list[EnvAssign] = []
    n_env = 0
    for w in words:
        name, eq, value = w.text.partition("=")
        if not eq or not env_name_is_valid(name):
            break
        env[name] = value
        live.append(EnvAssign(name, 0, n_env))
        n_env += 1
    argv = [w.text for w in words[n_env:]]
    if not argv:
        raise SpecError(f"line {d.lineno}: the command has only environment assignments")
    _check_program(argv[0], d.lineno)
    return Parsed(
        lines, directives, env, live, exec_index=0, words=words, env_words=n_env, argv=argv
    )
