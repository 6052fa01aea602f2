"""vLLM's flags, read from `vllm/engine/arg_utils.py`, its config dataclasses and the CLI
module that builds `make_arg_parser`."""

from __future__ import annotations

import ast
from typing import Any

from .deprecations import mark_deprecations
from .evaluate import Evaluator, Unresolved
from .fields import EngineLayout
from .flags import (
    action_name,
    add_argument_call,
    arity,
    boolean_optional,
    calls_in,
    flag_spec,
    hand_registered,
    method,
    parser_type,
)
from .modules import Source, dotted
from .vllm_config import config_kwargs

LAYOUT = EngineLayout(
    package="vllm",
    field_files=("config/*.py", "engine/arg_utils.py", "entrypoints/common/cli_args.py"),
    exclude=("benchmarks", "third_party"),
    tp_fields=("tensor_parallel_size",),
    startup_paths=("engine/arg_utils.py", "config/"),
    # A second tree, one package per model with its own kernels (`vllm/models/deepseek_v4/`),
    # named in the registry by full module path.
    model_packages=("model_executor/models", "models"),
    platform_objects={
        "current_platform": (
            "vllm.platforms",
            {
                "cuda": "vllm.platforms.cuda:NvmlCudaPlatform",
                "rocm": "vllm.platforms.rocm:RocmPlatform",
            },
        )
    },
)


class _VllmRegistration:
    """Walks an `add_cli_args` body in order: `x_kwargs = get_kwargs(Config)`, a field's entry
    bound to a name (`y = x_kwargs["f"]`, `y = get_kwargs(Config)["f"]`), edits such as
    `x_kwargs["f"]["type"] = ...`, `y["choices"].remove(...)` or `del x_kwargs["f"]["nargs"]`,
    and `add_argument` calls."""

    def __init__(self, source: Source, module: str, enable_disable: bool) -> None:
        self.source = source
        self.module = module
        self.enable_disable = enable_disable
        self.evaluator = Evaluator(source, module)
        self.tables: dict[str, dict[str, dict[str, Any]]] = {}
        self.entries: dict[str, dict[str, Any]] = {}  # a name bound to one field's entry
        self.flags: list[dict[str, Any]] = []

    def run(self, fn: ast.FunctionDef) -> list[dict[str, Any]]:
        self._body(fn.body)
        return self.flags

    def _body(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, ast.If | ast.For | ast.With | ast.Try):
                # Both branches: conditions there are about the help display or plugins.
                for block in ("body", "orelse", "finalbody"):
                    self._body(getattr(stmt, block, []) or [])
                continue
            if isinstance(stmt, ast.Assign):
                self._assign(stmt)
            elif isinstance(stmt, ast.AugAssign):
                self._extend(stmt)
            elif isinstance(stmt, ast.Delete):
                for target in stmt.targets:
                    found = self._slot(target)
                    if found:
                        found[0].pop(found[1], None)
            elif isinstance(stmt, ast.Expr):
                self._list_edit(stmt.value)
            for call in sorted(calls_in(stmt, "add_argument"), key=lambda c: c.lineno):
                self._add(call)

    def _slot(self, node: ast.AST) -> tuple[dict[str, Any], str] | None:
        """(field entry, key) for `x_kwargs["f"]["key"]` or `y["key"]`."""
        path = self._path(node)
        if path and len(path) == 3 and path[0] in self.tables:
            return self.tables[path[0]].setdefault(path[1], {}), path[2]
        if path and len(path) == 2 and path[0] in self.entries:
            return self.entries[path[0]], path[1]
        return None

    def _extend(self, stmt: ast.AugAssign) -> None:
        """`x_kwargs["f"]["choices"] += [...]` (0.30's `--collect-detailed-traces`)."""
        found = self._slot(stmt.target)
        items = found[0].get(found[1]) if found else None
        more = self.evaluator.lenient(stmt.value)
        if found and isinstance(stmt.op, ast.Add) and isinstance(items, list):
            if isinstance(more, list | tuple):
                found[0][found[1]] = [*items, *more]
            elif found[1] == "choices":
                found[0].update(choices=None, choices_unresolved=ast.unparse(stmt.value))

    def _list_edit(self, node: ast.AST) -> None:
        """`x_kwargs["f"]["choices"].remove("v")` (and `.append`)."""
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("remove", "append")
            and len(node.args) == 1
        ):
            return
        found = self._slot(node.func.value)
        value = self.evaluator.lenient(node.args[0])
        items = found[0].get(found[1]) if found else None
        if isinstance(items, list):
            if node.func.attr == "append":
                items.append(value)
            elif value in items:
                items.remove(value)

    def _fields_of(self, node: ast.AST) -> dict[str, dict[str, Any]] | None:
        if isinstance(node, ast.Call) and dotted(node.func) == "get_kwargs" and node.args:
            cls = self.source.find_class(self.module, dotted(node.args[0]))
            return config_kwargs(self.source, cls[0], cls[1]) if cls else None
        if isinstance(node, ast.Name):
            return self.tables.get(node.id)
        return None

    def _assign(self, stmt: ast.Assign) -> None:
        target = stmt.targets[0]
        value = stmt.value
        if isinstance(target, ast.Name):
            fields = self._fields_of(value)
            if fields is not None and isinstance(value, ast.Call):
                self.tables[target.id] = fields
            elif (
                isinstance(value, ast.Subscript)
                and isinstance(value.slice, ast.Constant)
                and (fields := self._fields_of(value.value)) is not None
            ):
                # An alias: edits reach the table too.
                self.entries[target.id] = fields.setdefault(str(value.slice.value), {})
            return
        found = self._slot(target)
        if found:
            entry, key = found
            if key == "type":
                entry["type"] = parser_type(self.evaluator, value)
            elif key == "action":
                entry["action"] = action_name(value)
            else:
                entry[key] = self.evaluator.lenient(value)

    def _path(self, node: ast.AST) -> list[str] | None:
        keys: list[str] = []
        while isinstance(node, ast.Subscript):
            if not (isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)):
                return None
            keys.insert(0, node.slice.value)
            node = node.value
        return [node.id, *keys] if isinstance(node, ast.Name) and keys else None

    def _add(self, call: ast.Call) -> None:
        preset: dict[str, Any] = {}
        spread = [k.value for k in call.keywords if k.arg is None]
        for node in list(spread):
            # `**{**x_kwargs["f"], "default": None}`: the table entry sits one level down.
            if isinstance(node, ast.Dict):
                spread += [v for k, v in zip(node.keys, node.values, strict=True) if k is None]
        for value in spread:
            path = self._path(value)
            # argparse names the dest after the option (`--attention-backend` for the field
            # `backend`), as get_kwargs sets none.
            if path and len(path) == 2 and path[0] in self.tables:
                preset = dict(self.tables[path[0]].get(path[1], {}))
            elif isinstance(value, ast.Name) and value.id in self.entries:
                preset = dict(self.entries[value.id])
        spec = add_argument_call(call, self.evaluator, self.source.where(self.module, call), preset)
        if spec is None:
            return
        if preset.get("where"):
            # The field's declaration; the gates cite the registration too.
            spec["registered"], spec["where"] = spec["where"], preset["where"]
            spec["config"] = preset["config"]
        if spec["action"] == "boolean_optional" and self.enable_disable:
            _enable_disable(spec)
        self.flags.append(spec)


