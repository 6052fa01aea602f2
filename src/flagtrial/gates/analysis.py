"""The state of one edit's analysis: the flag's field and value bound with and without the
edit (and the fields it maps to, found in argument resolution), the command's other flags
and the host's facts; the walk of every function that mentions them, in the order that
reaches startup code first; the functions registered for the value. The outcome is decided
in gates/decide.py."""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from typing import Any

from flagtrial.gates.capability import Evaluator
from flagtrial.gates.decide import decide
from flagtrial.gates.evidence import Chain
from flagtrial.gates.index import SourceIndex
from flagtrial.gates.model import Evidence, GateFinding, GateHost, ModelFacts, Outcome
from flagtrial.gates.modelfiles import ARCHITECTURE, other_model
from flagtrial.gates.paths import Walker
from flagtrial.gates.platforms import foreign_module, platform_module
from flagtrial.gates.reader import SourceReader
from flagtrial.gates.reads import consumer
from flagtrial.gates.sites import Guard, ReadSite
from flagtrial.gates.values import UNKNOWN, FieldBinding, Val
from flagtrial.sourceread.fields import UNSET, FieldDef
from flagtrial.sourceread.flags import canonical, switch_value
from flagtrial.sourceread.modules import module_name

MAX_MAPPING_ROUNDS = 3
# Fields named like `dtype` or `device` are read in thousands of places; past this many
# functions the walk stops, and the outcome says so (a no-op is then never claimed).
MAX_UNITS = 150


def convert(value: str | None, fdef: FieldDef | None) -> Any:
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


def flag_value(flag: dict[str, Any], used: str, value: str | None, fdef: FieldDef | None) -> Any:
    if flag["nargs"] == 0:
        return switch_value(flag, used)
    return convert(value, fdef)


def json_value(value: str | None) -> Any:
    """A dotted config key's value, parsed as the engine does: JSON, else the string."""
    if value is None:
        return True
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def snake(name: str) -> str:
    out = [("_" + c.lower()) if c.isupper() else c for c in name]
    return "".join(out).lstrip("_")


