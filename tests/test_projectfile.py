"""The project file `flagtrial init` writes is generated from the settings model."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from pydantic import BaseModel

from flagtrial.errors import ProjectError
from flagtrial.projectfile import template
from flagtrial.settings import Project, Ssh, parse_project
from harness.cli import cli

# Measures nothing: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine


def fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, object]]:
    """(dotted key, field info) of every key a project file can hold."""
    found: list[tuple[str, object]] = []
    for name, info in model.model_fields.items():
        if info.exclude:
            continue
        kind = info.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            found += fields(kind, f"{prefix}{name}.")
        else:
            found.append((prefix + name, info))
    return found


PROJECTS = [
    Project(unit="llama.service"),
    Project(
        target="ssh://root@10.200.1.2:2222",
        unit="sglang.service",
        engine="sglang",
        endpoint="http://10.200.1.2:30000",
        ssh=Ssh(known_hosts="/etc/ft/known_hosts", identity_file="/root/.ssh/id_ed25519"),
        secret_names=["MY_TOKEN_VAR", "--api-key"],
    ),
]


@pytest.mark.parametrize("project", PROJECTS, ids=["defaults", "ssh"])
def test_the_template_reads_back_as_the_project_it_was_made_from(
    project: Project, tmp_path: Path
) -> None:
    text = template(project)
    read = parse_project(text, tmp_path / "flagtrial.toml")
    assert read.model_dump() == project.model_dump()


def test_every_key_of_the_model_is_in_the_template_with_its_description() -> None:
    text = template(PROJECTS[0])
    keys = fields(Project)
    assert len(keys) > 50
    for key, info in keys:
        name = key.rsplit(".", 1)[-1]
        description = info.description  # type: ignore[attr-defined]
        assert description, f"{key} has no description"
        assert " ".join(description.split())[:40] in " ".join(
            line.lstrip("# ") for line in text.splitlines()
        ), key
        assert f"\n{name} = " in text or f"\n# {name} = " in text, key


def test_keys_left_unset_are_commented_with_an_example_that_validates(tmp_path: Path) -> None:
    text = template(PROJECTS[0])
    commented = [line[2:] for line in text.splitlines() if line.startswith("# ") and " = " in line]
    assert commented, "no unset key shown"
    # Uncommenting every example still gives a valid project file, but for the one key that
    # stands in place of another: [gpu] declares compute_cap (NVIDIA) or gfx (AMD).
    for instead in ("gfx = ", "compute_cap = "):
        uncommented = "\n".join(
            line[2:] if line.startswith("# ") and " = " in line and instead not in line else line
            for line in text.splitlines()
        )
        parsed = tomllib.loads(uncommented)
        assert parsed["spec_path"] and parsed["workload"]["model"]
        (tmp_path / parsed["workload"]["prompts_file"]).write_text('{"prompt": "hello"}\n')
        parse_project(uncommented, tmp_path / "flagtrial.toml")
    with pytest.raises(ProjectError, match="declare compute_cap \\(NVIDIA\\) or gfx"):
        parse_project(text.replace("# gfx = ", "gfx = ").replace("# compute_cap", "compute_cap"),
                      tmp_path / "flagtrial.toml")  # fmt: skip


def test_init_writes_the_generated_file(tmp_path: Path) -> None:
    out = tmp_path / "flagtrial.toml"
    args = ["init", "--unit", "vllm.service", "--engine", "vllm", "--target", "local"]
    done = cli(out, *args, timeout=60)
    assert done.returncode == 0, done.stderr
    expected = Project(
        target="local", unit="vllm.service", engine="vllm", endpoint="http://127.0.0.1:8000"
    )
    assert out.read_text() == template(expected)
