"""The values the evaluator computes: a Python value or UNKNOWN, marked when a host fact decided
it (`hw`), with the definitions that decided it; the references it follows (functions,
classes, modules); the scope of locals a function body is read in."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flagtrial.gates.model import GateHost

if TYPE_CHECKING:
    from flagtrial.gates.capability import Evaluator

# (role, file index or -1, line, note): a link of the evidence chain, hashable.
Trace = tuple[str, int, int, str]


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


class _NotNone:
    """A value the host has but the facts do not give (the CUDA version when not told)."""

    def __repr__(self) -> str:
        return "<some value>"


UNKNOWN: Any = _Unknown()
NOT_NONE: Any = _NotNone()


class Capability(tuple[int, int]):
    """vLLM's DeviceCapability and torch's (major, minor) alike: a tuple with to_int()."""

    def to_int(self) -> int:
        return self[0] * 10 + self[1]


@dataclass(frozen=True)
class FuncRef:
    fi: int
    ni: int
    bound: tuple[tuple[str, Any], ...] = ()  # functools.partial keywords
    owner: Any = None  # the instance or class a method is bound to
    origin: Trace | None = None  # where this callable got its name (`x = partial(...)`)


@dataclass(frozen=True, eq=False)
class LambdaRef:
    """A `lambda` without parameters (vLLM's `environment_variables` table), with the
    scope it was written in: calling it evaluates its body there."""

    node: ast.Lambda
    scope: Scope


@dataclass(frozen=True)
class ClassRef:
    fi: int
    name: str


@dataclass(frozen=True)
class Instance:
    cls: ClassRef


@dataclass(frozen=True)
class ModuleRef:
    name: str


@dataclass(frozen=True)
class EnumMember:
    cls: str
    name: str
    # The member's value where the enum mixes in str or int (`class ConnectorType(str,
    # Enum)`): such a member compares equal to it.
    value: Any = field(default=UNKNOWN, compare=False)


@dataclass(frozen=True)
class Builtin:
    name: str
    bound: Any = None  # the receiver of a bound str/dict/tuple method


@dataclass(frozen=True)
class DeviceProps:
    """torch.cuda.get_device_properties(i): the facts the host gives, the rest unknown."""

    host: GateHost

    def attr(self, name: str) -> Any:
        cap = self.host.capability
        if name in ("major", "minor") and cap:
            return cap[0] if name == "major" else cap[1]
        if name == "gcnArchName":
            return (self.host.gfx or UNKNOWN) if self.host.platform == "rocm" else ""
        if name == "name":
            return self.host.gpu_name or UNKNOWN
        return UNKNOWN


@dataclass(frozen=True)
class Val:
    value: Any
    hw: bool = False
    traces: tuple[Trace, ...] = ()

    @property
    def known(self) -> bool:
        return self.value is not UNKNOWN

    def truth(self) -> bool | None:
        """True, False, or None when unknown."""
        v = self.value
        if v is UNKNOWN:
            return None
        if v is NOT_NONE:
            return True
        try:
            return bool(v)
        except Exception:
            return None


def join(*vals: Val) -> tuple[bool, tuple[Trace, ...]]:
    hw = any(v.hw for v in vals)
    traces: tuple[Trace, ...] = ()
    for v in vals:
        traces += tuple(t for t in v.traces if t not in traces)
    return hw, traces


def derived(value: Any, *vals: Val) -> Val:
    hw, traces = join(*vals)
    return Val(value, hw, traces)


PLAIN = (bool, int, float, str, type(None), tuple, Capability, frozenset)


class Lazy:
    """A local bound to an expression, evaluated only if something reads it."""

    __slots__ = ("_val", "ev", "item", "node", "scope")

    def __init__(self, ev: Evaluator, node: ast.expr, scope: Scope, item: int | None = None):
        self.ev, self.node, self.scope, self.item = ev, node, scope, item
        self._val: Val | None = None

    def force(self) -> Val:
        if self._val is None:
            self._val = Val(UNKNOWN)  # a self-reference while evaluating stays unknown
            val = self.ev.expr(self.node, self.scope)
            if self.item is not None:
                items = val.value if isinstance(val.value, tuple) else None
                val = derived(
                    items[self.item] if items and self.item < len(items) else UNKNOWN, val
                )
            self._val = val
        return self._val


@dataclass
class Scope:
    fi: int
    locals: dict[str, Val | Lazy] = field(default_factory=dict)
    cls: ClassRef | None = None  # for super() and class attributes
    owner: Any = None  # what `self` / `cls` is
    # Walked as part of argument resolution: a setting no binding gives reads as its
    # declared default there (the command leaves it out).
    startup: bool = False

    def snapshot(self) -> Scope:
        return Scope(self.fi, dict(self.locals), self.cls, self.owner, self.startup)


@dataclass(frozen=True)
class FieldBinding:
    """A field's value in this evaluation, optionally only through a receiver named like
    `attention_config` (vLLM's `AttentionConfig.backend` is too common a name otherwise)."""

    value: Any
    receiver: str | None = None


def assign(scope: Scope, targets: list[ast.expr], val: Val) -> None:
    """Bind simple names (and tuple unpacking of known tuples); other targets are ignored."""
    for target in targets:
        if isinstance(target, ast.Name):
            scope.locals[target.id] = val
        elif isinstance(target, ast.Tuple | ast.List):
            items = val.value if isinstance(val.value, tuple) else None
            for i, elt in enumerate(target.elts):
                if isinstance(elt, ast.Name):
                    known = items is not None and len(items) == len(target.elts)
                    item = items[i] if items is not None and known else UNKNOWN
                    scope.locals[elt.id] = derived(item, val)


def plain(value: Any) -> bool:
    return isinstance(value, PLAIN) and value is not UNKNOWN


def same(a: Val, b: Val) -> bool:
    if not (a.known and b.known):
        return False
    try:
        return bool(a.value == b.value) and type(a.value) is type(b.value)
    except Exception:
        return False
