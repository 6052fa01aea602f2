"""Attribution on a real llama-server: changes of 2 to 6 edits of known effect, each tried
as a trial and then attributed (flagtrial.attribution); how often the culprits are found,
the restarts and load-seconds spent, against one edit at a time.

The edits and their known effects on the known-good (8 slots of 1024 tokens, a 8192-token
context, 512-token batches, a tiny generated model, 200-word prompts):
  --parallel 4        harmful: half the concurrent requests (capacity, from /props)
  --ctx-size 4096     harmful: half the KV cache (capacity, from the startup log)
  --ubatch-size 16    harmful: prefill several times slower (measured)
  --ctx-size 16384    beneficial: twice the context per request and KV cache (capacity)
  --alias bench       useless: a label the server only reports back
  --timeout 700       useless: the HTTP read/write timeout
  --cont-batching     useless: llama-server's default (its --help), settled without a restart
  --cache-type-v q8_0 and --flash-attn off
                      interacting: each alone starts (a quantized V cache turns flash
                      attention's `auto` on); together the server refuses to start ("quantized
                      V cache requires flash_attn to be enabled"). On the small model: the
                      tiny one's 16-wide heads take no 32-wide quantized block.
The first nine cases were written down before the first run and not changed after it; the
two with the beneficial edit were added after it, the two with the interacting pair later
(run alone: `--case N`, the rows merged into the results). Runs are counted
even when other work shares the cores (set_aside_disturbed = false): this 2-core machine is
never idle while it runs.

    PYTHONPATH=src .venv/bin/python benchmarks/attribution/run.py
Writes results.json and results.md next to this file (`--table`: results.md again from
results.json; `--case N ...`: only those cases, by their index in CASES, their rows merged
into the results).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from flagtrial.attribution.attribute import Attribute, ledger_cost
from flagtrial.cache import cache_root, llama_server_path
from flagtrial.demo import free_port, write_unit
from flagtrial.errors import UsageError
from flagtrial.launch.change import Change, Edit
from flagtrial.modelgen import generate_model
from flagtrial.session import Session
from flagtrial.targets.process import ProcessTarget
from flagtrial.trial import Trial

HERE = Path(__file__).parent
POOL: dict[str, tuple[Edit, str]] = {
    "np4": (Edit(op="set", name="--parallel", value="4"), "harmful"),
    "ctx4096": (Edit(op="set", name="--ctx-size", value="4096"), "harmful"),
    "ub16": (Edit(op="set", name="--ubatch-size", value="16"), "harmful"),
    "ctx16384": (Edit(op="set", name="--ctx-size", value="16384"), "beneficial"),
    "alias": (Edit(op="set", name="--alias", value="bench"), "useless"),
    "timeout": (Edit(op="set", name="--timeout", value="700"), "useless"),
    "cb": (Edit(op="add", name="--cont-batching"), "useless"),
    "ctvq8": (Edit(op="set", name="--cache-type-v", value="q8_0"), "interacting"),
    "faoff": (Edit(op="set", name="--flash-attn", value="off"), "interacting"),
}
SMALL_MODEL = {"ctvq8"}  # edits the tiny model cannot start with
CASES = [
    ["cb", "np4"],  # the demo's shape: settled without a restart
    ["alias", "np4"],
    ["alias", "timeout", "np4"],
    ["alias", "timeout", "cb", "ctx4096"],
    ["alias", "np4", "timeout", "ctx4096"],
    ["timeout", "alias", "cb", "np4", "ctx4096"],
    ["alias", "timeout", "cb", "np4", "ctx4096", "ub16"],
    ["alias", "ub16"],  # measured: the two-level design
    ["alias", "timeout", "cb", "ub16"],
    # added after the first run: a beneficial edit
    ["alias", "ctx16384"],
    ["timeout", "ctx16384", "np4"],
    # added later: the interacting pair
    ["ctvq8", "alias", "faoff"],
    ["alias", "ctvq8", "timeout", "faoff"],
    # added with the measured design: three edits measured, a half fraction
    ["alias", "timeout", "ub16"],
]
PROJECT = """unit = "llama.service"
endpoint = "http://127.0.0.1:{port}"
ready_timeout_s = 30
[workload]
concurrency = [4]
prompt_words = 200
max_tokens = 8
requests_per_run = 4
warmup_requests = 1
run_timeout_s = 60
[policy]
runs = 2
capacity_guard = "revert"
max_seconds = 90
set_aside_disturbed = false
"""


def prepare(root: Path, names: list[str]) -> Path:
    port = free_port()
    size = "small" if SMALL_MODEL & set(names) else "tiny"
    model = generate_model(cache_root() / "models" / f"{size}.gguf", size=size, seed=1)
    unit = root / "llama.service"
    write_unit(unit, llama_server_path(), model, port)
    unit.write_text(unit.read_text().replace("--threads 1", "--threads 1 -b 512 -ub 512"))
    (root / "flagtrial.toml").write_text(PROJECT.format(port=port))
    return root / "flagtrial.toml"


async def one_case(project: Path, names: list[str]) -> dict[str, Any]:
    session = Session.open(project, lambda state, detail: None)
    change = Change(edits=[POOL[n][0] for n in names])
    began = time.monotonic()
    try:
        async with session.target.lock("benchmark"):
            outcome = await Trial(session, change).run()
            trial_cost = ledger_cost(session, outcome.trial_id)
            try:
                attributed = await Attribute(session, outcome.trial_id).run()
            except UsageError as e:  # the trial showed nothing to attribute
                return {"edits": names, "verdict": outcome.verdict.decision, "refused": str(e),
                        "reasons": [r.message for r in outcome.verdict.reasons]}  # fmt: skip
    finally:
        assert isinstance(session.target, ProcessTarget)
        await session.target.stop()
        await session.close()
    found = {n: v.outcome for n, v in zip(names, attributed.edits, strict=True)}
    expected = {n: POOL[n][1] for n in names}
    culprits = {n for n in names if expected[n] in ("harmful", "interacting")}
    effective = {n for n in names if expected[n] != "useless"}
    return {
        "edits": names,
        "verdict": outcome.verdict.decision,
        "expected": expected,
        "found": found,
        "culprits_found": sorted(n for n in culprits if found[n] == expected[n]),
        # not found, but not cleared either: what it does was never measured
        "culprits_unresolved": sorted(n for n in culprits if found[n] == "unresolved"),
        # an edit given an effect it does not have, or a culprit cleared
        "wrong": sorted(
            n
            for n in names
            if found[n] != "unresolved"
            and (found[n] != expected[n] if n in effective else found[n] != "useless")
        ),
        "trial": trial_cost.model_dump(),
        "used": attributed.used.model_dump(),
        "one_at_a_time": attributed.one_at_a_time.model_dump(),
        "stopped": attributed.stopped,
        "wall_s": round(time.monotonic() - began, 1),
    }


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| edits | trial | per edit (found) | wrong | restarts (one at a time) "
        "| load s (one at a time) | stopped |",
        "|---|---|---|---|---|---|---|",
    ]
    refused = [r for r in results if "refused" in r]
    results = [r for r in results if "refused" not in r]
    for r in results:
        per = ", ".join(f"{n}: {r['found'][n]}" for n in r["edits"])
        used, naive = r["used"], r["one_at_a_time"]
        lines.append(
            f"| {len(r['edits'])} | {r['verdict']} | {per} | {', '.join(r['wrong']) or '-'} "
            f"| {used['restarts']} ({naive['restarts']}) | {used['load_s']:g} "
            f"({naive['load_s']:g}) | {r['stopped'] or '-'} |"
        )
    culprits = sum(
        1 for r in results for n in r["edits"] if r["expected"][n] in ("harmful", "interacting")
    )
    found = sum(len(r["culprits_found"]) for r in results)
    unresolved = sum(len(r["culprits_unresolved"]) for r in results)
    wrong = sum(len(r["wrong"]) for r in results)
    lines.append("")
    lines.append(
        f"culprits (harmful or interacting) found {found} of {culprits} ({unresolved} left "
        "unresolved: not measured, "
        "or the bound stopped the search first); "
        f"wrong outcomes {wrong}; restarts "
        f"{sum(r['used']['restarts'] for r in results)} against "
        f"{sum(r['one_at_a_time']['restarts'] for r in results)} one edit at a time; "
        f"load {sum(r['used']['load_s'] for r in results):.1f} s against "
        f"{sum(r['one_at_a_time']['load_s'] for r in results):.1f} s."
    )
    lines += [f"Not attributed: {', '.join(r['edits'])} ({r['verdict']}: {r['refused']})"
              for r in refused]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    if sys.argv[1:] == ["--table"]:  # results.md again from results.json
        cases = json.loads((HERE / "results.json").read_text())["cases"]
        (HERE / "results.md").write_text(table(cases))
        return
    chosen = [int(i) for i in sys.argv[2:]] if sys.argv[1:2] == ["--case"] else None
    results = []
    for names in CASES if chosen is None else [CASES[i] for i in chosen]:
        with tempfile.TemporaryDirectory() as tmp:
            project = prepare(Path(tmp), names)
            results.append(asyncio.run(one_case(project, names)))
            print(json.dumps(results[-1], default=sorted), flush=True)
    machine = {"cpus": os.cpu_count(), "load_avg": os.getloadavg()}
    if chosen is not None:  # merged: each case's row where it stands in CASES
        kept = json.loads((HERE / "results.json").read_text())
        rows = {tuple(r["edits"]): r for r in kept["cases"]}
        rows.update({tuple(r["edits"]): {**r, "machine": machine} for r in results})
        results = [rows[tuple(c)] for c in CASES if tuple(c) in rows]
        machine = kept["machine"]
    (HERE / "results.json").write_text(
        json.dumps({"machine": machine, "cases": results}, indent=1, default=sorted) + "\n"
    )
    (HERE / "results.md").write_text(table(results))
    print(table(results))


if __name__ == "__main__":
    main()
