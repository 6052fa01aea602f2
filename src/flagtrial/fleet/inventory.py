"""An Ansible inventory (INI, YAML, or any source ansible-core parses), read with
ansible-core's own InventoryManager and VariableManager, so groups, children, host and group
vars and group_vars/ host_vars/ folders mean what they mean to Ansible."""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from flagtrial.errors import ProjectError, UsageError
from flagtrial.settings import DeclaredGpu

# The host var that declares a host's GPU for the gate analysis, as the project's [gpu] does
# (a mapping: compute_cap, count, cuda); it replaces the project's [gpu] for that host.
GPU_VAR = "flagtrial_gpu"


@dataclass(frozen=True)
class FleetHost:
    """One host of a group, as flagtrial reaches it: Ansible's name and its connection vars."""

    name: str  # inventory_hostname
    address: str  # ansible_host, else the name
    user: str | None  # ansible_user
    port: int | None  # ansible_port
    gpu: DeclaredGpu | None = field(default=None, compare=False)  # its flagtrial_gpu var

    @property
    def url(self) -> str:
        """The ssh:// target flagtrial's SSH target reaches it by."""
        host = f"[{self.address}]" if ":" in self.address else self.address
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port else ""
        return f"ssh://{user}{host}{port}"


def _cause(warnings: str) -> str:
    """The first reason ansible-core gave for not parsing a source (its warnings hold them)."""
    lines = [line.strip() for line in warnings.splitlines()]
    for i, line in enumerate(lines):
        if line == "<<< caused by >>>":
            return next((rest for rest in lines[i + 1 :] if rest), "")
    return next((line for line in lines if line), "")


def load_group(path: Path, group: str) -> list[FleetHost]:
    """The hosts of `group` in the inventory at `path`, in the inventory's order. A source
    ansible-core cannot parse is a ProjectError (exit 2), an unknown or empty group a
    UsageError (exit 2): each one line."""
    # ansible-core costs a start that only the fleet commands need.
    from ansible import constants
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    if not path.is_file():
        raise ProjectError(f"fleet.inventory: no inventory file at {path}")
    # Ansible only warns about a source it cannot parse and goes on with an empty inventory.
    constants.INVENTORY_ANY_UNPARSED_IS_FAILED = True
    warnings = io.StringIO()
    try:
        with contextlib.redirect_stderr(warnings):
            loader = DataLoader()
            inventory = InventoryManager(loader=loader, sources=[str(path)])
            variables = VariableManager(loader=loader, inventory=inventory)
    except AnsibleError as e:
        why = _cause(warnings.getvalue()) or str(e).splitlines()[0]
        raise ProjectError(f"inventory {path} cannot be parsed: {why}") from None
    if group not in inventory.groups:
        known = ", ".join(sorted(set(inventory.groups) - {"all", "ungrouped"})) or "none"
        raise UsageError(f"no group {group!r} in inventory {path} (its groups: {known})")
    hosts = []
    for host in inventory.groups[group].get_hosts():
        v = variables.get_vars(host=host)
        port = v.get("ansible_port")
        try:
            port_number = int(port) if port is not None else None
        except (TypeError, ValueError):
            raise ProjectError(f"inventory {path}: {host.name}: ansible_port {port!r}") from None
        user = v.get("ansible_user")
        hosts.append(
            FleetHost(
                name=host.name,
                address=str(v.get("ansible_host") or host.name),
                user=str(user) if user else None,
                port=port_number,
                gpu=_declared_gpu(path, host.name, v.get(GPU_VAR)),
            )
        )
    if not hosts:
        raise UsageError(f"group {group!r} in inventory {path} has no hosts")
    return hosts


def _declared_gpu(path: Path, host: str, value: object) -> DeclaredGpu | None:
    if value is None:
        return None
    try:
        return DeclaredGpu.model_validate(value)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in (GPU_VAR, *first["loc"]))
        raise ProjectError(f"inventory {path}: {host}: {where}: {first['msg']}") from None
