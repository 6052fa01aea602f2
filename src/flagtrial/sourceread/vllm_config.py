"""vLLM's config dataclasses as `get_kwargs` / `_compute_kwargs` (vllm/engine/arg_utils.py)
turn their fields into argparse keywords, and the fields' declared defaults."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from .evaluate import Evaluator, TypeShape, Unresolved, type_shape
from .flags import JSON_TYPE, calls_in, scalar, scalar_shape, type_name
from .modules import Source, dotted


def config_kwargs(source: Source, module: str, cls: ast.ClassDef) -> dict[str, dict[str, Any]]:
    """argparse keywords per field of a config class, as `get_kwargs` / `_compute_kwargs`
    (vllm/engine/arg_utils.py) derive them from the field's type; help from the attribute
    docstring under the field."""
    kwargs: dict[str, dict[str, Any]] = {}
    evaluator = Evaluator(source, module)
    for base in cls.bases:
        hit = source.find_class(module, dotted(base))
        if hit is not None:
            kwargs.update(config_kwargs(source, hit[0], hit[1]))
    section = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.name).lower()
    body = cls.body
    for i, stmt in enumerate(body):
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        name = stmt.target.id
        if dotted(stmt.annotation) == "ClassVar" or (
            isinstance(stmt.annotation, ast.Subscript)
            and dotted(stmt.annotation.value) in ("ClassVar", "InitVar")
        ):
            continue
        doc = ""
        following = body[i + 1] if i + 1 < len(body) else None
        if (
            isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            doc = following.value.value
        shape = type_shape(source, module, stmt.annotation)
        kw: dict[str, Any] = {
            "help": re.sub(r"\s+", " ", doc).strip(),
            "default": evaluator.lenient(_field_default(stmt.value)),
            "settings": [name, f"{section}.{name}"],
            "where": source.where(module, stmt),
            "config": f"{cls.name}.{name}",
        }
        kw.update(_compute_kwargs(shape))
        if kw.get("choices") and "None" in shape.parts and "bool" not in shape.parts:
            kw["choices"] = [*kw["choices"], *_none_choice(source)]
        if kw.get("type") == "int":
            kw["type"] = _int_parsers(source).get(name, "int")
        kwargs[name] = kw
    return kwargs


def _none_choice(source: Source) -> list[Any]:
    """What `_compute_kwargs` (engine/arg_utils.py) adds to the choices of an optional field:
    `kwargs[name]["choices"].append(None)`, the word "None" up to 0.30."""
    if "none_choice" not in source.memo:
        hit = source.lookup("vllm.engine.arg_utils", "_compute_kwargs")
        module, function = hit if hit else ("", None)
        source.memo["none_choice"] = [
            Evaluator(source, module).value(call.args[0])
            for call in (calls_in(function, "append") if function else ())
            if isinstance(call.func, ast.Attribute)
            and isinstance(call.func.value, ast.Subscript)
            and isinstance(call.func.value.slice, ast.Constant)
            and call.func.value.slice.value == "choices"
        ][:1]
    choices: list[Any] = source.memo["none_choice"]
    return choices


def _int_parsers(source: Source) -> dict[str, str]:
    """Int fields `_compute_kwargs` (engine/arg_utils.py) gives a parser of their own, field ->
    type: `if name == "max_model_len": kwargs[name]["type"] = human_readable_int_or_auto`,
    `elif name in human_readable_int_args: ... = human_readable_int` (0.32 and later)."""
    if "int_parsers" in source.memo:
        known: dict[str, str] = source.memo["int_parsers"]
        return known
    hit = source.lookup("vllm.engine.arg_utils", "_compute_kwargs")
    fn = hit[1] if hit and isinstance(hit[1], ast.FunctionDef) else None
    sets: dict[str, list[Any]] = {}
    out: dict[str, str] = {}
    for node in ast.walk(fn) if fn else ():
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Set)
        ):
            sets[node.targets[0].id] = [
                e.value for e in node.value.elts if isinstance(e, ast.Constant)
            ]
    for node in ast.walk(fn) if fn else ():
        test = node.test if isinstance(node, ast.If) else None
        if not (isinstance(test, ast.Compare) and dotted(test.left) == "name"):
            continue
        other = test.comparators[0]
        if isinstance(test.ops[0], ast.Eq) and isinstance(other, ast.Constant):
            names = [str(other.value)]
        elif isinstance(test.ops[0], ast.In) and isinstance(other, ast.Name):
            names = sets.get(other.id, [])
        else:
            continue
        for stmt in node.body:  # type: ignore[attr-defined]
            target = stmt.targets[0] if isinstance(stmt, ast.Assign) else None
            if (
                isinstance(target, ast.Subscript)
                and isinstance(target.slice, ast.Constant)
                and target.slice.value == "type"
            ):
                out.update(dict.fromkeys(names, type_name(stmt.value)))
    source.memo["int_parsers"] = out
    return out


def _field_default(node: ast.AST | None) -> ast.AST | None:
    if isinstance(node, ast.Call) and dotted(node.func) in ("field", "Field"):
        return next((k.value for k in node.keywords if k.arg == "default"), None)
    return node


def _compute_kwargs(shape: TypeShape) -> dict[str, Any]:
    """The branches of `_compute_kwargs`, in its order."""
    parts = shape.parts
    if "dataclass" in parts:
        return {"type": JSON_TYPE}
    if parts == {"bool", "str", "None"}:
        return {"type": "str", "nargs": "?"}
    if "bool" in parts:
        return {"action": "boolean_optional"}
    if "Literal" in parts:
        if "str" in parts:
            return {"type": "str"}  # a metavar, not a closed list
        return {"type": scalar(shape.literals), "choices": sorted(shape.literals, key=str)}
    for kind in ("tuple", "list", "set"):
        if kind in parts:
            element = shape.element
            choices = None
            if element is not None and "Literal" in element.parts and "str" not in element.parts:
                choices = sorted(element.literals, key=str)
            nargs = "+" if kind != "tuple" or shape.tuple_len is None else shape.tuple_len
            out: dict[str, Any] = {"type": scalar_shape(element), "nargs": nargs}
            if choices is not None:
                out["choices"] = choices
            return out
    if "int" in parts:
        return {"type": "int"}
    if "float" in parts:
        return {"type": "float"}
    if "dict" in parts:
        return {"type": JSON_TYPE}
    return {"type": "str"}


def config_defaults(package_dir: Path, module: str, cls_name: str) -> dict[str, Any]:
    """Field -> declared default of a config dataclass (vLLM's CacheConfig, ...)."""
    source = Source(package_dir)
    found = source.find_class(module, cls_name)
    if found is None:
        raise Unresolved(f"{module}.{cls_name}")
    return {name: kw["default"] for name, kw in config_kwargs(source, *found).items()}
