"""Ledger bookkeeping on real SQLite, and project-file errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flagtrial.errors import LedgerError, ProjectError
from flagtrial.ledger import SCHEMA_VERSION, Ledger
from flagtrial.reasons import Code, Reason
from flagtrial.settings import load_project
from flagtrial.states import FINAL, TRANSITIONS, TransitionError, TrialState

# Measures nothing: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine


def test_generations_are_content_addressed(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.db")
    a = ledger.record_generation("t", "one")
    b = ledger.record_generation("t", "two")
    assert ledger.record_generation("t", "one").id == a.id
    assert a.id != b.id
    assert ledger.last_known_good("t") is None
    ledger.mark_known_good(b.id, {"engine": "x"})
    ledger.mark_known_good(a.id, {"engine": "x"})
    # The most recently confirmed generation is the known-good, not the newest.
    assert ledger.last_known_good("t").id == a.id


def test_trial_journal(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.db")
    gen = ledger.record_generation("t", "spec")
    trial = ledger.start_trial("t", {"edits": []}, gen.id)
    died = Reason(code=Code.SERVER_DIED, values={"error": "x"})
    ledger.step(trial, TrialState.PREFLIGHTED)
    ledger.step(trial, TrialState.MEASURING_BASELINE)
    ledger.add_run(trial, "baseline", 8, 0, {"output_tok_s": 1.0})
    ledger.step(
        trial, TrialState.JUDGED, "REVERT", verdict="REVERT", reasons_json=[died.model_dump()]
    )
    row = ledger.trial(trial)
    assert (row.state, row.verdict, row.reasons) == ("judged", "REVERT", [died])
    assert [e.state for e in ledger.events(trial)] == [
        "planned",
        "preflighted",
        "measuring-baseline",
        "judged",
    ]
    assert ledger.runs(trial)[0].summary == {"output_tok_s": 1.0}
    # a second connection (another flagtrial process) sees the same ledger
    assert Ledger(tmp_path / "l.db").trial(trial).verdict == "REVERT"


def test_journal_refuses_a_step_the_state_machine_does_not_allow(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.db")
    gen = ledger.record_generation("t", "spec")
    trial = ledger.start_trial("t", {"edits": []}, gen.id)
    # kept straight from planned: no verdict yet, so nothing may be kept
    with pytest.raises(TransitionError, match="no transition from planned to kept"):
        ledger.step(trial, TrialState.KEPT, "kept", finished_at=1.0)
    row = ledger.trial(trial)
    assert (row.state, row.finished_at) == ("planned", None)  # nothing written
    assert [e.state for e in ledger.events(trial)] == ["planned"]
    ledger.step(trial, TrialState.ABORTED, "interrupted")
    # a finished trial's journal is closed, whatever comes
    assert ledger.unfinished_trials("t") == []
    for state in TrialState:
        with pytest.raises(TransitionError):
            ledger.step(trial, state)
    assert [e.state for e in ledger.events(trial)] == ["planned", "aborted"]
    assert all(not TRANSITIONS[s] for s in FINAL)
    assert all(TRANSITIONS[s] for s in TrialState if s not in FINAL)


def test_corrupt_ledger_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(LedgerError, match="ledger"):
        Ledger(path)


def test_newer_schema_refused(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    Ledger(path).db.execute("PRAGMA user_version=99")
    with pytest.raises(LedgerError, match="newer"):
        Ledger(path)


def test_schema_1_ledger_is_migrated_with_its_runs(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    ledger = Ledger(path)
    gen = ledger.record_generation("t", "ExecStart=/bin/x\n")
    trial = ledger.start_trial("t", {"edits": []}, gen.id)
    # what schema 1 was: runs without their block and foreign load, a spec held as TEXT
    for column in ("block", "disturbed", "foreign_json"):
        ledger.db.execute(f"ALTER TABLE runs DROP COLUMN {column}")
    ledger.db.executescript(
        "ALTER TABLE generations ADD COLUMN spec_text TEXT NOT NULL DEFAULT '';"
        "UPDATE generations SET spec_text = CAST(spec AS TEXT);"
        "ALTER TABLE generations DROP COLUMN spec;"
    )
    ledger.db.execute(
        "INSERT INTO runs (trial_id, arm, concurrency, run_index, summary_json, at) "
        "VALUES (?, 'baseline', 8, 0, '{\"output_tok_s\": 100.0}', 0)",
        (trial,),
    )
    ledger.db.execute("PRAGMA user_version=1")
    ledger.close()
    migrated = Ledger(path)
    assert migrated.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert migrated.generation(gen.id) == gen
    [run] = migrated.runs(trial)
    assert (run.block, run.disturbed, run.foreign) == (0, None, None)
    assert run.summary == {"output_tok_s": 100.0}
    migrated.add_run(trial, "candidate", 8, 0, {}, block=1, disturbed="busy", foreign={"a": 1})
    assert migrated.runs(trial)[1].foreign == {"a": 1}


def schema_3_trial(ledger: Ledger) -> int:
    """A trial as schema 3 stored it: reasons as plain text, in the column and the record."""
    gen = ledger.record_generation("t", "ExecStart=/bin/x\n")
    trial = ledger.start_trial("t", {"edits": []}, gen.id)
    words = ["harmful: output tok/s at c=8: 300 -> 200 (-33.3 %, -40.0 .. -26.0 %)", "x"]
    record = {"verdict": {"decision": "REVERT", "reasons": words, "effects": []}, "host": {}}
    ledger.db.execute(
        "UPDATE trials SET verdict='REVERT', reasons_json=?, record_json=? WHERE id=?",
        (json.dumps(words), json.dumps(record), trial),
    )
    ledger.db.execute("PRAGMA user_version=3")
    return trial


def test_schema_3_reasons_get_codes(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    ledger = Ledger(path)
    trial = schema_3_trial(ledger)
    ledger.close()
    migrated = Ledger(path)
    assert migrated.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
    row = migrated.trial(trial)
    assert [(r.code, r.values) for r in row.reasons] == [
        (
            Code.TEXT,
            {"text": "harmful: output tok/s at c=8: 300 -> 200 (-33.3 %, -40.0 .. -26.0 %)"},
        ),
        (Code.TEXT, {"text": "x"}),
    ]
    assert [r.message for r in row.reasons][1] == "x"
    assert row.record["verdict"]["reasons"] == [r.model_dump() for r in row.reasons]
    assert row.record["host"] == {}
    # opened again: nothing to migrate, nothing changed
    assert Ledger(path).trial(trial) == row


def test_schema_3_export_imports_with_codes(tmp_path: Path) -> None:
    old = Ledger(tmp_path / "old.db")
    trial = schema_3_trial(old)
    export = old.export(include_secrets=True)
    export["schema_version"] = 3  # as a schema-3 flagtrial wrote it
    copy = Ledger(tmp_path / "copy.db")
    assert copy.import_(export) > 0
    assert [(r.code, r.message) for r in copy.trial(trial).reasons][1] == (Code.TEXT, "x")
    assert copy.trial(trial).record["verdict"]["reasons"][1]["code"] == "text"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("unit = ", "not valid TOML"),
        ('target = "process"', "unit: Field required"),
        ('unit = "x.service"\nbogus = 1', "bogus: Extra inputs are not permitted"),
        ('unit = "x.service"\n[workload]\nconcurrency = []', "workload.concurrency"),
        ('unit = "x.service"\n[policy]\nruns = 1', "policy.runs"),
    ],
)
def test_malformed_project_file(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "flagtrial.toml"
    path.write_text(text)
    with pytest.raises(ProjectError, match=message):
        load_project(path)


def test_missing_project_file(tmp_path: Path) -> None:
    with pytest.raises(ProjectError, match="flagtrial init"):
        load_project(tmp_path / "flagtrial.toml")


def test_history_names_the_target_of_each_trial_once_there_are_several(tmp_path: Path) -> None:
    """A fleet shares one ledger: its history says which host each trial ran on."""
    from rich.console import Console

    from flagtrial.ui import history_table

    ledger = Ledger(tmp_path / "l.db")

    def shown() -> str:
        console = Console(width=200, record=True)
        console.print(history_table(ledger.trials(), ledger.generations()))
        return console.export_text()

    one = ledger.record_generation("ssh://root@ft-41/llama.service", "spec")
    ledger.start_trial("ssh://root@ft-41/llama.service", {"edits": []}, one.id)
    assert "target" not in shown()  # one host: no column for it
    two = ledger.record_generation("ssh://root@ft-42/llama.service", "spec")
    ledger.start_trial("ssh://root@ft-42/llama.service", {"edits": []}, two.id)
    text = shown()
    assert "target" in text and "ft-41" in text and "ft-42" in text
