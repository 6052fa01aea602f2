"""Command-line face: parse, call, render. Exit codes are documented in the README."""

from __future__ import annotations

import contextlib
import json
import shlex
import shutil
import signal
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar
from urllib.parse import urlsplit

import typer
from rich.markup import escape

# Typer vendors click: its usage errors are these classes.
from typer._click.exceptions import ClickException, NoArgsIsHelpError

from flagtrial import ui
from flagtrial.errors import (
    FlagtrialError,
    GateError,
    LedgerError,
    LockHeldError,
    TargetError,
    UsageError,
)
from flagtrial.launch.spec import printable
from flagtrial.ledger import Ledger
from flagtrial.projectfile import template
from flagtrial.records import TrialRow
from flagtrial.settings import (
    PROJECT_FILE,
    Project,
    Ssh,
    load_project,
    parse_project,
    validate_project,
)
from flagtrial.states import FINAL

# A command imports the engines, targets, trial and gate analysis it uses when it runs:
# together they cost a start (httpx, asyncssh, numpy, scipy, the gate index) that --help,
# history and show must not pay.
if TYPE_CHECKING:
    from flagtrial.launch.change import Change
    from flagtrial.targets.holder import LockHolder
    from flagtrial.trial import Session

app = typer.Typer(
    no_args_is_help=True,
    help="Trial a launch-flag change on an LLM server: preflight, deploy, measure, "
    "decide, roll back.",
)

EXIT_VERDICT = {"KEEP": 0, "REVERT": 10, "INCONCLUSIVE": 11}
EXIT_INTERRUPTED = 130

T = TypeVar("T")

ProjectOpt = Annotated[Path, typer.Option("--project", "-p", help="the project file")]
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]
AcceptNewOpt = Annotated[
    bool,
    typer.Option(
        "--accept-new-host-key",
        help="ssh: trust and record an unknown host's key (a changed key is always refused)",
    ),
]
AddOpt = Annotated[
    list[str] | None, typer.Option("--add", help="add a flag: '--cont-batching', '-np=4'")
]
SetOpt = Annotated[
    list[str] | None, typer.Option("--set", help="set a flag's value: '--parallel=4'")
]
RemoveOpt = Annotated[list[str] | None, typer.Option("--remove", help="remove a flag: '--mlock'")]
EnvOpt = Annotated[list[str] | None, typer.Option("--env", help="set an environment variable: K=V")]
UnsetEnvOpt = Annotated[
    list[str] | None, typer.Option("--unset-env", help="unset an environment variable")
]


def _version(value: bool) -> None:
    if value:
        import importlib.metadata

        ui.console.print(f"flagtrial {importlib.metadata.version('flagtrial')}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="print the version"),
    ] = False,
) -> None:
    """Trial a launch-flag change on an LLM server: preflight, deploy, measure, decide,
    roll back."""


def run(body: Callable[[], Awaitable[T]]) -> T:
    """Run a command body; a FlagtrialError it raises reaches `main`, the one error printer.

    Ctrl-C and SIGTERM cancel the body, whose own cleanup (a trial's rollback) runs before
    the exit with 130; a second Ctrl-C stops at once and leaves the journal to `recover`.
    """
    import asyncio  # not at start: --help and the ledger commands run no event loop

    async def guarded() -> T:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        return await body()

    try:
        return asyncio.run(guarded())
    except (KeyboardInterrupt, asyncio.CancelledError):
        ui.err_console.print(
            "interrupted (after a second Ctrl-C the trial is unfinished: run `flagtrial recover`)"
        )
        raise typer.Exit(EXIT_INTERRUPTED) from None


@contextlib.asynccontextmanager
async def open_session(
    project_path: Path, *, accept_new_host_key: bool = False, json_out: bool = False
) -> AsyncIterator[Session]:
    """With `json_out`, progress lines go to stderr: stdout holds only the JSON."""
    from flagtrial.engines import make_engine
    from flagtrial.targets import make_target
    from flagtrial.trial import Session

    project = load_project(project_path)
    target = make_target(project, accept_new_host_key=accept_new_host_key)
    notify = ui.notify_stderr if json_out else ui.notify
    progress = ui.RestartProgress(ui.err_console if json_out else ui.console)
    engine = make_engine(project.engine, project.workload)
    session = Session(project, target, engine, open_ledger(project), notify, progress)
    try:
        yield session
    finally:
        await session.close()


