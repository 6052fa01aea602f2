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
"""

from __future__ import annotations

import ast
import json
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flagtrial.errors import FlagtrialError
from flagtrial.gates.capability import Evaluator
from flagtrial.gates.index import SourceIndex, load_index
from flagtrial.gates.model import Evidence, GateFinding, GateHost, ModelFacts, Outcome
from flagtrial.gates.paths import Walker
from flagtrial.gates.platforms import foreign_module, platform_module
from flagtrial.gates.reader import SourceReader
from flagtrial.gates.selector import selected_backend_failure
from flagtrial.gates.sites import Guard, RaiseSite, ReadSite, all_hold
from flagtrial.gates.values import (
    UNKNOWN,
    ClassRef,
    FieldBinding,
    Instance,
    Scope,
    Trace,
    Val,
    assign,
)
from flagtrial.gates.wheel import engine_source
from flagtrial.sourceread import LAYOUTS
from flagtrial.sourceread.common import UNSET, FieldDef, canonical, module_name, switch_value
from flagtrial.targets.base import HostFacts

MAX_MAPPING_ROUNDS = 3
MAX_SHOWN = 4
MAX_EFFECTS = 60
# Fields named like `dtype` or `device` are read in thousands of places; past this many
# functions the walk stops, and the outcome says so (a no-op is then never claimed).
MAX_UNITS = 150

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
) -> list[GateFinding]:
    """One finding per edit `(flag, value)`; value None for a switch. `flag` may be any
    alias or unambiguous prefix, or `--flag=value` with value None.

    `host`: a GateHost, or a target's HostFacts (nvidia-smi: CUDA, version not known).
    `command`: the whole candidate argv (flags only): the other flags' values are known to
    every guard. `model`: the model's config.json (MLA, MoE, a quantized checkpoint).
    Thread-safe and silent: the trial runs it with `asyncio.to_thread` while the server
    restarts. The first call for a version downloads its wheel and indexes it (seconds);
    later calls read the cached index.
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
        findings.append(_Analysis(index, reader, host, tp, flag, value, others, facts).run())
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
        values[flag["dest"]] = _flag_value(flag, name, raw, table.field(flag["dest"]))
    return values


# ------------------------------------------------------------------ values


def _convert(value: str | None, fdef: FieldDef | None) -> Any:
    """A command-line value as argparse with the field's type would store it."""
    if value is None:
        return True
    kind = fdef.kind if fdef else "other"
    try:
        if kind == "int":
            return int(value)
        if kind == "float":
            return float(value)
    except ValueError:
        return value
    if kind == "bool":
        return value.lower() in ("1", "true", "yes", "on")
    return value


def _flag_value(flag: dict[str, Any], used: str, value: str | None, fdef: FieldDef | None) -> Any:
    if flag["nargs"] == 0:
        return switch_value(flag, used)
    return _convert(value, fdef)


def _json_value(value: str | None) -> Any:
    """A dotted config key's value, parsed as the engine does: JSON, else the string."""
    if value is None:
        return True
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def _snake(name: str) -> str:
    out = [("_" + c.lower()) if c.isupper() else c for c in name]
    return "".join(out).lstrip("_")


# ------------------------------------------------------------------ classification


@dataclass
class _Effect:
    site: ReadSite
    # "alive", "hw" (ruled out by the host), "foreign" (code of another platform), "value"
    # (no difference for this value)
    status: str
    deciding: Val | None = None
    guard: Guard | None = None