@dataclass
class Analysis:
    """One edit on one host: its bindings with and without the edit, the walk of every
    function that mentions them, and the evidence chain of the finding."""

    index: SourceIndex
    reader: SourceReader
    host: GateHost
    tp: int
    flag_name: str
    raw_value: str | None
    others: dict[str, Any] = field(default_factory=dict)  # the command's other flags
    model: ModelFacts | None = None
    env: dict[str, str] = field(default_factory=dict)  # what the launch's environment sets
    new: dict[str, FieldBinding] = field(default_factory=dict)
    old: dict[str, FieldBinding] = field(default_factory=dict)
    facts: set[str] = field(default_factory=set)  # fields known from the host, not edited
    skipped: int = 0  # functions mentioning a field that were not walked (MAX_UNITS)
    selected: dict[str, None] = field(default_factory=dict)  # functions the value selects
    dest: str = ""  # the field the flag sets
    path: tuple[str, ...] = ()  # a dotted key's path: ("compilation_config", "pass_config", "x")
    chain: Chain = field(init=False)

    def __post_init__(self) -> None:
        self.chain = Chain(self.index, self.reader)

    def run(self) -> GateFinding:
        option = self.flag_name
        # vLLM's dotted form sets one key of a JSON config flag:
        # `--compilation-config.pass_config.fuse_rope_kvcache=true`.
        base, *keys = option.split(".") if option.startswith("--") else (option,)
        flag = self.index.table.lookup(base)
        if flag is None or (keys and flag["nargs"] == 0):
            return self.finding(
                Outcome.UNKNOWN,
                f"{option} is not a flag of {self.index.engine} {self.index.version}",
            )
        self._bind(flag, base, keys)
        walker = self._walk_until_stable()
        return decide(self, walker)

    def _bind(self, flag: dict[str, Any], option: str, keys: list[str]) -> None:
        table = self.index.table
        if keys:
            dest = keys[-1]
            self.path = (flag["dest"], *keys)
            fdef = table.field(dest)
            value = json_value(self.raw_value)
            # A name several config classes declare is read through its parent's name.
            ambiguous = table.declared.get(dest, 0) > 1 and len(keys) > 1
            receiver = keys[-2] if ambiguous else None
        else:
            dest = flag["dest"]
            fdef = table.field(dest)
            value = flag_value(flag, option, self.raw_value, fdef)
            receiver = None
        where, line = (flag.get("registered") or flag["where"]).rsplit(":", 1)
        file = f"{self.index.layout.package}/{where}"
        self.chain.items.append(
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
            self._set(config_field, value, cdef, snake(owner))
        known = {t: self.tp for t in self.index.layout.tp_fields} | self.others
        for name, val in known.items():
            if name not in self.new:
                self.new[name] = self.old[name] = FieldBinding(val)
                self.facts.add(name)

    def _set(self, name: str, value: Any, fdef: FieldDef | None, receiver: str | None) -> None:
        self.new[name] = FieldBinding(value, receiver)
        self.old[name] = FieldBinding(fdef.default if fdef else UNSET, receiver)
        if fdef:
            self.chain.items.append(
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
            walker = self.walk()
            derived = self._mappings(walker)
            fresh = {k: v for k, v in derived.items() if k not in self.new}
            if not fresh:
                return walker
            for name, (val, site) in fresh.items():
                fdef = self.index.table.field(name)
                self.chain.items.append(
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

    def walk(self, *, everything_default: bool = False) -> Walker:
        ev_new, ev_old = (
            Evaluator(
                self.index,
                self.reader,
                self.host,
                bound,
                model=self.model,
                env=self.env,
                resolution_defaults=self.defaults(bound, all_fields=everything_default),
            )
            for bound in (self.new, self.old)
        )
        units: dict[tuple[int, int, int], None] = {}
        lines: set[tuple[int, int]] = set()
        for name in sorted(self.edited):
            receiver = self.new[name].receiver
            for fi, line, start, end in self.index.mentions.get(name, []):
                # read only through `<receiver>.name`: a unit that never names the
                # receiver holds no read of it (vLLM's `attention_config.backend`)
                if receiver and not self._names(fi, start, end, receiver):
                    continue
                units[(fi, start, end)] = None
                lines.add((fi, line))
        walker = Walker(ev_new, ev_old, self.edited, lines)
        # Argument resolution first and always whole: a startup failure there is never
        # among the functions left unwalked; elsewhere code on this platform comes first.
        ranked = sorted(
            units, key=lambda u: (not self.startup_file(u[0]), self.foreign(u[0]) is not None)
        )
        startup = sum(1 for u in ranked if self.startup_file(u[0]))
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

    def _names(self, fi: int, start: int, end: int, word: str) -> bool:
        return any(word in line for line in self.reader.lines(fi)[start - 1 : end])

    def _other_models(self, fi: int, start: int) -> bool:
        """A function registered for model architectures (`@_register_for("IQuestQ1ForCausalLM")`)
        that do not include this model's: it never runs for it."""
        if self.model is None or not self.model.architectures:
            return False
        fn = next((f for f in self.index.files[fi].funcs if f.start == start), None)
        if fn is None or not fn.dispatch or not all(ARCHITECTURE.match(k) for k in fn.dispatch):
            return False
        return not set(fn.dispatch) & set(self.model.architectures)

    def platform_hook(self, fi: int, line: int) -> bool:
        """Inside `check_and_update_config` of the class the host's runtime selects (vLLM's
        `CpuPlatform` on a CPU host): it runs at every launch, and only on this platform."""
        module = platform_module(self.index, self.host.platform)
        if module is None or self.index.files[fi].module != module:
            return False
        return any(
            f.name == "check_and_update_config" and f.start <= line <= f.end
            for f in self.index.files[fi].funcs
        )

    def startup_file(self, fi: int) -> bool:
        path = self.index.files[fi].path.removeprefix(self.index.layout.package + "/")
        return path.startswith(self.index.layout.startup_paths)

    def foreign(self, fi: int, line: int | None = None) -> str | None:
        """Why code at `line` of file `fi` never runs here (another platform's module, another
        model's), or None when it may."""
        why = foreign_module(self.index, self.reader, fi, self.host)
        if why is None and self.model is not None and self._builds_named_model():
            why = other_model(self.index, self.reader, fi, line, self.model)
        return why

    def _builds_named_model(self) -> bool:
        """Only the classes config.json's architectures name are built: no draft model
        (speculative decoding) and no other implementation (`--model-impl transformers`)."""
        settings = {**self.others, **{name: self.new[name].value for name in self.edited}}
        return not any(
            ("speculative" in name and value not in (None, False, ""))
            or (name == "model_impl" and value not in (None, "auto"))
            for name, value in settings.items()
        )

    def _runs_at_startup(self, fi: int, stmts: list[ast.stmt]) -> bool:
        """Argument resolution runs at every launch; so does the function that resolves a
        field (`resolve_flashinfer_allreduce_fusion_backend`) once the field is set. Other
        code (a kernel's constructor, a model's layer) runs only where it is selected."""
        if self.startup_file(fi):
            return True
        node = stmts[0] if len(stmts) == 1 else None
        if node is not None and self.platform_hook(fi, node.lineno):
            return True
        name = node.name if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) else ""
        return any(f in name for f in self.edited)

    def _dispatched(self, ev_new: Evaluator, ev_old: Evaluator) -> list[tuple[int, int, Guard]]:
        """Functions registered under the edited value: `@register_attention_backend("fa3")`
        runs when `attention_backend` is "fa3" (the registrar names the field)."""
        found = []
        for name in sorted(self.edited):
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
                self.chain.add("dispatch", fi, fn.start, note)
                self.selected[f"{fn.name}() at {self.index.files[fi].path}:{fn.start}"] = None
        return found

    def _mappings(self, walker: Walker) -> dict[str, tuple[Val, ReadSite]]:
        derived: dict[str, tuple[Val, ReadSite]] = {}
        for site in walker.reads:
            # Only argument resolution maps one setting to another: elsewhere `dtype=x.f`
            # passes a value to a kernel, not to the `dtype` setting.
            if not site.runs_at_startup:
                continue
            kind, writes = consumer(site, self.index.table.fields, self.new)
            if kind != "mapping":
                continue
            for name, node in writes.items():
                # A name several config classes declare (vLLM's `backend`) says nothing.
                if self.index.table.declared.get(name) != 1:
                    continue
                if name not in self.new and name not in derived:
                    derived[name] = (walker.ev_new.expr(node, site.scope_new), site)
        return derived

    def defaults(
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

    def platform_evaluator(self) -> Evaluator:
        """An Evaluator of the command without the edit, every setting it leaves out at its
        declared default: what the platform's own pick is computed with."""
        return Evaluator(
            self.index,
            self.reader,
            self.host,
            self.old,
            model=self.model,
            env=self.env,
            defaults=self.defaults(self.old, all_fields=True),
        )

    def where(self, site: ReadSite) -> str:
        return f"{self.index.files[site.fi].path}:{site.node.lineno}"

    def finding(
        self, outcome: Outcome, reason: str, unless_raised: Outcome | None = None
    ) -> GateFinding:
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
            evidence=self.chain.items,
            unless_raised=unless_raised,
        )
