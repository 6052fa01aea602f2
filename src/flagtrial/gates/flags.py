"""Which internal field a command-line flag sets, read from the engine's own registration code.

Two registration styles are read, both as the engines write them:

- annotated fields (SGLang 0.5.23: `name: A[T, "help"]` or `A[T, Arg(cli_name=, aliases=,
  no_cli=)]` in `srt/arg_groups/fields/*.py`, turned into `--name` by
  `add_cli_args_from_dataclass`), and plain config dataclass fields (vLLM `config/*.py`);
- explicit `parser.add_argument("--x", ...)` calls (SGLang's deprecated spellings in
  `srt/server_args.py`; vLLM's `engine/arg_utils.py`, where `**model_kwargs["name"]` says which
  config field the flag's value lands in).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

FlagAction = Literal["value", "true", "false", "const", "bool_optional"]


class Unset:
    """A default that is not a literal (computed, a factory): never equal to a known value."""

    _instance: Unset | None = None

    def __new__(cls) -> Unset:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<computed>"

    def __reduce__(self) -> str:
        return "UNSET"


UNSET = Unset()


@dataclass(frozen=True)
class FieldDef:
    """An internal setting: where it is declared, its literal default, its value kind."""

    name: str
    file: str
    line: int
    owner: str
    default: object = UNSET
    kind: str = "other"  # bool, int, float, str or other: how a command-line value converts


@dataclass(frozen=True)
class FlagDef:
    """One command-line option and the field it sets."""

    names: tuple[str, ...]
    dest: str
    file: str
    line: int
    action: FlagAction = "value"
    const: object = None
    # vLLM: the config field (`AttentionConfig.backend`) that receives the value of `dest`.
    config_field: str | None = None
    config_owner: str | None = None

    @property
    def canonical(self) -> str:
        return next((n for n in self.names if n.startswith("--")), self.names[0])


@dataclass(frozen=True)
class EngineLayout:
    """Where one engine keeps its flags and fields, and what its source tree holds."""

    package: str
    # Globs (relative to the package) of files declaring annotated or dataclass fields.
    field_files: tuple[str, ...]
    # Files with explicit add_argument calls.
    argparse_files: tuple[str, ...]
    # Whether every annotated field in field_files is a flag (SGLang's auto-registration).
    annotated_fields_are_flags: bool
    # Classes whose dataclass fields each become `--field-name` (vLLM's frontend args).
    dataclass_flag_classes: tuple[str, ...] = ()
    # Subtrees not part of the server that launches with these flags.
    exclude: tuple[str, ...] = ()
    # Fields that hold the tensor-parallel size (known from the host facts).
    tp_fields: tuple[str, ...] = ()
    # Code that runs at every launch (argument resolution and validation), relative to the
    # package: a certain raise there is a certain startup failure.
    startup_paths: tuple[str, ...] = ()
    # Objects chosen at run time (plugin discovery), bound per host runtime:
    # name -> (module defining it, {runtime: "module:Class"}).
    platform_objects: dict[str, tuple[str, dict[str, str]]] = field(default_factory=dict)


LAYOUTS: dict[str, EngineLayout] = {
    "sglang": EngineLayout(
        package="sglang",
        # 0.5.23 declares fields in namespace classes; 0.5.10 in the ServerArgs dataclass.
        field_files=("srt/arg_groups/fields/*.py", "srt/server_args.py"),
        argparse_files=("srt/server_args.py",),
        annotated_fields_are_flags=True,
        # multimodal_gen is the separate diffusion server with its own arguments; test and
        # benchmark code never runs in `sglang.launch_server`.
        exclude=("test", "multimodal_gen", "benchmark"),
        tp_fields=("tp_size",),
        startup_paths=("srt/arg_groups/", "srt/server_args.py"),
    ),
    "vllm": EngineLayout(
        package="vllm",
        field_files=("config/*.py", "engine/arg_utils.py", "entrypoints/common/cli_args.py"),
        argparse_files=("engine/arg_utils.py", "entrypoints/common/cli_args.py"),
        annotated_fields_are_flags=False,
        dataclass_flag_classes=("BaseFrontendArgs", "FrontendArgs"),
        exclude=("benchmarks", "third_party"),
        tp_fields=("tensor_parallel_size",),
        startup_paths=("engine/arg_utils.py", "config/"),
        platform_objects={
            "current_platform": (
                "vllm.platforms",
                {
                    "cuda": "vllm.platforms.cuda:NvmlCudaPlatform",
                    "rocm": "vllm.platforms.rocm:RocmPlatform",
                },
            )
        },
    ),
}


@dataclass
class FlagTable:
    """Every flag and field of one engine version."""

    flags: dict[str, FlagDef] = field(default_factory=dict)  # by every option string
    fields: dict[str, FieldDef] = field(default_factory=dict)  # the first declaration by name
    by_owner: dict[str, dict[str, FieldDef]] = field(default_factory=dict)
    declared: dict[str, int] = field(default_factory=dict)  # how many classes declare a name

    def field(self, name: str, owner: str | None = None) -> FieldDef | None:
        if owner is not None and name in self.by_owner.get(owner, {}):
            return self.by_owner[owner][name]
        return self.fields.get(name)

    def lookup(self, name: str) -> FlagDef | None:
        """An option string, or an unambiguous prefix (argparse's allow_abbrev)."""
        if name in self.flags:
            return self.flags[name]
        matches = {id(f): f for n, f in self.flags.items() if n.startswith(name)}
        return next(iter(matches.values())) if len(matches) == 1 else None


def _literal(node: ast.expr | None) -> object:
    if node is None:
        return UNSET
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return UNSET


def _kind(annotation: ast.expr) -> str:
    """bool/int/float/str from `Optional[int]`, `int | None`, `A[bool, ...]`, `Literal["a"]`."""
    names = {n.id for n in ast.walk(annotation) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(annotation) if isinstance(n, ast.Attribute)}
    consts = [
        n.value for n in ast.walk(annotation) if isinstance(n, ast.Constant) and n.value is not None
    ]
    for kind in ("bool", "int", "float"):
        if kind in names:
            return kind
    if "str" in names or ("Literal" in names and all(isinstance(c, str) for c in consts)):
        return "str"
    return "other"


def _annotated_meta(annotation: ast.expr) -> tuple[ast.expr, ast.expr | None] | None:
    """(type, metadata) of `A[T, meta]` / `Annotated[T, meta]`; None for a plain annotation."""
    if not isinstance(annotation, ast.Subscript):
        return None
    head = annotation.value
    head_name = head.id if isinstance(head, ast.Name) else getattr(head, "attr", "")
    if head_name not in ("A", "Annotated") or not isinstance(annotation.slice, ast.Tuple):
        return None
    elts = annotation.slice.elts
    return elts[0], (elts[1] if len(elts) > 1 else None)


def _keywords(call: ast.Call) -> dict[str, ast.expr]:
    return {k.arg: k.value for k in call.keywords if k.arg}


def _strings(node: ast.expr | None) -> tuple[str, ...]:
    if isinstance(node, ast.List | ast.Tuple):
        return tuple(e.value for e in node.elts if isinstance(e, ast.Constant) and e.value)
    return ()


def _flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


class _FlagReader:
    def __init__(self, layout: EngineLayout, table: FlagTable) -> None:
        self.layout = layout
        self.table = table

    def add(self, flag: FlagDef) -> None:
        for name in flag.names:
            # The first registration wins, as argparse refuses a second one.
            self.table.flags.setdefault(name, flag)

    def read_fields(self, tree: ast.Module, rel: str) -> None:
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            is_flag_class = cls.name in self.layout.dataclass_flag_classes
            for stmt in cls.body:
                if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
                    continue
                name = stmt.target.id
                meta = _annotated_meta(stmt.annotation)
                type_node = meta[0] if meta else stmt.annotation
                fdef = FieldDef(
                    name=name,
                    file=rel,
                    line=stmt.lineno,
                    owner=cls.name,
                    default=self._default(stmt.value),
                    kind=_kind(type_node),
                )
                self.table.fields.setdefault(name, fdef)
                if name not in self.table.by_owner.setdefault(cls.name, {}):
                    self.table.by_owner[cls.name][name] = fdef
                    self.table.declared[name] = self.table.declared.get(name, 0) + 1
                if is_flag_class and not name.startswith("_"):
                    action: FlagAction = "bool_optional" if fdef.kind == "bool" else "value"
                    self.add(FlagDef((_flag_name(name),), name, rel, stmt.lineno, action))
                elif meta and self.layout.annotated_fields_are_flags:
                    self._annotated_flag(name, fdef, meta[1], rel, stmt.lineno)

    def _default(self, node: ast.expr | None) -> object:
        # vLLM's EngineArgs: `max_model_len: int | None = ModelConfig.max_model_len`.
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.attr in self.table.by_owner.get(node.value.id, {})
        ):
            return self.table.by_owner[node.value.id][node.attr].default
        return _literal(node)

    def _annotated_flag(
        self, name: str, fdef: FieldDef, meta: ast.expr | None, rel: str, line: int
    ) -> None:
        if isinstance(meta, ast.Constant) and isinstance(meta.value, str):
            kw: dict[str, ast.expr] = {}
        elif isinstance(meta, ast.Call) and getattr(meta.func, "id", "") == "Arg":
            kw = _keywords(meta)
            if _literal(kw.get("no_cli")) is True:
                return
        else:
            return
        cli_name = _literal(kw.get("cli_name"))
        names = (cli_name if isinstance(cli_name, str) else _flag_name(name),)
        names += _strings(kw.get("aliases"))
        action: FlagAction = "true" if fdef.kind == "bool" and "action" not in kw else "value"
        self.add(FlagDef(names, name, rel, line, action))

    def read_argparse(self, tree: ast.Module, rel: str) -> None:
        # `model_kwargs = get_kwargs(ModelConfig)` names the config class of `**model_kwargs[...]`.
        kwarg_owner: dict[str, str] = {}
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and getattr(node.value.func, "id", "") == "get_kwargs"
                and node.value.args
                and isinstance(node.value.args[0], ast.Name)
            ):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        kwarg_owner[target.id] = node.value.args[0].id
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"
            ):
                self._argparse_flag(node, rel, kwarg_owner)

    def _argparse_flag(self, call: ast.Call, rel: str, kwarg_owner: dict[str, str]) -> None:
        names = tuple(
            a.value
            for a in call.args
            if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-")
        )
        if not names:
            return
        kw = _keywords(call)
        config_field = config_owner = None
        # `**kwargs["field"]`, also inside a merge: `**{**kwargs["field"], "default": None}`.
        for k in (k for k in call.keywords if k.arg is None):
            for sub in ast.walk(k.value):
                if (
                    isinstance(sub, ast.Subscript)
                    and isinstance(sub.value, ast.Name)
                    and isinstance(sub.slice, ast.Constant)
                    and config_field is None
                ):
                    config_field = str(sub.slice.value)
                    config_owner = kwarg_owner.get(sub.value.id)
        dest_node = _literal(kw.get("dest"))
        longs = [n for n in names if n.startswith("--")]
        dest = (
            dest_node
            if isinstance(dest_node, str)
            else (longs[0] if longs else names[0]).lstrip("-").replace("-", "_")
        )
        action, const = self._action(kw, config_field, config_owner)
        flag = FlagDef(names, dest, rel, call.lineno, action, const, config_field, config_owner)
        if action == "bool_optional":
            flag = FlagDef(
                names + tuple("--no-" + n[2:] for n in longs),
                dest,
                rel,
                call.lineno,
                action,
                const,
                config_field,
                config_owner,
            )
        self.add(flag)

    def _action(
        self, kw: dict[str, ast.expr], config_field: str | None, config_owner: str | None
    ) -> tuple[FlagAction, object]:
        node = kw.get("action")
        name = node.value if isinstance(node, ast.Constant) else getattr(node, "attr", None)
        name = name or getattr(node, "id", None) or ""
        if "const_value" in kw:
            return "const", _literal(kw["const_value"])
        if name == "store_const":
            return "const", _literal(kw.get("const"))
        if "BooleanOptional" in str(name):
            return "bool_optional", None
        if "True" in str(name) or name == "store_true":
            return "true", None
        if "False" in str(name) or name == "store_false":
            return "false", None
        if not name and config_field:
            # `**kwargs["field"]` from get_kwargs: a bool field becomes BooleanOptionalAction.
            fdef = self.table.field(config_field, config_owner)
            if fdef and fdef.kind == "bool":
                return "bool_optional", None
        return "value", None


def read_flag_table(root: Path, layout: EngineLayout) -> FlagTable:
    """Parse the registration files of `root/<package>` (a few files: milliseconds)."""
    pkg = root / layout.package
    table = FlagTable()
    reader = _FlagReader(layout, table)
    parsed: dict[Path, ast.Module] = {}

    def parse(path: Path) -> ast.Module:
        if path not in parsed:
            parsed[path] = ast.parse(path.read_bytes())
        return parsed[path]

    for pattern in layout.field_files:
        for path in sorted(pkg.glob(pattern)):
            reader.read_fields(parse(path), path.relative_to(root).as_posix())
    for rel_file in layout.argparse_files:
        path = pkg / rel_file
        if path.exists():
            reader.read_argparse(parse(path), path.relative_to(root).as_posix())
    return table