@dataclass
class _Analysis:
    index: SourceIndex
    reader: SourceReader
    host: GateHost
    tp: int
    flag_name: str
    raw_value: str | None
    others: dict[str, Any] = field(default_factory=dict)  # the command's other flags
    model: ModelFacts | None = None
    new: dict[str, FieldBinding] = field(default_factory=dict)
    old: dict[str, FieldBinding] = field(default_factory=dict)
    evidence: list[Evidence] = field(default_factory=list)
    facts: set[str] = field(default_factory=set)  # fields known from the host, not edited
    skipped: int = 0  # functions mentioning a field that were not walked (MAX_UNITS)
    selected: dict[str, None] = field(default_factory=dict)  # functions the value selects
    dest: str = ""  # the field the flag sets

    # ---------------------------------------------------------- setup

    def run(self) -> GateFinding:
        option = self.flag_name
        # vLLM's dotted form sets one key of a JSON config flag:
        # `--compilation-config.pass_config.fuse_rope_kvcache=true`.
        base, *keys = option.split(".") if option.startswith("--") else (option,)
        flag = self.index.table.lookup(base)
        if flag is None or (keys and flag["nargs"] == 0):
            return self._finding(
                Outcome.UNKNOWN,
                f"{option} is not a flag of {self.index.engine} {self.index.version}",
            )
        self._bind(flag, base, keys)
        walker = self._walk_until_stable()
        return self._decide(walker)

    def _bind(self, flag: dict[str, Any], option: str, keys: list[str]) -> None:
        table = self.index.table
        if keys:
            dest = keys[-1]
            fdef = table.field(dest)
            value = _json_value(self.raw_value)
            # A name several config classes declare is read through its parent's name.
            ambiguous = table.declared.get(dest, 0) > 1 and len(keys) > 1
            receiver = keys[-2] if ambiguous else None
        else:
            dest = flag["dest"]
            fdef = table.field(dest)
            value = _flag_value(flag, option, self.raw_value, fdef)
            receiver = None
        where, line = (flag.get("registered") or flag["where"]).rsplit(":", 1)
        file = f"{self.index.layout.package}/{where}"
        self.evidence.append(
            Evidence(
                role="flag",
                file=file,
                line=int(line),
                code=self.reader.line(self._fi(file), int(line)),
                note=f"{option}{''.join('.' + k for k in keys)} sets {dest}={value!r}"
                + (f" (alias of {canonical(flag)})" if option != canonical(flag) else ""),
            )
        )
        self._set(dest, value, fdef, receiver)
        self.dest = dest
        owner, _, config_field = (flag.get("config") or "").partition(".")
        if not keys and config_field and config_field != dest:
            # vLLM: `--attention-backend` lands in `AttentionConfig.backend`, read through
            # an `attention_config` object.
            cdef = table.field(config_field, owner)
            self._set(config_field, value, cdef, _snake(owner))
        known = {t: self.tp for t in self.index.layout.tp_fields} | self.others
        for name, val in known.items():
            if name not in self.new:
                self.new[name] = self.old[name] = FieldBinding(val)
                self.facts.add(name)

    def _set(self, name: str, value: Any, fdef: FieldDef | None, receiver: str | None) -> None:
        self.new[name] = FieldBinding(value, receiver)
        self.old[name] = FieldBinding(fdef.default if fdef else UNSET, receiver)
        if fdef:
            self.evidence.append(
                Evidence(
                    role="field",
                    file=fdef.file,
                    line=fdef.line,
                    code=self.reader.line(self._fi(fdef.file), fdef.line),
                    note=f"{fdef.owner}.{name}, default {fdef.default!r}",
                )
            )

    def _fi(self, path: str) -> int:
        return self.index.modules.get(module_name(path), -1)

    @property
    def edited(self) -> frozenset[str]:
        return frozenset(n for n in self.new if n not in self.facts)

    def _walk_until_stable(self) -> Walker:
        """Walk every unit that mentions a field; fields the edit is mapped to join the set,
        and the walk repeats with them."""
        for _ in range(MAX_MAPPING_ROUNDS):
            walker = self._walk()
            derived = self._mappings(walker)
            fresh = {k: v for k, v in derived.items() if k not in self.new}
            if not fresh:
                return walker
            for name, (val, site) in fresh.items():
                fdef = self.index.table.field(name)
                self.evidence.append(
                    Evidence(
                        role="mapping",
                        file=self.index.files[site.fi].path,
                        line=site.node.lineno,
                        code=self.reader.line(site.fi, site.node.lineno),
                        note=f"maps to {name}={val.value!r}",
                    )
                )
                self._set(name, val.value if val.known else UNSET, fdef, None)
        return walker

    def _walk(self, *, everything_default: bool = False) -> Walker:
        ev_new, ev_old = (
            Evaluator(
                self.index,
                self.reader,
                self.host,
                bound,
                model=self.model,
                resolution_defaults=self._defaults(bound, all_fields=everything_default),
            )
            for bound in (self.new, self.old)
        )
        units: dict[tuple[int, int, int], None] = {}
        lines: set[tuple[int, int]] = set()
        for name in sorted(self.edited):
            for fi, line, start, end in self.index.mentions.get(name, []):
                units[(fi, start, end)] = None
                lines.add((fi, line))
        walker = Walker(ev_new, ev_old, self.edited, lines)
        # Argument resolution first and always whole: a startup failure there is never
        # among the functions left unwalked; elsewhere code on this platform comes first.
        ranked = sorted(
            units, key=lambda u: (not self._startup_file(u[0]), self._foreign(u[0]) is not None)
        )
        startup = sum(1 for u in ranked if self._startup_file(u[0]))
        limit = max(MAX_UNITS, startup)
        self.skipped = max(0, len(ranked) - limit)
        for fi, start, end in ranked[:limit]:
            if self._other_models(fi, start):
                continue
            stmts = self.reader.unit(fi, start, end)
            walker.walk_unit(fi, stmts, runs_at_startup=self._runs_at_startup(fi, stmts))
        for fi, ni, guard in self._dispatched(ev_new, ev_old):
            fn = self.index.func((fi, ni))
            stmts = self.reader.unit(fi, fn.start, fn.end)
            walker.walk_unit(fi, stmts, (guard,), runs_at_startup=True)
        return walker

    def _other_models(self, fi: int, start: int) -> bool:
        """A function registered for model architectures (`@_register_for("IQuestQ1ForCausalLM")`)
        that do not include this model's: it never runs for it."""
        if self.model is None or not self.model.architectures:
            return False
        fn = next((f for f in self.index.files[fi].funcs if f.start == start), None)
        if fn is None or not fn.dispatch or not all(_ARCH.match(k) for k in fn.dispatch):
            return False
        return not set(fn.dispatch) & set(self.model.architectures)

    def _platform_hook(self, fi: int, line: int) -> bool:
        """Inside `check_and_update_config` of the class the host's runtime selects (vLLM's
        `CpuPlatform` on a CPU host): it runs at every launch, and only on this platform."""
        module = platform_module(self.index, self.host.platform)
        if module is None or self.index.files[fi].module != module:
            return False
        return any(
            f.name == "check_and_update_config" and f.start <= line <= f.end
            for f in self.index.files[fi].funcs
        )

    def _startup_file(self, fi: int) -> bool:
        path = self.index.files[fi].path.removeprefix(self.index.layout.package + "/")
        return path.startswith(self.index.layout.startup_paths)

    def _foreign(self, fi: int) -> str | None:
        return foreign_module(self.index, self.reader, fi, self.host)

    def _runs_at_startup(self, fi: int, stmts: list[ast.stmt]) -> bool:
        """Argument resolution runs at every launch; so does the function that resolves a
        field (`resolve_flashinfer_allreduce_fusion_backend`) once the field is set. Other
        code (a kernel's constructor, a model's layer) runs only where it is selected."""
        if self._startup_file(fi):
            return True
        node = stmts[0] if len(stmts) == 1 else None
        if node is not None and self._platform_hook(fi, node.lineno):
            return True
        name = node.name if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) else ""
        return any(f in name for f in self.edited)

    def _dispatched(self, ev_new: Evaluator, ev_old: Evaluator) -> list[tuple[int, int, Guard]]:
        """Functions registered under the edited value: `@register_attention_backend("fa3")`
        runs when `attention_backend` is "fa3" (the registrar names the field)."""
        found = []
        for name in self.edited:
            value = self.new[name].value
            if not isinstance(value, str):
                continue
            for fi, ni in self.index.dispatch.get(value, []):
                fn = self.index.func((fi, ni))
                registrar = fn.registrar.removeprefix("register_")
                if name not in fn.registrar and registrar not in name:
                    continue
                old = self.old[name].value
                node = ast.Constant(value=f"{name} == {value!r}", lineno=fn.start)
                was = Val(UNKNOWN if old is UNSET else old == value)
                selected = Guard(node, fi, True, True, Val(True), was)
                found.append((fi, ni, selected))
                note = f"@{fn.registrar}({value!r}) runs {fn.name}() for {name}={value!r}"
                self._add("dispatch", fi, fn.start, note)
                self.selected[f"{fn.name}() at {self.index.files[fi].path}:{fn.start}"] = None
        return found

    # ---------------------------------------------------------- reads

    def _mappings(self, walker: Walker) -> dict[str, tuple[Val, ReadSite]]:
        derived: dict[str, tuple[Val, ReadSite]] = {}
        for site in walker.reads:
            # Only argument resolution maps one setting to another: elsewhere `dtype=x.f`
            # passes a value to a kernel, not to the `dtype` setting.
            if not site.runs_at_startup:
                continue
            kind, writes = self._consumer(site)
            if kind != "mapping":
                continue
            for name, node in writes.items():
                # A name several config classes declare (vLLM's `backend`) says nothing.
                if self.index.table.declared.get(name) != 1:
                    continue
                if name not in self.new and name not in derived:
                    derived[name] = (walker.ev_new.expr(node, site.scope_new), site)
        return derived

    def _consumer(self, site: ReadSite) -> tuple[str, dict[str, ast.expr]]:
        """What a read controls: 'effect', 'mapping' (sets other fields), 'self' (only
        resolves its own fields), 'validation' (only raises), 'none'."""
        stmt, node = site.stmt, site.context or site.node
        if site.context is not None and isinstance(stmt, ast.If) and stmt.test is site.context:
            if _leaves(stmt.body) and not stmt.orelse:
                return "effect", {}  # the rest of the function runs or not
            truth = site.ctx.new.truth() if site.ctx else None
            # Either branch can differ from before; only those taken with the edit map values.
            kind, _ = self._branches_kind([stmt.body, stmt.orelse])
            if kind != "mapping":
                return kind, {}
            taken = [b for b, t in ((stmt.body, True), (stmt.orelse, False)) if truth in (t, None)]
            return self._branches_kind(taken)
        if site.context is not None and isinstance(stmt, ast.Assert):
            return "validation", {}
        parent = site.parents.get(id(node))
        target = None
        if isinstance(parent, ast.keyword) and parent.arg:
            target = parent.arg
        elif isinstance(parent, ast.Dict):
            key = next(
                (k for k, v in zip(parent.keys, parent.values, strict=True) if v is node), None
            )
            target = (
                key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None
            )
        elif isinstance(stmt, ast.Assign) and stmt.value is node:
            attrs = [t.attr for t in stmt.targets if isinstance(t, ast.Attribute)]
            target = attrs[0] if attrs else None
        if isinstance(target, str) and target in self.index.table.fields:
            if target in self.new:
                return "self", {}
            return "mapping", {target: node}
        return "effect", {}

    def _branches_kind(self, branches: list[list[ast.stmt]]) -> tuple[str, dict[str, ast.expr]]:
        writes: dict[str, ast.expr] = {}
        kinds: set[str] = set()
        for body in branches:
            for stmt in body:
                kinds.add(self._statement_kind(stmt, writes))
        if "effect" in kinds:
            return "effect", {}
        others = {k: v for k, v in writes.items() if k not in self.new}
        if others:
            return "mapping", others
        if "raise" in kinds:
            return "validation", {}
        return ("self" if writes else "none"), {}

    def _statement_kind(self, stmt: ast.stmt, writes: dict[str, ast.expr]) -> str:
        fields = self.index.table.fields
        if isinstance(stmt, ast.Pass | ast.Continue) or (
            isinstance(stmt, ast.Return) and (stmt.value is None or _is_none(stmt.value))
        ):
            return "none"
        if isinstance(stmt, ast.Raise):
            return "raise"
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            call = stmt.value
            name = call.func.attr if isinstance(call.func, ast.Attribute) else ""
            name = name or getattr(call.func, "id", "")
            if name in ("warning", "info", "debug", "warn", "print", "error", "warning_once"):
                return "none"
            named = {k.arg: k.value for k in call.keywords if k.arg}
            if named and all(k in fields for k in named):
                # declare_resolution(server_args, "source", field=value)
                writes.update(named)
                return "write"
        if isinstance(stmt, ast.Return) and isinstance(stmt.value, ast.Dict):
            keys = [
                k.value
                for k in stmt.value.keys
                if isinstance(k, ast.Constant) and isinstance(k.value, str)
            ]
            if keys and len(keys) == len(stmt.value.keys) and all(k in fields for k in keys):
                writes.update(zip(keys, stmt.value.values, strict=True))
                return "write"
        if isinstance(stmt, ast.Assign) and all(
            isinstance(t, ast.Attribute) and t.attr in fields for t in stmt.targets
        ):
            for t in stmt.targets:
                assert isinstance(t, ast.Attribute)
                writes[t.attr] = stmt.value
            return "write"
        return "effect"

    def _resets(self, site: ReadSite) -> bool:
        """`if <field set> and <not this GPU>: <field> = default` in code that runs at every
        launch: the engine undoes the edit here, so nothing later sees it."""
        stmt = site.stmt
        hook = self._platform_hook(site.fi, site.node.lineno)
        # In the platform's own hook a bare `if x.f: x.f = False` is this platform's doing.
        bare = hook and isinstance(stmt, ast.If) and stmt.test is site.node and site.ctx is None
        if not (
            site.runs_at_startup
            and isinstance(stmt, ast.If)
            and (
                bare
                or (
                    site.ctx is not None
                    and stmt.test is site.context
                    and site.ctx.new.truth() is True
                    and (site.ctx.new.hw or hook)
                )
            )
            and all_hold(g.holds_new for g in site.guards if not g.assumed) is True
        ):
            return False
        writes: dict[str, ast.expr] = {}
        kinds = {self._statement_kind(s, writes) for s in stmt.body}
        if "effect" in kinds or "raise" in kinds or site.field not in writes:
            return False
        value = Evaluator(self.index, self.reader, self.host, self.new, model=self.model).expr(
            writes[site.field], site.scope_new
        )
        if not value.known:
            return False
        # Back to the default, or switched off (`self.fuse_x = False`).
        off = value.value in (False, None) and bool(self.new[site.field].value)
        return off or _equal(value.value, self.old[site.field].value)

    def _effects(self, walker: Walker) -> list[_Effect]:
        """The reads that change what runs, classified (at most MAX_EFFECTS: a long list
        proves nothing more, and each costs evaluating its guards)."""
        effects = []
        for site in walker.reads:
            if self._declaration_read(site):
                continue
            if self._consumer(site)[0] == "effect":
                effects.append(self._effect(site))
                if len(effects) >= MAX_EFFECTS:
                    break
        return effects

    def _declaration_read(self, site: ReadSite) -> bool:
        """`ServerArgs.f` (`default=ServerArgs.f` in the parser): the class's declared
        default, the same with or without the edit."""
        fdef = self.index.table.field(site.field)
        node = site.node
        return (
            fdef is not None
            and isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == fdef.owner
        )

    def _overwritten(self, walker: Walker) -> GateFinding | None:
        """`def _handle_amd_specifics(self): if is_hip(): self.f = 16`, called at the top
        level of `__post_init__`, every test true on this host: the edited setting is
        replaced at every launch. Only when argument resolution reads it nowhere else (such
        a read could act before the write) and the edit sets nothing else."""
        name = self.dest
        if self.edited != {name}:
            return None
        startup_reads = [
            r for r in walker.reads if r.runs_at_startup and not self._declaration_read(r)
        ]
        if startup_reads:
            return None
        ev = Evaluator(self.index, self.reader, self.host, self.new, model=self.model)
        for fi, _, start, end in self.index.mentions.get(name, []):
            if not self._startup_file(fi):
                continue
            fn = next((f for f in self.index.files[fi].funcs if f.start == start), None)
            stmts = self.reader.unit(fi, start, end)
            if fn is None or fn.cls is None or not stmts:
                continue
            node = stmts[0]
            if not isinstance(node, ast.FunctionDef) or not self._called_at_init(
                ev, fi, fn.cls, fn.name
            ):
                continue
            found = _unconditional_write(ev, Scope(fi), node.body, name)
            if found is None:
                continue
            write, tests = found
            for test, val in tests:
                self._value_evidence(fi, test, val)
            self._add("gate", fi, write.lineno, f"sets {name} whatever the command says")
            return self._finding(
                Outcome.NO_OP,
                f"{self.index.files[fi].path}:{write.lineno} ({fn.name}(), run by __post_init__)"
                f" replaces {name} at every launch on this host",
            )
        return None

    def _called_at_init(self, ev: Evaluator, fi: int, cls: str, method: str) -> bool:
        """`self.<method>()` is a top-level statement of the class's `__post_init__`, with
        no return before it but under a test false with this command (`if
        self.model_path.lower() in ["none", "dummy"]: return`)."""
        info = self.index.files[fi].classes.get(cls)
        if info is None or "__post_init__" not in info.methods:
            return False
        init = self.index.files[fi].funcs[info.methods["__post_init__"]]
        stmts = self.reader.unit(fi, init.start, init.end)
        if not stmts or not isinstance(stmts[0], ast.FunctionDef):
            return False
        for stmt in stmts[0].body:
            call = stmt.value if isinstance(stmt, ast.Expr) else None
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == method
                and isinstance(call.func.value, ast.Name)
                and call.func.value.id == "self"
            ):
                return True
            if any(isinstance(n, ast.Return) for n in ast.walk(stmt)):
                skipped = (
                    isinstance(stmt, ast.If)
                    and not stmt.orelse
                    and ev.expr(stmt.test, Scope(fi)).truth() is False
                )
                if not skipped:
                    return False
        return False

    def _effect(self, site: ReadSite) -> _Effect:
        foreign = self._foreign(site.fi)
        if foreign is not None:
            return _Effect(site, "foreign", Val(False, True, (("note", -1, 0, foreign),)))
        for guard in site.guards:
            if guard.holds_new is False:
                return _Effect(site, "hw" if guard.new.hw else "value", guard.new, guard)
        if site.ctx is not None:
            a = site.ctx.new
            b = site.ctx.old if site.ctx.tainted else a
            if a.known and b.known and _equal(a.value, b.value):
                return _Effect(site, "hw" if a.hw else "value", a)
        return _Effect(site, "alive")

    # ---------------------------------------------------------- outcome

    def _decide(self, walker: Walker) -> GateFinding:
        certain = [r for r in walker.raises if r.certain]
        failures = [r for r in certain if r.runs_at_startup]
        if failures:
            first = min(failures, key=lambda r: (len(r.chain), r.stmt.lineno))
            # The reads nearest before the raise (or before the first call followed to it).
            fi, start, _ = first.unit
            until = first.chain[0][2] if first.chain else first.stmt.lineno
            near = sorted(
                (r.node.lineno, r.field)
                for r in walker.reads
                if r.fi == fi and start <= r.node.lineno <= until
            )
            for line, name in near[-2:]:
                self._add("read", fi, line, f"reads {name}")
            self._raise_evidence(first)
            return self._finding(Outcome.FAILS, self._raise_reason(first))
        rejected = self._backend_rejected()
        if rejected is not None:
            return rejected
        reset = next((r for r in walker.reads if self._resets(r)), None)
        if reset is not None:
            self._add("read", reset.fi, reset.node.lineno, f"reads {reset.field}")
            if reset.context is not None and reset.ctx is not None:
                self._value_evidence(reset.fi, reset.context, reset.ctx.new)
            assert isinstance(reset.stmt, ast.If)  # _resets holds only for an `if`
            write = next(
                (
                    getattr(n, "lineno", reset.stmt.lineno)
                    for b in reset.stmt.body
                    for n in ast.walk(b)
                    if _writes(n, reset.field)
                ),
                reset.stmt.lineno,
            )
            self._add("gate", reset.fi, write, f"turns {reset.field} off again on this host")
            return self._finding(
                Outcome.NO_OP,
                f"{self._where(reset)} turns {reset.field} off again on this host",
            )
        replaced = self._overwritten(walker)
        if replaced is not None:
            return replaced
        choice = self._platform_choice(walker)
        blocking = self._config_failure() if choice is not None else None
        if blocking is not None:
            self._raise_evidence(blocking)
            return self._finding(
                Outcome.UNKNOWN,
                f"without the flag this host picks the same value, but"
                f" {self._raise_reason(blocking).removesuffix(' on this host')} is reached"
                " with every test holding (with the settings left out at their defaults)",
            )
        if choice is not None:
            site, value = choice
            self._add("read", site.fi, site.node.lineno, f"reads {site.field}")
            self._add("gate", site.fi, site.stmt.lineno, "the platform's choice when not given")
            for trace in value.traces:
                self._trace(trace)
            return self._finding(
                Outcome.NO_OP,
                f"{self._where(site)}: without the flag this host gets {site.field}="
                f"{value.value!r} anyway",
            )
        effects = self._effects(walker)
        alive = [e for e in effects if e.status == "alive"]
        blocked = [e for e in effects if e.status in ("hw", "foreign")]
        if alive or self.selected:
            # Reads behind a host-dependent guard that holds (or may) say most about the GPU.
            # Reads every guard of which holds come first (they are shown to run), then
            # those in the code that serves, not in argument resolution.
            alive.sort(
                key=lambda e: (
                    not _shown(e.site),
                    e.site.runs_at_startup,
                    not any(g.new.hw for g in e.site.guards)
                    and not (e.site.ctx is not None and e.site.ctx.new.hw),
                )
            )
            for effect in alive[:MAX_SHOWN]:
                self._read_evidence(effect)
            for effect in blocked[:2]:
                self._read_evidence(effect)  # what this GPU rules out, though others act
            self._possible_failures(walker)
            if self.skipped:
                self.evidence.append(
                    Evidence(
                        role="note",
                        note=f"{self.skipped} more functions mention the field and were not"
                        " walked: a startup failure there is not ruled out",
                    )
                )
            possible = self._failure_with_defaults()
            if possible is not None:
                self._raise_evidence(possible)
                return self._finding(
                    Outcome.UNKNOWN,
                    f"{self._raise_reason(possible).removesuffix(' on this host')} on this host"
                    " if the settings the command leaves out keep their defaults (argument"
                    " resolution may change them): not ruled out",
                )
            count = f"{len(alive)}+" if len(effects) >= MAX_EFFECTS else str(len(alive))
            parts = [f"selects {', '.join(self.selected)}"] if self.selected else []
            if alive:
                parts.append(
                    f"{count} read(s) of {', '.join(sorted(self.edited))} can act on this"
                    f" host, e.g. {self._where(alive[0].site)}"
                )
            return self._finding(Outcome.ACTIVE, "; ".join(parts))
        if blocked and self.skipped:
            return self._finding(
                Outcome.UNKNOWN,
                f"the reads walked are ruled out by the GPU, but {self.skipped} functions that"
                " mention the field were not walked",
            )
        if blocked:
            for effect in blocked[:MAX_SHOWN]:
                self._read_evidence(effect)
            return self._finding(
                Outcome.NO_OP,
                f"every read that would act ({len(blocked)}) is ruled out by the GPU",
            )
        if effects:
            return self._finding(Outcome.UNKNOWN, "no read changes what runs for this value")
        return self._finding(
            Outcome.UNKNOWN, f"no read of {', '.join(sorted(self.edited))} that acts was found"
        )

    def _backend_rejected(self) -> GateFinding | None:
        """vLLM: an attention backend the command names is validated alone at startup; its
        own capability check False on this GPU is a ValueError (gates/selector.py)."""
        value = self.new.get("attention_backend")
        cap = self.host.capability
        if self.index.engine != "vllm" or value is None or cap is None:
            return None
        if not isinstance(value.value, str):
            return None
        hit = selected_backend_failure(
            self.index, self.reader, self.host.platform, cap, value.value
        )
        if hit is None:
            return None
        self._add(
            "gate",
            hit.check_fi,
            hit.check_line,
            f"`{hit.check}` is False for capability {cap[0]}.{cap[1]}",
        )
        self._add(
            "raise",
            hit.raise_fi,
            hit.raise_line,
            "a selected backend that reports a"
            " reason is not replaced: ValueError while the attention layers are built",
        )
        where = f"{self.index.files[hit.raise_fi].path}:{hit.raise_line}"
        return self._finding(
            Outcome.FAILS,
            f"raise ValueError at {where} on this host: {hit.backend} does not support"
            f" compute capability {cap[0]}.{cap[1]}",
        )

    def _defaults(
        self, bound: dict[str, FieldBinding], *, all_fields: bool = False
    ) -> dict[str, Any]:
        """Declared literal defaults of the settings not bound here (not in the command).
        Argument resolution may rewrite a setting: unless `all_fields` (a guess: the
        platform's own pick, a failure not ruled out), only those it never writes."""
        written = frozenset() if all_fields else self.index.writes
        return {
            n: d.default
            for n, d in self.index.table.fields.items()
            if d.default is not UNSET
            and n not in bound
            and n not in written
            and self.index.table.declared.get(n) == 1
        }

    def _platform_choice(self, walker: Walker) -> tuple[ReadSite, Val] | None:
        """`if x.f is None: x.f = <the platform's pick>` in argument resolution, taken only
        without the edit, picking the edited value on this host: the edit changes nothing.
        The pick is computed with the command's other settings and every other setting at
        its declared default."""
        name = self.dest
        new, old = self.new[name].value, self.old[name].value
        if new is UNSET or _equal(new, old):
            return None
        ev = Evaluator(
            self.index,
            self.reader,
            self.host,
            self.old,
            model=self.model,
            defaults=self._defaults(self.old, all_fields=True),
        )
        for site in walker.reads:
            stmt = site.stmt
            if (
                site.field != name
                or not site.runs_at_startup
                or site.ctx is None
                or site.scope_old is None
                or not isinstance(stmt, ast.If)
                or stmt.test is not site.context
                or site.ctx.new.truth() is not False
                or ev.expr(stmt.test, site.scope_old).truth() is not True
                or all_hold(g.holds(ev.expr(g.node, site.scope_old)) for g in site.guards)
                is not True
            ):
                continue
            value = _picked(ev, stmt.body, self._method_scope(ev, site, site.scope_old), name)
            if value is not None and value.known and _equal(value.value, new):
                return site, value
        return None

    def _method_scope(self, ev: Evaluator, site: ReadSite, scope: Scope) -> Scope:
        """The read's scope with `self` the instance of the class whose method holds it, so
        that `self._get_default_attn_backend(...)` is followed (server_args.py, 0.5.10);
        locals the walk could not know without `self` (`x = self.use_mla_backend()`, in
        the method's own body before the read) are evaluated again with it."""
        out = scope.snapshot()
        funcs = [
            f
            for f in self.index.files[site.fi].funcs
            if f.cls and f.start <= site.node.lineno <= f.end
        ]
        if not funcs:
            return out
        fn = max(funcs, key=lambda f: f.start)
        if "staticmethod" in fn.decorators or "classmethod" in fn.decorators:
            return out
        stmts = self.reader.unit(site.fi, fn.start, fn.end)
        node = stmts[0] if stmts else None
        if not isinstance(node, ast.FunctionDef) or not node.args.args:
            return out
        assert fn.cls is not None
        cls = ClassRef(site.fi, fn.cls)
        out.cls, out.owner = cls, Instance(cls)
        me = node.args.args[0].arg
        out.locals[me] = Val(out.owner)
        for stmt in node.body:
            if (stmt.end_lineno or stmt.lineno) >= site.stmt.lineno:
                break  # the statement that holds the read, or one after it
            if (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)
            ):
                local = out.locals.get(stmt.targets[0].id)
                if not isinstance(local, Val) or not local.known:
                    out.locals[stmt.targets[0].id] = ev.expr(stmt.value, out)
            else:
                # a branch or loop may rebind a local (`self.x = ...` rebinds no `self`)
                for name in self.reader.stores(stmt) - {me}:
                    out.locals[name] = Val(UNKNOWN)
        return out

    def _where(self, site: ReadSite) -> str:
        return f"{self.index.files[site.fi].path}:{site.node.lineno}"

    def _config_failure(self) -> RaiseSite | None:
        """A startup check of the edited value whose every test holds once the settings left
        out take their defaults, host-dependent or not: no NO-OP is claimed over it."""
        walker = self._walk(everything_default=True)
        for r in walker.raises:
            guards = [g for g in r.guards if not g.assumed]
            # in a check that itself tests the edited value (`if view.x == "v": ...`)
            if (
                r.runs_at_startup
                and not r.in_try
                and not r.chain
                and any(g.tainted for g in guards)
                # earlier checks of the function pass too: it is this one that raises
                and all_hold(g.holds_new for g in r.guards) is True
            ):
                return r
        return None

    def _failure_with_defaults(self) -> RaiseSite | None:
        """The startup raise that is certain once every setting the command leaves out is
        taken at its declared default (argument resolution may rewrite some: a guess, so
        it makes the outcome UNKNOWN, never FAILS)."""
        walker = self._walk(everything_default=True)
        failures = [r for r in walker.raises if r.certain and r.runs_at_startup]
        return min(failures, key=lambda r: (len(r.chain), r.stmt.lineno)) if failures else None

    def _possible_failures(self, walker: Walker) -> None:
        """Raises that the edit reaches on this host when something not known here holds:
        the function runs (a kernel selected by the model), or a guard not known here."""
        for r in walker.raises:
            if r.certain:
                fn = self._function_at(r.fi, r.stmt.lineno)
                self._add(
                    "note",
                    r.fi,
                    r.stmt.lineno,
                    f"raises on this host when {fn} runs; whether it runs at startup depends"
                    " on the model and other settings",
                )
                return
        for r in walker.raises:
            if r.in_try or any(g.holds_new is False for g in r.guards):
                continue
            if (
                any(g.new.hw for g in r.guards)
                and all(g.holds_old is not True for g in r.guards if g.holds_new is None)
                and any(g.holds_old is False for g in r.guards)
            ):
                self._add(
                    "note",
                    r.fi,
                    r.stmt.lineno,
                    "may raise here, depending on what is not known about the host",
                )
                return

    def _function_at(self, fi: int, line: int) -> str:
        funcs = [f for f in self.index.files[fi].funcs if f.start <= line <= f.end]
        if not funcs:
            return "this module"
        fn = max(funcs, key=lambda f: f.start)
        return f"{fn.cls}.{fn.name}()" if fn.cls else f"{fn.name}()"

    def _raise_reason(self, site: RaiseSite) -> str:
        code = self.reader.line(site.fi, site.stmt.lineno)
        kind = "assert fails" if isinstance(site.stmt, ast.Assert) else code.split("(")[0]
        return f"{kind} at {self.index.files[site.fi].path}:{site.stmt.lineno} on this host"

    def _raise_evidence(self, site: RaiseSite) -> None:
        for role, fi, line, code in site.chain:
            self._add(role, fi, line, "followed with the edited value", code=code)
        for guard in site.guards:
            if not guard.assumed:
                self._guard_evidence(guard)
        self._add("raise", site.fi, site.stmt.lineno, "raised with the edit")

    def _read_evidence(self, effect: _Effect) -> None:
        site = effect.site
        status = {
            "alive": "acts on this host",
            "hw": "ruled out on this host",
            "foreign": "ruled out on this host",
            "value": "no difference",
        }[effect.status]
        self._add("read", site.fi, site.node.lineno, f"reads {site.field}: {status}")
        if effect.status == "foreign" and effect.deciding is not None:
            for trace in effect.deciding.traces:
                self._trace(trace)
            return
        if effect.guard is not None:
            self._guard_evidence(effect.guard)
        elif effect.deciding is not None and site.context is not None:
            self._value_evidence(site.fi, site.context, effect.deciding)
        else:
            for guard in site.guards:
                if guard.new.hw:
                    self._guard_evidence(guard)
            if site.ctx is not None and site.ctx.new.hw and site.context is not None:
                self._value_evidence(site.fi, site.context, site.ctx.new)

    def _guard_evidence(self, guard: Guard) -> None:
        if isinstance(guard.node, ast.Constant):  # a dispatch selection, already shown
            return
        self._value_evidence(guard.fi, guard.node, guard.new)

    def _value_evidence(self, fi: int, node: ast.expr, val: Val) -> None:
        text = ast.unparse(node)
        if len(text) > 90:
            text = text[:87] + "..."
        truth = val.truth()
        shown = "unknown" if truth is None else str(truth)
        where = "on this host" if val.hw else "with the edit"
        self._add("gate", fi, node.lineno, f"`{text}` is {shown} {where}")
        for trace in val.traces:
            self._trace(trace)

    def _trace(self, trace: Trace) -> None:
        role, fi, line, note = trace
        if fi < 0:
            self.evidence.append(Evidence(role="note", note=note))
        else:
            self._add("helper" if role != "call" else "call", fi, line, note)

    def _add(self, role: Any, fi: int, line: int, note: str, code: str | None = None) -> None:
        path = self.index.files[fi].path
        item = Evidence(
            role=role,
            file=path,
            line=line,
            code=code if code is not None else self.reader.line(fi, line),
            note=note,
        )
        if not any(e.where == item.where and e.role == item.role for e in self.evidence):
            self.evidence.append(item)

    def _finding(self, outcome: Outcome, reason: str) -> GateFinding:
        return GateFinding(
            engine=self.index.engine,
            version=self.index.version,
            flag=self.flag_name,
            value=self.raw_value,
            host=self.host.describe(),
            tp=self.tp,
            fields=sorted(self.edited),
            outcome=outcome,
            reason=reason,
            evidence=self.evidence,
        )


