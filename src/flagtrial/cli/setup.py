"""Setting up and showing: `init` (a project file, from options or a live unit), `model`
(a generated GGUF model)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

import typer

from flagtrial import ui
from flagtrial.cli.common import (
    DEFAULT_PROJECT,
    AcceptNewOpt,
    ProjectOpt,
    app,
    run,
    write_output,
)
from flagtrial.errors import FlagtrialError, UsageError
from flagtrial.projectfile import template
from flagtrial.settings import Project, Ssh, parse_project, validate_project


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
    project: ProjectOpt = DEFAULT_PROJECT,
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
