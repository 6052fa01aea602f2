"""A group's hosts as sessions (one SSH target each, one shared ledger), and their status:
which generation each runs, whether its spec and facts are the group's known-good (the
canary's), and which cannot be reached. Status changes nothing on any host."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Literal, TypeVar
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel

from flagtrial.engines import make_engine
from flagtrial.engines.base import ProgressFn
from flagtrial.errors import FlagtrialError, ProjectError, UsageError
from flagtrial.facts import Facts
from flagtrial.fleet.inventory import FleetHost, load_group
from flagtrial.launch.spec import spec_sha256
from flagtrial.ledger import Ledger
from flagtrial.records import Generation
from flagtrial.redact import Redactor
from flagtrial.session import Notify, Session, verify_facts
from flagtrial.settings import Project, load_project
from flagtrial.targets import make_target
from flagtrial.targets.systemd import SystemdTarget

T = TypeVar("T")


def inventory_path(project: Project) -> Path:
    if project.fleet.inventory is None:
        raise ProjectError("fleet.inventory is not set in the project file: name the inventory")
    return project.path(project.fleet.inventory)


def host_endpoint(endpoint: str, address: str) -> str:
    """The project's endpoint with its host replaced by the fleet host's address."""
    parts = urlsplit(endpoint)
    host = f"[{address}]" if ":" in address else address
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc))


def host_project(project: Project, host: FleetHost) -> Project:
    """The project as it applies to one host: its ssh:// target, its endpoint, its declared
    GPU (the host's flagtrial_gpu var, else the project's [gpu])."""
    update = {"target": host.url, "endpoint": host_endpoint(project.endpoint, host.address)}
    return project.model_copy(update=update | ({"gpu": host.gpu} if host.gpu else {}))


class Fleet:
    """The hosts of one inventory group, each with its own session over the shared ledger."""

    def __init__(
        self,
        project: Project,
        project_file: Path,
        group: str,
        notify: Notify,
        progress: ProgressFn | None = None,
        *,
        secrets: Redactor | None = None,
        accept_new_host_key: bool = False,
        canaries: list[str] | int | None = None,
    ) -> None:
        self.project = project
        self.project_file = project_file
        self.group = group
        self.inventory = inventory_path(project)
        self.hosts = load_group(self.inventory, group)
        self.canaries = self._canaries(canaries)
        self.ledger = Ledger(project.ledger_path, secrets)
        self.sessions: dict[str, Session] = {}
        for host in self.hosts:
            hp = host_project(project, host)
            target = make_target(hp, accept_new_host_key=accept_new_host_key)
            engine = make_engine(hp.engine, hp.workload)
            self.sessions[host.name] = Session(
                hp, target, engine, self.ledger, _prefixed(notify, host.name), progress
            )

    @classmethod
    def open(
        cls,
        path: Path,
        group: str,
        notify: Notify,
        progress: ProgressFn | None = None,
        *,
        secrets: Redactor | None = None,
        accept_new_host_key: bool = False,
        canaries: list[str] | int | None = None,
    ) -> Fleet:
        project = load_project(path)
        if secrets is not None:
            secrets.add_names(project.secret_names)
        return cls(
            project,
            path,
            group,
            notify,
            progress,
            secrets=secrets,
            accept_new_host_key=accept_new_host_key,
            canaries=canaries,
        )

    def _canaries(self, given: list[str] | int | None) -> list[str]:
        """The canaries, in the order their trials run: `given` (the command line's names
        or count), else the project's fleet.canary or fleet.canary_count."""
        names = [h.name for h in self.hosts]
        policy = self.project.fleet
        chosen = policy.canary if given is None else given
        if chosen is None:
            chosen = policy.canary_count
        if isinstance(chosen, int):
            if chosen > len(names):
                raise UsageError(f"{chosen} canaries: group {self.group!r} has {len(names)} hosts")
            return names[:chosen]
        chosen = [chosen] if isinstance(chosen, str) else chosen
        unknown = [c for c in chosen if c not in names]
        if unknown or not chosen or len(set(chosen)) != len(chosen):
            why = f"{unknown[0]!r} is not a host of" if unknown else "name distinct hosts of"
            raise UsageError(f"canary: {why} group {self.group!r}")
        return list(chosen)

    @property
    def canary(self) -> str:
        """The first canary: the group's known-good, the facts later hosts are checked against."""
        return self.canaries[0]

    @property
    def unit(self) -> str:
        """The unit's full name, as systemd and Ansible's systemd module take it."""
        target = self.sessions[self.canary].target
        assert isinstance(target, SystemdTarget)
        return target.unit

    @property
    def others(self) -> list[FleetHost]:
        """The hosts a promotion reaches: all but the canaries, in inventory order."""
        return [h for h in self.hosts if h.name not in self.canaries]

    def known_good(self) -> Generation | None:
        """The group's known-good: the canary's."""
        return self.ledger.last_known_good(self.sessions[self.canary].target.name)

    async def each(
        self, hosts: list[FleetHost], body: Callable[[FleetHost, Session], Awaitable[T]]
    ) -> dict[str, T | FlagtrialError]:
        """`body` on every host at once; a host's FlagtrialError is its result."""

        async def one(host: FleetHost) -> T | FlagtrialError:
            try:
                return await body(host, self.sessions[host.name])
            except FlagtrialError as e:
                return e

        results = await asyncio.gather(*(one(h) for h in hosts))
        return {h.name: r for h, r in zip(hosts, results, strict=True)}

    async def aclose(self) -> None:
        await asyncio.gather(*(s.target.aclose() for s in self.sessions.values()))
        self.ledger.close()


