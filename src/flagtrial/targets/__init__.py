"""Targets: where a server runs and how it is restarted, one adapter per file."""

from __future__ import annotations

from pathlib import Path

from flagtrial.settings import Project
from flagtrial.targets.base import Target
from flagtrial.targets.process import ProcessTarget
from flagtrial.targets.systemd import SystemdTarget


def make_target(project: Project, *, accept_new_host_key: bool = False) -> Target:
    if project.target == "process":
        return ProcessTarget(project.path(project.unit), project.state_dir / "process")
    restart_timeout_s = project.ready_timeout_s
    if project.target == "local":
        return SystemdTarget(project.unit, project.spec_path, restart_timeout_s=restart_timeout_s)
    # asyncssh costs a start that only an ssh target needs.
    from flagtrial.targets.ssh import SshTarget

    ssh = project.ssh

    def local(path: str | None) -> Path | None:
        return project.path(path) if path else None

    identity = local(ssh.identity_file)
    config = local(ssh.ssh_config)
    return SshTarget(
        project.target,
        project.unit,
        project.spec_path,
        known_hosts=local(ssh.known_hosts),
        accept_new_host_key=accept_new_host_key or ssh.accept_new_host_key,
        client_keys=[identity] if identity else None,
        ssh_config=[config] if config else None,
        proxy_jump=ssh.proxy_jump,
        connect_timeout_s=ssh.connect_timeout_s,
        restart_timeout_s=restart_timeout_s,
    )
