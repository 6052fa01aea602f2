"""Attribution on a real llama-server under the process target: which edit of a reverted
change did it, in fewer restarts than one per edit, journaled, recovered when killed, and the
fixed change tried in one command."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flagtrial.demo import free_port, write_unit
from flagtrial.ledger import Ledger
from flagtrial.targets.process import ProcessTarget
from harness.cli import cli
from harness.project import update_project_file, write_project_file

pytestmark = pytest.mark.slow


class Server:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.file = root / "flagtrial.toml"
        self.unit = root / "llama.service"

    def cli(self, *args: str, faults: str | None = None) -> subprocess.CompletedProcess[str]:
        return cli(self.file, *args, faults=faults)

    def json(self, *args: str) -> dict[str, Any]:
        result = self.cli(*args, "--json")
        assert result.returncode in (0, 10, 11), result.stdout + result.stderr
        return dict(json.loads(result.stdout[result.stdout.index("{\n") :]))

    def ledger(self) -> Ledger:
        return Ledger(self.root / ".flagtrial" / "ledger.db")

    def stop(self) -> None:
        asyncio.run(ProcessTarget(self.unit, self.root / ".flagtrial" / "process").stop())


@pytest.fixture
def server(tmp_path: Path, llama_server_bin: Path, small_model: Path) -> Iterator[Server]:
    """8 slots of 1024 tokens; a capacity loss reverts at once, after the known-good's runs
    (counted on a busy machine: only the candidate's facts decide here)."""
    port = free_port()
    s = Server(tmp_path)
    write_unit(s.unit, llama_server_bin, small_model, port)
    write_project_file(
        s.file,
        f'unit = "llama.service"\nendpoint = "http://127.0.0.1:{port}"\nready_timeout_s = 30\n'
        "[workload]\nconcurrency = [4]\nprompt_words = 16\nmax_tokens = 8\n"
        "requests_per_run = 4\nwarmup_requests = 1\nrun_timeout_s = 60\n"
        '[policy]\nruns = 2\ncapacity_guard = "revert"\nset_aside_disturbed = false\n',
    )
    yield s
    s.stop()


def by_edit(attribution: dict[str, Any]) -> dict[str, tuple[str, list[str]]]:
    return {
        f"{v['edit']['op']} {v['edit']['name']}": (v["outcome"], v["evidence"])
        for v in attribution["edits"]
    }


def test_the_demo_change_is_attributed_without_a_restart(server: Server) -> None:
    """The seed story's two flags: `--cont-batching` is what llama-server runs anyway (its
    --help), so only `--parallel -1` can carry the capacity loss: no restart to find it."""
    before = server.unit.read_bytes()
    out = server.json("trial", "--add", "--cont-batching", "--set", "--parallel=-1", "--attribute")
    assert out["verdict"]["decision"] == "REVERT"
    found = by_edit(out["attribution"])
    outcome, evidence = found["add --cont-batching"]
    assert outcome == "useless"
    assert evidence == [
        "--cont-batching is what the known-good already runs "
        "(llama-server --help: default: enabled)"
    ]
    outcome, evidence = found["set --parallel"]
    assert outcome == "harmful"
    assert any(e.startswith("concurrent requests 8 -> 4 (-50.0 %)") for e in evidence), evidence
    assert any("kv_unified" in e for e in evidence), evidence  # the implicit change, too
    assert out["attribution"]["used"] == {"restarts": 0, "load_s": 0.0}
    assert out["attribution"]["one_at_a_time"]["restarts"] == 3
    assert server.unit.read_bytes() == before
    # The fixed change, in one command: only --cont-batching is left to try.
    tried = server.cli("trial", "--from-attribution", "1")
    assert tried.returncode in (0, 10, 11), tried.stdout + tried.stderr
    trials = server.ledger().trials()
    assert trials[-1].change == {"edits": [{"op": "add", "name": "--cont-batching", "value": None}]}


def test_restarts_with_no_load_find_the_culprit_among_the_rest(server: Server) -> None:
    """Three edits, one inert by --help: the other two are started one at a time (2 restarts
    and the known-good's restore, against 4 one edit at a time); the alias moves nothing,
    `--parallel 4` carries both capacity moves. Every restart is journaled."""
    before = server.unit.read_bytes()
    out = server.json(
        "trial", "--set", "--alias=renamed", "--set", "--parallel=4", "--add", "--cont-batching"
    )
    assert out["verdict"]["decision"] == "REVERT"
    attributed = server.json("attribute", str(out["trial_id"]))
    found = by_edit(attributed)
    # The REVERT came from the facts, before any candidate run: the alias moved no fact, but
    # what it does to speed was never measured.
    assert found["set --alias"] == (
        "unresolved",
        ["none of the change's effects follows it; its own speed not measured"],
    )
    assert found["add --cont-batching"][0] == "useless"
    outcome, evidence = found["set --parallel"]
    assert outcome == "harmful"
    assert any(
        e.startswith("concurrent requests 8 -> 4 (-50.0 %)")
        and e.endswith("(a start with only this edit)")
        for e in evidence
    ), evidence
    assert attributed["used"]["restarts"] == 3
    assert attributed["one_at_a_time"]["restarts"] == 4
    assert attributed["used"]["restarts"] < attributed["one_at_a_time"]["restarts"]
    assert server.unit.read_bytes() == before
    (journal,) = attributed["journals"]
    row = server.ledger().trial(journal)
    assert row.state == "reverted"
    assert row.record["attribution_of"] == out["trial_id"]
    states = [e.state for e in server.ledger().events(journal)]
    assert states.count("restarting") == 2 and states[-1] == "reverted"
    shown = server.ledger().attribution(out["trial_id"])
    assert shown is not None and shown["edits"] == attributed["edits"]
    history = server.cli("history")
    assert f"reverted (attribution of {out['trial_id']})" in history.stdout, history.stdout
    shown = server.cli("show", str(out["trial_id"]))
    assert shown.returncode == 0 and f"attribution of trial {out['trial_id']}" in shown.stdout
    journal_shown = server.cli("show", str(journal))
    assert f"(attribution of {out['trial_id']})" in journal_shown.stdout, journal_shown.stdout


def test_killed_mid_attribution_recovers_to_the_known_good(server: Server) -> None:
    before = server.unit.read_bytes()
    out = server.json("trial", "--set", "--alias=renamed", "--set", "--parallel=4")
    killed = server.cli("attribute", str(out["trial_id"]), faults="facts=KILL")
    assert killed.returncode == -9, killed.stdout + killed.stderr
    assert server.unit.read_bytes() != before  # a subset was serving when it died
    recovered = server.cli("recover")
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert server.unit.read_bytes() == before
    journal = server.ledger().trials()[-1]
    assert journal.record["attribution_of"] == out["trial_id"]
    assert journal.state == "recovered"
    assert server.ledger().attribution(out["trial_id"]) is None  # no result from a killed one


def test_interrupted_attribution_restores_and_exits_130(server: Server) -> None:
    before = server.unit.read_bytes()
    out = server.json("trial", "--set", "--alias=renamed", "--set", "--parallel=4")
    stopped = server.cli("attribute", str(out["trial_id"]), faults="facts=INT")
    assert stopped.returncode == 130, stopped.stdout + stopped.stderr
    assert server.unit.read_bytes() == before
    journal = server.ledger().trials()[-1]
    assert journal.state == "reverted"
    assert "interrupted" in [e.detail for e in server.ledger().events(journal.id)][-2]


def test_what_cannot_be_attributed_is_refused_in_one_line(server: Server) -> None:
    out = server.json("trial", "--set", "--parallel=4")
    one = server.cli("attribute", str(out["trial_id"]))
    assert one.returncode == 2 and "nothing to attribute" in one.stderr, one.stderr
    missing = server.cli("attribute", "99")
    assert missing.returncode == 2 and "no trial 99" in missing.stderr, missing.stderr
    never = server.cli("trial", "--from-attribution", str(out["trial_id"]))
    assert never.returncode == 2 and "never attributed" in never.stderr, never.stderr
    both = server.cli("trial", "--from-attribution", "1", "--set", "--parallel=2")
    assert both.returncode == 2 and "no edits" in both.stderr, both.stderr


def slow_prefill_server(server: Server, small_model: Path, tiny_model: Path) -> bytes:
    """The tiny model with 512-token batches, 200-word prompts: `-ub=16` makes prefill
    several times slower and moves no fact. Returns the unit as it then is."""
    text = server.unit.read_text().replace(str(small_model), str(tiny_model))
    server.unit.write_text(text.replace("--threads 1", "--threads 1 -b 512 -ub 512"))
    update_project_file(
        server.file,
        workload={"prompt_words": 200, "max_tokens": 8},
        # runs count though other work shares the cores: the design's first replicate takes
        # the trial's last blocks, which must not have been set aside
        policy={"max_seconds": 90, "attribution_max_seconds": 300, "set_aside_disturbed": False},
    )
    return server.unit.read_bytes()


def measured_harm(server: Server, small_model: Path, tiny_model: Path) -> tuple[bytes, Any]:
    """The unit before, and a trial of the alias and the 16-token batches that ends on the
    measured harm (no fact moves), not yet attributed."""
    before = slow_prefill_server(server, small_model, tiny_model)
    out = server.json("trial", "--set", "--alias=renamed", "--set", "-ub=16")
    assert out["verdict"]["finding"] == "harm", out["verdict"]["reasons"]
    return before, out


def test_a_measured_harm_is_attributed_by_the_measured_design(
    server: Server, small_model: Path, tiny_model: Path
) -> None:
    """No fact moves: the REVERT is measured (16-token batches make 200-word prompts' prefill
    several times slower). The two edits are measured in the full factorial (the known-good,
    each alone, both), a restart before every run, replicates until each main effect decides:
    the alias shows nothing, the batch size the harm, with its interval."""
    before = slow_prefill_server(server, small_model, tiny_model)
    out = server.json("trial", "--set", "--alias=renamed", "--set", "-ub=16", "--attribute")
    assert out["verdict"]["decision"] == "REVERT", out["verdict"]["reasons"]
    assert out["verdict"]["finding"] == "harm"
    attributed = out["attribution"]
    found = by_edit(attributed)
    outcome, evidence = found["set -ub"]
    assert outcome == "harmful"
    assert any("main effect over" in e and "output tok/s" in e for e in evidence), evidence
    # equivalent within the margin (useless), or too noisy to say in the bound (unresolved)
    outcome, evidence = found["set --alias"]
    assert outcome in ("useless", "unresolved")
    assert any("main effect over" in e for e in evidence), evidence
    (journal,) = attributed["journals"]  # no fact restarts: one journal, the design's
    ledger = server.ledger()
    row = ledger.trial(journal)
    assert row.record["attribution_of"] == out["trial_id"] and row.state == "reverted"
    runs = ledger.runs(journal)
    assert {r.arm for r in runs} == {"known-good", "edits 1", "edits 2", "edits 1, 2"}
    # the first replicate takes the known-good and the whole change from the trial's last
    # blocks: only each edit alone is started for it
    assert {r.arm for r in runs if r.block == 0} == {"edits 1", "edits 2"}
    (replicates,) = {int(m) for e in evidence for m in re.findall(r"over (\d+) replicates", e)}
    assert attributed["used"]["restarts"] == 4 * replicates - 2 + 1  # and the restore
    assert attributed["used"]["load_s"] == pytest.approx(
        sum(r.summary["duration_s"] for r in runs), abs=0.2
    )
    # one edit at a time for the same widths: 3 arms of twice the runs
    assert attributed["one_at_a_time"]["restarts"] > attributed["used"]["restarts"]
    assert server.unit.read_bytes() == before


def test_a_design_its_bound_stops_before_a_replicate_leaves_the_edits_unresolved(
    server: Server, small_model: Path, tiny_model: Path
) -> None:
    before, out = measured_harm(server, small_model, tiny_model)
    # one start: the first replicate needs two at least (each edit alone; the known-good and
    # the whole change may come from the trial's last blocks)
    update_project_file(server.file, policy={"attribution_max_restarts": 1})
    attributed = server.json("attribute", str(out["trial_id"]))
    assert attributed["stopped"] == "bound: 1 restarts"
    assert attributed["used"]["restarts"] == 2  # one arm, and the restore
    for verdict in attributed["edits"]:
        assert verdict["outcome"] == "unresolved"
        assert any("0 replicates of the design done" in e for e in verdict["evidence"])
    assert server.unit.read_bytes() == before


def test_killed_mid_design_recovers_to_the_known_good(
    server: Server, small_model: Path, tiny_model: Path
) -> None:
    before, out = measured_harm(server, small_model, tiny_model)
    killed = server.cli("attribute", str(out["trial_id"]), faults="measuring=KILL")
    assert killed.returncode == -9, killed.stdout + killed.stderr
    journal = server.ledger().trials()[-1]
    assert journal.record["attribution_of"] == out["trial_id"] and journal.state == "measuring"
    recovered = server.cli("recover")
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert server.unit.read_bytes() == before
    assert server.ledger().trial(journal.id).state == "recovered"
    assert server.ledger().attribution(out["trial_id"]) is None


def test_a_kept_change_with_an_implicit_change_is_attributed_against_its_old_known_good(
    server: Server,
) -> None:
    """Kept (a 60 % capacity loss allowed, INCONCLUSIVE kept by the policy), yet the server
    moved a setting unasked: each edit is started on the spec the trial measured against,
    and the kept candidate, the known-good now, is restored and verified after."""
    policy = {"on_inconclusive": "keep", "capacity_loss_max_pct": 60, "max_seconds": 20}
    update_project_file(server.file, policy=policy)
    out = server.json("trial", "--set", "--alias=renamed", "--set", "--parallel=16", "--attribute")
    assert out["outcome"] == "kept", out["verdict"]["reasons"]
    kept = server.unit.read_bytes()
    assert b"--parallel 16" in kept
    attributed = out["attribution"]
    found = by_edit(attributed)
    outcome, evidence = found["set --parallel"]
    assert outcome == "harmful"  # twice the requests, each half the context
    assert any(e.startswith("context per request 1024 -> 512 (-50.0 %)") for e in evidence)
    assert any(e.startswith("concurrent requests 8 -> 16 (+100.0 %)") for e in evidence)
    assert any(e.startswith("n_ctx_slot: 1024 -> 512") for e in evidence), evidence
    assert found["set --alias"][0] in ("useless", "unresolved")
    assert server.unit.read_bytes() == kept  # back on the kept candidate
    (journal,) = attributed["journals"]
    row = server.ledger().trial(journal)
    assert row.baseline_gen == out["candidate_gen"] and row.state == "reverted"


def test_the_restart_bound_stops_the_search_and_says_so(server: Server) -> None:
    before = server.unit.read_bytes()
    out = server.json("trial", "--set", "--alias=renamed", "--set", "--parallel=4")
    update_project_file(server.file, policy={"attribution_max_restarts": 1})
    attributed = server.json("attribute", str(out["trial_id"]))
    assert attributed["stopped"] == "bound: 1 restarts"
    # one subset read, then the known-good restored: the rest is not settled
    assert attributed["used"]["restarts"] == 2
    assert {v["outcome"] for v in attributed["edits"]} == {"unresolved"}
    assert server.unit.read_bytes() == before


def test_the_fixed_change_keeps_a_secret_value_the_ledger_shows_redacted(server: Server) -> None:
    secret = "hf_attribution_secret_0123456789"
    out = server.json("trial", "--set", "--parallel=4", "--env", f"HF_TOKEN={secret}")
    attributed = server.cli("attribute", str(out["trial_id"]), "--json")
    assert attributed.returncode == 0, attributed.stdout + attributed.stderr
    assert secret not in attributed.stdout + attributed.stderr
    assert '"value": "<redacted>"' in attributed.stdout
    tried = server.cli("trial", "--from-attribution", str(out["trial_id"]))
    assert tried.returncode in (0, 10, 11), tried.stdout + tried.stderr
    assert secret not in tried.stdout + tried.stderr
    ledger = server.ledger()
    last = ledger.trials()[-1]
    assert last.change["edits"] == [{"op": "setenv", "name": "HF_TOKEN", "value": "<redacted>"}]
    assert last.candidate_gen is not None
    # the candidate ran with the real value, not the marker
    assert f"HF_TOKEN={secret}" in ledger.generation(last.candidate_gen).spec_text


def test_a_pair_that_fails_to_start_only_together_is_found_interacting(server: Server) -> None:
    """A quantized V cache starts with flash attention on `auto` (it turns on), flash
    attention off starts with the f16 cache; both together fail at startup ("quantized V
    cache requires flash_attn to be enabled"). The alias takes no part: cleared."""
    before = server.unit.read_bytes()
    out = server.json(
        "trial", "--set", "--alias=renamed", "--set", "--cache-type-v=q8_0",
        "--set", "--flash-attn=off", "--attribute",
    )  # fmt: skip
    assert out["verdict"]["decision"] == "REVERT", out["verdict"]["reasons"]
    attributed = out["attribution"]
    found = by_edit(attributed)
    assert found["set --cache-type-v"] == (
        "interacting",
        ["the server does not start only together with edit(s) 3"],
    )
    assert found["set --flash-attn"] == (
        "interacting",
        ["the server does not start only together with edit(s) 2"],
    )
    assert found["set --alias"][0] == "unresolved"  # no part in it; its speed not measured
    # {alias}, {ctv}, {fa} alone start; {ctv, fa} does not: 4 starts and the restore
    assert attributed["used"]["restarts"] == 5
    (journal,) = attributed["journals"]
    facts = [e.detail for e in server.ledger().events(journal) if e.state == "facts"]
    assert facts == ["edits 1: no effect", "edits 2: no effect", "edits 3: no effect"], facts
    assert server.unit.read_bytes() == before
    # the fixed change leaves both out
    tried = server.cli("trial", "--from-attribution", str(out["trial_id"]))
    assert tried.returncode in (0, 10, 11), tried.stdout + tried.stderr
    last = server.ledger().trials()[-1]
    assert last.change == {"edits": [{"op": "set", "name": "--alias", "value": "renamed"}]}
