"""SGLang's flags, read from `sglang/srt/server_args.py` and `srt/arg_groups/`."""

from __future__ import annotations

import ast
from typing import Any

from .deprecations import mark_deprecations, replacement
from .evaluate import Evaluator, Unresolved, type_shape
from .fields import EngineLayout
from .flags import (
    action_name,
    action_nargs,
    all_calls,
    arity,
    boolean_optional,
    flag_spec,
    hand_registered,
    method,
    parser_type,
    scalar,
    scalar_shape,
)
from .modules import Source, dotted

LAYOUT = EngineLayout(
    package="sglang",
    # 0.5.23 declares fields in namespace classes; 0.5.10 in the ServerArgs dataclass.
    field_files=("srt/arg_groups/fields/*.py", "srt/server_args.py"),
    # multimodal_gen is the separate diffusion server with its own arguments; test and
    # benchmark code never runs in `sglang.launch_server`.
    exclude=("test", "multimodal_gen", "benchmark"),
    tp_fields=("tp_size",),
    startup_paths=("srt/arg_groups/", "srt/server_args.py"),
    model_packages=("srt/models",),
)


def _sglang_fields_flags(source: Source, fn: ast.FunctionDef) -> list[dict[str, Any]]:
    """Flags of `add_cli_args_from_dataclass(parser, ServerArgs)` (srt/arg_groups/arg_utils.py,
    0.5.14 and later), whose rules `_field_flag` follows: the annotated fields of ServerArgs,
    after those of the namespace classes in `_INPUT_NAMESPACES` that server_args.py merges
    into its annotations (`{**_annotations, **ServerArgs.__annotations__}`, 0.5.20 and
    later). Nothing where `add_cli_args` does not call it (0.5.13 and before)."""
    if not any(dotted(c.func) == "add_cli_args_from_dataclass" for c in all_calls(fn)):
        return []
    module = "sglang.srt.server_args"
    tree = source.tree(module)
    assert tree is not None
    namespaces = next(
        (
            node.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "_INPUT_NAMESPACES" for t in node.targets)
        ),
        ast.List(elts=[]),
    )
    assert isinstance(namespaces, ast.List)
    classes = [dotted(element) for element in namespaces.elts] + ["ServerArgs"]
    # A field declared twice (0.5.15's `dcp_size`) is one field, the later declaration's.
    fields: dict[str, dict[str, Any] | None] = {}
    for name in classes:
        found = source.find_class(module, name)
        if found is None:
            raise Unresolved(f"namespace class {name}")
        ns_module, cls = found
        evaluator = Evaluator(source, ns_module)
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                fields[stmt.target.id] = _field_flag(source, ns_module, stmt, evaluator)
    return [spec for spec in fields.values() if spec is not None]


def _field_flag(
    source: Source, module: str, stmt: ast.AnnAssign, evaluator: Evaluator
) -> dict[str, Any] | None:
    found = _arg(stmt.annotation)
    if found is None:
        return None  # no Arg: not a CLI field
    parts, meta, help_node = found
    if evaluator.lenient(meta.get("no_cli")):
        return None
    assert isinstance(stmt.target, ast.Name)
    field = stmt.target.id
    cli_name = evaluator.lenient(meta.get("cli_name")) or "--" + field.replace("_", "-")
    names = [cli_name, *(evaluator.lenient(meta.get("aliases")) or [])]
    help_text = evaluator.lenient(help_node) or ""
    default = evaluator.lenient(stmt.value)
    where = source.where(module, stmt)
    choices = evaluator.lenient(meta.get("choices"))
    type_parser = meta.get("type_parser")
    shape = type_shape(source, module, parts[0])
    common = {"help_": help_text, "default": default, "where": where, "settings": [field]}
    if "action" in meta:
        return _action_flag(names, field, meta, evaluator, common)
    if "Literal" in shape.parts:
        type_ = parser_type(evaluator, type_parser) if type_parser else scalar(shape.literals)
        return flag_spec(
            names, field, type_=type_, choices=list(choices or shape.literals), **common
        )
    if "list" in shape.parts and type_parser is None:
        element = scalar_shape(shape.element)
        nargs = evaluator.lenient(meta.get("nargs")) or "+"
        return flag_spec(names, field, nargs=nargs, type_=element, choices=choices, **common)
    if shape.parts - {"None"} == {"bool"}:
        return flag_spec(names, field, action="store_true", nargs=0, **common)
    type_ = parser_type(evaluator, type_parser) if type_parser else scalar_shape(shape)
    nargs = evaluator.lenient(meta.get("nargs"))
    spec = flag_spec(names, field, nargs=nargs, type_=type_, choices=choices, **common)
    required = evaluator.lenient(meta.get("required"))
    spec["required"] = required is True or (required is None and stmt.value is None)
    return spec


