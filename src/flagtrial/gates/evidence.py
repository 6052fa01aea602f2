"""The evidence chain of a finding: the flag, its field, the reads, gates, helpers and
raises that decided it, each with its file:line and code, added once each."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

from flagtrial.gates.index import SourceIndex
from flagtrial.gates.model import Evidence
from flagtrial.gates.reader import SourceReader
from flagtrial.gates.reads import Effect
from flagtrial.gates.sites import Guard, RaiseSite
from flagtrial.gates.values import Trace, Val


@dataclass
class Chain:
    index: SourceIndex
    reader: SourceReader
    items: list[Evidence] = field(default_factory=list)

    def raise_reason(self, site: RaiseSite) -> str:
        code = self.reader.line(site.fi, site.stmt.lineno)
        kind = "assert fails" if isinstance(site.stmt, ast.Assert) else code.split("(")[0]
        return f"{kind} at {self.index.files[site.fi].path}:{site.stmt.lineno} on this host"

    def raised(self, site: RaiseSite) -> None:
        for role, fi, line, code in site.chain:
            self.add(role, fi, line, "followed with the edited value", code=code)
        for guard in site.guards:
            if not guard.assumed:
                self.guard(guard)
        self.add("raise", site.fi, site.stmt.lineno, "raised with the edit")

    def read(self, effect: Effect) -> None:
        site = effect.site
        status = {
            "alive": "acts on this host",
            "hw": "ruled out on this host",
            "foreign": "ruled out on this host",
            "value": "no difference",
        }[effect.status]
        self.add("read", site.fi, site.node.lineno, f"reads {site.field}: {status}")
        if effect.status == "foreign" and effect.deciding is not None:
            for trace in effect.deciding.traces:
                self.trace(trace)
            return
        if effect.guard is not None:
            self.guard(effect.guard)
        elif effect.deciding is not None and site.context is not None:
            self.value(site.fi, site.context, effect.deciding)
        else:
            for guard in site.guards:
                if guard.new.hw:
                    self.guard(guard)
            if site.ctx is not None and site.ctx.new.hw and site.context is not None:
                self.value(site.fi, site.context, site.ctx.new)
            elif effect.status == "hw" and effect.deciding is not None:
                for trace in effect.deciding.traces:  # what rules it out beyond its guards
                    self.trace(trace)

    def guard(self, guard: Guard) -> None:
        if isinstance(guard.node, ast.Constant):  # a dispatch selection, already shown
            return
        self.value(guard.fi, guard.node, guard.new)

    def value(self, fi: int, node: ast.expr, val: Val) -> None:
        text = ast.unparse(node)
        if len(text) > 90:
            text = text[:87] + "..."
        truth = val.truth()
        shown = "unknown" if truth is None else str(truth)
        where = "on this host" if val.hw else "with the edit"
        self.add("gate", fi, node.lineno, f"`{text}` is {shown} {where}")
        for trace in val.traces:
            self.trace(trace)

    def trace(self, trace: Trace) -> None:
        role, fi, line, note = trace
        if fi < 0:
            self.items.append(Evidence(role="note", note=note))
        else:
            self.add("helper" if role != "call" else "call", fi, line, note)

    def add(self, role: Any, fi: int, line: int, note: str, code: str | None = None) -> None:
        path = self.index.files[fi].path
        item = Evidence(
            role=role,
            file=path,
            line=line,
            code=code if code is not None else self.reader.line(fi, line),
            note=note,
        )
        if not any(e.where == item.where and e.role == item.role for e in self.items):
            self.items.append(item)

    def function_at(self, fi: int, line: int) -> str:
        funcs = [f for f in self.index.files[fi].funcs if f.start <= line <= f.end]
        if not funcs:
            return "this module"
        fn = max(funcs, key=lambda f: f.start)
        return f"{fn.cls}.{fn.name}()" if fn.cls else f"{fn.name}()"
