"""`flagtrial demo`: the seed story replayed on a local llama-server (or a real vLLM
server)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated

import typer

from flagtrial import ui
from flagtrial.cli.common import EXIT_VERDICT, app, open_session, run
from flagtrial.errors import TargetError, UsageError


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
    facts, reverted and verified, and attributed to the edit that did it."""
    from flagtrial.attribution.attribute import after
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
                    if (attributed := await after(session, outcome)) is not None:
                        ui.show_attribution(attributed)
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