def _prefixed(notify: Notify, name: str) -> Notify:
    return lambda kind, detail: notify(kind, f"{name}: {detail}")


class HostStatus(BaseModel):
    name: str
    target: str
    canary: bool
    reachable: bool
    error: str | None = None
    generation: int | None = None  # the ledger's generation of its installed spec, if any
    spec: Literal["known-good", "differs", "unknown"] = "unknown"
    facts: list[str] | None = None  # mismatches against the known-good's; None: not recorded
    serving: bool | None = None


class FleetStatus(BaseModel):
    group: str
    known_good: int | None  # the canary's known-good generation
    hosts: list[HostStatus]

    @property
    def unreachable(self) -> list[HostStatus]:
        return [h for h in self.hosts if not h.reachable]


async def status(fleet: Fleet) -> FleetStatus:
    good = fleet.known_good()
    good_facts = Facts.model_validate(good.facts) if good and good.facts else None

    async def one(host: FleetHost, session: Session) -> HostStatus:
        name = host.name
        row = HostStatus(
            name=name, target=session.target.name, canary=name in fleet.canaries, reachable=True
        )
        spec = await session.target.read_spec()
        digest = spec_sha256(spec.text)
        gens = fleet.ledger.generations(session.target.name)
        mine = next((g for g in reversed(gens) if g.spec_sha256 == digest), None)
        row.generation = mine.id if mine else None
        if good is not None:
            row.spec = "known-good" if digest == good.spec_sha256 else "differs"
        if mine is not None and mine.known_good and mine.facts and good_facts is not None:
            tolerance = session.engine.capacity_tolerance_pct
            row.facts = verify_facts(good_facts, Facts.model_validate(mine.facts), tolerance)
        row.serving = await session.live_facts() is not None
        return row

    results = await fleet.each(fleet.hosts, one)
    rows = []
    for host in fleet.hosts:
        result = results[host.name]
        if isinstance(result, FlagtrialError):
            result = HostStatus(
                name=host.name,
                target=fleet.sessions[host.name].target.name,
                canary=host.name in fleet.canaries,
                reachable=False,
                error=str(result),
            )
        rows.append(result)
    return FleetStatus(group=fleet.group, known_good=good.id if good else None, hosts=rows)
