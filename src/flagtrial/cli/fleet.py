"""Fleets: `fleet status GROUP`, `fleet recover GROUP` (and what `trial --fleet` runs): the
library's fleet package, parsed and rendered."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from flagtrial import ui
from flagtrial.cli.common import (
    DEFAULT_PROJECT,
    EXIT_VERDICT,
    AcceptNewOpt,
    JsonOpt,
    ProjectOpt,
    app,
    emit_json,
    run,
)
from flagtrial.errors import FlagtrialError, TargetError

if TYPE_CHECKING:
    from flagtrial.fleet.hosts import Fleet, FleetStatus
    from flagtrial.fleet.promote import FleetTrial, Promotion
    from flagtrial.launch.change import Change

fleet_app = typer.Typer(no_args_is_help=True, help="A group of hosts from an Ansible inventory.")
app.add_typer(fleet_app, name="fleet")

GroupArg = Annotated[str, typer.Argument(help="the inventory group")]


@contextlib.asynccontextmanager
async def open_fleet(
    project: Path,
    group: str,
    *,
    accept_new_host_key: bool = False,
    json_out: bool = False,
    canaries: list[str] | int | None = None,
) -> AsyncIterator[Fleet]:
    from flagtrial.fleet.hosts import Fleet

    fleet = Fleet.open(
        project,
        group,
        ui.notify_stderr if json_out else ui.notify,
        ui.RestartProgress(ui.err_console if json_out else ui.console),
        secrets=ui.secrets,
        accept_new_host_key=accept_new_host_key,
        canaries=canaries,
    )
    try:
        yield fleet
    finally:
        await fleet.aclose()


@fleet_app.command("status")
def status(
    group: GroupArg,
    project: ProjectOpt = DEFAULT_PROJECT,
    json_out: JsonOpt = False,
    accept_new: AcceptNewOpt = False,
) -> None:
    """Each host's generation, spec and facts against the group's known-good; changes nothing."""
    from flagtrial.fleet.hosts import status as read_status

    async def body() -> FleetStatus:
        async with open_fleet(
            project, group, accept_new_host_key=accept_new, json_out=json_out
        ) as fleet:
            return await read_status(fleet)

    report = run(body)
    if json_out:
        emit_json(report.model_dump())
    else:
        ui.console.print(status_table(report))
    if report.unreachable:
        raise TargetError(
            f"{len(report.unreachable)} of {len(report.hosts)} hosts of {group} cannot be "
            "read: " + "; ".join(f"{h.name}: {h.error}" for h in report.unreachable)
        )


def status_table(report: FleetStatus) -> Table:
    good = f"generation {report.known_good}" if report.known_good else "none recorded yet"
    table = Table(title=f"group {report.group}: known-good {good}", title_justify="left")
    for column in ("host", "target", "generation", "spec", "facts", "serving"):
        table.add_column(column)
    for h in report.hosts:
        name = f"{h.name} (canary)" if h.canary else h.name
        if not h.reachable:
            table.add_row(name, h.target, "", "", "", f"[red]cannot be read[/red]: {h.error}")
            continue
        facts = (
            "not recorded"
            if h.facts is None
            else "known-good"
            if not h.facts
            else "differ: " + "; ".join(h.facts)
        )
        table.add_row(
            name,
            h.target,
            str(h.generation) if h.generation else "not in the ledger",
            h.spec if h.spec != "unknown" else "no known-good",
            facts,
            "yes" if h.serving else "no",
        )
    return table


# Exit codes of a promotion (README): all promoted 0; some hosts rolled back 12; past the
# failure budget, every host back on its known-good 13.
EXIT_HOSTS_ROLLED_BACK = 12
EXIT_FLEET_ROLLED_BACK = 13


def fleet_trial(
    group: str,
    change: Change,
    project: Path,
    *,
    json_out: bool,
    accept_new: bool,
    force: bool,
    canaries: list[str] | int | None = None,
) -> int:
    """`trial --fleet GROUP`: each canary's trial rendered as `trial` renders it, then the
    promotion's hosts and waves."""
    from flagtrial.fleet.promote import fleet_trial as run_fleet_trial

    async def body() -> FleetTrial:
        async with open_fleet(
            project, group, accept_new_host_key=accept_new, json_out=json_out, canaries=canaries
        ) as fleet:
            return await run_fleet_trial(fleet, change, force=force)

    done = run(body)
    promotion = done.promotion
    first = next(iter(done.canaries.values()))
    if json_out:
        emit_json(
            {
                "canary": first.model_dump(),
                "canaries": {name: o.model_dump() for name, o in done.canaries.items()},
                "canaries_rolled_back": done.rolled_back,
                "differences": {
                    name: {"differs": lines, "gates": done.differences.findings.get(name, [])}
                    for name, lines in done.differences.named.items()
                },
                "promotion": promotion.model_dump() if promotion else None,
            }
        )
    else:
        for name, outcome in done.canaries.items():
            if len(done.canaries) > 1:
                ui.console.print(f"canary {name}:", markup=False)
            ui.show_outcome(outcome)
        if promotion is not None:
            show_promotion(promotion)
        elif done.stopped_by is not None:
            back = f"; {', '.join(done.rolled_back)} rolled back" if done.rolled_back else ""
            ui.console.print(
                f"not promoted: canary {done.stopped_by} did not keep it{back}", markup=False
            )
    if promotion is None:  # the last canary's trial stopped it: its verdict's code
        return EXIT_VERDICT[list(done.canaries.values())[-1].verdict.decision]
    if promotion.budget_exceeded:
        return EXIT_FLEET_ROLLED_BACK
    return 0 if promotion.count("promoted") == len(promotion.hosts) else EXIT_HOSTS_ROLLED_BACK


