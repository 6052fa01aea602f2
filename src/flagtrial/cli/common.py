"""What every command shares: the Typer app, the options, the event loop with its
interruption, the session and ledger opened from a project file, JSON and file output."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from flagtrial import ui
from flagtrial.errors import UsageError
from flagtrial.ledger import Ledger
from flagtrial.settings import PROJECT_FILE, Project

# A command imports the engines, targets, trial and gate analysis it uses when it runs:
# together they cost a start (httpx, asyncssh, numpy, scipy, the gate index) that --help,
# history and show must not pay.
if TYPE_CHECKING:
    from flagtrial.launch.change import Change
    from flagtrial.session import Session

app = typer.Typer(
    no_args_is_help=True,
    help="Trial a launch-flag change on an LLM server: preflight, deploy, measure, "
    "decide, roll back.",
)

EXIT_VERDICT = {"KEEP": 0, "REVERT": 10, "INCONCLUSIVE": 11}
EXIT_INTERRUPTED = 130
DEFAULT_PROJECT = Path(PROJECT_FILE)

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
    from flagtrial.session import Session

    session = Session.open(
        project_path,
        ui.notify_stderr if json_out else ui.notify,
        ui.RestartProgress(ui.err_console if json_out else ui.console),
        accept_new_host_key=accept_new_host_key,
        secrets=ui.secrets,
    )
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
