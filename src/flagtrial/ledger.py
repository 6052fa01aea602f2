"""The ledger: every generation of a launch spec and every trial, in SQLite (WAL mode)."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flagtrial.errors import LedgerError, UsageError
from flagtrial.launch.spec import decode_spec, encode_spec, spec_sha256
from flagtrial.ledger_schema import SCHEMA_VERSION, coded_trial, migrate, owner_only
from flagtrial.reasons import Reason
from flagtrial.records import Event, Generation, RunRow, TrialRow
from flagtrial.redact import Redactor
from flagtrial.states import FINAL, TrialState, check


class Ledger:
    """`secrets` redacts what the ledger hands out for people and tools to read (trials,
    events, exports); it learns the secret values of every spec the ledger holds."""

    def __init__(self, path: Path, secrets: Redactor | None = None) -> None:
        self.path = path
        self.secrets = secrets if secrets is not None else Redactor()
        self._learnt_gen = 0  # generations up to this id have taught self.secrets
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            owner_only(path)
            self.db = sqlite3.connect(path, timeout=5.0, isolation_level=None)
            self.db.row_factory = sqlite3.Row
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA foreign_keys=ON")
            migrate(self.db, path, self.tx)
        except (sqlite3.Error, OSError) as e:
            raise LedgerError(f"ledger {path}: {e}") from e

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        try:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")
        except sqlite3.Error as e:
            raise LedgerError(f"ledger {self.path}: {e}") from e

    def close(self) -> None:
        self.db.close()

    # generations

    def record_generation(self, target: str, spec_text: str, note: str = "") -> Generation:
        """The generation holding exactly this text (its bytes) for this target, created when
        new."""
        digest = spec_sha256(spec_text)
        row = self.db.execute(
            "SELECT * FROM generations WHERE target=? AND spec_sha256=? ORDER BY id DESC LIMIT 1",
            (target, digest),
        ).fetchone()
        if row is None:
            with self.tx() as db:
                cur = db.execute(
                    "INSERT INTO generations (target, spec, spec_sha256, created_at, note) "
                    "VALUES (?,?,?,?,?)",
                    (target, encode_spec(spec_text), digest, time.time(), note),
                )
            return self.generation(int(cur.lastrowid or 0))
        return self._generation(row)

    def mark_known_good(self, gen_id: int, facts: dict[str, Any]) -> None:
        with self.tx() as db:
            db.execute(
                "UPDATE generations SET known_good=1, good_at=?, facts_json=? WHERE id=?",
                (time.time(), json.dumps(facts), gen_id),
            )

    def generation(self, gen_id: int) -> Generation:
        row = self.db.execute("SELECT * FROM generations WHERE id=?", (gen_id,)).fetchone()
        if row is None:
            raise UsageError(f"no generation {gen_id} in {self.path}")
        return self._generation(row)

    def last_known_good(self, target: str) -> Generation | None:
        """The generation most recently confirmed good (by a baseline, a KEEP or a rollback)."""
        row = self.db.execute(
            "SELECT * FROM generations WHERE target=? AND known_good=1 "
            "ORDER BY good_at DESC, id DESC LIMIT 1",
            (target,),
        ).fetchone()
        return self._generation(row) if row else None

    def generations(self, target: str | None = None) -> list[Generation]:
        rows = self.db.execute(
            "SELECT * FROM generations WHERE (? IS NULL OR target=?) ORDER BY id", (target, target)
        ).fetchall()
        return [self._generation(r) for r in rows]

    @staticmethod
    def _generation(row: sqlite3.Row) -> Generation:
        return Generation(
            id=row["id"],
            target=row["target"],
            spec_text=decode_spec(row["spec"]),
            spec_sha256=row["spec_sha256"],
            created_at=row["created_at"],
            known_good=bool(row["known_good"]),
            facts=json.loads(row["facts_json"]) if row["facts_json"] else None,
            note=row["note"],
        )

    # trials

    def start_trial(self, target: str, change: dict[str, Any], baseline_gen: int) -> int:
        secrets = self.redactor()
        secrets.learn_change(change.get("edits", []))
        with self.tx() as db:
            cur = db.execute(
                "INSERT INTO trials (target, change_json, baseline_gen, state, started_at) "
                "VALUES (?,?,?,?,?)",
                (
                    target,
                    json.dumps(secrets.data(change)),
                    baseline_gen,
                    TrialState.PLANNED,
                    time.time(),
                ),
            )
            trial_id = int(cur.lastrowid or 0)
            db.execute(
                "INSERT INTO events (trial_id, at, state, detail) VALUES (?,?,?,?)",
                (trial_id, time.time(), TrialState.PLANNED, ""),
            )
        return trial_id

    def step(self, trial_id: int, state: TrialState, detail: str = "", **fields: Any) -> None:
        """Journal one step: the trial's state and any of its columns, plus a timeline event.
        A step the state machine does not allow from the trial's state is refused
        (states.TransitionError), nothing written. Only spec texts are needed to restore:
        what a step records is kept redacted."""
        secrets = self.redactor()
        detail = secrets.text(detail)
        columns: dict[str, Any] = {"state": state.value}
        for key, value in fields.items():
            columns[key] = json.dumps(secrets.data(value)) if key.endswith("_json") else value
        assignments = ", ".join(f"{k}=?" for k in columns)
        with self.tx() as db:
            row = db.execute("SELECT state FROM trials WHERE id=?", (trial_id,)).fetchone()
            if row is None:
                raise UsageError(f"no trial {trial_id} in {self.path}")
            check(TrialState(row["state"]), state, trial_id)
            db.execute(f"UPDATE trials SET {assignments} WHERE id=?", (*columns.values(), trial_id))
            db.execute(
                "INSERT INTO events (trial_id, at, state, detail) VALUES (?,?,?,?)",
                (trial_id, time.time(), state, detail),
            )

    def add_run(
        self,
        trial_id: int,
        arm: str,
        concurrency: int,
        run_index: int,
        summary: dict[str, Any],
        *,
        block: int = 0,
        disturbed: str | None = None,
        foreign: dict[str, Any] | None = None,
    ) -> None:
        """One measured run; `disturbed` is why it was set aside, `foreign` the foreign load
        measured around it (None: not measured)."""
        with self.tx() as db:
            db.execute(
                "INSERT INTO runs (trial_id, arm, concurrency, run_index, summary_json, at, "
                "block, disturbed, foreign_json) VALUES (?,?,?,?,?,?,?,?,?)",
                (trial_id, arm, concurrency, run_index, json.dumps(summary), time.time(),
                 block, disturbed, json.dumps(foreign) if foreign is not None else None),
            )  # fmt: skip

    def record_attribution(self, trial_id: int, record: dict[str, Any]) -> int:
        """Which edit of trial `trial_id` did what (attribution.Attribution), kept redacted."""
        with self.tx() as db:
            cur = db.execute(
                "INSERT INTO attributions (trial_id, record_json, at) VALUES (?,?,?)",
                (trial_id, json.dumps(self.redactor().data(record)), time.time()),
            )
        return int(cur.lastrowid or 0)

    def attribution(self, trial_id: int) -> dict[str, Any] | None:
        """The latest attribution of trial `trial_id`, as stored."""
        row = self.db.execute(
            "SELECT record_json FROM attributions WHERE trial_id=? ORDER BY id DESC LIMIT 1",
            (trial_id,),
        ).fetchone()
        return json.loads(row["record_json"]) if row else None

    def trial(self, trial_id: int) -> TrialRow:
        row = self.db.execute("SELECT * FROM trials WHERE id=?", (trial_id,)).fetchone()
        if row is None:
            raise UsageError(f"no trial {trial_id} in {self.path}")
        return self._trial(row)

    def trials(self, target: str | None = None) -> list[TrialRow]:
        rows = self.db.execute(
            "SELECT * FROM trials WHERE (? IS NULL OR target=?) ORDER BY id", (target, target)
        ).fetchall()
        return [self._trial(r) for r in rows]

    def unfinished_trials(self, target: str) -> list[TrialRow]:
        """Trials of `target` whose journal is open: unfinished only for a caller that holds
        the target's lock or found it free (Target.lock_holder), running otherwise."""
        marks = ",".join("?" * len(FINAL))
        rows = self.db.execute(
            f"SELECT * FROM trials WHERE target=? AND state NOT IN ({marks}) ORDER BY id",
            (target, *FINAL),
        ).fetchall()
        return [self._trial(r) for r in rows]

    def events(self, trial_id: int) -> list[Event]:
        rows = self.db.execute(
            "SELECT at, state, detail FROM events WHERE trial_id=? ORDER BY id", (trial_id,)
        ).fetchall()
        secrets = self.redactor()
        return [Event(at=r["at"], state=r["state"], detail=secrets.text(r["detail"])) for r in rows]

    def runs(self, trial_id: int) -> list[RunRow]:
        rows = self.db.execute(
            "SELECT arm, concurrency, run_index, summary_json, block, disturbed, foreign_json "
            "FROM runs WHERE trial_id=? ORDER BY id",
            (trial_id,),
        ).fetchall()
        return [
            RunRow(
                arm=r["arm"],
                concurrency=r["concurrency"],
                run_index=r["run_index"],
                block=r["block"],
                summary=json.loads(r["summary_json"]),
                disturbed=r["disturbed"],
                foreign=json.loads(r["foreign_json"]) if r["foreign_json"] else None,
            )
            for r in rows
        ]

    def _trial(self, row: sqlite3.Row) -> TrialRow:
        # Redacted on reading too: a ledger written before redaction existed holds secrets.
        secrets = self.redactor()
        return TrialRow(
            id=row["id"],
            target=row["target"],
            change=secrets.data(json.loads(row["change_json"])),
            baseline_gen=row["baseline_gen"],
            candidate_gen=row["candidate_gen"],
            state=row["state"],
            verdict=row["verdict"],
            reasons=[
                Reason.model_validate(r) for r in secrets.data(json.loads(row["reasons_json"]))
            ],
            record=secrets.data(json.loads(row["record_json"])),
            started_at=row["started_at"],
            finished_at=row["finished_at"],
        )

    # moving between machines

    TABLES = ("generations", "trials", "events", "runs", "attributions")

    def redactor(self) -> Redactor:
        """self.secrets, taught the secret values of every generation recorded so far."""
        for row in self.db.execute(
            "SELECT id, spec FROM generations WHERE id > ? ORDER BY id", (self._learnt_gen,)
        ):
            self.secrets.learn_spec(decode_spec(row["spec"]))
            self._learnt_gen = row["id"]
        return self.secrets

    def export(self, *, include_secrets: bool = False) -> dict[str, Any]:
        """Every row of every table, as JSON-ready dicts, with the schema version. A spec is
        exported as `spec_text` (non-UTF-8 bytes as surrogate escapes, which JSON writes as
        \\udcXX), the same shape every schema's export has.

        By default a readable copy: secret values redacted everywhere, spec texts included
        (`secrets_left_out` says whether a spec lost any, which makes the copy unfit to
        restore from); include_secrets gives the spec texts as they are, to move the ledger.
        """
        rows = {
            table: [
                _exported(dict(r)) for r in self.db.execute(f"SELECT * FROM {table} ORDER BY id")
            ]
            for table in self.TABLES
        }
        left_out = False
        if not include_secrets:
            secrets = self.redactor()
            for table, items in rows.items():
                for row in items:
                    for key, value in row.items():
                        if not isinstance(value, str):
                            continue
                        if key == "spec_text":
                            row[key] = secrets.spec(value)
                            left_out = left_out or row[key] != value
                        elif key.endswith("_json"):
                            row[key] = json.dumps(secrets.data(json.loads(value)))
                        elif table != "generations" or key == "note":
                            row[key] = secrets.text(value)
        return {"schema_version": SCHEMA_VERSION, "secrets_left_out": left_out, **rows}

    def import_(self, data: dict[str, Any]) -> int:
        """Load an export into this (empty) ledger in one transaction; returns rows written."""
        # Schema 2 only added run columns with defaults, every schema exports a spec as
        # spec_text, and a trial's plain-text reasons get codes on the way in (_imported):
        # an export of any schema loads.
        if data.get("schema_version") not in (1, 2, 3, 4, SCHEMA_VERSION):
            raise LedgerError(
                f"export has schema {data.get('schema_version')}, this ledger {SCHEMA_VERSION}"
            )
        if data.get("secrets_left_out"):
            raise LedgerError(
                "the export has its secrets redacted, so its specs cannot be restored: "
                "export with --include-secrets to move a ledger"
            )
        if self.db.execute("SELECT COUNT(*) FROM generations").fetchone()[0]:
            raise LedgerError(f"ledger {self.path} is not empty: import into a new one")
        written = 0
        with self.tx() as db:
            for table in self.TABLES:
                for exported in data.get(table, []):
                    row = _imported(exported)
                    cols = ", ".join(row)
                    marks = ", ".join("?" * len(row))
                    db.execute(
                        f"INSERT INTO {table} ({cols}) VALUES ({marks})", tuple(row.values())
                    )
                    written += 1
        return written


def _exported(row: dict[str, Any]) -> dict[str, Any]:
    """A row as JSON holds it: a generation's spec bytes as text."""
    if "spec" in row:
        row["spec_text"] = decode_spec(row.pop("spec"))
    return row


def _imported(row: dict[str, Any]) -> dict[str, Any]:
    """An exported row as the ledger holds it: a generation's spec text as its bytes, a
    trial's reasons with codes."""
    if "reasons_json" in row:
        return coded_trial(row)
    if "spec_text" not in row:
        return row
    row = dict(row)
    row["spec"] = encode_spec(row.pop("spec_text"))
    return row
