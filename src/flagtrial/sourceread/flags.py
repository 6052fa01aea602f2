"""Flags as argparse holds them: one flag's spec (`flag_spec`), read from an `add_argument(...)`
call with argparse's own rules (arity, switch defaults, BooleanOptionalAction), and the
helpers both engines' readers use to find those calls.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from typing import Any

from .deprecations import replacement
from .evaluate import Evaluator, TypeShape, Unresolved
from .modules import Source, dotted

JSON_TYPE = "json"


def flag_spec(
    names: list[str],
    dest: str,
    *,
    action: str = "store",
    nargs: Any = None,
    type_: str = "str",
    choices: list[Any] | None = None,
    help_: str = "",
    default: Any = None,
    where: str = "",
    settings: list[str] | None = None,
) -> dict[str, Any]:
    return {
        "names": names,
        "negative": [],
        "dest": dest,
        "action": action,
        "nargs": nargs,
        "type": type_,
        "choices": None if choices is None else [c for c in choices if c is not None],
        "help": help_,
        "default": None if default is None else repr(default),
        "deprecated": None,
        "removed": False,
        "settings": settings if settings is not None else [dest],
        "where": where,
    }


_TYPE_NAMES = {"int": "int", "float": "float", "str": "str"}
# Parsers that take one word and turn it into a number or JSON (the engines' helpers);
# "int_hr" is an integer that may carry a k/m/g/t suffix (`human_readable_int`).
_VALUE_PARSERS = {
    "human_readable_int": "int_hr",
    "human_readable_int_or_auto": "str",
    "json.loads": JSON_TYPE,
    "json_list_type": JSON_TYPE,
    "nullable_str": "str",
    "optional_str": "str",
    "optional_int": "int",
    "optional_float": "float",
    "parse_cuda_graph_config_arg": JSON_TYPE,  # SGLang 0.5.23 --cuda-graph-config
}


def type_name(node: ast.AST | None) -> str:
    if node is None:
        return "str"
    name = dotted(node)
    if name in _TYPE_NAMES:
        return _TYPE_NAMES[name]
    if isinstance(node, ast.Call) and dotted(node.func) == "optional_type" and node.args:
        return type_name(node.args[0])
    return _VALUE_PARSERS.get(name, "str")


def parser_type(evaluator: Evaluator, node: ast.AST | None) -> str:
    """`type_name`, and a parser of the package's own that parses its word as JSON
    (`parse_cuda_graph_config_arg`, srt/model_executor/cuda_graph_config.py) is `json`."""
    name = type_name(node)
    hit = evaluator.source.lookup(evaluator.module, node.id) if isinstance(node, ast.Name) else None
    fn = hit[1] if hit else None
    if name == "str" and isinstance(fn, ast.FunctionDef) and fn.args.args:
        word = fn.args.args[0].arg
        for call in all_calls(fn):
            if dotted(call.func) == "json.loads" and dotted(call.args[0]) == word:
                return JSON_TYPE
    return name


def action_nargs(evaluator: Evaluator, node: ast.AST | None) -> Any:
    """The nargs a custom action class gives itself when the registration names none:
    its `__init__`'s default (`def __init__(self, option_strings, dest, nargs=0, ...)`,
    SGLang's Deprecated*Action), else argparse's None."""
    hit = evaluator.source.lookup(evaluator.module, dotted(node)) if node is not None else None
    init = method(hit[1], "__init__") if hit and isinstance(hit[1], ast.ClassDef) else None
    if hit is None or init is None:
        return None
    params = init.args.args[len(init.args.args) - len(init.args.defaults) :]
    defaults = dict(zip([a.arg for a in params], init.args.defaults, strict=True))
    defaults.update(
        (a.arg, d) for a, d in zip(init.args.kwonlyargs, init.args.kw_defaults, strict=True) if d
    )
    return Evaluator(evaluator.source, hit[0]).lenient(defaults.get("nargs"))


def action_name(node: ast.AST | None) -> str:
    if node is None:
        return "store"
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    name = dotted(node).rsplit(".", 1)[-1]
    if name == "BooleanOptionalAction":
        return "boolean_optional"
    return f"custom:{name}" if name else "store"


def arity(action: str, nargs: Any) -> Any:
    """nargs as argparse applies it: 0 for switches (SGLang's `DeprecatedStoreTrueAction`
    too), else what was given (None: one word)."""
    if action in ("store_true", "store_false", "store_const", "count", "boolean_optional"):
        return 0
    if re.search(r"Store(?:True|False)Action$", action):
        return 0
    return nargs


def add_argument_call(
    call: ast.Call,
    evaluator: Evaluator,
    where: str,
    preset: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """A flag from one `add_argument(...)` call; `preset` holds keyword values computed
    elsewhere (vLLM's `**get_kwargs(Config)["field"]`), which explicit keywords override."""
    names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    if not names:
        return None
    nodes = _keyword_nodes(call)
    kw = _keyword_values(evaluator, nodes, preset)
    long_names = [n for n in names if n.startswith("--")]
    dest = kw.get("dest") or (long_names or names)[0].lstrip("-").replace("-", "_")
    action = kw.get("action", "store")
    if "default" not in kw and action in ("store_true", "store_false"):
        kw["default"] = action == "store_false"  # argparse's own default for a switch
    spec = flag_spec(
        names,
        dest,
        action=action,
        nargs=arity(action, kw.get("nargs")),
        type_=kw.get("type", "str"),
        choices=list(kw["choices"]) if isinstance(kw.get("choices"), list | tuple | set) else None,
        help_=kw.get("help") or "",
        default=kw.get("default"),
        where=where,
        settings=kw.get("settings"),
    )
    _mark(spec, kw, nodes)
    return spec


def _keyword_nodes(call: ast.Call) -> dict[str, ast.AST]:
    """The call's keywords by name, a `**{...}` literal's entries among them."""
    nodes: dict[str, ast.AST] = {}
    for keyword in call.keywords:
        if keyword.arg is None:
            if isinstance(keyword.value, ast.Dict):
                for k, v in zip(keyword.value.keys, keyword.value.values, strict=True):
                    if isinstance(k, ast.Constant):
                        nodes[str(k.value)] = v
            continue
        nodes[keyword.arg] = keyword.value
    return nodes


def _keyword_values(
    evaluator: Evaluator, nodes: dict[str, ast.AST], preset: dict[str, Any] | None
) -> dict[str, Any]:
    kw: dict[str, Any] = dict(preset or {})
    for key, node in nodes.items():
        if key == "action":
            kw["action"] = action_name(node)
        elif key == "type":
            kw["type"] = parser_type(evaluator, node)
        else:
            kw[key] = evaluator.lenient(node)
    if "nargs" not in kw and kw.get("action", "").startswith("custom:"):
        kw["nargs"] = action_nargs(evaluator, nodes.get("action"))
    return kw


def _mark(spec: dict[str, Any], kw: dict[str, Any], nodes: dict[str, ast.AST]) -> None:
    """What the keywords say beyond `flag_spec`'s fields: deprecated, removed, a constant, ..."""
    action = spec["action"]
    if "choices" in nodes and spec["choices"] is None:
        spec["choices_unresolved"] = ast.unparse(nodes["choices"])
    elif kw.get("choices_unresolved"):
        spec["choices_unresolved"] = kw["choices_unresolved"]
    if action.startswith("custom:Deprecated") or kw.get("deprecated") is True:
        spec["deprecated"] = replacement(kw.get("new_flag") or "")
    if "const_value" in nodes or action == "store_const":
        spec["const"] = kw.get("const_value", kw.get("const"))
    if kw.get("error_message"):
        spec["removed"] = True
        spec["help"] = spec["help"] or kw["error_message"]
    if action == "boolean_optional":
        boolean_optional(spec)
    if not spec["names"][0].startswith("-"):
        spec["positional"] = True
    if kw.get("required"):
        spec["required"] = True


def boolean_optional(spec: dict[str, Any]) -> None:
    """argparse.BooleanOptionalAction adds `--no-X` for each `--X`."""
    positives = [n for n in spec["names"] if n.startswith("--")]
    spec["negative"] = [f"--no-{n[2:]}" for n in positives]
    spec["names"] = [*spec["names"], *spec["negative"]]


def calls_in(fn: ast.AST, method: str) -> Iterator[ast.Call]:
    for node in ast.walk(fn):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == method
        ):
            yield node