def open_ledger(project: Project) -> Ledger:
    """The project's ledger, sharing ui's redactor: what it knows to be secret is never printed."""
    ui.secrets.add_names(project.secret_names)
    return Ledger(project.ledger_path, ui.secrets)


def make_change(
    add: list[str] | None,
    set_: list[str] | None,
    remove: list[str] | None,
    env: list[str] | None,
    unset_env: list[str] | None,
) -> Change:
    from flagtrial.launch.change import Change

    change = Change.from_cli(
        add=add or [],
        set_=set_ or [],
        remove=remove or [],
        env=env or [],
        unset_env=unset_env or [],
    )
    if not change.edits:
        raise typer.BadParameter("give at least one of --add, --set, --remove, --env, --unset-env")
    ui.secrets.learn_change(change.edits)
    return change


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(ui.secrets.data(data), indent=2, default=str) + "\n")


def write_output(out: Path, text: str, *, overwrite: bool = True, private: bool = False) -> None:
    """Write a file a command produces (`private`: owner-only, before any byte is in it); a
    path that exists (unless `overwrite`) or cannot be written is one UsageError line."""
    if out.is_dir():
        raise UsageError(f"{out} is a folder: give a file name")
    if out.exists() and not overwrite:
        raise UsageError(f"{out} exists (use --force to overwrite)")
    try:
        if private:
            out.touch(mode=0o600)
            out.chmod(0o600)
        out.write_text(text)
    except OSError as e:
        raise UsageError(f"cannot write {out}: {e.strerror}") from None


@app.command()
def init(
    unit: Annotated[
        str | None, typer.Option(help="process: the unit file's path; systemd: the unit's name")
    ] = None,
    from_unit: Annotated[
        str | None,
        typer.Option(
            "--from-unit",
            help="read a live unit: local:UNIT or ssh://user@host[:port]:UNIT",
        ),
    ] = None,
    engine: Annotated[str | None, typer.Option(help="llamacpp, sglang or vllm")] = None,
    endpoint: Annotated[str | None, typer.Option(help="the server's base URL")] = None,
    target: Annotated[str, typer.Option(help="process, local or ssh://...")] = "process",
    project: ProjectOpt = Path(PROJECT_FILE),
    force: Annotated[bool, typer.Option(help="overwrite an existing project file")] = False,
    known_hosts: Annotated[Path | None, typer.Option(help="ssh: known_hosts file")] = None,
    identity_file: Annotated[Path | None, typer.Option(help="ssh: private key")] = None,
    accept_new: AcceptNewOpt = False,
) -> None:
    """Write a commented project file, from options or from a live unit."""
    from flagtrial.engines import ENGINES

    ssh = Ssh(
        known_hosts=str(known_hosts.resolve()) if known_hosts else None,
        identity_file=str(identity_file.resolve()) if identity_file else None,
    )
    if project.exists() and not force:
        raise UsageError(f"{project} exists (use --force to overwrite)")
    if from_unit:
        target, unit = _split_host_unit(from_unit)
        found_engine, found_endpoint = run(lambda: _inspect_unit(target, unit, ssh, accept_new))
        engine = engine or found_engine
        endpoint = endpoint or found_endpoint
    if not unit:
        raise typer.BadParameter("give --unit or --from-unit")
    engine = engine or "llamacpp"
    default = ENGINES[engine].default_port if engine in ENGINES else 8080
    endpoint = endpoint or f"http://127.0.0.1:{default}"
    settings = validate_project(
        {"target": target, "unit": unit, "engine": engine, "endpoint": endpoint,
         "ssh": ssh.model_dump(exclude_defaults=True)},
        project,
    )  # fmt: skip
    text = template(settings)
    # Checked before it is written: a bad option leaves no invalid file behind.
    parse_project(text, project)
    write_output(project, text)
    ui.console.print(f"wrote {project}: {engine} at {endpoint}, unit {unit} on {target}")


