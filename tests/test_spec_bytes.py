"""Byte-exact launch specs: CRLF, non-UTF-8 bytes, a missing final newline and a BOM survive
every read, ledger copy, edit, install and restore, on a real llama-server under the process
target and on a real systemd host over SSH; a restore that does not bring the exact bytes
back is not verified."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from flagtrial.demo import free_port, write_unit
from flagtrial.errors import RollbackError
from flagtrial.launch.change import Change, Edit
from flagtrial.launch.spec import LaunchSpec, decode_spec, encode_spec, parse_unit, spec_sha256
from flagtrial.ledger import SCHEMA_VERSION, Ledger
from flagtrial.settings import load_project
from flagtrial.targets.process import ProcessTarget
from flagtrial.trial import Trial
from harness.cli import cli
from harness.hosts import LLAMA_PORT, SystemdHost, host_fixture, llama_unit, ssh_project
from harness.project import write_project_file
from harness.session import recorder, session_for

# What it asserts rests on the server's facts, crashes, bounds and files, never on a
# measured difference: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine

LATIN1_COMMENT = b"# r\xe9glage du serveur (Latin-1)\n"


def crlf(data: bytes) -> bytes:
    return data.replace(b"\n", b"\r\n")


def with_latin1_comment(data: bytes) -> bytes:
    """A Latin-1 comment line next to the flag the trials edit (inside the command's
    continuation when it has one), else after the first line."""
    if b"    --parallel" in data:
        return data.replace(b"    --parallel", b"    " + LATIN1_COMMENT + b"    --parallel")
    first, rest = data.split(b"\n", 1)
    return first + b"\n" + LATIN1_COMMENT + rest


# The unit shapes a trial must give back byte for byte.
SHAPES = {
    "crlf": crlf,
    "latin1-no-final-newline": lambda d: with_latin1_comment(d).removesuffix(b"\n"),
    "bom-crlf-latin1": lambda d: b"\xef\xbb\xbf" + crlf(with_latin1_comment(d)),
}


# ---------------------------------------------------------------------------- no server


def test_ledger_stores_spec_bytes_and_hashes_them_once(tmp_path: Path) -> None:
    data = b"\xef\xbb\xbf[Service]\r\n# caf\xe9\r\nExecStart=/usr/bin/x -np 4\r\nUser=llm"
    text = decode_spec(data)
    ledger = Ledger(tmp_path / "l.db")
    gen = ledger.record_generation("t", text)
    assert encode_spec(ledger.generation(gen.id).spec_text) == data
    assert gen.spec_sha256 == spec_sha256(parse_unit(text).text) == hashlib.sha256(data).hexdigest()
    # the same bytes are the same generation; a changed line ending is a new one
    assert ledger.record_generation("t", text).id == gen.id
    assert ledger.record_generation("t", text.replace("\r\n", "\n")).id != gen.id
    [stored] = ledger.db.execute("SELECT spec FROM generations WHERE id=?", (gen.id,)).fetchone()
    assert stored == data


def test_export_and_import_keep_every_byte(tmp_path: Path) -> None:
    data = b"[Service]\r\n# caf\xe9\rExecStart=/usr/bin/x\n"
    ledger = Ledger(tmp_path / "a.db")
    gen = ledger.record_generation("t", decode_spec(data))
    exported = tmp_path / "export.json"
    exported.write_text(json.dumps(ledger.export(), indent=1))  # as `ledger export` writes it
    again = Ledger(tmp_path / "b.db")
    again.import_(json.loads(exported.read_text()))
    assert encode_spec(again.generation(gen.id).spec_text) == data
    assert again.generation(gen.id).spec_sha256 == gen.spec_sha256
    assert again.export() == json.loads(exported.read_text())


# What schema 2 held: a spec as TEXT (it could only store valid UTF-8).
SCHEMA_2_GENERATIONS = """
CREATE TABLE generations (
  id INTEGER PRIMARY KEY, target TEXT NOT NULL, spec_text TEXT NOT NULL,
  spec_sha256 TEXT NOT NULL, created_at REAL NOT NULL, known_good INTEGER NOT NULL DEFAULT 0,
  good_at REAL, facts_json TEXT, note TEXT NOT NULL DEFAULT ''
);
"""


def test_schema_2_ledger_migrates_to_spec_bytes(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    ledger = Ledger(path)
    ledger.db.executescript(f"DROP TABLE generations; {SCHEMA_2_GENERATIONS}")
    text = "[Service]\r\nExecStart=/usr/bin/x \\\r\n  -np 4\r\n# réglage"
    ledger.db.execute(
        "INSERT INTO generations (target, spec_text, spec_sha256, created_at, known_good, "
        "facts_json) VALUES ('t', ?, ?, 0, 1, '{}')",
        (text, hashlib.sha256(text.encode()).hexdigest()),
    )
    ledger.db.execute("PRAGMA user_version=2")
    ledger.close()
    migrated = Ledger(path)
    assert migrated.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    good = migrated.last_known_good("t")
    assert good is not None and good.spec_text == text
    # the old hash is the hash of the bytes: the installed spec is still that generation
    assert migrated.record_generation("t", text).id == good.id
    latin1 = migrated.record_generation("t", decode_spec(b"[Service]\n# caf\xe9\n"))
    assert encode_spec(migrated.generation(latin1.id).spec_text) == b"[Service]\n# caf\xe9\n"


def test_an_edit_keeps_each_line_s_own_ending() -> None:
    text = "[Service]\nExecStart=/usr/bin/x \\\r\n  -np 4\r\nUser=llm\n"
    spec = parse_unit(text)
    appended = spec.with_argv([*spec.argv, "--metrics"])
    assert (
        appended.text
        == "[Service]\nExecStart=/usr/bin/x \\\r\n  -np 4 \\\r\n  --metrics\r\nUser=llm\n"
    )
    assert spec.with_argv([*spec.argv[:-1], "8"]).text == text.replace("-np 4", "-np 8")


def test_process_target_reads_and_writes_bytes(tmp_path: Path) -> None:
    data = b"\xef\xbb\xbf# caf\xe9\r\n[Service]\r\nExecStart=/usr/bin/x -np 4\rUser=llm"
    path = tmp_path / "llama.service"
    path.write_bytes(data)
    target = ProcessTarget(path, tmp_path / "state")
    spec = asyncio.run(target.read_spec())
    assert encode_spec(spec.text) == data and spec.argv == ["/usr/bin/x", "-np", "4"]
    asyncio.run(target.install_spec(spec.with_argv(["/usr/bin/x", "-np", "8"])))
    assert path.read_bytes() == data.replace(b"-np 4", b"-np 8")


# ---------------------------------------------------------------------------- process target


class Project:
    def __init__(self, root: Path, unit_bytes: bytes, port: int) -> None:
        self.root = root
        self.file = root / "flagtrial.toml"
        self.unit = root / "llama.service"
        self.unit.write_bytes(unit_bytes)
        write_project_file(
            self.file,
            f'unit = "llama.service"\nendpoint = "http://127.0.0.1:{port}"\nready_timeout_s = 30\n'
            "[workload]\nconcurrency = [4]\nprompt_words = 16\nmax_tokens = 16\n"
            "requests_per_run = 4\nwarmup_requests = 1\nrun_timeout_s = 30\n"
            # a capacity loss reverts at once: these tests are about the restore's bytes
            '[policy]\nruns = 2\nmax_runs = 2\ncapacity_guard = "revert"\n'
            "set_aside_disturbed = false\n",
        )

    def cli(self, *args: str, strict_output: bool = False) -> subprocess.CompletedProcess[str]:
        # strict: as under en_US.UTF-8 (C.UTF-8 escapes raw bytes on its own)
        env = {"PYTHONIOENCODING": "utf-8:strict"} if strict_output else {}
        return cli(self.file, *args, env=env)

    def ledger(self) -> Ledger:
        return Ledger(load_project(self.file).ledger_path)

    def stop(self) -> None:
        asyncio.run(ProcessTarget(self.unit, self.root / ".flagtrial" / "process").stop())


@pytest.fixture
def make_project(tmp_path: Path, llama_server_bin: Path, tiny_model: Path) -> Iterator[object]:
    made: list[Project] = []

    def make(shape: str) -> Project:
        port = free_port()
        template = tmp_path / f"template-{port}.service"
        write_unit(template, llama_server_bin, tiny_model, port)
        root = tmp_path / shape
        root.mkdir()
        project = Project(root, SHAPES[shape](template.read_bytes()), port)
        made.append(project)
        return project

    yield make
    for project in made:
        project.stop()


@pytest.mark.slow
@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_reverted_trial_gives_the_unit_back_byte_for_byte(make_project, shape: str) -> None:  # type: ignore[no-untyped-def]
    project: Project = make_project(shape)
    before, mode = project.unit.read_bytes(), project.unit.stat().st_mode
    result = project.cli("trial", "--set", "--parallel=-1")
    assert result.returncode == 10, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert "facts match the known-good" in result.stdout
    assert project.unit.read_bytes() == before
    assert project.unit.stat().st_mode == mode
    ledger = project.ledger()
    [trial] = ledger.trials()
    assert trial.state == "reverted"
    known_good = ledger.generation(trial.baseline_gen)
    assert encode_spec(known_good.spec_text) == before
    assert known_good.spec_sha256 == hashlib.sha256(before).hexdigest()
    # the candidate is the known-good with one line changed, every other byte kept
    candidate = encode_spec(ledger.generation(trial.candidate_gen or 0).spec_text)
    assert candidate == before.replace(b"--parallel 8", b"--parallel -1")
    # and preflight shows the diff of such a unit without tripping over its bytes, also
    # where the terminal's encoding is strict UTF-8
    shown = project.cli("preflight", "--set", "--parallel=2", strict_output=True)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "+    --parallel 2" in shown.stdout
    if b"\xe9" in before:
        assert "r\\xe9glage" in shown.stdout  # the byte shown as an escape
    assert project.unit.read_bytes() == before


class NormalizingTarget(ProcessTarget):
    """A host where something (a config tool, an editor hook) rewrites CRLF to LF after
    every install: the facts come back, the bytes do not."""

    async def install_spec(self, spec: LaunchSpec) -> None:
        await super().install_spec(spec)
        self.spec_path.write_bytes(self.spec_path.read_bytes().replace(b"\r\n", b"\n"))


@pytest.mark.slow
def test_a_restore_that_changes_bytes_is_not_verified(make_project) -> None:  # type: ignore[no-untyped-def]
    project: Project = make_project("crlf")
    settings = load_project(project.file)
    events: list[tuple[str, str]] = []
    target = NormalizingTarget(settings.path(settings.unit), settings.state_dir / "process")
    session = session_for(project.file, recorder(events), target=target)

    async def trial() -> None:
        try:
            async with target.lock("test"):
                await Trial(
                    session, Change(edits=[Edit(op="set", name="--parallel", value="-1")])
                ).run()
        finally:
            await session.close()

    with pytest.raises(RollbackError, match="bytes differ at byte"):
        asyncio.run(trial())
    reverted = [detail for state, detail in events if state == "reverted"]
    assert len(reverted) == 1 and "facts differ: the spec's bytes differ" in reverted[0]
    record = project.ledger().trials()[0].record
    assert record["restore"]["verified"] is False


# ---------------------------------------------------------------------------- over SSH

N = 18  # this module's container: ft-18 at 10.200.18.2
UNIT_PATH = "/etc/systemd/system/llama.service"


host = host_fixture(N)


@pytest.mark.slow
def test_a_reverted_trial_over_ssh_gives_the_unit_back_byte_for_byte(
    host: SystemdHost, tmp_path: Path
) -> None:
    unit = crlf(with_latin1_comment(llama_unit("-np 8").encode()))
    project = ssh_project(
        host, tmp_path / "flagtrial.toml", llama_unit("-np 8"),
        "[workload]\nconcurrency = [8]\nprompt_words = 16\nmax_tokens = 16\n"
        "requests_per_run = 8\nwarmup_requests = 1\nrun_timeout_s = 60\n"
        '[policy]\nruns = 2\nmax_runs = 2\ncapacity_guard = "revert"\n'
        "set_aside_disturbed = false\n",
    )  # fmt: skip
    subprocess.run(
        ["nsenter", "-t", str(host.leader), "-a", "sh", "-c",
         'cat >"$1" && chmod 0640 "$1" && systemctl daemon-reload', "sh", UNIT_PATH],
        input=unit, check=True,
    )  # fmt: skip
    mode = host.sh('stat -c %a "$1"', UNIT_PATH).stdout.strip()
    result = cli(project, "trial", "--set", "--parallel=-1")
    assert result.returncode == 10, result.stdout + result.stderr
    assert "facts match the known-good" in result.stdout
    assert host.read(UNIT_PATH) == unit
    assert host.sh('stat -c %a "$1"', UNIT_PATH).stdout.strip() == mode == "640"
    assert host.sh("systemctl is-active llama.service").stdout.strip() == "active"
    ledger = Ledger(load_project(project).ledger_path)
    [trial] = ledger.trials()
    assert encode_spec(ledger.generation(trial.baseline_gen).spec_text) == unit
    assert f"--port {LLAMA_PORT}" in ledger.generation(trial.baseline_gen).spec_text
