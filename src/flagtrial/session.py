"""The session: what every command that touches a server needs (project, target, engine,
ledger), and what it does on the server outside a trial's loop: read the known-good, check a
change against the engine's own flags, restore a generation, recover an unfinished trial."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
from pydantic import BaseModel

from flagtrial.engines import make_engine
from flagtrial.engines.base import (
    Engine,
    LogsLate,
    ProgressFn,
    ResolvesDefaults,
    ValueChecker,
    wait_ready,
)
from flagtrial.engines.flag_table import check_candidate
from flagtrial.errors import ChangeError, FlagtrialError, LockHeldError, RollbackError
from flagtrial.facts import Facts, diff_facts, request_tokens
from flagtrial.faults import checkpoint
from flagtrial.launch.change import (
    Change,
    apply_change,
    check_listen_address,
    checkable_args,
    names_touched,
)
from flagtrial.launch.spec import LaunchSpec, byte_difference
from flagtrial.ledger import Ledger
from flagtrial.records import Generation
from flagtrial.redact import Redactor
from flagtrial.settings import Project, load_project
from flagtrial.states import TrialState
from flagtrial.targets import make_target
from flagtrial.targets.base import Target
from flagtrial.targets.holder import held_message

# How long a start's log may trail its readiness (engines.base.LogsLate) before its facts
# are read from what there is.
LOG_LAG_MAX_S = 10.0


Notify = Callable[[str, str], None]


@dataclass(frozen=True)
class CheckedChange:
    """A change checked against the engine's own flags: the candidate spec it makes."""

    candidate: LaunchSpec
    notes: list[str]  # deprecations and the like: shown, not fatal
    named_settings: set[str]


class Restore(BaseModel):
    generation: int
    facts: Facts
    verified: bool
    mismatches: list[str]

    def raise_unless_verified(self) -> None:
        """RollbackError (exit 9) when the restored server does not report its known facts."""
        if not self.verified:
            raise RollbackError(
                f"restored generation {self.generation} but its facts differ: "
                + "; ".join(self.mismatches)
            )


def verify_facts(expected: Facts, actual: Facts, tolerance_pct: float = 0.0) -> list[str]:
    """Mismatches between two fact sets: capacity within the engine's tolerance, resolved
    settings exactly."""
    diff = diff_facts(expected, actual, set())
    return [c.describe() for c in diff.capacity if abs(c.pct) > tolerance_pct] + [
        s.describe() for s in diff.implicit
    ]


