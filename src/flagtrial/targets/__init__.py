"""Targets: where a server runs and how it is restarted, one adapter per file."""

from __future__ import annotations

from flagtrial.errors import ProjectError
from flagtrial.settings import Project
from flagtrial.targets.base import Target
from flagtrial.targets.process import ProcessTarget


def make_target(project: Project) -> Target:
    if project.target == "process":
        return ProcessTarget(project.path(project.unit), project.state_dir / "process")
    raise ProjectError(f"target {project.target!r} is not supported (use 'process')")
