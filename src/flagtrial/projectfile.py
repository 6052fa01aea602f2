"""The commented project file `flagtrial init` writes, generated from the settings model: every
key with its own description, so the file cannot fall behind the model."""

from __future__ import annotations

import textwrap
from typing import Any

import tomli_w
from pydantic import BaseModel

from flagtrial.settings import Project

HEADER = "# flagtrial project file. Relative paths resolve against this file's folder.\n"
WIDTH = 95


def template(project: Project) -> str:
    """`project` as TOML: each key preceded by its description, keys left unset commented out
    with an example value; the sections ([ssh], [policy], ...) after the top-level keys."""
    data = project.model_dump(mode="json")
    top, sections = [HEADER], []
    for name, info in type(project).model_fields.items():
        if info.exclude:
            continue
        value = getattr(project, name)
        if isinstance(value, BaseModel):
            sections.append(_section(name, value, data[name]))
        else:
            top.append(_key(project, name, data[name]))
    return "\n".join([*top, *sections])


def _section(name: str, model: BaseModel, data: dict[str, Any]) -> str:
    doc = textwrap.dedent(type(model).__doc__ or "").strip()
    lines = [f"[{name}]", *_comment(doc)]
    return "\n".join(lines) + "\n" + "\n".join(_key(model, key, data[key]) for key in data)


def _key(model: BaseModel, name: str, value: Any) -> str:
    info = type(model).model_fields[name]
    lines = _comment(info.description or "")
    if value is None:
        example = (info.examples or [None])[0]
        shown = _toml(name, example).splitlines() if example is not None else [f"{name} ="]
        lines.extend(f"# {line}" for line in shown)
    else:
        lines.append(_toml(name, value))
    return "\n".join(lines) + "\n"


def _toml(name: str, value: Any) -> str:
    """One `key = value` line: tables inline (the key stays in its section), arrays on one
    line (a commented example stays one line)."""
    return f"{name} = {_value(value)}"


def _value(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(_toml(key, item) for key, item in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    return tomli_w.dumps({"v": value}).strip().removeprefix("v = ")


def _comment(text: str) -> list[str]:
    return [f"# {line}" for line in textwrap.wrap(" ".join(text.split()), WIDTH)]
