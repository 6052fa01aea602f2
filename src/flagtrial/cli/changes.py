"""Trying a change: `trial`, `preflight` (the library's preflight, rendered) and `gates`
(the source gate analysis of one flag, no host needed)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from flagtrial import ui
from flagtrial.cli.common import (
    DEFAULT_PROJECT,
    EXIT_VERDICT,
    AcceptNewOpt,
    AddOpt,
    EnvOpt,
    JsonOpt,
    ProjectOpt,
    RemoveOpt,
    SetOpt,
    UnsetEnvOpt,
    app,
    emit_json,
    make_change,
    open_session,
    run,
)
from flagtrial.errors import GateError, UsageError
from flagtrial.launch.spec import printable

if TYPE_CHECKING:
    from flagtrial.preflight import PreflightReport


@app.command()
def trial(
    add: AddOpt = None,
    set_: SetOpt = None,
    remove: RemoveOpt = None,
    env: EnvOpt = None,
    unset_env: UnsetEnvOpt = None,
    project: ProjectOpt = DEFAULT_PROJECT,
    json_out: JsonOpt = False,
    accept_new: AcceptNewOpt = False,
    force: Annotated[
        bool, typer.Option(help="deploy even when the engine's source says it fails at startup")
    ] = False,
    attribute: Annotated[
        bool,
        typer.Option(
            "--attribute",
            help="two or more edits, not kept (or kept with a capacity loss or an implicit "
            "change): find which edit did it",
        ),
    ] = False,
    from_attribution: Annotated[
        int | None,
        typer.Option(
            "--from-attribution",
            metavar="TRIAL",
            help="try attributed trial TRIAL's change without its harmful and interacting edits",
        ),
    ] = None,
    fleet: Annotated[
        str | None,
        typer.Option(help="an inventory group: trial on its canary, then promote in waves"),
    ] = None,
    canary: Annotated[
        list[str] | None,
        typer.Option(
            metavar="HOST",
            help="--fleet: a canary host (repeat for several; replaces fleet.canary)",
        ),
    ] = None,
    canaries: Annotated[
        int | None,
        typer.Option(
            min=1, metavar="N", help="--fleet: the group's first N hosts are the canaries"
        ),
    ] = None,
) -> None:
    """Try a change: measure the known-good, deploy the candidate, read its facts, measure,
    decide KEEP / REVERT / INCONCLUSIVE, roll back unless kept."""
    from flagtrial.trial import Trial

    edits = (add, set_, remove, env, unset_env)
    if from_attribution is not None and (any(edits) or fleet is not None):
        raise UsageError(
            "--from-attribution takes its change from the attribution: no edits, no --fleet"
        )
    if (canary or canaries) and (fleet is None or (canary and canaries)):
        raise UsageError("--canary or --canaries: with --fleet, one of them")
    change = make_change(*edits) if from_attribution is None else None
    if fleet is not None and change is not None:
        from flagtrial.cli.fleet import fleet_trial

        opts = {"json_out": json_out, "accept_new": accept_new, "force": force}
        raise typer.Exit(fleet_trial(fleet, change, project, canaries=canary or canaries, **opts))

    async def body() -> int:
        from flagtrial.attribution import attribute as attribution
        from flagtrial.attribution.fixed import fixed_change

        async with open_session(
            project, accept_new_host_key=accept_new, json_out=json_out
        ) as session:
            tried = change or await fixed_change(session, from_attribution or 0)
            ui.secrets.learn_change(tried.edits)
            async with session.target.lock("flagtrial trial"):
                outcome = await Trial(session, tried, force=force).run()
                attributed = await attribution.after(session, outcome) if attribute else None
            if json_out:
                dumped = attributed.model_dump() if attributed else None
                emit_json({**outcome.model_dump(), "attribution": dumped})
            else:
                ui.show_outcome(outcome)
                if attributed is not None:
                    ui.show_attribution(attributed)
            return EXIT_VERDICT[outcome.verdict.decision]

    raise typer.Exit(run(body))


@app.command()
def attribute(
    trial_id: Annotated[int, typer.Argument(metavar="TRIAL", help="a finished trial's id")],
    project: ProjectOpt = DEFAULT_PROJECT,
    json_out: JsonOpt = False,
    accept_new: AcceptNewOpt = False,
) -> None:
    """Which edit of TRIAL's change did it: per edit harmful, useless, beneficial or
    interacting, with its evidence, in as few restarts as the evidence allows; the server ends
    on the known-good."""
    from flagtrial.attribution.attribute import Attribute

    async def body() -> None:
        async with (
            open_session(project, accept_new_host_key=accept_new, json_out=json_out) as session,
            session.target.lock("flagtrial attribute"),
        ):
            attributed = await Attribute(session, trial_id).run()
        if json_out:
            emit_json(attributed.model_dump())
        else:
            ui.show_attribution(attributed)

    run(body)


@app.command()
def preflight(
    add: AddOpt = None,
    set_: SetOpt = None,
    remove: RemoveOpt = None,
    env: EnvOpt = None,
    unset_env: UnsetEnvOpt = None,
    project: ProjectOpt = DEFAULT_PROJECT,
    accept_new: AcceptNewOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Validate a change against the engine's own flags and show the candidate; deploys nothing."""
    from flagtrial.preflight import preflight as check

    change = make_change(add, set_, remove, env, unset_env)

    async def body() -> None:
        async with open_session(
            project, accept_new_host_key=accept_new, json_out=json_out
        ) as session:
            report = await check(session, change)
        if json_out:
            emit_json(
                {
                    "passed": report.passed,
                    "change": change.model_dump(),
                    "notes": report.notes,
                    "gates": [f.model_dump(mode="json") for f in report.findings],
                    "gates_skipped": report.skipped,
                    "resolution": report.prediction.model_dump(mode="json")
                    if report.prediction
                    else None,
                    "diff": report.diff,
                }
            )
        else:
            show_preflight(report)
        if not report.passed:
            raise GateError("preflight failed: a change fails at startup on this GPU")
        if not json_out:
            ui.console.print("[green]preflight passed[/green]: every flag is known to the engine")

    run(body)


