"""Redaction of secret values: which names are secret, units in every systemd form, command
files, flags, free text, the facts servers echo, and the ledger's file mode and copies."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from flagtrial.engines.vllm import parse_startup_log
from flagtrial.facts import Facts
from flagtrial.launch.spec import parse_command, parse_unit
from flagtrial.ledger import Ledger
from flagtrial.reasons import Code, Reason
from flagtrial.redact import MARK, Redactor, is_secret_name
from flagtrial.states import TrialState

# Measures nothing: may run beside another module (harness/machine.py).
pytestmark = pytest.mark.shares_machine

UNIT = """[Unit]
Description=llama-server
# old: HF_TOKEN=hf_commented_out_value
[Service]
Environment=HF_TOKEN=hf_plain_value OMP_NUM_THREADS=1
Environment="OPENAI_API_KEY=sk two words" "LLAMA_LOG_COLORS=off"
Environment=A=1 \\
    MY_SETTING=listed_by_project \\
    "DB_PASSWORD=spans \\
continuation"
SetCredential=token:credential_value
ExecStart=/opt/llama-server -m /m.gguf --api-key api_key_value \\
    --hf-token=hf_flag_value --max-num-batched-tokens 8192 -np 4
"""
SECRETS = (
    "hf_commented_out_value", "hf_plain_value", "sk two words", "two words", "listed_by_project",
    "spans", "continuation", "credential_value", "api_key_value", "hf_flag_value",
)  # fmt: skip


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("HF_TOKEN", True), ("OPENAI_API_KEY", True), ("--api-key", True), ("--hf-token", True),
        ("PGPASSWORD", True), ("AWS_SECRET_ACCESS_KEY", True), ("apiKey", True),
        ("arg.api_key", True), ("GOOGLE_APPLICATION_CREDENTIALS", True), ("DB_PASSWD", True),
        ("SESSION_COOKIE", True), ("AUTH", True), ("my_setting", True),
        ("SECRET_KEY_BASE", True), ("MYSQL_PWD", True), ("HFTOKEN", True),
        ("--max-num-batched-tokens", False), ("--tokenizer", False), ("kv_tokens", False),
        ("--long-prefill-token-threshold", False), ("token_capacity", False),
        ("--api-key-file", False),
        ("OMP_NUM_THREADS", False), ("--parallel", False), ("--kv-cache-dtype", False),
    ],
)  # fmt: skip
def test_secret_names(name: str, secret: bool) -> None:
    assert is_secret_name(name, ["MY_SETTING"]) is secret


def test_unit_redacted_line_for_line_in_every_form() -> None:
    parse_unit(UNIT)  # a valid unit
    shown = Redactor(["MY_SETTING"]).spec(UNIT)
    for value in SECRETS:
        assert value not in shown
    lines = shown.splitlines()
    assert len(lines) == len(UNIT.splitlines())
    assert "Environment=HF_TOKEN=<redacted> OMP_NUM_THREADS=1" in lines
    assert 'Environment=OPENAI_API_KEY=<redacted> "LLAMA_LOG_COLORS=off"' in lines
    assert "    MY_SETTING=<redacted> \\" in lines and "    DB_PASSWORD=<redacted>" in lines
    assert "ExecStart=/opt/llama-server -m /m.gguf --api-key <redacted> \\" in lines
    # a tuning flag that merely mentions tokens stays readable
    assert "    --hf-token=<redacted> --max-num-batched-tokens 8192 -np 4" in lines


def test_command_file_and_learnt_values() -> None:
    text = "HF_TOKEN='hf with space' llama-server --api-key \"k e y\" --port 8080\n"
    parse_command(text)
    r = Redactor()
    assert r.spec(text) == "HF_TOKEN=<redacted> llama-server --api-key <redacted> --port 8080\n"
    r.learn_spec(text)
    # learnt values are scrubbed from any text, however it is quoted there
    assert r.text("crash: bad key 'k e y' for hf with space") == (
        f"crash: bad key '{MARK}' for {MARK}"
    )


def test_free_text_patterns() -> None:
    r = Redactor()
    line = (
        "non-default args: {'model': '/m', 'api_key': ['sk-1'], 'hf_token': 'hf_2'} "
        "Environment=HF_TOKEN=hf_3 --api-key sk-4 --admin-api-key=sk-5 -np 4"
    )
    shown = r.text(line)
    for value in ("sk-1", "hf_2", "hf_3", "sk-4", "sk-5"):
        assert value not in shown
    assert "'model': '/m'" in shown and "-np 4" in shown


def test_diff_shows_a_changed_secret_as_a_changed_line() -> None:
    new = UNIT.replace("hf_plain_value", "hf_new_value").replace("-np 4", "-np 8")
    diff = Redactor().diff(UNIT, new, "known-good", "candidate")
    assert "hf_new_value" not in diff and "hf_plain_value" not in diff
    assert "-Environment=HF_TOKEN=<redacted> OMP_NUM_THREADS=1\n" in diff
    assert "+Environment=HF_TOKEN=<redacted> OMP_NUM_THREADS=1\n" in diff
    assert "+    --hf-token=<redacted> --max-num-batched-tokens 8192 -np 8\n" in diff


def test_facts_servers_echo_are_redacted_as_read() -> None:
    """vLLM logs its non-default args (api_key among them); SGLang's /server_info has
    api_key: the facts hold neither, and numbers under secret-looking names stay."""
    log = (
        "(APIServer pid=1) INFO 11-29 22:40:00 [utils.py:233] non-default args: "
        "{'model': '/m', 'api_key': ['sk-vllm-secret'], 'max_num_batched_tokens': 512}\n"
    )
    _, settings, _ = parse_startup_log(log)
    facts = Facts(
        engine="vllm",
        settings={**settings, "api_key": "sk-sglang-secret", "token_capacity": 4096},
        log_lines=["started with --api-key sk-line-secret"],
    )
    dumped = facts.model_dump_json()
    for value in ("sk-vllm-secret", "sk-sglang-secret", "sk-line-secret"):
        assert value not in dumped
    assert facts.settings["arg.max_num_batched_tokens"] == 512
    assert facts.settings["token_capacity"] == 4096


def test_ledger_created_owner_only_and_tightened(tmp_path: Path) -> None:
    path = tmp_path / "state" / "ledger.db"
    ledger = Ledger(path)
    ledger.record_generation("t", UNIT)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    for side in ("-wal", "-shm"):
        assert stat.S_IMODE(path.with_name(path.name + side).stat().st_mode) == 0o600
    ledger.close()
    path.chmod(0o644)
    Ledger(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_ledger_keeps_specs_for_restore_and_redacts_everything_else(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.db", Redactor(["MY_SETTING"]))
    good = ledger.record_generation("t", UNIT)
    change = {"edits": [{"op": "setenv", "name": "HF_TOKEN", "value": "hf_in_change"}]}
    trial = ledger.start_trial("t", change, good.id)
    died = Reason(code=Code.SERVER_DIED, values={"error": "hf_in_change"}).model_dump()
    ledger.step(trial, TrialState.PREFLIGHTED)
    ledger.step(trial, TrialState.MEASURING_BASELINE)
    ledger.step(trial, TrialState.JUDGED, "crashed: --api-key api_key_value", reasons_json=[died])
    assert ledger.generation(good.id).spec_text == UNIT  # what a restore installs
    raw = json.dumps([dict(r) for r in ledger.db.execute("SELECT * FROM trials")])
    raw += json.dumps([dict(r) for r in ledger.db.execute("SELECT * FROM events")])
    exported = json.dumps(ledger.export())
    for value in (*SECRETS, "hf_in_change"):
        assert value not in raw and value not in exported
    copy = Ledger(tmp_path / "copy.db")
    with pytest.raises(Exception, match="--include-secrets"):
        copy.import_(ledger.export())
    assert copy.import_(ledger.export(include_secrets=True)) > 0
    assert copy.generation(good.id).spec_text == UNIT


def test_a_directive_systemd_would_refuse_still_hides_its_secrets() -> None:
    unit = (
        "[Service]\n"
        'Environment="HF_TOKEN=bad \\q escape"\n'
        "ExecStartPre=/bin/true ; /bin/prepare --auth-token pre_secret\n"
        "Environment=OPENAI_API_KEY=still_structural\n"
        "ExecStart=/opt/llama-server -m /m.gguf\n"
    )
    shown = Redactor().spec(unit)
    for value in ("bad", "escape", "pre_secret", "still_structural"):
        assert value not in shown
    assert len(shown.splitlines()) == 5