# a model architecture's class name: LlamaForCausalLM, IQuestQ1MTP, Qwen3VLModel
_ARCH = re.compile(r"^[A-Z][A-Za-z0-9]*(For[A-Z]\w*|Model|MTP|NextN)$")


def _picked(ev: Evaluator, body: list[ast.stmt], scope: Scope, name: str) -> Val | None:
    """The value a resolution branch gives field `name`: `return {"name": v}`,
    `x.name = v`, `overrides["name"] = v` or `declare_resolution(x, "why", name=v)`, after
    its local assignments."""
    for stmt in body:
        if isinstance(stmt, ast.Assign):
            target = stmt.targets[0]
            if (isinstance(target, ast.Attribute) and target.attr == name) or (
                isinstance(target, ast.Subscript)
                and isinstance(target.slice, ast.Constant)
                and target.slice.value == name
            ):
                return ev.expr(stmt.value, scope)
            assign(scope, stmt.targets, ev.expr(stmt.value, scope))
        elif isinstance(stmt, ast.Return) and isinstance(stmt.value, ast.Dict):
            for key, value in zip(stmt.value.keys, stmt.value.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == name:
                    return ev.expr(value, scope)
            return None
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            for kw in stmt.value.keywords:
                if kw.arg == name:
                    return ev.expr(kw.value, scope)
        else:
            return None
    return None


def _unconditional_write(
    ev: Evaluator, scope: Scope, body: list[ast.stmt], name: str
) -> tuple[ast.stmt, list[tuple[ast.expr, Val]]] | None:
    """`self.<name> = <constant>` reached through `if` bodies whose tests are true on this
    host (and read nothing of the edit), with nothing before it that may return or raise:
    the write and the tests."""
    for stmt in body:
        if (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Attribute)
            and stmt.targets[0].attr == name
            and isinstance(stmt.value, ast.Constant)
        ):
            return stmt, []
        if isinstance(stmt, ast.If) and not any(
            isinstance(n, ast.Attribute) and n.attr == name for n in ast.walk(stmt.test)
        ):
            inner = _unconditional_write(ev, scope, stmt.body, name)
            if inner is not None:
                val = ev.expr(stmt.test, scope)
                if val.truth() is True and val.hw:
                    return inner[0], [(stmt.test, val), *inner[1]]
                return None
        if any(isinstance(n, ast.Return | ast.Raise) for n in ast.walk(stmt)):
            return None
    return None


def _shown(site: ReadSite) -> bool:
    """Every guard of the read holds with the edit on this host: it runs whenever its
    function does."""
    return all_hold(g.holds_new for g in site.guards) is True


def _writes(node: ast.AST, name: str) -> bool:
    """`x.name = ...`, `name=...` in a call, or `{"name": ...}`."""
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
        return node.attr == name
    if isinstance(node, ast.keyword):
        return node.arg == name
    return isinstance(node, ast.Dict) and any(
        isinstance(k, ast.Constant) and k.value == name for k in node.keys
    )


def _leaves(body: list[ast.stmt]) -> bool:
    return any(isinstance(s, ast.Return | ast.Raise | ast.Continue | ast.Break) for s in body)


def _is_none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _equal(a: Any, b: Any) -> bool:
    if a is UNKNOWN or b is UNKNOWN:
        return False
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:
        return False


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
