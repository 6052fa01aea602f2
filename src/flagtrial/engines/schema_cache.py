"""An engine's flag schema is its own `--help`, cached per program and version."""

from __future__ import annotations

import hashlib
from pathlib import Path

from flagtrial.cache import cache_root, store
from flagtrial.errors import TargetError
from flagtrial.launch.schema import FlagSchema
from flagtrial.targets.base import Target


def cache_dir() -> Path:
    return cache_root() / "schemas"


async def help_schema(target: Target, engine: str, program: list[str]) -> FlagSchema:
    """Run `PROGRAM --version` (cheap) to key the cache, `PROGRAM --help` only on a miss."""
    rc, version = await target.run([*program, "--version"])
    if rc == 127:
        raise TargetError(f"server binary not found on {target.name}: {program[0]}")
    key = hashlib.sha256(f"{target.name}\0{' '.join(program)}\0{version}".encode()).hexdigest()[:16]
    path = cache_dir() / f"{engine}-{key}.help"
    if path.exists():
        return FlagSchema.parse_help(path.read_text(), program=program[-1])
    rc, text = await target.run([*program, "--help"])
    if rc != 0:
        raise TargetError(f"`{' '.join(program)} --help` failed on {target.name} (exit {rc})")
    schema = FlagSchema.parse_help(text, program=program[-1])
    store(path, text)
    return schema
