"""The ledger's SQLite schema, its migrations from every older version, and the file's mode
(owner-only: it holds launch specs with their secrets). ledger.py reads and writes the rows.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from flagtrial.errors import LedgerError
from flagtrial.reasons import coded

SCHEMA_VERSION = 5

SCHEMA = """
CREATE TABLE IF NOT EXISTS generations (
  id INTEGER PRIMARY KEY,
  target TEXT NOT NULL,
  spec BLOB NOT NULL,
  spec_sha256 TEXT NOT NULL,
  created_at REAL NOT NULL,
  known_good INTEGER NOT NULL DEFAULT 0,
  good_at REAL,
  facts_json TEXT,
  note TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS trials (
  id INTEGER PRIMARY KEY,
  target TEXT NOT NULL,
  change_json TEXT NOT NULL,
  baseline_gen INTEGER NOT NULL REFERENCES generations(id),
  candidate_gen INTEGER REFERENCES generations(id),
  state TEXT NOT NULL,
  verdict TEXT,
  reasons_json TEXT NOT NULL DEFAULT '[]',
  record_json TEXT NOT NULL DEFAULT '{}',
  started_at REAL NOT NULL,
  finished_at REAL
);
CREATE TABLE IF NOT EXISTS events (
  id INTEGER PRIMARY KEY,
  trial_id INTEGER NOT NULL REFERENCES trials(id),
  at REAL NOT NULL,
  state TEXT NOT NULL,
  detail TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS runs (
  id INTEGER PRIMARY KEY,
  trial_id INTEGER NOT NULL REFERENCES trials(id),
  arm TEXT NOT NULL,
  concurrency INTEGER NOT NULL,
  run_index INTEGER NOT NULL,
  summary_json TEXT NOT NULL,
  at REAL NOT NULL,
  block INTEGER NOT NULL DEFAULT 0,
  disturbed TEXT,
  foreign_json TEXT
);
CREATE TABLE IF NOT EXISTS attributions (
  id INTEGER PRIMARY KEY,
  trial_id INTEGER NOT NULL REFERENCES trials(id),
  record_json TEXT NOT NULL,
  at REAL NOT NULL
);
"""
# Schema 1 -> 2: runs know their restart block and the foreign load measured around them.
MIGRATE_1_TO_2 = """
ALTER TABLE runs ADD COLUMN block INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN disturbed TEXT;
ALTER TABLE runs ADD COLUMN foreign_json TEXT;
"""
# Schema 2 -> 3: a generation holds its spec's exact bytes (TEXT cannot hold a non-UTF-8
# byte). Schema 2 could only store valid UTF-8, so its text cast to bytes is exact and its
# hashes stay right.
MIGRATE_2_TO_3 = """
ALTER TABLE generations ADD COLUMN spec BLOB NOT NULL DEFAULT x'';
UPDATE generations SET spec = CAST(spec_text AS BLOB);
ALTER TABLE generations DROP COLUMN spec_text;
"""
# Schema 3 -> 4: reasons carry their codes (flagtrial.reasons); one stored as plain text
# becomes a reason of code "text" with its words (coded_trial), in the trial's reasons and
# in the verdict of its record.
# Schema 4 -> 5: which edit of a trial's change did what (flagtrial.attribution).
MIGRATE_4_TO_5 = """
CREATE TABLE IF NOT EXISTS attributions (
  id INTEGER PRIMARY KEY,
  trial_id INTEGER NOT NULL REFERENCES trials(id),
  record_json TEXT NOT NULL,
  at REAL NOT NULL
);
"""


# The ledger holds launch specs as they are (secrets included, to restore them byte for
# byte): owner-only. SQLite gives its -wal and -shm files the database file's mode.
LEDGER_MODE = 0o600
_SIDECARS = ("", "-wal", "-shm", "-journal")


def owner_only(path: Path) -> None:
    """Create the ledger file owner-only, and tighten an existing one and its sidecars."""
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, LEDGER_MODE)
    os.close(fd)
    for suffix in _SIDECARS:
        side = path.with_name(path.name + suffix)
        try:
            mode = side.stat().st_mode & 0o777
        except FileNotFoundError:
            continue
        if mode & 0o077:
            side.chmod(mode & 0o700)


def migrate(
    db: sqlite3.Connection,
    path: Path,
    tx: Callable[[], AbstractContextManager[sqlite3.Connection]],
) -> None:
    """Bring the ledger at `path` to SCHEMA_VERSION; `tx` is the ledger's own transaction."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise LedgerError(
            f"ledger {path} has schema {version}, newer than this flagtrial ({SCHEMA_VERSION})"
        )
    # executescript commits on its own, so each migration is one script.
    if version < 1:
        db.executescript(f"BEGIN; {SCHEMA} PRAGMA user_version={SCHEMA_VERSION}; COMMIT;")
        return
    if version == 1:
        db.executescript(f"BEGIN; {MIGRATE_1_TO_2} PRAGMA user_version=2; COMMIT;")
    if version <= 2:
        db.executescript(f"BEGIN; {MIGRATE_2_TO_3} PRAGMA user_version=3; COMMIT;")
    if version <= 3:
        with tx() as db:
            for row in db.execute("SELECT * FROM trials").fetchall():
                new = coded_trial(dict(row))
                db.execute(
                    "UPDATE trials SET reasons_json=?, record_json=? WHERE id=?",
                    (new["reasons_json"], new["record_json"], row["id"]),
                )
            db.execute("PRAGMA user_version=4")
    if version <= 4:
        db.executescript(f"BEGIN; {MIGRATE_4_TO_5} PRAGMA user_version=5; COMMIT;")


def coded_trial(row: dict[str, Any]) -> dict[str, Any]:
    """A trial row with every reason coded (reasons.coded): in its reasons column and in the
    verdict its record holds."""
    record = json.loads(row["record_json"])
    verdict = record.get("verdict")
    if isinstance(verdict, dict) and isinstance(verdict.get("reasons"), list):
        verdict["reasons"] = coded(verdict["reasons"])
    return {
        **row,
        "reasons_json": json.dumps(coded(json.loads(row["reasons_json"]))),
        "record_json": json.dumps(record),
    }
