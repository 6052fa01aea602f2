"""Score the gate analysis on the hand-traced corpus (benchmarks/gates/corpus/).

    .venv/bin/python benchmarks/gates/evaluate.py --split dev [--with-resolution]

`--split held` and `fresh` to `fresh7` are for final measurements only (see
corpus/README.md): the held-back cases are never read while the analysis is developed. Writes
results-<split>.json next to this file and prints right / UNKNOWN / wrong per expected
outcome and engine, and the confusion matrix (predicted ACTIVE / NO-OP / FAILS / UNKNOWN x
expected ACTIVE / NO-OP / FAILS).

The analysis is called as the issue-13 contract states (gates-contract.md):
`analyze_change(engine, version, [(flag, value)], host, tp, command=..., model=...)`.
Until that signature exists the script stops with a message; `--current-api` instead passes
only what today's `analyze_change` takes (no command, no model, CUDA hosts only), for
checking this script itself.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
CORPUS = HERE / "corpus"
OUTCOMES = ("ACTIVE", "NO-OP", "FAILS")
PREDICTED = (*OUTCOMES, "UNKNOWN")
ENGINES = ("sglang", "vllm")
# In the order they were written: dev and held first, then the held-back sets written later
# by authors who never saw the analysis (corpus/README.md).
SPLITS = ("dev", "held", "fresh", "fresh2", "fresh3", "fresh4", "fresh5", "fresh6", "fresh7")
LATER_SETS = ("fresh", "fresh2", "fresh3", "fresh4", "fresh5", "fresh6", "fresh7")
TP_FLAGS = ("--tp-size", "--tp", "--tensor-parallel-size", "-tp")


class ApiMissing(RuntimeError):
    """The analysis API of the contract is not there (yet)."""


def load_cases(split: str) -> list[dict[str, Any]]:
    path = CORPUS / f"{split}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def situation(case: dict[str, Any]) -> tuple[Any, ...]:
    """What a case asks: the same edit of the same engine on the same host and model."""
    host = case["host"]
    edit = case["edit"]
    where = (host["platform"], host["sm"], host["gfx"])
    return (case["engine"], case["version"], edit["flag"], edit["value"], where, case["model"])


def unseen(cases: list[dict[str, Any]], split: str) -> tuple[list[dict[str, Any]], int]:
    """A later set's cases that ask nothing a case of an earlier set asks, and how many were
    left out."""
    earlier = SPLITS[: SPLITS.index(split)]
    seen = {situation(c) for s in earlier for c in load_cases(s)}
    kept = [c for c in cases if situation(c) not in seen]
    return kept, len(cases) - len(kept)


def load_models() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((CORPUS / "models").glob("*.json"))}


def tp_of(command: list[str]) -> int:
    for i, word in enumerate(command):
        for flag in TP_FLAGS:
            if word == flag and i + 1 < len(command):
                return int(command[i + 1])
            if word.startswith(flag + "="):
                return int(word.split("=", 1)[1])
    return 1


def without_edit(command: list[str], flag: str, value: str | None) -> list[str]:
    """The known-good command: the candidate with the edited flag (and its value) removed."""
    out, i = [], 0
    while i < len(command):
        if command[i] == flag:
            i += 1 if value is None else 2
            continue
        out.append(command[i])
        i += 1
    return out


def outcome_label(outcome: Any) -> str:
    from flagtrial.gates.model import Outcome

    return {
        Outcome.ACTIVE: "ACTIVE",
        Outcome.NO_OP: "NO-OP",
        Outcome.FAILS: "FAILS",
        Outcome.UNKNOWN: "UNKNOWN",
    }[outcome]


# ------------------------------------------------------------------ the one adapter


def gate_host(h: dict[str, Any], full: bool) -> Any:
    """The case's host as a GateHost; without the contract's fields (`full` False) only
    what today's GateHost takes."""
    from flagtrial.gates.model import GateHost, parse_compute_cap

    def cap(text: str | None) -> tuple[int, int] | None:
        return parse_compute_cap(text) if text else None

    fields: dict[str, Any] = {
        "platform": h["platform"],
        "compute_cap": cap(h["sm"]),
        "cuda_version": cap(h["cuda"]),
        "gpu_count": h["gpus"],
    }
    if full:
        fields.update(gfx=h["gfx"], rocm_version=cap(h["rocm"]))
    return GateHost(**fields)


