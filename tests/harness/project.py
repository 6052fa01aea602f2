"""Project files as the tests write them: keys validated by, and the file rendered from, the
settings model (`flagtrial.settings.Project` through `flagtrial.projectfile.template`, what
`flagtrial init` writes), so a test's project cannot hold a key the model lacks.

Keys come as TOML text (`'unit = "llama.service"\\n[policy]\\nruns = 2\\n'`), as a dict, or
both: the dict's keys win, tables merged key by key.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from flagtrial.projectfile import template
from flagtrial.settings import Project


def write_project_file(path: Path, toml: str = "", **keys: Any) -> Path:
    """Write the project holding `toml`'s keys and `keys` to `path`; returns `path`."""
    data = merged(tomllib.loads(toml), keys)
    path.write_text(template(Project.model_validate(data)))
    return path


def update_project_file(path: Path, toml: str = "", **keys: Any) -> Path:
    """Rewrite the project file at `path` with `toml`'s keys and `keys` set on top of its own."""
    data = merged(tomllib.loads(path.read_text()), tomllib.loads(toml))
    return write_project_file(path, **merged(data, keys))


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out