def _has_enable_disable(source: Source) -> bool:
    """0.33 and later replace BooleanOptionalAction with `EnableDisableAction`."""
    return source.find_class("vllm.utils.argparse_utils", "EnableDisableAction") is not None


def _enable_disable(spec: dict[str, Any]) -> None:
    """vLLM >= 0.33 registers `EnableDisableAction` for BooleanOptionalAction
    (vllm/utils/argparse_utils.py): `--enable-x` also gets `--disable-x`, and vice versa."""
    inverses = {"--enable-": "--disable-", "--disable-": "--enable-"}
    positives = [n for n in spec["names"] if n not in spec["negative"]]
    extra = [
        inverse + name.removeprefix(prefix)
        for name in positives
        for prefix, inverse in inverses.items()
        if name.startswith(prefix)
    ]
    spec["names"] = [*spec["names"], *extra]
    spec["negative"] = [*spec["negative"], *extra]


def _frontend_flags(source: Source, module: str) -> list[dict[str, Any]]:
    """`FrontendArgs.add_cli_args` (vllm/entrypoints/common/cli_args.py): `--field` for
    every field of FrontendArgs and its bases, after `_customize_cli_kwargs` edits."""
    found = source.find_class(module, "FrontendArgs")
    if found is None:
        raise Unresolved("FrontendArgs")
    table = config_kwargs(source, found[0], found[1])
    enable_disable = _has_enable_disable(source)
    walker = _VllmRegistration(source, module, enable_disable)
    walker.tables["frontend_kwargs"] = table
    for cls_name in ("BaseFrontendArgs", "FrontendArgs"):
        hit = source.find_class(module, cls_name)
        customize = method(hit[1], "_customize_cli_kwargs") if hit else None
        if customize is not None:
            walker._body(customize.body)
    flags = []
    for field, kw in table.items():
        kw = dict(kw)
        extra = kw.pop("flags", None) or []
        names = [*extra, "--" + field.replace("_", "-")]
        action = kw.get("action", "store")
        spec = flag_spec(
            names,
            field,
            action=action,
            nargs=arity(action, kw.get("nargs")),
            type_=kw.get("type", "str"),
            choices=kw.get("choices"),
            help_=kw.get("help", ""),
            default=kw.get("default"),
            where=kw.get("where", ""),
            settings=kw.get("settings"),
        )
        if action == "boolean_optional":
            boolean_optional(spec)
            if enable_disable:
                _enable_disable(spec)
        flags.append(spec)
    return flags


# Where `make_arg_parser` lives: 0.33, 0.32 (entrypoints/launchers), 0.31 and before.
VLLM_CLI_MODULES = (
    "vllm.entrypoints.common.cli_args",
    "vllm.entrypoints.launchers.cli_args",
    "vllm.entrypoints.openai.cli_args",
)


def vllm_flags(source: Source) -> dict[str, Any]:
    """`make_arg_parser` (vllm/entrypoints/common/cli_args.py): its own flags, FrontendArgs,
    then `AsyncEngineArgs.add_cli_args` (which calls `EngineArgs.add_cli_args`)."""
    cli = next((m for m in VLLM_CLI_MODULES if source.path(m)), None)
    engine = "vllm.engine.arg_utils"
    cli_tree = source.tree(cli) if cli else None
    if cli is None or cli_tree is None:
        raise Unresolved(" or ".join(VLLM_CLI_MODULES))
    make = next(
        n for n in cli_tree.body if isinstance(n, ast.FunctionDef) and n.name == "make_arg_parser"
    )
    flags = hand_registered(source, cli, make)
    flags += _frontend_flags(source, cli)
    for cls_name in ("EngineArgs", "AsyncEngineArgs"):
        found = source.find_class(engine, cls_name)
        fn = method(found[1], "add_cli_args") if found else None
        if fn is None:
            raise Unresolved(f"{cls_name}.add_cli_args")
        flags += _VllmRegistration(source, engine, _has_enable_disable(source)).run(fn)
    mark_deprecations(flags)
    return {"flags": flags, "resolvers": {}}
