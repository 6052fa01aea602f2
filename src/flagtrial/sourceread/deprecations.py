"""Deprecations named in help texts ("(Deprecated: use --x=auto)", "Deprecated. Use --x
instead.", "[Deprecated] Use --x instead.", "--x is deprecated and will be removed").
"""

from __future__ import annotations

import re
from typing import Any

_DEPRECATED_HEAD = re.compile(r"^\W*(?:note:\s*)?deprecated\b", re.I)
# A flag as help texts write it: `--x`, `--x=v`, `--x-{decode,prefill}=disabled`.
_FLAG_WORD = r"--[A-Za-z0-9](?:[\w.\-]|\{[\w,]+\})*(?:=[^\s,;)`'\"]+)?"
_REPLACEMENT = re.compile(rf"\buse\s+[`'\"]?({_FLAG_WORD})", re.I)


def replacement(new_flag: str) -> str:
    """The flag a `new_flag=` names, as help texts give it (`--attn-dp-size <dp-size>` ->
    `--attn-dp-size`), so the parser's table and this one agree."""
    m = re.match(_FLAG_WORD, new_flag.strip())
    return m.group(0).rstrip(".") if m else new_flag.strip()


def mark_deprecations(flags: list[dict[str, Any]]) -> None:
    """A flag is deprecated when its help starts so, or says that it, by name, is; the flag a
    replacement names is written as help texts give it (see `replacement`)."""
    for spec in flags:
        text = spec["help"]
        own = any(re.search(rf"{re.escape(n)}\W{{0,3}}is deprecated", text) for n in spec["names"])
        if spec["deprecated"]:
            spec["deprecated"] = replacement(spec["deprecated"])
            continue
        if not (spec["deprecated"] == "" or _DEPRECATED_HEAD.search(text) or own):
            continue
        m = _REPLACEMENT.search(text[:300])
        spec["deprecated"] = m.group(1).rstrip(".") if m else ""
