"""Real trials on llama-server: A/A (a flag that cannot matter) and a known large effect.

Each trial is a whole flagtrial trial (flagtrial.trial.Trial under the process target, the
same code as `flagtrial trial`) on a real llama-server on 127.0.0.1: the protocol chosen
from the restart cost, restart blocks, foreign-load hygiene, the verdict and the restore.
The workload is the default one at c=8 (64-word prompts, 64 tokens, 16 requests a run) and
the policy the default one but for the capacity guardrail, switched off (`-np 1` has an
eighth of the slots) so that the measurement alone decides. The large-effect trials
alternate with their mirror image (which arm has the effect). `--slow` trials start the
server 20 s late (a wrapper that sleeps, then execs llama-server: a large model's load
time), so the protocol chosen is before-after. Bounded: `--budget-s` for the whole script,
`--trial-s` per trial. Writes results[--key] of results.json; other sections are kept.

    .venv/bin/python benchmarks/verdicts/real.py --aa 40 --large 4 --slow 4 \
        --budget-s 5400
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from server import model

from flagtrial.cache import llama_server_path
from flagtrial.demo import free_port, write_unit
from flagtrial.launch.change import Change, Edit
from flagtrial.ledger import Ledger
from flagtrial.load.workload import Workload
from flagtrial.reasons import STOPS
from flagtrial.session import Session
from flagtrial.settings import Policy
from flagtrial.targets.process import ProcessTarget
from flagtrial.trial import Trial, TrialOutcome

HERE = Path(__file__).parent
RESULTS = HERE / "results.json"
LEVEL = 8
WORKLOAD = Workload(concurrency=[LEVEL])
SLOW_START_S = 20


def write_project(root: Path, unit: Path, port: int, policy: Policy) -> Path:
    path = root / "flagtrial.toml"
    workload = WORKLOAD.model_dump(exclude_defaults=True)
    changed = policy.model_dump(exclude_defaults=True)
    path.write_text(
        f'unit = "{unit.name}"\nendpoint = "http://127.0.0.1:{port}"\nready_timeout_s = 60\n'
        "[workload]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in workload.items())
        + "[policy]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in changed.items())
    )  # fmt: skip
    return path


def set_slots(unit: Path, slots: int) -> None:
    lines = unit.read_text().splitlines(keepends=True)
    unit.write_text("".join(f"    --parallel {slots}\n" if "--parallel" in x else x for x in lines))


def one_trial(project: Path, change: Change) -> tuple[TrialOutcome, float]:
    session = Session.open(project, lambda state, detail: None)

    async def run() -> TrialOutcome:
        try:
            async with session.target.lock("verdicts benchmark"):
                return await Trial(session, change).run()
        finally:
            await session.close()

    began = time.monotonic()
    outcome = asyncio.run(run())
    return outcome, time.monotonic() - began


def record(outcome: TrialOutcome, wall_s: float, ledger: Path, primary: str) -> dict:
    db = Ledger(ledger)
    try:
        runs = [r for r in db.runs(outcome.trial_id) if r.concurrency == LEVEL]
        design = db.trial(outcome.trial_id).record.get("design", {})
    finally:
        db.close()
    verdict = outcome.verdict
    effect = next((e for e in verdict.effects if e.metric == primary), None)
    # why the measurement stopped: Stop.why, the first of the verdict's notes
    why = verdict.first(STOPS) or verdict.reasons[0]
    foreign = [r.foreign["cpu_cores"] for r in runs if r.foreign]
    return {
        "decision": verdict.decision,
        "finding": verdict.finding,
        "why": why.message,
        "reason": verdict.reasons[0].message,
        "design": design.get("kind"),
        "looks": design.get("looks"),
        # measurement time, restarts included, when the procedure stopped
        "measure_s": why.values.get("seconds"),
        "runs": len(runs),
        "load_s": sum(r.summary["duration_s"] for r in runs),
        "wall_s": wall_s,
        "effect_pct": effect.pct if effect else None,
        "interval_pct": [effect.lo_pct, effect.hi_pct] if effect else None,
        "foreign_cores_median": float(np.median(foreign)) if foreign else 0.0,
        "disturbed": sum(1 for r in runs if r.disturbed),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--aa", type=int, default=6, help="A/A trials")
    ap.add_argument("--large", type=int, default=4, help="large-effect trials")
    ap.add_argument("--slow", type=int, default=0, help="slow-start trials, A/A and large")
    ap.add_argument("--trial-s", type=float, default=None, help="max_seconds (the default's)")
    ap.add_argument("--budget-s", type=float, default=600.0, help="whole script")
    ap.add_argument("--foreign-limit", type=float, default=0.5, help="cores; policy's limit")
    ap.add_argument("--model", default="small")
    ap.add_argument("--key", default="real", help="section of results.json to write")
    args = ap.parse_args()
    bounds = {} if args.trial_s is None else {"max_seconds": args.trial_s}
    policy = Policy(**bounds, foreign_cpu_max_cores=args.foreign_limit, capacity_loss_max_pct=100.0)
    deadline = time.monotonic() + args.budget_s
    kinds = [("A/A", i) for i in range(args.aa)] + [("large", i) for i in range(args.large)]
    kinds += [("slow A/A" if i % 2 else "slow large", i) for i in range(args.slow)]
    # Interleave the kinds so a busy spell of the machine does not fall on one kind only.
    kinds.sort(key=lambda k: k[1])
    out: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="flagtrial-real-") as tmp:
        root = Path(tmp)
        unit = root / "llama.service"
        port = free_port()
        slow = root / "slow" / "llama-server"
        slow.parent.mkdir()
        slow.write_text(f'#!/bin/sh\nsleep {SLOW_START_S}\nexec {llama_server_path()} "$@"\n')
        slow.chmod(0o755)
        write_unit(unit, slow, model(args.model), port)
        slow_unit = unit.read_text()
        write_unit(unit, llama_server_path(), model(args.model), port)
        project = write_project(root, unit, port, policy)
        eight_slots = unit.read_text()
        target = ProcessTarget(unit, root / ".flagtrial" / "process")
        try:
            for kind, i in kinds:
                if time.monotonic() + min(policy.max_seconds, 300) > deadline:
                    break
                # the known-good of every trial
                unit.write_text(slow_unit if kind.startswith("slow") else eight_slots)
                if kind.endswith("A/A"):
                    edit, truth = Edit(op="add", name="--alias", value="candidate"), "none"
                elif i % 2 == 0 or kind.startswith("slow"):
                    edit, truth = Edit(op="set", name="--parallel", value="1"), "harm"
                else:
                    set_slots(unit, 1)
                    edit, truth = Edit(op="set", name="--parallel", value="8"), "gain"
                outcome, wall_s = one_trial(project, Change(edits=[edit]))
                r = record(outcome, wall_s, root / ".flagtrial" / "ledger.db",
                           policy.primary_metric)  # fmt: skip
                r.update(kind=kind, truth=truth, candidate=f"{edit.name} {edit.value}")
                out.append(r)
                print(
                    f"{kind} truth={truth}: {r['decision']} ({r['finding']}) after {r['runs']} "
                    f"runs, {r['measure_s'] or 0:.0f}s; {r['why'][:150]}",
                    flush=True,
                )
                save(args, policy, out)  # after every trial: a killed run keeps what it had
        finally:
            asyncio.run(target.stop())


def save(args: argparse.Namespace, policy: Policy, trials: list[dict]) -> None:
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results[args.key] = {
        "model": args.model,
        "hygiene": "on",
        "driver": "flagtrial.trial.Trial",
        "procedure": "planned looks (flagtrial.spending)",
        "workload": WORKLOAD.model_dump(),
        "policy": policy.model_dump(),
        "slow_start_s": SLOW_START_S,
        "cpus": os.cpu_count(),
        "trials": trials,
    }
    RESULTS.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