def contract_api() -> bool:
    """Whether the analysis API of the contract is there (analyze_change takes command= and
    model=, GateHost has gfx)."""
    from flagtrial.gates.analyze import analyze_change
    from flagtrial.gates.model import GateHost

    params = inspect.signature(analyze_change).parameters
    return "command" in params and "model" in params and "gfx" in GateHost.model_fields


def analyze(case: dict[str, Any], model: dict[str, Any] | None, current_api: bool) -> Any:
    """One GateFinding for the case's edit, through the contract's API (or, with
    `current_api`, through today's `analyze_change` given only what it takes)."""
    from flagtrial.gates.analyze import analyze_change

    full = contract_api()
    if not full and not current_api:
        raise ApiMissing(
            "flagtrial.gates.analyze.analyze_change does not take command=/model= yet, or "
            "GateHost has no gfx field (gates-contract.md); rerun with --current-api to "
            "score today's analysis without them"
        )
    edit = case["edit"]
    extra = {"command": case["command"], "model": model} if full else {}
    findings = analyze_change(
        case["engine"],
        case["version"],
        [(edit["flag"], edit["value"])],
        gate_host(case["host"], full),
        tp_of(case["command"]),
        **extra,
    )
    return findings[0]


def resolve_and_combine(
    case: dict[str, Any], finding: Any, model_dir: Path, python: Path, model: dict[str, Any] | None
) -> Any:
    """Static + the engine's own resolution of known-good and candidate, run here in the
    engine's installed venv with the case's GPU facts declared (helper "resolve":
    engines/resolve.py `resolve_local`, gates/preflight.py `corrected`)."""
    try:
        from flagtrial.engines.resolve import ResolveFacts, resolve_local
        from flagtrial.gates.preflight import corrected
    except ImportError as e:
        raise ApiMissing(f"the engine's own resolution is not available yet ({e})") from e
    edit = case["edit"]
    argv = [str(model_dir) if w == "MODEL" else w for w in case["command"]]
    facts = ResolveFacts.from_gate_host(gate_host(case["host"], contract_api()))
    # Cached: a resolution depends only on the engine build, the command and the facts, not on
    # the static analysis being evaluated, so reruns reuse it.
    known_good = without_edit(argv, edit["flag"], edit["value"])
    good = resolve_local(python, case["engine"], known_good, facts, cached=True)
    candidate = resolve_local(python, case["engine"], argv, facts, cached=True)
    host = gate_host(case["host"], contract_api())
    return corrected([finding], good, candidate, host, case["command"], model)[0]


# ------------------------------------------------------------------ scoring


def score(rows: list[dict[str, Any]], column: str) -> dict[str, Any]:
    """right/UNKNOWN/wrong per (engine, expected), the confusion matrix, and the targets."""
    per: dict[str, dict[str, Counter[str]]] = {}
    confusion = {p: Counter() for p in PREDICTED}
    for r in rows:
        pred, exp = r[column], r["expected"]
        verdict = "right" if pred == exp else "unknown" if pred == "UNKNOWN" else "wrong"
        per.setdefault(r["engine"], {}).setdefault(exp, Counter())[verdict] += 1
        confusion[pred][exp] += 1
    n = len(rows)
    right = sum(confusion[o][o] for o in OUTCOMES)
    return {
        "cases": n,
        "right": right,
        "right_pct": round(100 * right / n, 1) if n else 0.0,
        "unknown": sum(confusion["UNKNOWN"].values()),
        "wrong_noop": sum(v for e, v in confusion["NO-OP"].items() if e != "NO-OP"),
        "active_where_fails": confusion["ACTIVE"]["FAILS"],
        "per_engine": {e: {o: dict(c) for o, c in d.items()} for e, d in per.items()},
        "confusion": {p: {e: confusion[p][e] for e in OUTCOMES} for p in PREDICTED},
    }


