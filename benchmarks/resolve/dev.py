"""The engine's own resolution on the gates corpus' development half (never the held half),
for the engines installed here (SGLang 0.5.23 and 0.5.10 on torch CPU, vLLM CPU 0.32.0), and
its time.

Per case: the known-good (the command without the edit) and the candidate resolved with the
case's host as declared facts; what resolution alone says (gates/preflight.py `combine` on an
UNKNOWN static finding): FAILS, NO-OP, or nothing (the findings stand). Writes
benchmarks/resolve/dev-results.json and prints a summary.

    PYTHONPATH=src python benchmarks/resolve/dev.py CORPUS_DEV_JSONL
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from flagtrial.cache import cache_root, installed_engines
from flagtrial.engines.resolve import Resolution, ResolveFacts, resolve_local
from flagtrial.gates.model import GateFinding, Outcome
from flagtrial.gates.preflight import combine

HERE = Path(__file__).parent
INSTALLED = installed_engines()
TOKENIZER = cache_root() / "models" / "tiny-llama-hf"


def facts(host: dict) -> ResolveFacts | None:  # type: ignore[type-arg]
    if host["platform"] == "cpu":
        return None
    cap = tuple(int(x) for x in host["sm"].split(".")) if host.get("sm") else None
    return ResolveFacts(
        platform=host["platform"],
        compute_cap=cap,
        cuda=host.get("cuda"),
        gfx=host.get("gfx"),
        rocm=host.get("rocm"),
        gpus=host.get("gpus") or 1,
    )


def without_edit(command: list[str], edit: dict) -> list[str]:  # type: ignore[type-arg]
    """The known-good: the case's command without the edited flag (and its value)."""
    out: list[str] = []
    words = iter(command)
    for word in words:
        if word == edit["flag"]:
            if edit["value"] is not None:
                next(words, None)
        elif not word.startswith(edit["flag"] + "="):
            out.append(word)
    return out


def model_dir(root: Path, corpus: Path, name: str) -> Path:
    """config.json from the corpus, the tiny model's tokenizer beside it (resolution loads it)."""
    folder = root / name
    if not folder.exists():
        folder.mkdir()
        shutil.copy(corpus.parent / "models" / f"{name}.json", folder / "config.json")
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(TOKENIZER / f, folder / f)
    return folder


def main(dev: Path) -> None:
    cases = [json.loads(line) for line in dev.read_text().splitlines() if line.strip()]
    cases = [c for c in cases if (c["engine"], c["version"]) in INSTALLED]
    results, seen = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            python = INSTALLED[(case["engine"], case["version"])]
            folder = model_dir(Path(tmp), dev, case["model"])
            command = [str(folder) if w == "MODEL" else w for w in case["command"]]
            env = {"SGLANG_USE_CPU_ENGINE": "1"} if case["host"]["platform"] == "cpu" else {}
            declared = facts(case["host"])
            timed: list[float] = []

            def run(
                argv: list[str],
                case: dict = case,
                python: Path = python,  # type: ignore[type-arg]
                declared: ResolveFacts | None = declared,
                env: dict = env,  # type: ignore[type-arg]
                timed: list[float] = timed,
            ) -> Resolution:
                key = json.dumps([case["engine"], argv, case["host"]])
                if key not in seen:
                    began = time.monotonic()
                    seen[key] = resolve_local(
                        python, case["engine"], argv, declared, env, cached=True
                    )
                    timed.append(round(time.monotonic() - began, 1))
                return seen[key]

            good = run(without_edit(command, case["edit"]))
            cand = run(command)
            finding = GateFinding(
                engine=case["engine"],
                version=case["version"],
                flag=case["edit"]["flag"],
                value=case["edit"]["value"],
                host="",
                tp=1,
                outcome=Outcome.UNKNOWN,
                reason="",
            )
            said = combine([finding], good, cand)[0].outcome
            verdict = {Outcome.FAILS: "FAILS", Outcome.NO_OP: "NO-OP"}.get(said, "-")
            row = {
                "id": case["id"],
                "expected": case["expected"],
                "resolution": verdict,
                "known_good": good.describe(),
                "candidate": cand.describe(),
                "seconds": timed,
            }
            results.append(row)
            print(json.dumps(row), flush=True)
    (HERE / "dev-results.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
