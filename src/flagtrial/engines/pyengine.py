"""A Python engine (SGLang, vLLM) on its host: the interpreter it runs under, the version
installed there, and its flag table, read there and cached per engine version.

The version costs one `python -c` that reads package metadata (the engine is not imported).
On a cache miss `source_flags.py` itself runs on the host under that interpreter, reading
the installed source with `ast`: no engine import, no GPU. Tables of older versions seen
before stay in the cache; a flag they had and this version lacks is reported as removed.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path, PurePosixPath
from typing import Any

from flagtrial.engines import source_flags
from flagtrial.engines.flag_table import EngineSchema
from flagtrial.engines.schema_cache import cache_dir
from flagtrial.errors import SpecError, TargetError
from flagtrial.targets.base import Target

_VERSION = "import sys, importlib.metadata as m; print(m.version(sys.argv[1]))"
_PYTHON = re.compile(r"python[0-9.]*")
_SOURCE = Path(source_flags.__file__).read_text()
# Tables read by another extractor revision are not reused.
_REVISION = hashlib.sha256(_SOURCE.encode()).hexdigest()[:12]


def host_python(program: list[str]) -> str:
    """`/v/bin/python -m sglang.launch_server` -> its python; a console script
    (`/v/bin/vllm serve`) -> the python beside it (a virtualenv's layout)."""
    first = program[0]
    if _PYTHON.fullmatch(PurePosixPath(first).name):
        return first
    folder = PurePosixPath(first).parent
    return str(folder / "python3") if str(folder) not in ("", ".") else "python3"


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", version)[:4])


def _cached(engine: str, version: str) -> Path:
    return cache_dir() / f"{engine}-{version}-{_REVISION}.json"


def cached_table(engine: str, version: str) -> dict[str, Any] | None:
    path = _cached(engine, version)
    return json.loads(path.read_text()) if path.exists() else None


def store_table(engine: str, version: str, table: dict[str, Any]) -> None:
    path = _cached(engine, version)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(table))
    tmp.replace(path)


def removed_flags(engine: str, version: str, table: dict[str, Any]) -> dict[str, str]:
    """Flag -> `engine OLDER` for spellings the newest older cached table had and this lacks."""
    names = {n for spec in table["flags"] for n in spec["names"]}
    removed: dict[str, str] = {}
    older = []
    for path in cache_dir().glob(f"{engine}-*-{_REVISION}.json"):
        other = path.name[len(engine) + 1 : -len(f"-{_REVISION}.json")]
        if version_key(other) < version_key(version):
            older.append(other)
    for other in sorted(older, key=version_key):  # newest last: it names the flag's last home
        old = cached_table(engine, other) or {"flags": []}
        for spec in old["flags"]:
            for name in spec["names"]:
                if name.startswith("-") and name not in names:
                    removed[name] = f"{engine} {other}"
    return removed


async def installed_version(target: Target, engine: str, python: str) -> str:
    rc, out = await target.run([python, "-c", _VERSION, engine])
    if rc == 127:
        raise TargetError(f"no Python at {python} on {target.name}")
    if rc != 0:
        raise TargetError(f"{engine} is not installed for {python} on {target.name}")
    return out.strip().splitlines()[-1]


async def read_table(target: Target, engine: str, python: str) -> tuple[str, dict[str, Any]]:
    """(version, flag table) of the engine installed for `python` on the target's host."""
    version = await installed_version(target, engine, python)
    table = cached_table(engine, version)
    if table is None:
        rc, out = await target.run([python, "-c", _SOURCE, engine], timeout_s=120.0)
        try:
            table = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise TargetError(
                f"reading the flags of {engine} {version} on {target.name} failed (exit {rc})"
            ) from None
        if "error" in table:
            raise SpecError(table["error"])
        store_table(engine, version, table)
    return version, table


async def engine_schema(
    target: Target, engine: str, program: list[str], **parsing: bool
) -> EngineSchema:
    version, table = await read_table(target, engine, host_python(program))
    return EngineSchema.from_table(
        engine, version, table, removed_flags(engine, version, table), **parsing
    )
