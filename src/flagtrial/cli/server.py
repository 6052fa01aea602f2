"""Acting on the target outside a trial: `rollback`, `recover`, `facts`, `unlock`, each a
library call of flagtrial.operations, rendered."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from flagtrial import ui
from flagtrial.cli.common import (
    DEFAULT_PROJECT,
    AcceptNewOpt,
    JsonOpt,
    ProjectOpt,
    app,
    emit_json,
    open_session,
    run,
)

if TYPE_CHECKING:
    from flagtrial.operations import FactsReport


@app.command()
def rollback(
    to: Annotated[int | None, typer.Option("--to", help="generation to restore")] = None,
    project: ProjectOpt = DEFAULT_PROJECT,
    accept_new: AcceptNewOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Restore the last known-good generation (or --to GEN, one that was known-good once),
    restart, verify its facts."""
    from flagtrial import operations

    async def body() -> None:
        async with open_session(
            project, accept_new_host_key=accept_new, json_out=json_out
        ) as session:
            restore = await operations.rollback(session, to)
            if json_out:
                emit_json(restore.model_dump())
            else:
                ui.console.print(ui.restore_line(restore))
            if not restore.verified:
                raise typer.Exit(9)

    run(body)


@app.command()
def recover(
    project: ProjectOpt = DEFAULT_PROJECT,
    accept_new: AcceptNewOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Finish what a killed flagtrial left: roll an unfinished trial back (or finish a KEEP)
    and verify the server's facts. Safe to run again, and to kill and rerun."""
    from flagtrial import operations

    async def body() -> None:
        async with open_session(
            project, accept_new_host_key=accept_new, json_out=json_out
        ) as session:
            ended = await operations.recover(session)
        if json_out:
            emit_json({"recovered": [{"trial": i, "state": st} for i, st in ended.items()]})
        else:
            ui.console.print(
                f"recovered {len(ended)} unfinished trial(s)" if ended else "nothing to recover"
            )

    run(body)


@app.command()
def unlock(
    project: ProjectOpt = DEFAULT_PROJECT,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="stop a holder that still runs (SIGTERM, so its trial rolls back; SIGKILL "
            "after a grace), then recover its trial",
        ),
    ] = False,
    accept_new: AcceptNewOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Free the target's lock when its holder is gone. A holder that still runs is named and
    left alone (exit 6) unless --force."""
    from flagtrial import operations

    # with --json, the lines go to stderr and stdout holds {"lock": ..., "holder": ...}
    console = ui.err_console if json_out else ui.console

    def say(line: str) -> None:
        console.print(line, markup=False)

    async def body() -> None:
        async with open_session(
            project, accept_new_host_key=accept_new, json_out=json_out
        ) as session:
            done = await operations.unlock(session, say, force=force)
        if json_out:
            emit_json(
                {
                    "lock": done.lock,
                    "holder": done.holder,
                    "trials": [{"trial": i, "state": st} for i, st in done.trials.items()],
                }
            )

    run(body)


@app.command()
def facts(
    project: ProjectOpt = DEFAULT_PROJECT,
    json_out: JsonOpt = False,
    accept_new: AcceptNewOpt = False,
) -> None:
    """Read what the running server reports about itself, next to the known-good. Starts it
    (holding the lock) only for a first baseline or when it is down; while another command
    holds the lock, or a trial is left unfinished, it restarts nothing."""
    from flagtrial import operations

    async def body() -> None:
        async with open_session(
            project, accept_new_host_key=accept_new, json_out=json_out
        ) as session:
            read = await operations.read_facts(session)
        if json_out:
            emit_json(_facts_json(read))
        elif read.read_only is not None:
            _show_read_only(read)
        else:
            assert read.facts is not None
            ui.console.print(ui.host_line(read.host, read.facts))
            ui.console.print(
                ui.facts_table(read.facts, title=f"facts of generation {read.generation}")
            )
            for key, value in read.facts.settings.items():
                ui.console.print(f"  {key} = {value!r}")

    run(body)


def _facts_json(read: FactsReport) -> dict[str, object]:
    facts = read.facts.model_dump() if read.facts else None
    host = read.host.model_dump()
    if read.read_only is None:
        return {"generation": read.generation, "facts": facts, "host": host}
    live = read.live.model_dump() if read.live else None
    return {"generation": read.generation, "facts": facts, "live": live, "host": host,
            "read_only": read.read_only}  # fmt: skip


def _show_read_only(read: FactsReport) -> None:
    shown = read.live or read.facts
    assert shown is not None
    ui.console.print(f"nothing restarted: {read.read_only}", style="yellow", markup=False)
    ui.console.print(ui.host_line(read.host, shown))
    if read.generation is not None and read.facts:
        title = f"recorded facts of generation {read.generation}"
        ui.console.print(ui.facts_table(read.facts, title=title))
    if read.live:
        ui.console.print(ui.facts_table(read.live, title="live facts (read over HTTP)"))