def show_preflight(report: PreflightReport) -> None:
    from flagtrial.gates.analyze import render_text

    for line in report.change.describe().splitlines():
        ui.console.print(f"  {ui.secrets.text(line)}", markup=False)
    for note in report.notes:
        ui.console.print(f"  [yellow]note:[/yellow] {ui.secrets.text(note)}")
    if report.findings:
        text = ui.secrets.text(render_text(report.findings))
        ui.console.print(text, markup=False, soft_wrap=True)
    elif report.skipped:
        ui.console.print(f"  {report.skipped}")
    for line in report.prediction.lines() if report.prediction else []:
        ui.console.print(f"  {ui.secrets.text(line)}", markup=False, soft_wrap=True)
    ui.console.print(printable(report.diff), markup=False)


# FLAG is itself an option-like word: let it through as an argument.
@app.command(context_settings={"ignore_unknown_options": True})
def gates(
    flag: Annotated[str, typer.Argument(help="the flag, e.g. --attention-backend")],
    value: Annotated[str | None, typer.Argument(help="its value, if it takes one")] = None,
    engine: Annotated[str, typer.Option(help="ENGINE==VERSION, e.g. sglang==0.5.23")] = "",
    sm: Annotated[str, typer.Option(help="CUDA compute capability, e.g. 120 or 9.0")] = "",
    gfx: Annotated[str, typer.Option(help="AMD GPU architecture, e.g. gfx942")] = "",
    cpu: Annotated[bool, typer.Option("--cpu", help="a host without a GPU")] = False,
    cuda: Annotated[str | None, typer.Option(help="CUDA version, e.g. 12.8")] = None,
    rocm: Annotated[str | None, typer.Option(help="ROCm version, e.g. 6.3")] = None,
    tp: Annotated[
        int | None, typer.Option(help="tensor parallel size (else the command's)")
    ] = None,
    gpus: Annotated[int | None, typer.Option(help="GPUs on the host (else the tp size)")] = None,
    command: Annotated[
        str, typer.Option(help="the whole candidate command's flags, e.g. '--tp-size 4 ...'")
    ] = "",
    model_config: Annotated[
        Path | None, typer.Option("--model-config", help="the model's config.json")
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", help="NAME=VALUE the launch's environment sets (repeatable)"),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Will FLAG act on this GPU? Evidence from the engine's own source; no host needed."""
    from flagtrial.engines import GATED
    from flagtrial.gates import preflight as gating
    from flagtrial.gates.analyze import analyze_change, render_text
    from flagtrial.gates.model import GateHost, parse_compute_cap

    name, sep, version = engine.partition("==")
    if not sep or name not in GATED or sum(map(bool, (sm, gfx, cpu))) != 1:
        raise typer.BadParameter(
            "give --engine sglang==VERSION or vllm==VERSION, and one of --sm, --gfx, --cpu"
        )
    argv = shlex.split(command)
    size = tp if tp is not None else gating.tensor_parallel(argv, name)
    count = 0 if cpu else gpus if gpus is not None else size
    try:
        host = GateHost(
            platform="cpu" if cpu else "rocm" if gfx else "cuda",
            compute_cap=parse_compute_cap(sm) if sm else None,
            cuda_version=parse_compute_cap(cuda) if cuda else None,
            gfx=gfx.lower() or None,
            rocm_version=parse_compute_cap(rocm) if rocm else None,
            gpu_count=count,
        )
        model = json.loads(model_config.read_text()) if model_config else None
    except (ValueError, OSError) as e:
        raise UsageError(f"gates: {e}") from None
    if any("=" not in word for word in env or []):
        raise UsageError("gates: --env takes NAME=VALUE (a word without '=' was given)")
    variables = dict(word.split("=", 1) for word in env or [])
    findings = analyze_change(
        name, version, [(flag, value)], host, size, command=argv, model=model, env=variables
    )
    if json_out:
        emit_json([f.model_dump(mode="json") for f in findings])
    else:
        ui.console.print(render_text(findings), markup=False, soft_wrap=True)