def show_promotion(p: Promotion) -> None:
    table = Table(title=f"promotion of trial {p.trial_id} to {p.group}", title_justify="left")
    for column in ("host", "wave", "outcome", "detail"):
        table.add_column(column)
    for name in p.canaries:
        table.add_row(f"{name} (canary)", "", "rolled back" if p.canary_rolled_back else "kept", "")
    for h in p.hosts:
        style = {"promoted": "green", "rolled back": "yellow"}.get(h.outcome, "red")
        wave = str(h.wave) if h.wave else ""
        table.add_row(h.name, wave, f"[{style}]{h.outcome}[/{style}]", escape(h.detail))
    ui.console.print(table)
    for i, w in enumerate(p.waves, 1):
        ui.console.print(f"wave {i} ({', '.join(w.hosts)}): {w.seconds:.1f}s, {w.failed} failed")
    if p.budget_exceeded:
        ui.console.print(
            "[red]past the failure budget[/red]: every promoted host and the canaries rolled back"
        )


@fleet_app.command("recover")
def recover(
    group: GroupArg,
    project: ProjectOpt = DEFAULT_PROJECT,
    json_out: JsonOpt = False,
    accept_new: AcceptNewOpt = False,
) -> None:
    """Finish a killed promotion: every host verified on the new generation or its known-good."""
    from flagtrial.fleet.promote import recover as run_recover

    async def body() -> dict[str, dict[int, str] | FlagtrialError]:
        async with open_fleet(
            project, group, accept_new_host_key=accept_new, json_out=json_out
        ) as fleet:
            return await run_recover(fleet)

    results = run(body)
    failed = {name: r for name, r in results.items() if isinstance(r, FlagtrialError)}
    done = {name: r for name, r in results.items() if not isinstance(r, FlagtrialError)}
    if json_out:
        emit_json({"hosts": done, "failed": {name: str(e) for name, e in failed.items()}})
    else:
        for name, trials in done.items():
            ended = ", ".join(f"trial {t} {state}" for t, state in trials.items())
            ui.console.print(f"{name}: {ended or 'nothing to recover'}", markup=False)
    if failed:
        first = next(iter(failed.values()))
        raise type(first)(
            f"{len(failed)} of {len(results)} hosts not recovered: "
            + "; ".join(f"{name}: {e}" for name, e in failed.items())
        )