def render(title: str, s: dict[str, Any]) -> str:
    lines = [
        f"== {title}: {s['right']}/{s['cases']} right ({s['right_pct']} %), "
        f"{s['unknown']} UNKNOWN, wrong NO-OP {s['wrong_noop']}, "
        f"ACTIVE where it fails {s['active_where_fails']}"
    ]
    lines.append(f"{'engine':8} {'expected':8} {'right':>6} {'UNKNOWN':>8} {'wrong':>6}")
    for engine in ENGINES:
        for exp in OUTCOMES:
            c = s["per_engine"].get(engine, {}).get(exp)
            if c:
                lines.append(
                    f"{engine:8} {exp:8} {c.get('right', 0):>6} "
                    f"{c.get('unknown', 0):>8} {c.get('wrong', 0):>6}"
                )
    lines.append(f"{'predicted / expected':22}" + "".join(f"{e:>8}" for e in OUTCOMES))
    for p in PREDICTED:
        lines.append(f"{p:22}" + "".join(f"{s['confusion'][p][e]:>8}" for e in OUTCOMES))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", choices=SPLITS, required=True)
    ap.add_argument(
        "--with-resolution",
        action="store_true",
        help="also score static + the engine's own resolution where installed here",
    )
    ap.add_argument(
        "--case",
        action="append",
        default=[],
        metavar="ID",
        help="only this case (repeatable, for debugging; results file not written)",
    )
    ap.add_argument(
        "--current-api",
        action="store_true",
        help="call today's analyze_change with only what it takes",
    )
    args = ap.parse_args(argv)

    cases = [c for c in load_cases(args.split) if not args.case or c["id"] in args.case]
    if args.split in LATER_SETS:
        cases, repeated = unseen(cases, args.split)
        print(f"{args.split}: {len(cases)} cases; {repeated} left out as repeating earlier ones")
    models = load_models()
    from flagtrial.cache import installed_engines

    resolvable = installed_engines() if args.with_resolution else {}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ft-corpus-models-") as tmp:
        model_dirs = {}
        for name, cfg in models.items():
            d = Path(tmp) / name
            d.mkdir()
            (d / "config.json").write_text(json.dumps(cfg))
            model_dirs[name] = d
        for case in cases:
            row = {k: case[k] for k in ("id", "engine", "version", "class", "expected")}
            start = time.perf_counter()
            try:
                finding = analyze(case, models.get(case["model"]), args.current_api)
                row["static"] = outcome_label(finding.outcome)
                row["reason"] = finding.reason
            except ApiMissing as e:
                print(f"evaluate: {e}", file=sys.stderr)
                return 2
            except Exception as e:  # one case's crash is scored UNKNOWN, and shown
                row["static"], row["reason"] = "UNKNOWN", f"analysis raised {type(e).__name__}: {e}"
                finding = None
            row["static_s"] = round(time.perf_counter() - start, 3)
            if args.with_resolution:
                row["combined"] = row["static"]
                # where the engine's release is installed here its own resolution runs
                if finding is not None and (case["engine"], case["version"]) in resolvable:
                    try:
                        python = resolvable[(case["engine"], case["version"])]
                        combined = resolve_and_combine(
                            case, finding, model_dirs[case["model"]], python,
                            models.get(case["model"]),
                        )  # fmt: skip
                        row["combined"] = outcome_label(combined.outcome)
                        row["combined_reason"] = combined.reason
                    except ApiMissing as e:
                        print(f"evaluate: {e}", file=sys.stderr)
                        return 2
            rows.append(row)

    report: dict[str, Any] = {"split": args.split, "static": score(rows, "static")}
    if args.with_resolution:
        report["resolved_releases"] = sorted(f"{e} {v}" for e, v in resolvable)
    out = [render(f"{args.split}: static analysis", report["static"])]
    if args.with_resolution:
        report["combined"] = score(rows, "combined")
        out.append(render(f"{args.split}: static + resolution", report["combined"]))
    report["cases"] = rows
    if not args.case:  # a debugging subset leaves the recorded figures alone
        (HERE / f"results-{args.split}.json").write_text(json.dumps(report, indent=1) + "\n")
    print("\n\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