class Session:
    """What every command that touches a server needs: project, target, engine, ledger."""

    def __init__(
        self,
        project: Project,
        target: Target,
        engine: Engine,
        ledger: Ledger,
        notify: Notify,
        progress: ProgressFn | None = None,
    ) -> None:
        self.project = project
        self.target = target
        self.engine = engine
        self.ledger = ledger
        self.notify = notify
        self.progress = progress  # told how each restart's start goes, while it goes

    @classmethod
    def open(
        cls,
        path: Path,
        notify: Notify,
        progress: ProgressFn | None = None,
        *,
        target: Target | None = None,
        accept_new_host_key: bool = False,
        secrets: Redactor | None = None,
    ) -> Session:
        """A session from a project file: its target (unless `target`), its engine, its
        ledger. `secrets`, the redactor of what is printed, learns the project's secret names
        and is the ledger's: what the ledger knows to be secret is never printed."""
        project = load_project(path)
        if secrets is not None:
            secrets.add_names(project.secret_names)
        if target is None:
            target = make_target(project, accept_new_host_key=accept_new_host_key)
        engine = make_engine(project.engine, project.workload)
        ledger = Ledger(project.ledger_path, secrets)
        return cls(project, target, engine, ledger, notify, progress)

    async def restart_and_read(self) -> Facts:
        """Restart on the installed spec, wait until ready, read the server's facts."""
        began = time.monotonic()
        mark = await self.target.restart()
        return await self.read_started(mark, began)

    async def read_started(self, mark: str, began: float) -> Facts:
        """Wait until the start logged after `mark` (begun at `began`) is ready, read its facts."""
        await wait_ready(
            self.engine,
            self.target,
            self.project.endpoint,
            mark,
            self.project.ready_timeout_s,
            self.progress,
        )
        took = time.monotonic() - began
        self.notify("ready", f"server ready in {took:.1f}s")
        log = await self.target.logs_since(mark)
        if isinstance(self.engine, LogsLate):
            deadline = time.monotonic() + LOG_LAG_MAX_S
            while not self.engine.startup_logged(log) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
                log = await self.target.logs_since(mark)
        async with httpx.AsyncClient(timeout=10.0) as client:
            facts = await self.engine.facts(client, self.project.endpoint, log)
        if isinstance(self.engine, ResolvesDefaults):
            program = (await self.target.read_spec()).program
            facts = await self.engine.with_defaults(self.target, program, facts)
        # Capacity at the workload's lengths, as this server counts its prompts.
        tokens = await request_tokens(self.project.endpoint, self.project.workload)
        return facts.at_tokens(tokens).model_copy(update={"ready_s": took})

    async def close(self) -> None:
        await self.target.aclose()
        self.ledger.close()

    async def recover(self) -> None:
        """Finish what a killed flagtrial left: a trial judged KEEP is promoted (the candidate
        installed, restarted and verified against the facts it was judged on), any other
        unfinished trial is rolled back to its baseline and verified. A journal is unfinished
        only when its holder is gone: while another command holds the lock, its trial runs,
        and this refuses (LockHeldError) rather than restart the server under it."""
        holder = await self.target.lock_holder()
        if holder is not None and not holder.ours:
            raise LockHeldError(held_message(self.target.name, holder))
        for trial in self.ledger.unfinished_trials(self.target.name):
            self.notify("recover", f"trial {trial.id} was left unfinished in state {trial.state}")
            facts_after = trial.facts_after
            # an attribution's probe trial (ledgers before the measured design) is never kept
            probe = trial.record.get("probe_of") is not None
            if trial.verdict == "KEEP" and not probe and trial.candidate_gen and facts_after:
                candidate = self.ledger.generation(trial.candidate_gen)
                promoted = await self.restore(candidate, facts_after)
                if promoted.verified:
                    self.ledger.mark_known_good(candidate.id, trial.record["facts_after"])
                    self.ledger.step(
                        trial.id,
                        TrialState.KEPT,
                        "recovered: promotion finished",
                        finished_at=time.time(),
                    )
                    continue
                self.notify("recover", "the kept candidate came back different: "
                            + "; ".join(promoted.mismatches))  # fmt: skip
            restore = await self.restore(self.ledger.generation(trial.baseline_gen))
            self.ledger.step(
                trial.id,
                TrialState.RECOVERED,
                "recovered: " + restore_detail(restore),
                finished_at=time.time(),
            )
            self.notify("recovered", restore_detail(restore))
            if not restore.verified:
                raise RollbackError(
                    f"recovered trial {trial.id}, but the facts differ: "
                    + "; ".join(restore.mismatches)
                )

    async def live_facts(self) -> Facts | None:
        """The running server's facts read over HTTP, restarting nothing (no startup log, so
        facts only a log gives are missing); None when it does not answer."""
        async with httpx.AsyncClient(timeout=10.0) as client:
            if not await _ready(self.engine, client, self.project.endpoint):
                return None
            try:
                return await self.engine.facts(client, self.project.endpoint, "")
            except (httpx.HTTPError, FlagtrialError, KeyError, ValueError):
                return None

    async def known_good(self) -> tuple[Generation, LaunchSpec, Facts]:
        """The known-good generation, running and read, for a command that holds the lock:
        unfinished trials are recovered first. The installed spec becomes the baseline when
        the ledger has none, or when someone changed the spec outside flagtrial."""
        await self.recover()
        spec = await self.target.read_spec()
        installed = self.ledger.record_generation(self.target.name, spec.text, note="installed")
        good = self.ledger.last_known_good(self.target.name)
        state = await self.target.state()
        if (
            good is not None
            and good.id == installed.id
            and state.status == "running"
            and good.facts
        ):
            async with httpx.AsyncClient(timeout=10.0) as client:
                if await _ready(self.engine, client, self.project.endpoint):
                    return good, spec, Facts.model_validate(good.facts)
        if good is not None and good.id != installed.id:
            self.notify(
                "baseline",
                f"installed spec differs from known-good generation {good.id}; "
                f"taking the installed spec (generation {installed.id}) as the baseline",
            )
        self.notify("baseline", f"starting generation {installed.id} to read its facts")
        facts = await self.restart_and_read()
        self.ledger.mark_known_good(installed.id, facts.model_dump())
        return self.ledger.generation(installed.id), spec, facts

    async def check_change(self, spec: LaunchSpec, change: Change) -> CheckedChange:
        """Everything knowable before a deploy: the candidate, checked against the engine's own
        flags and parser, and which resolved settings the change names."""
        schema = await self.engine.flag_schema(self.target, spec.program)
        candidate = apply_change(spec, change, schema)
        if candidate.text == spec.text:
            # An A/A trial by accident costs restarts and says nothing about the change.
            raise ChangeError(
                "the change leaves the launch spec as it is (the values are already set): "
                "nothing to trial"
            )
        check_listen_address(
            spec, candidate, schema, self.project.endpoint, self.engine.default_port
        )
        if isinstance(self.engine, ValueChecker):
            await self.engine.check_values(
                self.target, spec.program, checkable_args(change, schema)
            )
        notes = check_candidate(schema, candidate)
        named = {k for f in names_touched(change, schema) for k in self.engine.settings_for_flag(f)}
        return CheckedChange(candidate=candidate, notes=notes, named_settings=named)

    async def restore(self, gen: Generation, expected: Facts | None = None) -> Restore:
        """Install a generation, restart, and verify the spec reads back as the generation's
        exact bytes and the server reports its known facts again (`expected`, by default the
        generation's own)."""
        installed = await self.target.read_spec()
        spec = LaunchSpec(kind=installed.kind, text=gen.spec_text, dropin=installed.dropin)
        await self.target.install_spec(spec)
        # Facts cannot see a changed line ending or comment byte: the bytes are compared too.
        differs = byte_difference(gen.spec_text, (await self.target.read_spec()).text)
        checkpoint("restore-installed")
        facts = await self.restart_and_read()
        if expected is None and gen.facts:
            expected = Facts.model_validate(gen.facts)
        tolerance = self.engine.capacity_tolerance_pct
        mismatches = verify_facts(expected, facts, tolerance) if expected else []
        mismatches = [differs, *mismatches] if differs else mismatches
        return Restore(
            generation=gen.id,
            facts=facts,
            verified=expected is not None and not mismatches,
            mismatches=mismatches,
        )


async def _ready(engine: Engine, client: httpx.AsyncClient, base_url: str) -> bool:
    try:
        return await engine.is_ready(client, base_url)
    except httpx.HTTPError:
        return False


def restore_detail(restore: Restore) -> str:
    if restore.verified:
        return f"generation {restore.generation} serving, facts match the known-good"
    return f"generation {restore.generation} serving, facts differ: " + "; ".join(
        restore.mismatches
    )
