"""Whether llama-server reads a flag's value as written, as its own readers would.

llama.cpp reads an `N` with std::stoi or std::stof (glibc strtol / strtof: leading blanks
skipped, what follows the number ignored, ERANGE thrown) and a toggle with common/arg.cpp's
truthy / falsey / auto words; the flag's kind and minimum come from its help (schema.py).
"""

from __future__ import annotations

import re

from flagtrial.launch.helptext import FlagDef

# common/arg.cpp is_truthy / is_falsey / is_autoy: the words a toggle takes.
TOGGLE_WORDS = {
    "on": ("on", "enabled", "true", "1"),
    "off": ("off", "disabled", "false", "0"),
    "auto": ("auto", "-1"),
}
# glibc strtol / strtof, as std::stoi and std::stof call them: leading blanks, a sign, then
# the longest number; what follows is ignored.
_STRTOL = re.compile(r"[ \t\n\v\f\r]*([+-]?\d+)", re.ASCII)  # ASCII: `੦` is no digit to C
_STRTOF = re.compile(
    r"[ \t\n\v\f\r]*([+-]?(?:0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?\d+)?"
    r"|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan(?:\([0-9A-Za-z_]*\))?))",
    re.I | re.ASCII,
)
_INT32 = (-(2**31), 2**31 - 1)
_FLT_MAX = 3.4028234663852886e38
_FLT_MIN = 1.1754943508222875e-38


def _stoi(text: str) -> tuple[float, int]:
    """std::stoi: the number and where it stopped reading; ValueError where it throws."""
    if not (m := _STRTOL.match(text)):
        raise ValueError("not an integer")
    n = int(m.group(1))
    if not _INT32[0] <= n <= _INT32[1]:
        raise ValueError("out of range for a 32-bit integer")
    return n, m.end()


def _stof(text: str) -> tuple[float, int]:
    """std::stof, which also throws on strtof's ERANGE (overflow and underflow)."""
    if not (m := _STRTOF.match(text)):
        raise ValueError("not a number")
    word = m.group(1).lower()
    x = float.fromhex(word) if "x" in word else float(word.partition("(")[0])
    if abs(x) > _FLT_MAX or 0 < abs(x) < _FLT_MIN:
        raise ValueError("out of range for a 32-bit float")
    return x, m.end()


def value_problem(flag: FlagDef, name: str, value: str) -> str | None:
    """Why `name value` must not reach llama-server: it refuses it at start, or it silently
    reads only part of it (`-t 1.5` runs 1 thread: a trial would measure another value than
    the one asked for)."""
    if flag.kind is None or f"'{value}'" in flag.help:  # `either a number, 'auto', or 'all'`
        return None
    if flag.kind == "toggle":
        words = [
            w for key in (flag.metavar or "").strip("[]").split("|") for w in TOGGLE_WORDS[key]
        ]
        if value in words:
            return None
        return f"{name} {value!r}: not one of {', '.join(words)}"
    readers = {"int": (_stoi,), "float": (_stof,), "number": (_stoi, _stof)}[flag.kind]
    read: list[tuple[float, int]] = []
    errors: list[str] = []
    for reader in readers:
        try:
            read.append(reader(value))
        except ValueError as e:
            errors.append(str(e))
    if not read:
        return f"{name} {value!r}: {errors[-1]}"
    n, end = read[0]
    if flag.minimum is not None and n < flag.minimum:
        return (
            f"{name} {value!r}: below {flag.minimum}, and the help gives no meaning to a "
            f"negative {flag.canonical}"
        )
    if end < len(value) and flag.kind != "number":
        return (
            f"{name} {value!r} would be read as {n:g} (the engine ignores {value[end:]!r}): "
            f"give {n:g} if that is meant"
        )
    return None