def all_calls(fn: ast.AST) -> Iterator[ast.Call]:
    return (node for node in ast.walk(fn) if isinstance(node, ast.Call))


def method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next(
        (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name),
        None,
    )


def function_locals(fn: ast.FunctionDef, evaluator: Evaluator) -> dict[str, Any]:
    """Values of the simple local assignments in a function body (in order)."""
    scope: dict[str, Any] = {}
    local = Evaluator(evaluator.source, evaluator.module, scope)
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                scope[node.targets[0].id] = local.value(node.value)
            except (Unresolved, TypeError):
                continue
    return scope


def hand_registered(source: Source, module: str, fn: ast.FunctionDef) -> list[dict[str, Any]]:
    """Flags from every `*.add_argument(...)` call in one function."""
    evaluator = Evaluator(source, module)
    evaluator.local = function_locals(fn, evaluator)
    flags = []
    for call in sorted(calls_in(fn, "add_argument"), key=lambda c: c.lineno):
        spec = add_argument_call(call, evaluator, source.where(module, call))
        if spec is not None:
            flags.append(spec)
    return flags


def scalar(values: list[Any]) -> str:
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "int"
    if values and all(isinstance(v, float) for v in values):
        return "float"
    return "str"


def scalar_shape(shape: TypeShape | None) -> str:
    """argparse's `type=` for a field: `_infer_type_func` maps int and float, else str."""
    if shape is None:
        return "str"
    for kind in ("int", "float"):
        if shape.parts - {"None"} == {kind}:
            return kind
    return "str"


def canonical(spec: dict[str, Any]) -> str:
    """The spelling a flag is named by: its first positive long option."""
    positives: list[str] = [n for n in spec["names"] if n not in spec["negative"]]
    return next((n for n in positives if n.startswith("--")), positives[0])


def switch_value(spec: dict[str, Any], used: str) -> Any:
    """What a flag that takes no value (nargs 0) stores when given as `used`."""
    if used in spec["negative"] or re.search(r"(?:^store_false|StoreFalseAction)$", spec["action"]):
        return False
    return spec.get("const", True)