def _arg(ann: ast.expr) -> tuple[list[ast.expr], dict[str, ast.AST], ast.AST | None] | None:
    """An `A[type, Arg(...)]` (or `A[type, "help"]`) annotation's parts, the `Arg` keywords
    and the help text's node; None for any other annotation."""
    if not (isinstance(ann, ast.Subscript) and dotted(ann.value) in ("A", "Annotated")):
        return None
    parts = list(ann.slice.elts) if isinstance(ann.slice, ast.Tuple) else [ann.slice]
    for extra in parts[1:]:
        if isinstance(extra, ast.Call) and dotted(extra.func) == "Arg":
            meta: dict[str, ast.AST] = {k.arg: k.value for k in extra.keywords if k.arg}
            return parts, meta, meta.get("help")
        if isinstance(extra, ast.Constant | ast.JoinedStr | ast.BinOp):
            return parts, {}, extra
    return None


def _action_flag(
    names: list[str],
    field: str,
    meta: dict[str, ast.AST],
    evaluator: Evaluator,
    common: dict[str, Any],
) -> dict[str, Any]:
    """A field whose `Arg(action=...)` names an argparse action."""
    action = action_name(meta["action"])
    kwargs = _keywords(meta.get("action_kwargs"), evaluator)
    nargs = kwargs["nargs"] if "nargs" in kwargs else action_nargs(evaluator, meta["action"])
    spec = flag_spec(
        names,
        field,
        action=action,
        nargs=arity(action, nargs),
        type_=kwargs.get("type", "str"),
        choices=kwargs.get("choices"),
        **common,
    )
    if action == "boolean_optional":
        boolean_optional(spec)
    if action.startswith("custom:Deprecated"):
        spec["deprecated"] = replacement(kwargs.get("new_flag") or "")
    return spec


def _keywords(node: ast.AST | None, evaluator: Evaluator) -> dict[str, Any]:
    """An `action_kwargs={...}` dict, key by key: `type` named as argparse applies it."""
    if not isinstance(node, ast.Dict):
        return {}
    out: dict[str, Any] = {}
    for key, value in zip(node.keys, node.values, strict=True):
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            out[key.value] = (
                parser_type(evaluator, value) if key.value == "type" else evaluator.lenient(value)
            )
    return out


def _server_args_add_cli_args(source: Source) -> ast.FunctionDef:
    module = "sglang.srt.server_args"
    found = source.find_class(module, "ServerArgs")
    fn = method(found[1], "add_cli_args") if found else None
    if fn is None:
        raise Unresolved("ServerArgs.add_cli_args")
    return fn


def _declared_resolutions(source: Source) -> dict[str, list[str]]:
    """field -> ["source (file:line)", ...] for every `declare_resolution(args, "source",
    field=...)` and every `@register_post_process` pass returning `{"field": ...}`."""
    out: dict[str, list[str]] = {}
    folder = source.root / "sglang" / "srt" / "arg_groups"
    for path in sorted(folder.glob("*.py")):  # none before 0.5.14
        module = f"sglang.srt.arg_groups.{path.stem}"
        tree = source.tree(module)
        assert tree is not None
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and dotted(node.func) == "declare_resolution"
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
            ):
                for keyword in node.keywords:
                    if keyword.arg:
                        label = f"{node.args[1].value!s} ({source.where(module, node)})"
                        out.setdefault(keyword.arg, []).append(label)
            elif isinstance(node, ast.FunctionDef) and any(
                dotted(d) == "register_post_process" for d in node.decorator_list
            ):
                for ret in ast.walk(node):
                    if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Dict):
                        for key in ret.value.keys:
                            if isinstance(key, ast.Constant):
                                label = f"{node.name} ({source.where(module, ret)})"
                                out.setdefault(str(key.value), []).append(label)
    return {k: list(dict.fromkeys(v)) for k, v in out.items()}


def _from_cli_args_renames(source: Source) -> dict[str, str]:
    """0.5.10's `ServerArgs.from_cli_args` copies `args.tensor_parallel_size` into the field
    `tp_size`: dest -> field for every `args.X = args.Y` there."""
    found = source.find_class("sglang.srt.server_args", "ServerArgs")
    fn = method(found[1], "from_cli_args") if found else None
    renames: dict[str, str] = {}
    for node in ast.walk(fn) if fn else ():
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Attribute)
            and isinstance(node.value, ast.Attribute)
        ):
            renames[node.value.attr] = node.targets[0].attr
    return renames


def sglang_flags(source: Source) -> dict[str, Any]:
    """SGLang's table: the dataclass fields `add_cli_args` registers (0.5.14 and later), then
    its hand-registered flags (all of them up to 0.5.13). Resolution causes where the
    version records them (`arg_groups/`)."""
    fn = _server_args_add_cli_args(source)
    flags = _sglang_fields_flags(source, fn)
    flags += hand_registered(source, "sglang.srt.server_args", fn)
    resolvers = _declared_resolutions(source)
    renamed = _from_cli_args_renames(source)
    for spec in flags:
        if spec["dest"] in renamed:
            spec["settings"] = [renamed[spec["dest"]]]
    mark_deprecations(flags)
    return {"flags": flags, "resolvers": resolvers}
