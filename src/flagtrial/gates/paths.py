"""The guarded paths through one function: which conditions must hold for a statement to run.

A walk visits statements in order. Each point has guards: enclosing `if`/`elif`/`while`
tests, earlier early exits (`if x: return`) and asserts, and, inside an expression, the
earlier operands of an `and`/`or` chain and the test of a conditional expression. A guard is
evaluated (lazily, only when a finding needs it) twice: with the edit (`new`) and with the
field's default (`old`). The walk reports:

- `ReadSite`: a read of a field, with its guards and its boolean context (`x.f is None and y`);
- `RaiseSite`: a `raise` or an `assert` whose guards involve the edit, also inside functions
  the walk follows: calls whose arguments carry the edited value, or that run only because
  of it.

"Involve the edit" is decided syntactically (taint): a guard or argument reads an edited
field, or a local assigned from one. A raise no edited value reaches cannot be its doing.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from flagtrial.gates.capability import Evaluator
from flagtrial.gates.definitions import bind_import
from flagtrial.gates.interpret import bind
from flagtrial.gates.reader import StmtFacts, own_expressions
from flagtrial.gates.sites import (
    Guard,
    RaiseSite,
    ReadSite,
    all_hold,
    boolean_context,
    in_log_call,
)
from flagtrial.gates.values import UNKNOWN, FuncRef, Lazy, Scope, Trace, Val

MAX_CALL_DEPTH = 3
MAX_CALLEE_LINES = 600


@dataclass
class _State:
    guards: tuple[Guard, ...]
    new: Scope
    old: Scope
    tainted: set[str]  # locals assigned from an edited value
    in_try: bool
    depth: int
    chain: tuple[Trace, ...]
    runs_at_startup: bool  # the walk began in code that runs at every launch
    unit: tuple[int, int, int]  # (file, first line, last line) where the walk began

    def branch(self, guard: Guard | None) -> _State:
        return _State(
            self.guards + ((guard,) if guard else ()),
            self.new.snapshot(),
            self.old.snapshot(),
            set(self.tainted),
            self.in_try,
            self.depth,
            self.chain,
            self.runs_at_startup,
            self.unit,
        )


@dataclass
class Walker:
    """Walks units for one query; the two evaluators hold the `new` and `old` field values."""

    ev_new: Evaluator
    ev_old: Evaluator
    fields: frozenset[str]  # fields whose reads are reported
    mentions: set[tuple[int, int]]  # (file, line) where the index saw one of them
    reads: list[ReadSite] = field(default_factory=list)
    raises: list[RaiseSite] = field(default_factory=list)
    budget: int = 200  # functions followed into
    _seen: set[tuple[int, int, bool]] = field(default_factory=set)

    def walk_unit(
        self,
        fi: int,
        stmts: list[ast.stmt],
        guards: tuple[Guard, ...] = (),
        runs_at_startup: bool = False,
    ) -> None:
        """A function unit walks its body with unknown parameters; a statement unit, itself.

        `runs_at_startup`: the caller knows this code runs at every launch with the edit
        (argument resolution, a function registered for the value); only there is a certain
        raise a certain startup failure."""
        new, old = Scope(fi, startup=runs_at_startup), Scope(fi, startup=runs_at_startup)
        body = stmts
        if len(stmts) == 1 and isinstance(stmts[0], ast.FunctionDef | ast.AsyncFunctionDef):
            a = stmts[0].args
            fn = next(
                (f for f in self.ev_new.index.files[fi].funcs if f.start == stmts[0].lineno), None
            )
            own = (
                self.ev_new.model_self(fi, fn.cls)
                if fn and "staticmethod" not in fn.decorators
                else None
            )
            for p in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg):
                if p is not None:
                    # `def f(server_args, hf_config)`: the model's config when it is known
                    model = self.ev_new.model_param(p.arg)
                    new.locals[p.arg] = old.locals[p.arg] = model or Val(UNKNOWN)
            if own is not None and a.args:
                new.locals[a.args[0].arg] = old.locals[a.args[0].arg] = own
            body = stmts[0].body
        unit = (
            (fi, stmts[0].lineno, stmts[-1].end_lineno or stmts[-1].lineno) if stmts else (fi, 0, 0)
        )
        self._block(body, _State(guards, new, old, set(), False, 0, (), runs_at_startup, unit))

    # ------------------------------------------------------------- statements

    def _block(self, stmts: list[ast.stmt], st: _State) -> str | None:
        """Walk a block: "raise" when it always raises, "leave" when it always leaves
        (return/continue/break or raise), None when it can fall through."""
        reader = self.ev_new.reader
        for stmt in stmts:
            facts = reader.facts(stmt) if self._hot(stmt, st) else None
            if facts is not None:
                self._expressions(facts, stmt, st)
            left = self._statement(stmt, facts, st)
            if left:
                return left
        return None

    def _statement(self, stmt: ast.stmt, facts: StmtFacts | None, st: _State) -> str | None:
        """One statement of a block; "raise" or "leave" when the block ends with it."""
        match stmt:
            case ast.If():
                return self._if(stmt, facts, st)
            case ast.Assert(test=test):
                guard = self._guard(test, False, facts, st)
                self._raise(stmt, (*st.guards, guard), st)
                st.guards += (guard.negated().assume(True),)
            case ast.Raise():
                self._raise(stmt, st.guards, st)
                return "raise"
            case ast.Return() | ast.Continue() | ast.Break():
                return "leave"
            case ast.Assign(targets=targets, value=value):
                self._assign(targets, value, facts, st)
            case ast.AnnAssign(target=target, value=value) if value is not None:
                self._assign([target], value, facts, st)
            case ast.AugAssign():
                self._forget(st, stmt)
            case ast.Import() | ast.ImportFrom():
                bind_import(self.ev_new, st.new, stmt)
                bind_import(self.ev_old, st.old, stmt)
            case ast.For() | ast.AsyncFor() | ast.While():
                test = stmt.test if isinstance(stmt, ast.While) else stmt.iter
                loop = Guard(test, st.new.fi, True, False, Val(UNKNOWN), Val(UNKNOWN))
                self._forget(st, stmt)
                self._block(stmt.body, st.branch(loop))
                self._forget(st, stmt)
            case ast.With() | ast.AsyncWith():
                return self._block(stmt.body, st)
            case ast.Try() | ast.TryStar():
                self._try(stmt, st)
            case ast.Match():
                for case in stmt.cases:
                    unknown = Guard(
                        stmt.subject, st.new.fi, True, False, Val(UNKNOWN), Val(UNKNOWN)
                    )
                    self._block(case.body, st.branch(unknown))
                self._forget(st, stmt)
        return None

    def _if(self, stmt: ast.If, facts: StmtFacts | None, st: _State) -> str | None:
        guard = self._guard(stmt.test, True, facts, st)
        left_body = self._block(stmt.body, st.branch(guard))
        left_else = self._block(stmt.orelse, st.branch(guard.negated())) if stmt.orelse else None
        self._forget(st, stmt)
        if left_body and left_else:
            return "raise" if left_body == left_else == "raise" else "leave"
        if left_body:
            st.guards += (guard.negated().assume(left_body == "raise"),)
        elif left_else:
            st.guards += (guard.assume(left_else == "raise"),)
        return None

    def _try(self, stmt: ast.Try | ast.TryStar, st: _State) -> None:
        inner = st.branch(None)
        inner.in_try = True
        self._block(stmt.body, inner)
        for handler in stmt.handlers:
            self._block(handler.body, inner)
        self._forget(st, stmt)
        self._block(stmt.orelse, st.branch(None))
        self._block(stmt.finalbody, st)

    def _hot(self, stmt: ast.stmt, st: _State) -> bool:
        """Whether a statement can involve the edit: it mentions an edited field, uses a
        tainted local, or runs on a path that depends on the edit. Others are only walked."""
        if st.tainted or st.depth > 0 or any(g.tainted for g in st.guards):
            return True
        fi = st.new.fi
        for root in own_expressions(stmt):
            end = root.end_lineno or root.lineno
            if any((fi, line) in self.mentions for line in range(root.lineno, end + 1)):
                return True
        return False

    def _is_tainted(self, facts: StmtFacts | None, node: ast.AST, st: _State) -> bool:
        """Whether `node` reads an edited value (never, in a statement that is not hot)."""
        if facts is None or not (st.tainted or self.fields & facts.attrs.keys()):
            return False
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and sub.id in st.tainted:
                return True
            if isinstance(sub, ast.Attribute) and sub.attr in self.fields:
                return True
            if isinstance(sub, ast.Constant) and sub.value in self.fields:
                return True  # getattr(x, "field")
        return False

    def _guard(self, test: ast.expr, positive: bool, facts: StmtFacts | None, st: _State) -> Guard:
        tainted = self._is_tainted(facts, test, st)
        return Guard(
            test,
            st.new.fi,
            positive,
            tainted,
            (self.ev_new, st.new.snapshot()),
            (self.ev_old, st.old.snapshot()),
        )

    def _assign(
        self, targets: list[ast.expr], value: ast.expr, facts: StmtFacts | None, st: _State
    ) -> None:
        tainted = self._is_tainted(facts, value, st)
        if not tainted and st.runs_at_startup and isinstance(value, ast.Call):
            # `backends = attention_backends_of(view)`: a helper that reads the edited
            # setting carries its value.
            tainted = self._reads_edit(value, st)
        new_scope, old_scope = st.new.snapshot(), st.old.snapshot()
        for target in targets:
            names: list[tuple[str, int | None]] = []
            if isinstance(target, ast.Name):
                names.append((target.id, None))
            elif isinstance(target, ast.Tuple | ast.List):
                names += [(e.id, i) for i, e in enumerate(target.elts) if isinstance(e, ast.Name)]
            for name, item in names:
                st.new.locals[name] = Lazy(self.ev_new, value, new_scope, item)
                st.old.locals[name] = Lazy(self.ev_old, value, old_scope, item)
                (st.tainted.add if tainted else st.tainted.discard)(name)

    def _reads_edit(self, call: ast.Call, st: _State) -> bool:
        """Whether the function a call resolves to reads an edited field itself."""
        ref = self.ev_new.expr(call.func, st.new).value
        if not isinstance(ref, FuncRef):
            return False
        fn = self.ev_new.index.func((ref.fi, ref.ni))
        return any((ref.fi, line) in self.mentions for line in range(fn.start, fn.end + 1))

    def _forget(self, st: _State, stmt: ast.stmt) -> None:
        """Names a branch or loop may have rebound are unknown after it."""
        for name in self.ev_new.reader.stores(stmt):
            st.new.locals[name] = st.old.locals[name] = Val(UNKNOWN)
            st.tainted.discard(name)

    def _raise(self, stmt: ast.stmt, guards: tuple[Guard, ...], st: _State) -> None:
        # Inside a followed call the path itself involves the edit; elsewhere a guard must.
        if st.depth > 0 or any(g.tainted for g in guards):
            self.raises.append(
                RaiseSite(st.new.fi, stmt, guards, st.chain, st.in_try, st.runs_at_startup, st.unit)
            )

    # ------------------------------------------------------------- expressions

    def _expressions(self, facts: StmtFacts, stmt: ast.stmt, st: _State) -> None:
        if st.depth == 0:
            for name in sorted(self.fields & facts.attrs.keys()):
                for node in facts.attrs[name]:
                    if self.ev_new.field_value(node) is not None:
                        self._read(node, name, stmt, facts, st)
        if st.depth < MAX_CALL_DEPTH and self.budget > 0:
            for call in facts.calls:
                self._maybe_follow(call, facts, st)

    def _read(
        self, node: ast.expr, name: str, stmt: ast.stmt, facts: StmtFacts, st: _State
    ) -> None:
        if in_log_call(node, facts.parents):
            return
        context = boolean_context(node, facts.parents)
        top = context or node
        guards = st.guards + self._expr_guards(top, facts, st)
        ctx = self._guard(context, True, facts, st) if context is not None else None
        self.reads.append(
            ReadSite(
                st.new.fi,
                node,
                stmt,
                name,
                guards,
                context,
                ctx,
                facts.parents,
                st.new.snapshot(),
                st.runs_at_startup,
                st.old.snapshot(),
            )
        )

    def _expr_guards(self, target: ast.AST, facts: StmtFacts, st: _State) -> tuple[Guard, ...]:
        """Conditions inside the expression: earlier `and`/`or` operands, `x if c else y`."""
        guards: list[Guard] = []
        child = target
        while id(child) in facts.parents:
            parent = facts.parents[id(child)]
            if isinstance(parent, ast.BoolOp):
                for operand in parent.values:
                    if operand is child:
                        break
                    guards.append(self._guard(operand, isinstance(parent.op, ast.And), facts, st))
            elif isinstance(parent, ast.IfExp) and child is not parent.test:
                guards.append(self._guard(parent.test, child is parent.body, facts, st))
            child = parent
        return tuple(reversed(guards))

    def _maybe_follow(self, call: ast.Call, facts: StmtFacts, st: _State) -> None:
        """Follow a call into its definition when the edit decides what it does: an argument
        carries an edited value, or the call runs only with the edit."""
        args = [*call.args, *(k.value for k in call.keywords)]
        carries = any(self._is_tainted(facts, a, st) for a in args)
        if not carries and not any(g.tainted for g in st.guards):
            return
        if in_log_call(call, facts.parents):
            return
        guards = st.guards + self._expr_guards(call, facts, st)
        # an assumed guard that fails means an earlier raise: the run fails either way
        if all_hold(g.holds_new for g in guards if not g.assumed) is not True:
            return
        if not carries and all_hold(g.holds_old for g in guards) is True:
            return
        if any(isinstance(a, ast.Starred) for a in call.args) or any(
            k.arg is None for k in call.keywords
        ):
            return
        ref = self.ev_new.expr(call.func, st.new).value
        if not isinstance(ref, FuncRef):
            return
        fn = self.ev_new.index.func((ref.fi, ref.ni))
        key = (ref.fi, ref.ni, carries)
        if fn.end - fn.start > MAX_CALLEE_LINES or key in self._seen:
            return
        self._seen.add(key)
        stmts = self.ev_new.reader.unit(ref.fi, fn.start, fn.end)
        if not stmts or not isinstance(stmts[0], ast.FunctionDef | ast.AsyncFunctionDef):
            return
        self.budget -= 1
        args_new = [self.ev_new.expr(a, st.new) for a in call.args]
        args_old = [self.ev_old.expr(a, st.old) for a in call.args]
        kw_new = {k.arg: self.ev_new.expr(k.value, st.new) for k in call.keywords if k.arg}
        kw_old = {k.arg: self.ev_old.expr(k.value, st.old) for k in call.keywords if k.arg}
        new = bind(self.ev_new, ref, stmts[0], args_new, kw_new)
        old = bind(self.ev_old, ref, stmts[0], args_old, kw_old)
        new.startup = old.startup = st.runs_at_startup
        tainted = {
            name
            for name, a, b in ((n, new.locals[n], old.locals.get(n)) for n in new.locals)
            if isinstance(a, Val) and isinstance(b, Val) and not _same_val(a, b)
        }
        code = self.ev_new.reader.line(st.new.fi, call.lineno)
        link: Trace = ("call", st.new.fi, call.lineno, code)
        inner = _State(
            guards,
            new,
            old,
            tainted,
            st.in_try,
            st.depth + 1,
            (*st.chain, link),
            st.runs_at_startup,
            st.unit,
        )
        self._block(stmts[0].body, inner)


def _same_val(a: Val, b: Val) -> bool:
    if not (a.known and b.known):
        return a.value is b.value
    try:
        return bool(a.value == b.value)
    except Exception:
        return False