def _split_host_unit(text: str) -> tuple[str, str]:
    host, sep, unit = text.rpartition(":")
    if not sep or not host or not unit:
        raise typer.BadParameter(f"--from-unit {text!r}: expected local:UNIT or ssh://HOST:UNIT")
    if host != "local" and not host.startswith("ssh://"):
        host = f"ssh://{host}"
    return host, unit


async def _inspect_unit(target: str, unit: str, ssh: Ssh, accept_new: bool) -> tuple[str, str]:
    """The engine and endpoint a live unit runs, read from its ExecStart."""
    from flagtrial.engines import ENGINES, detect_engine
    from flagtrial.launch.schema import flag_value
    from flagtrial.targets import make_target

    live = Project(target=target, unit=unit, ssh=ssh)
    host = make_target(live, accept_new_host_key=accept_new)
    try:
        spec = await host.read_spec()
    finally:
        await host.aclose()
    engine = detect_engine(spec.argv)
    if engine is None:
        raise FlagtrialError(f"{unit}: cannot tell the engine from {spec.argv[:3]} (use --engine)")
    address, port = flag_value(spec.argv, ("--host",)), flag_value(spec.argv, ("--port",))
    if address in (None, "0.0.0.0", "::"):
        address = urlsplit(target).hostname if target.startswith("ssh://") else "127.0.0.1"
    return engine, f"http://{address}:{port or ENGINES[engine].default_port}"


@app.command()
def model(
    out: Path,
    size: Annotated[str, typer.Option(help="tiny or small")] = "small",
    seed: Annotated[int, typer.Option(help="weights seed")] = 0,
) -> None:
    """Generate a random-weight llama GGUF model that never emits EOS (no downloads)."""
    from flagtrial.modelgen import generate_model

    if size not in ("tiny", "small"):
        raise typer.BadParameter("size must be tiny or small")
    if not out.parent.is_dir():
        raise UsageError(f"{out.parent} is not a folder (flagtrial model creates no folders)")
    generate_model(out, size=size, seed=seed)  # type: ignore[arg-type]
    ui.console.print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")


@app.command()
def trial(
    add: AddOpt = None,
    set_: SetOpt = None,
    remove: RemoveOpt = None,
    env: EnvOpt = None,
    unset_env: UnsetEnvOpt = None,
    project: ProjectOpt = Path(PROJECT_FILE),
    json_out: JsonOpt = False,
    accept_new: AcceptNewOpt = False,
    force: Annotated[
        bool, typer.Option(help="deploy even when the engine's source says it fails at startup")
    ] = False,
) -> None:
    """Try a change: measure the known-good, deploy the candidate, read its facts, measure,
    decide KEEP / REVERT / INCONCLUSIVE, roll back unless kept."""
    from flagtrial.trial import Trial

    change = make_change(add, set_, remove, env, unset_env)

    async def body() -> int:
        async with open_session(
            project, accept_new_host_key=accept_new, json_out=json_out
        ) as session:
            async with session.target.lock("flagtrial trial"):
                outcome = await Trial(session, change, force=force).run()
            if json_out:
                emit_json(outcome.model_dump())
            else:
                ui.show_outcome(outcome)
            return EXIT_VERDICT[outcome.verdict.decision]

    raise typer.Exit(run(body))


