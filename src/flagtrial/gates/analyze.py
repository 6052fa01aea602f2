"""Will this flag act on this GPU? The outcome of each edit, with the chain of evidence.

For each edit: the flag's field and value (and the fields it is mapped to, e.g. a deprecated
alias), every read of those fields, the guards of each read and of each `raise` the edit can
reach, evaluated for the host with and without the edit. Then:

- FAILS AT STARTUP: a raise (or failing assert) runs on every run of its code with the edit,
  not without it, because of a host fact, in code that runs at every launch: argument
  resolution, the function registered for the value (`@register_attention_backend("fa3")`),
  or the function that resolves the field. Elsewhere (a kernel's constructor) it is a note;
- NO-OP ON THIS HARDWARE: every read that would change what runs is ruled out by a guard
  that depends on the host, or argument resolution turns the field off again on this host;
- ACTIVE: some read changes what runs, and no guard rules it out on this host;
- UNKNOWN: no read found, or nothing decided.

Reads are matched by field name on any receiver (`server_args.x`, `get_exec().comm.x`,
`self.x`, `getattr(a, "x")`), so an unrelated attribute of the same name adds a read: that
can only turn a no-op into active, never the other way.

The pieces: gates/analysis.py binds the edit and walks the functions that mention it
(gates/paths.py, evaluating with gates/capability.py); gates/reads.py says what each read
does; gates/rewrites.py and gates/decide.py hold the rules; gates/evidence.py the chain.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from flagtrial.errors import FlagtrialError
from flagtrial.gates.analysis import Analysis, flag_value
from flagtrial.gates.index import SourceIndex, load_index
from flagtrial.gates.model import GateFinding, GateHost, ModelFacts
from flagtrial.gates.reader import SourceReader
from flagtrial.gates.wheel import engine_source
from flagtrial.sourceread import LAYOUTS
from flagtrial.targets.base import HostFacts

_READERS: dict[int, SourceReader] = {}
_READERS_LOCK = threading.Lock()


def _reader(index: SourceIndex) -> SourceReader:
    with _READERS_LOCK:
        if id(index) not in _READERS:
            _READERS[id(index)] = SourceReader(index)
        return _READERS[id(index)]


def source_index(engine: str, version: str, source: Path | None = None) -> SourceIndex:
    """The index of the engine's source: an installed package directory (either the directory
    holding `<engine>/` or that package itself), else the PyPI wheel of that exact version."""
    if engine not in LAYOUTS:
        raise FlagtrialError(f"no source gate analysis for engine {engine!r} (sglang, vllm)")
    if source is None:
        return load_index(engine_source(engine, version), engine, version)
    root = source.parent if source.name == engine and not (source / engine).is_dir() else source
    return load_index(root, engine, version, fingerprint=True)


def analyze_change(
    engine: str,
    version: str,
    edits: list[tuple[str, str | None]],
    host: GateHost | HostFacts,
    tp: int = 1,
    *,
    source: Path | None = None,
    command: list[str] | None = None,
    model: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> list[GateFinding]:
    """One finding per edit `(flag, value)`; value None for a switch. `flag` may be any
    alias or unambiguous prefix, or `--flag=value` with value None.

    `host`: a GateHost, or a target's HostFacts (nvidia-smi: CUDA, version not known).
    `command`: the whole candidate argv (flags only): the other flags' values are known to
    every guard. `model`: the model's config.json (MLA, MoE, a quantized checkpoint). `env`:
    the variables the launch's environment sets, read as set (the others as before: unknown,
    or unset where the platform's own pick is computed). Thread-safe and silent: the trial
    runs it with `asyncio.to_thread` while the server restarts. The first call for a version
    downloads its wheel and indexes it (seconds); later calls read the cached index.
    """
    if isinstance(host, HostFacts):
        host = GateHost.from_host_facts(host)
    index = source_index(engine, version, source)
    reader = _reader(index)
    findings = []
    for flag, value in edits:
        if value is None and "=" in flag:
            flag, value = flag.split("=", 1)
        others = _command_values(index, command or [], flag)
        facts = ModelFacts.of(model) if model is not None else None
        analysis = Analysis(index, reader, host, tp, flag, value, others, facts, env or {})
        findings.append(analysis.run())
    return findings


def _command_values(index: SourceIndex, argv: list[str], edited: str) -> dict[str, Any]:
    """field -> value for every flag of the command except the edited one (argparse's
    reading: `--x=v`, `--x v`, a switch alone)."""
    table = index.table
    target = table.lookup(edited.split("=", 1)[0])
    values: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        word = argv[i]
        i += 1
        if not word.startswith("--"):
            continue
        name, eq, inline = word.partition("=")
        flag = table.lookup(name)
        if flag is None or "." in name:
            continue
        raw: str | None = inline if eq else None
        if flag["nargs"] != 0 and not eq and i < len(argv) and not argv[i].startswith("--"):
            raw = argv[i]
            i += 1
        if target is not None and flag["dest"] == target["dest"]:
            continue
        values[flag["dest"]] = flag_value(flag, name, raw, table.field(flag["dest"]))
    return values


def render_text(findings: list[GateFinding]) -> str:
    """Plain text for a terminal or a report: outcome, reason, then the evidence chain."""
    lines: list[str] = []
    for f in findings:
        value = f" {f.value}" if f.value is not None else ""
        lines.append(f"{f.flag}{value}: {f.outcome.value}")
        lines.append(f"  {f.engine} {f.version} on {f.host}, tp {f.tp}: {f.reason}")
        for e in f.evidence:
            where = f"{e.where}  " if e.file else ""
            code = f"  `{e.code}`" if e.code and e.role not in ("note",) else ""
            lines.append(f"    {e.role:<8} {where}{e.note}{code}")
    return "\n".join(lines)
