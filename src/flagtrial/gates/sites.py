"""What a walk reports: a guard (a condition on a path, evaluated lazily with and without
the edit), a read of a field and a raise the edit reaches, with their guards; and what
surrounds a read in its expression (its boolean context, a logging call)."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from flagtrial.gates.values import Scope, Trace, Val

if TYPE_CHECKING:
    from flagtrial.gates.capability import Evaluator

LOG_CALLS = {
    "debug",
    "info",
    "warning",
    "warn",
    "error",
    "exception",
    "critical",
    "log",
    "print",
    "info_once",
    "warning_once",
    "debug_once",
    "print_warning_once",
    "print_info_once",
}


class Guard:
    """A condition on a path; `positive` says whether the path needs it true or false.

    `assumed`: it follows from an earlier `if x: raise` or `assert`; a run where it does not
    hold has already failed, so it does not make a later raise less certain."""

    def __init__(
        self,
        node: ast.expr,
        fi: int,
        positive: bool,
        tainted: bool,
        new: tuple[Evaluator, Scope] | Val,
        old: tuple[Evaluator, Scope] | Val,
        assumed: bool = False,
    ) -> None:
        self.node, self.fi, self.positive, self.tainted = node, fi, positive, tainted
        self._new, self._old = new, old
        self.assumed = assumed

    def negated(self) -> Guard:
        return Guard(self.node, self.fi, not self.positive, self.tainted, self._new, self._old)

    def assume(self, raised: bool) -> Guard:
        """This guard, `assumed` when the way around it was a raise."""
        if not raised:
            return self
        return Guard(self.node, self.fi, self.positive, self.tainted, self._new, self._old, True)

    @cached_property
    def new(self) -> Val:
        return (
            self._new if isinstance(self._new, Val) else self._new[0].expr(self.node, self._new[1])
        )

    @cached_property
    def old(self) -> Val:
        return (
            self._old if isinstance(self._old, Val) else self._old[0].expr(self.node, self._old[1])
        )

    def holds(self, val: Val) -> bool | None:
        truth = val.truth()
        return None if truth is None else truth == self.positive

    @property
    def holds_new(self) -> bool | None:
        return self.holds(self.new)

    @property
    def holds_old(self) -> bool | None:
        # An untainted guard reads nothing the edit changes: old is new.
        return self.holds(self.old if self.tainted else self.new)


def all_hold(values: Iterable[bool | None]) -> bool | None:
    """Three-valued conjunction, stopping at the first False."""
    result: bool | None = True
    for v in values:
        if v is False:
            return False
        if v is None:
            result = None
    return result


@dataclass(frozen=True)
class ReadSite:
    fi: int
    node: ast.expr  # the Attribute (or getattr call) that reads the field
    stmt: ast.stmt
    field: str
    guards: tuple[Guard, ...]
    context: ast.expr | None  # the enclosing comparison / boolean expression, if any
    ctx: Guard | None  # that context, evaluated like a guard (positive)
    parents: dict[int, ast.AST]
    scope_new: Scope
    runs_at_startup: bool
    scope_old: Scope | None = None


@dataclass(frozen=True)
class RaiseSite:
    fi: int
    stmt: ast.stmt  # a Raise, or the Assert that fails
    guards: tuple[Guard, ...]
    chain: tuple[Trace, ...]  # the calls followed to get here
    in_try: bool
    runs_at_startup: bool
    unit: tuple[int, int, int]  # where the walk that reached it began

    @cached_property
    def certain(self) -> bool:
        """Raises on every run of its function with the edit, not on every run without it,
        and because of the host: a guard that reads a host fact holds. A raise that only
        the configuration decides (`--enable-x does not support --y`) is left out."""
        guards = [g for g in self.guards if not g.assumed]
        if self.in_try or all_hold(g.holds_new for g in guards) is not True:
            return False
        if not any(g.new.hw for g in guards):
            return False
        return all_hold(g.holds_old for g in guards) is not True


def in_log_call(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    while id(node) in parents:
        node = parents[id(node)]
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in LOG_CALLS:
                return True
        if isinstance(node, ast.JoinedStr):
            return True
    return False


def boolean_context(node: ast.AST, parents: dict[int, ast.AST]) -> ast.expr | None:
    """The largest comparison / `and` / `or` / `not` expression around a read."""
    context: ast.expr | None = None
    while id(node) in parents:
        parent = parents[id(node)]
        if isinstance(parent, ast.Compare | ast.BoolOp) or (
            isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.Not)
        ):
            context = parent
            node = parent
        else:
            break
    return context