@app.command()
def preflight(
    add: AddOpt = None,
    set_: SetOpt = None,
    remove: RemoveOpt = None,
    env: EnvOpt = None,
    unset_env: UnsetEnvOpt = None,
    project: ProjectOpt = Path(PROJECT_FILE),
    accept_new: AcceptNewOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Validate a change against the engine's own flags and show the candidate; deploys nothing."""
    from flagtrial.engines import GATED
    from flagtrial.engines import resolve as resolving
    from flagtrial.gates import preflight as gating
    from flagtrial.gates.analyze import render_text

    change = make_change(add, set_, remove, env, unset_env)

    async def body() -> None:
        async with open_session(
            project, accept_new_host_key=accept_new, json_out=json_out
        ) as session:
            spec = await session.target.read_spec()
            ui.secrets.learn_spec(spec.text)
            checked = await session.preflight(spec, change)
            good = session.ledger.last_known_good(session.target.name)
            version = (good.facts or {}).get("version") if good else None
            host_facts = await session.target.host_facts()
            host = gating.gate_host(host_facts, session.project.gpu)
            findings = await gating.analyze(
                session.engine.name, version, change, checked.candidate, host
            )
            predicted = await resolving.predict(
                session.target,
                session.engine.name,
                spec,
                checked.candidate,
                resolving.declared_facts(host_facts, session.project.gpu),
                checked.named_settings,
            )
            if predicted is not None:
                findings = gating.combine(findings, predicted.known_good, predicted.candidate)
            skipped = None
            if not findings and session.engine.name in GATED:
                skipped = "source gate analysis skipped: " + (
                    "no GPU facts for this host ([gpu] in the project file)"
                    if host is None
                    else "engine version unknown (run `flagtrial facts` once)"
                )
            diff = ui.secrets.diff(spec.text, checked.candidate.text, "known-good", "candidate")
            passed = not gating.failing(findings) and not (predicted and predicted.refused)
            if json_out:
                emit_json(
                    {
                        "passed": passed,
                        "change": change.model_dump(),
                        "notes": checked.notes,
                        "gates": [f.model_dump(mode="json") for f in findings],
                        "gates_skipped": skipped,
                        "resolution": predicted.model_dump(mode="json") if predicted else None,
                        "diff": diff,
                    }
                )
            else:
                for line in change.describe().splitlines():
                    ui.console.print(f"  {ui.secrets.text(line)}", markup=False)
                for note in checked.notes:
                    ui.console.print(f"  [yellow]note:[/yellow] {ui.secrets.text(note)}")
                if findings:
                    ui.console.print(
                        ui.secrets.text(render_text(findings)), markup=False, soft_wrap=True
                    )
                elif skipped:
                    ui.console.print(f"  {skipped}")
                for line in predicted.lines() if predicted else []:
                    ui.console.print(f"  {ui.secrets.text(line)}", markup=False, soft_wrap=True)
                ui.console.print(printable(diff), markup=False)
            if not passed:
                raise GateError("preflight failed: a change fails at startup on this GPU")
            if not json_out:
                ui.console.print(
                    "[green]preflight passed[/green]: every flag is known to the engine"
                )

    run(body)


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
    findings = analyze_change(name, version, [(flag, value)], host, size, command=argv, model=model)
    if json_out:
        emit_json([f.model_dump(mode="json") for f in findings])
    else:
        ui.console.print(render_text(findings), markup=False, soft_wrap=True)


@app.command()
def rollback(
    to: Annotated[int | None, typer.Option("--to", help="generation to restore")] = None,
    project: ProjectOpt = Path(PROJECT_FILE),
    accept_new: AcceptNewOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Restore the last known-good generation (or --to GEN, one that was known-good once),
    restart, verify its facts."""

    async def body() -> None:
        async with open_session(
            project, accept_new_host_key=accept_new, json_out=json_out
        ) as session:
            async with session.target.lock("flagtrial rollback"):
                await session.recover()
                gen = (
                    session.ledger.generation(to)
                    if to is not None
                    else session.ledger.last_known_good(session.target.name)
                )
                if gen is None:
                    raise FlagtrialError("the ledger has no known-good generation for this target")
                if gen.target != session.target.name:
                    raise FlagtrialError(f"generation {gen.id} belongs to {gen.target}")
                if not gen.known_good or gen.facts is None:
                    # Its facts were never verified: restoring it would make an untried spec
                    # the known-good without a trial.
                    raise UsageError(
                        f"generation {gen.id} was never known-good ({gen.note or 'no note'}): "
                        "try it with `flagtrial trial` instead"
                    )
                restore = await session.restore(gen)
                if restore.verified:
                    session.ledger.mark_known_good(gen.id, restore.facts.model_dump())
            if json_out:
                emit_json(restore.model_dump())
            else:
                ui.console.print(ui.restore_line(restore))
            if not restore.verified:
                raise typer.Exit(9)

    run(body)


@app.command()
def recover(
    project: ProjectOpt = Path(PROJECT_FILE),
    accept_new: AcceptNewOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Finish what a killed flagtrial left: roll an unfinished trial back (or finish a KEEP)
    and verify the server's facts. Safe to run again, and to kill and rerun."""

    async def body() -> None:
        async with (
            open_session(project, accept_new_host_key=accept_new, json_out=json_out) as session,
            session.target.lock("flagtrial recover"),
        ):
            unfinished = session.ledger.unfinished_trials(session.target.name)
            await session.recover()
            ended = {t.id: session.ledger.trial(t.id).state for t in unfinished}
        if json_out:
            emit_json({"recovered": [{"trial": i, "state": st} for i, st in ended.items()]})
        else:
            ui.console.print(
                f"recovered {len(ended)} unfinished trial(s)" if ended else "nothing to recover"
            )

    run(body)


ledger_app = typer.Typer(help="Move the ledger between machines as JSON.")
app.add_typer(ledger_app, name="ledger")


@ledger_app.command("export")
def ledger_export(
    out: Path,
    project: ProjectOpt = Path(PROJECT_FILE),
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
def ledger_import(src: Path, project: ProjectOpt = Path(PROJECT_FILE)) -> None:
    """Load an exported ledger into this project's (new, empty) ledger."""
    try:
        data = json.loads(src.read_text())
        rows = Ledger(load_project(project).ledger_path).import_(data)
    except (OSError, ValueError) as e:
        raise LedgerError(f"cannot read {src}: {e}") from None
    ui.console.print(f"imported {rows} records from {src}")


@app.command()
def unlock(
    project: ProjectOpt = Path(PROJECT_FILE),
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
    from flagtrial.targets.holder import held_message

    # with --json, the lines go to stderr and stdout holds {"lock": ..., "holder": ...}
    say = ui.err_console.print if json_out else ui.console.print

    async def body() -> None:
        async with open_session(
            project, accept_new_host_key=accept_new, json_out=json_out
        ) as session:
            target, ledger = session.target, session.ledger
            holder = await target.lock_holder()
            trials: dict[int, str] = {}
            if holder is None:
                lock = "free"
                say("the lock was free")
            elif holder.alive is False:
                lock = "broken"
                await target.break_lock(holder)
                say(f"broke the lock held by {holder.info}, which was gone", markup=False)
            elif not force:
                raise LockHeldError("left alone: " + held_message(target.name, holder))
            else:
                lock = "forced"
                running = ledger.unfinished_trials(target.name)
                await _stop_holder(session, holder, say)
                async with target.lock("flagtrial unlock --force"):
                    await session.recover()
                for t in running:
                    trials[t.id] = ledger.trial(t.id).state
                    say(f"trial {t.id} ended {trials[t.id]}")
            if lock != "forced":
                for t in ledger.unfinished_trials(target.name):
                    trials[t.id] = t.state
                    say(f"trial {t.id} is unfinished ({t.state}): run `flagtrial recover`")
            if json_out:
                emit_json(
                    {
                        "lock": lock,
                        "holder": holder.info if holder else None,
                        "trials": [{"trial": i, "state": st} for i, st in trials.items()],
                    }
                )

    run(body)


async def _stop_holder(session: Session, holder: LockHolder, say: Callable[..., None]) -> None:
    """Stop a live holder (on this machine: signals; elsewhere only its lock can be broken),
    and free what its lock leaves on the host."""
    from flagtrial.targets.holder import stop_holder
    from flagtrial.targets.process import STOP_GRACE_S

    target = session.target
    if holder.alive and holder.host == socket.gethostname():
        # long enough for its own rollback: a stop, a start and the wait until ready
        grace = session.project.ready_timeout_s + STOP_GRACE_S
        killed = await stop_holder(holder, grace)
        how = f"killed (still running {grace:g}s after SIGTERM)" if killed else "stopped"
        say(f"{how} {holder.info}", markup=False)
    else:
        say(f"breaking the lock of {holder.info}, on another machine: stop it there", markup=False)
    if (left := await target.lock_holder()) is not None:
        await target.break_lock(left)


@app.command()
def facts(
    project: ProjectOpt = Path(PROJECT_FILE),
    json_out: JsonOpt = False,
    accept_new: AcceptNewOpt = False,
) -> None:
    """Read what the running server reports about itself, next to the known-good. Starts it
    (holding the lock) only for a first baseline or when it is down; while another command
    holds the lock, or a trial is left unfinished, it restarts nothing."""

    async def body() -> None:
        async with (
            open_session(project, accept_new_host_key=accept_new, json_out=json_out) as session,
            contextlib.AsyncExitStack() as stack,
        ):
            target = session.target
            held: LockHeldError | None = None
            try:
                await stack.enter_async_context(target.lock("flagtrial facts"))
            except LockHeldError as e:
                held = e
            left = [] if held else session.ledger.unfinished_trials(target.name)
            if held or left:
                why = str(held) if held else "; ".join(
                    f"trial {t.id} was left unfinished ({t.state}): run `flagtrial recover`"
                    for t in left
                )  # fmt: skip
                await _read_facts(session, why, held, json_out)
                return
            good, _, known = await session.known_good()
            host = await target.host_facts()
            if json_out:
                emit_json(
                    {"generation": good.id, "facts": known.model_dump(), "host": host.model_dump()}
                )
                return
            ui.console.print(ui.host_line(host, known))
            ui.console.print(ui.facts_table(known, title=f"facts of generation {good.id}"))
            for key, value in known.settings.items():
                ui.console.print(f"  {key} = {value!r}")

    run(body)


async def _read_facts(
    session: Session, why: str, held: LockHeldError | None, json_out: bool
) -> None:
    """What `facts` can read without restarting anything: the known-good's recorded facts and
    the live server's, over HTTP."""
    from flagtrial.facts import Facts

    good = session.ledger.last_known_good(session.target.name)
    known = Facts.model_validate(good.facts) if good and good.facts else None
    live = await session.live_facts()
    shown = live or known
    if shown is None:
        raise held or FlagtrialError(why)
    host = await session.target.host_facts()
    if json_out:
        emit_json({
            "generation": good.id if good else None,
            "facts": known.model_dump() if known else None,
            "live": live.model_dump() if live else None,
            "host": host.model_dump(),
            "read_only": why,
        })  # fmt: skip
        return
    ui.console.print(f"nothing restarted: {why}", style="yellow", markup=False)
    ui.console.print(ui.host_line(host, shown))
    if good and known:
        ui.console.print(ui.facts_table(known, title=f"recorded facts of generation {good.id}"))
    if live:
        ui.console.print(ui.facts_table(live, title="live facts (read over HTTP)"))


@app.command()
def history(project: ProjectOpt = Path(PROJECT_FILE), json_out: JsonOpt = False) -> None:
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
        for line in run(lambda: _open_trials(proj, open_trials)):
            ui.console.print(line, style="yellow", markup=False)


async def _open_trials(proj: Project, trials: list[TrialRow]) -> list[str]:
    """Whether each trial with an open journal runs (its holder holds the lock) or was left
    unfinished (its holder is gone): only the target's lock tells."""
    from flagtrial.targets import make_target
    from flagtrial.targets.holder import held_message

    holder, unknown = None, ""
    target = make_target(proj)
    try:
        holder = await target.lock_holder()
    except TargetError as e:
        unknown = f"cannot tell whether it runs: {e}"
    finally:
        await target.aclose()
    lines = []
    for t in trials:
        what = f"trial {t.id} ({t.state})"
        if t.target != target.name:
            lines.append(f"{what} is on {t.target}: run history with that target's project")
        elif unknown:
            lines.append(f"{what} has an open journal; {unknown}")
        elif holder is None:
            lines.append(f"{what} is unfinished, its holder is gone: run `flagtrial recover`")
        elif holder.alive is False:
            lines.append(f"{what} is unfinished: {held_message(target.name, holder)}")
        else:
            where = "" if holder.alive else " (on another machine)"
            lines.append(f"{what} is running, held by {holder.info}{where}")
    return lines


@app.command()
def show(
    trial_id: int, project: ProjectOpt = Path(PROJECT_FILE), json_out: JsonOpt = False
) -> None:
    """The whole story of one trial: change, facts, runs, verdict, timeline."""
    proj = load_project(project)
    ledger = open_ledger(proj)
    row = ledger.trial(trial_id)
    runs = ledger.runs(trial_id)
    events = ledger.events(trial_id)
    if json_out:
        emit_json(
            {
                "trial": row.model_dump(),
                "runs": [r.model_dump() for r in runs],
                "events": [e.model_dump() for e in events],
            }
        )
        return
    ui.console.print(
        f"[bold]trial {row.id}[/bold] on {row.target}: generation {row.baseline_gen} -> "
        f"{row.candidate_gen}, verdict [bold]{row.verdict or '-'}[/bold], state {row.state}"
    )
    for edit in row.change.get("edits", []):
        ui.console.print(f"  {ui._edit(edit)}")
    for reason in row.reasons:
        ui.console.print(f"  - {reason.message}")
    if runs:
        ui.console.print(ui.runs_table(runs))
    ui.console.print(ui.timeline(events))


@app.command()
def report(
    trial_id: int,
    out: Annotated[Path, typer.Option("--out", "-o", help="the HTML file to write")] = Path(
        "trial.html"
    ),
    project: ProjectOpt = Path(PROJECT_FILE),
) -> None:
    """Write one trial as an HTML page with plots of every run (JSON: `show --json`)."""
    from flagtrial.report import render_html

    proj = load_project(project)
    write_output(out, render_html(open_ledger(proj), trial_id))
    ui.console.print(f"wrote {out}")


@app.command()
def demo(
    workdir: Annotated[Path, typer.Option("--dir", help="where the demo's files go")] = Path(
        ".flagtrial-demo"
    ),
    port: Annotated[int, typer.Option(help="port for the demo server (default: a free one)")] = 0,
    engine: Annotated[
        str, typer.Option(help="llamacpp (a local llama-server) or vllm (a real vLLM server)")
    ] = "llamacpp",
) -> None:
    """Replay the seed story on a local llama-server (or a real vLLM server): a change that
    silently halves serving capacity with no throughput gain is found from the server's own
    facts, reverted and verified."""
    from flagtrial.cache import llama_server_path, vllm_python
    from flagtrial.demo import DEMO_CHANGE, VLLM_DEMO_CHANGE, free_port, prepare, prepare_vllm
    from flagtrial.targets.process import ProcessTarget
    from flagtrial.trial import Trial

    stories = {
        "llamacpp": (llama_server_path(), "llama-server not built", "`make demo`, which builds it",
                     prepare, DEMO_CHANGE),
        "vllm": (vllm_python(), "vLLM not installed", "`make demo-vllm`, which installs it",
                 prepare_vllm, VLLM_DEMO_CHANGE),
    }  # fmt: skip
    if engine not in stories:
        raise UsageError(f"--engine {engine!r}: the demo runs on {' or '.join(stories)}")
    needed, missing, hint, prepare_story, change = stories[engine]
    if not needed.exists():
        raise TargetError(f"{missing} at {needed} (run {hint})")
    if workdir.exists():
        shutil.rmtree(workdir)
    project_path = prepare_story(workdir, port or free_port())

    async def body() -> int:
        async with open_session(project_path) as session:
            target = session.target
            assert isinstance(target, ProcessTarget)
            try:
                async with target.lock("flagtrial demo"):
                    good, _, known = await session.known_good()
                    ui.console.print(
                        ui.facts_table(known, title=f"known-good generation {good.id}")
                    )
                    ui.console.print("candidate change:")
                    for line in change.describe().splitlines():
                        ui.console.print(f"  {line}")
                    outcome = await Trial(session, change).run()
                    ui.show_outcome(outcome)
            finally:
                await target.stop()
            ui.console.print(
                f"ledger: {session.project.ledger_path}  (try: flagtrial history -p "
                f"{project_path}; flagtrial show {outcome.trial_id} -p {project_path})"
            )
            return EXIT_VERDICT[outcome.verdict.decision]

    verdict = run(body)
    # The demo succeeds when flagtrial reached the right answer: REVERT.
    raise typer.Exit(0 if verdict == EXIT_VERDICT["REVERT"] else 1)


def main() -> None:
    """Every error is one line on stderr, usage errors too (Typer would draw a box)."""
    try:
        code = app(standalone_mode=False)
    except NoArgsIsHelpError as e:
        e.show()
        sys.exit(e.exit_code)
    except ClickException as e:
        ctx = getattr(e, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        ui.err_console.print(
            f"[red]error:[/red] {escape(ui.secrets.text(e.format_message()))}{escape(hint)}"
        )
        sys.exit(e.exit_code)
    except FlagtrialError as e:
        ui.err_console.print(f"[red]error:[/red] {ui.secrets.text(str(e))}")
        sys.exit(e.exit_code)
    sys.exit(code if isinstance(code, int) else 0)
