"""Reading the ledger: `history`, `show`, `report` (HTML), and `ledger export` / `import`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from flagtrial import ui
from flagtrial.cli.common import (
    DEFAULT_PROJECT,
    JsonOpt,
    ProjectOpt,
    app,
    emit_json,
    open_ledger,
    run,
    write_output,
)
from flagtrial.errors import LedgerError
from flagtrial.ledger import Ledger
from flagtrial.settings import load_project
from flagtrial.states import FINAL


@app.command()
def history(project: ProjectOpt = DEFAULT_PROJECT, json_out: JsonOpt = False) -> None:
    """Every generation and trial in the ledger."""
    proj = load_project(project)
    ledger = open_ledger(proj)
    trials, gens = ledger.trials(), ledger.generations()
    if json_out:
        emit_json(
            {
                "generations": [g.model_dump() for g in gens],
                "trials": [t.model_dump() for t in trials],
            }
        )
        return
    current = {g.target: ledger.last_known_good(g.target) for g in gens}
    ids = {g.id for g in current.values() if g}
    ui.console.print(ui.generations_table(gens, next(iter(ids), None) if len(ids) == 1 else None))
    ui.console.print(ui.history_table(trials, gens))
    if open_trials := [t for t in trials if t.state not in FINAL]:
        from flagtrial import operations

        for line in run(lambda: operations.open_trials(proj, open_trials)):
            ui.console.print(line, style="yellow", markup=False)


@app.command()
def show(trial_id: int, project: ProjectOpt = DEFAULT_PROJECT, json_out: JsonOpt = False) -> None:
    """The whole story of one trial: change, facts, runs, verdict, timeline."""
    proj = load_project(project)
    ledger = open_ledger(proj)
    row = ledger.trial(trial_id)
    runs = ledger.runs(trial_id)
    events = ledger.events(trial_id)
    attributed = ledger.attribution(trial_id)
    if json_out:
        emit_json(
            {
                "trial": row.model_dump(),
                "runs": [r.model_dump() for r in runs],
                "events": [e.model_dump() for e in events],
                "attribution": attributed,
            }
        )
        return
    ui.console.print(
        f"[bold]trial {row.id}[/bold]{ui.part_of(row)} on {row.target}: generation "
        f"{row.baseline_gen} -> {row.candidate_gen}, verdict [bold]{row.verdict or '-'}[/bold], "
        f"state {row.state}"
    )
    for edit in row.change.get("edits", []):
        ui.console.print(f"  {ui._edit(edit)}")
    for reason in row.reasons:
        ui.console.print(f"  - {reason.message}")
    if runs:
        ui.console.print(ui.runs_table(runs))
    ui.console.print(ui.timeline(events))
    if attributed is not None:
        from flagtrial.attribution.outcome import Attribution

        ui.show_attribution(Attribution.model_validate(attributed))


@app.command()
def report(
    trial_id: int,
    out: Annotated[Path, typer.Option("--out", "-o", help="the HTML file to write")] = Path(
        "trial.html"
    ),
    project: ProjectOpt = DEFAULT_PROJECT,
) -> None:
    """Write one trial as an HTML page with plots of every run (JSON: `show --json`)."""
    from flagtrial.report import render_html

    proj = load_project(project)
    write_output(out, render_html(open_ledger(proj), trial_id))
    ui.console.print(f"wrote {out}")


ledger_app = typer.Typer(help="Move the ledger between machines as JSON.")
app.add_typer(ledger_app, name="ledger")


@ledger_app.command("export")
def ledger_export(
    out: Path,
    project: ProjectOpt = DEFAULT_PROJECT,
    force: Annotated[bool, typer.Option(help="overwrite an existing file")] = False,
    include_secrets: Annotated[
        bool,
        typer.Option(
            "--include-secrets",
            help="keep secret values (the copy can then be imported and restored from; "
            "written owner-only)",
        ),
    ] = False,
) -> None:
    """Write every generation, trial, journal event and run to a JSON file (secret values
    redacted unless --include-secrets)."""
    ledger = open_ledger(load_project(project))
    data = ledger.export(include_secrets=include_secrets)
    write_output(out, json.dumps(data, indent=1), overwrite=force, private=include_secrets)
    ui.console.print(f"wrote {out}")


@ledger_app.command("import")
def ledger_import(src: Path, project: ProjectOpt = DEFAULT_PROJECT) -> None:
    """Load an exported ledger into this project's (new, empty) ledger."""
    try:
        data = json.loads(src.read_text())
        rows = Ledger(load_project(project).ledger_path).import_(data)
    except (OSError, ValueError) as e:
        raise LedgerError(f"cannot read {src}: {e}") from None
    ui.console.print(f"imported {rows} records from {src}")
