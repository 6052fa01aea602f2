"""The engine's own argument resolution, before the restart: what the server will resolve a
command to, or the raise it will refuse it with (resolve_dump.py runs on the engine's host).

`resolve_commands` resolves commands with the interpreter the server runs under, on the
host's own GPUs, or on declared GPU facts where the host has none it can report
(`ResolveFacts`). Known-good against candidate, the resolved settings are the predicted
implicit changes (`predicted_diff`); after the restart `Prediction.check` (over `compare`)
holds the candidate's against what its server reports.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from flagtrial.cache import cache_root, store
from flagtrial.engines import pyrepr, resolve_dump
from flagtrial.engines import sglang as sglang_engine
from flagtrial.engines.pyengine import host_python
from flagtrial.facts import Facts, FactsDiff, Scalar, diff_facts
from flagtrial.gates.model import GateHost
from flagtrial.launch.spec import LaunchSpec
from flagtrial.reasons import Code, Reason
from flagtrial.redact import MARK, Redactor, is_secret_name
from flagtrial.settings import DeclaredGpu
from flagtrial.targets.base import HostFacts, Target

ENGINES = ("sglang", "vllm")
_SOURCE = Path(resolve_dump.__file__).read_text()
# Importing the engine (torch, its configs) takes most of it; 2 busy cores: up to a minute.
TIMEOUT_S = 300.0
EACH_S = 120.0  # each further command of one request, the engine already imported
SHOWN_MISMATCHES = 5


class ResolveFacts(BaseModel):
    """Declared GPU facts, answering the engine's platform query (resolve_dump.py lists what
    it patches). None anywhere the host's GPUs answer for themselves."""

    platform: Literal["cuda", "rocm"] = "cuda"
    compute_cap: tuple[int, int] | None = None
    cuda: str | None = None
    gfx: str | None = None
    rocm: str | None = None
    gpus: int = 1
    memory_mib: float | None = None
    name: str | None = None

    @classmethod
    def from_gate_host(cls, host: GateHost) -> ResolveFacts | None:
        """From a gate host (the analysis' and the evaluator's); None for a CPU host."""
        platform = getattr(host, "platform", "cuda")
        if platform not in ("cuda", "rocm"):
            return None
        cuda = ".".join(map(str, host.cuda_version)) if host.cuda_version else None
        rocm = getattr(host, "rocm_version", None)
        return cls(
            platform=platform,
            compute_cap=host.compute_cap,
            cuda=cuda,
            gfx=getattr(host, "gfx", None),
            rocm=".".join(map(str, rocm)) if rocm else None,
            gpus=host.gpu_count or 1,
            name=host.gpu_name,
        )

    def describe(self) -> str:
        if self.platform == "rocm":
            gpu = self.gfx or "AMD GPU"
            return f"declared {gpu}, ROCm {self.rocm or 'unknown'}, {self.gpus} GPU(s)"
        cap = "SM{}{}".format(*self.compute_cap) if self.compute_cap else "unknown SM"
        return f"declared {cap}, CUDA {self.cuda or 'unknown'}, {self.gpus} GPU(s)"


def declared_facts(host: HostFacts, declared: DeclaredGpu) -> ResolveFacts | None:
    """Declared facts only where the host reports no GPU and the project declares one; the
    host's own GPUs (or its CPU) answer otherwise."""
    gate = None if host.gpus else GateHost.declared(declared)
    return ResolveFacts.from_gate_host(gate) if gate is not None else None


class Raised(BaseModel):
    type: str
    message: str
    file: str | None = None  # the innermost frame in the engine's package, from its top
    line: int | None = None

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.file else ""

    def describe(self) -> str:
        at = f" ({self.where})" if self.file else ""
        return f"{self.type}: {self.message.strip().splitlines()[0]}{at}"


class ModelRead(BaseModel):
    """The config.json of the model a command names, as read on the engine's host: what the
    source gate analysis follows of the model (its architectures, MLA, MoE, quantization)."""

    source: str  # the file read: in the model's folder or the host's Hugging Face cache
    config: dict[str, Any] = Field(repr=False)

    @property
    def architectures(self) -> list[str]:
        names = self.config.get("architectures")
        return [str(n) for n in names] if isinstance(names, list) else []

    def describe(self) -> str:
        return f"{', '.join(self.architectures) or 'no architectures named'} ({self.source})"


class Resolution(BaseModel):
    """One command resolved: its settings, the engine's raise, or why it could not run."""

    engine: str
    status: Literal["resolved", "raised", "unresolved"]
    settings: dict[str, Scalar] = Field(default_factory=dict)
    raised: Raised | None = None
    reason: str | None = None
    facts: str = "the host's own GPUs"
    patched: list[str] = Field(default_factory=list)
    stood_in: list[str] = Field(default_factory=list)
    seconds: float | None = None
    model: ModelRead | None = None
    # Whether `settings` is the whole resolved record (SGLang's resolved_dict), so that two
    # equal records mean the server behaves alike; vLLM's config line is a summary.
    complete: bool = False
    # vLLM: every field of the resolved configuration (all the engine core is given), the
    # engine arguments whose values reach the server only through it (read by the config's
    # creation, read by name nowhere else in the engine's source), and those read elsewhere.
    record: dict[str, Scalar] = Field(default_factory=dict)
    config_only: list[str] = Field(default_factory=list)
    read_beyond_config: list[str] = Field(default_factory=list)

    @field_validator("settings", "record")
    @classmethod
    def _no_secrets(cls, v: dict[str, Scalar]) -> dict[str, Scalar]:
        """Redacted as read, like the server's own report (Facts), so the two compare."""
        redacted: dict[str, Scalar] = Redactor().data(v)
        return redacted

    def runs_as(self) -> dict[str, Scalar]:
        """vLLM's record as the server acts on it: the requested attention backend acts
        through the selector's pick, recorded beside it (`attention.backend`), so where the
        pick is known the request is left out: two commands picking alike run alike."""
        if self.record.get("attention.backend") is None:
            return self.record
        return {k: v for k, v in self.record.items() if k != "attention_config.backend"}

    def describe(self) -> str:
        if self.raised is not None:
            return f"FAILS AT STARTUP: {self.raised.describe()}"
        if self.status == "unresolved":
            return f"not resolved: {self.reason}"
        return f"resolved ({len(self.settings)} settings)"


def request(
    engine: str, commands: list[list[str]], facts: ResolveFacts | None, env: dict[str, str]
) -> str:
    """resolve_dump's REQUEST; secret-named variables stay out of the command line."""
    plain = {k: v for k, v in env.items() if not is_secret_name(k)}
    return json.dumps(
        {
            "engine": engine,
            "commands": commands,
            "env": plain,
            "facts": None if facts is None else facts.model_dump(),
        }
    )


def _settings(engine: str, argv: list[str], out: dict[str, Any]) -> dict[str, Scalar]:
    """The engine's resolved record as settings, keyed as its server reports them."""
    if engine == "sglang":
        settings = sglang_engine.flatten(out.get("settings") or {})
        # Drawn afresh at every start unless given: not a setting of the command.
        for key, flag in sglang_engine._DRAWN_AT_START.items():
            if not any(word.split("=")[0] == flag for word in argv):
                settings.pop(key, None)
        return settings
    settings = pyrepr.parse_kwargs(out.get("config_line") or "")
    settings.update(pyrepr.flatten(out.get("settings") or {}))
    return settings


def _outputs(text: str) -> dict[int, dict[str, Any]]:
    """resolve_dump's marked lines by the index of their command."""
    prefix = resolve_dump.MARK + " "
    found = (json.loads(line[len(prefix) :]) for line in text.splitlines()
             if line.startswith(prefix))  # fmt: skip
    return {int(out.get("index", 0)): out for out in found}


def parse(
    engine: str, argv: list[str], facts: ResolveFacts | None, rc: int, text: str, index: int = 0
) -> Resolution:
    """Command `index` of a request, from resolve_dump's output (`text`, its exit `rc`)."""
    out = _outputs(text).get(index)
    where = "the host's own GPUs" if facts is None else facts.describe()
    if out is None:
        tail = " | ".join(text.strip().splitlines()[-3:])[-400:]
        return Resolution(engine=engine, status="unresolved", facts=where,
                          reason=f"the resolution did not run (exit {rc}): {tail}")  # fmt: skip
    raised = out.get("raised")
    return Resolution(
        engine=engine,
        status=out["status"],
        settings=_settings(engine, argv, out) if out["status"] == "resolved" else {},
        raised=Raised.model_validate(raised) if raised else None,
        reason=out.get("reason"),
        facts=where,
        patched=out.get("patched") or [],
        stood_in=out.get("stood_in") or [],
        seconds=out.get("seconds"),
        model=ModelRead.model_validate(out["model"]) if out.get("model") else None,
        complete=engine == "sglang",
        record=out.get("record") or {},
        config_only=out.get("config_only") or [],
        read_beyond_config=out.get("read_beyond_config") or [],
    )


def timeout_s(commands: int) -> float:
    """One import of the engine, then each command's own resolution."""
    return TIMEOUT_S + EACH_S * (commands - 1)


async def resolve_commands(
    target: Target,
    engine: str,
    python: str,
    commands: list[list[str]],
    facts: ResolveFacts | None = None,
    env: dict[str, str] | None = None,
) -> list[Resolution]:
    """Resolve each of `commands` (the server's arguments, program words left out) on the
    target's host with `python`, the interpreter the server runs under, importing the engine
    once for all of them."""
    rc, text = await target.run(
        [python, "-c", _SOURCE, request(engine, commands, facts, env or {})],
        timeout_s=timeout_s(len(commands)),
    )
    return [parse(engine, argv, facts, rc, text, i) for i, argv in enumerate(commands)]


# Where a model folder the command names stands in a cached resolution: the cache holds what
# the folder holds, not where it lies (a copy, a temporary folder: the same resolution).
_PLACEHOLDER = "\x00flagtrial-model-{}\x00"


def _model_dirs(argv: list[str]) -> list[str]:
    """The words of `argv` that name a model folder (one holding a config.json)."""
    return [w for w in dict.fromkeys(argv) if (Path(w) / "config.json").is_file()]


def _movable(argv: list[str]) -> list[str]:
    """The model folders named by an absolute path: replaced in a cached resolution wherever
    they occur (a relative word such as "." could be part of any text, so it stays)."""
    return [w for w in _model_dirs(argv) if Path(w).is_absolute() and len(w) > 1]


def _folder(word: str) -> str:
    """A model folder by what the resolution can read of it: config.json, its last path part
    (defaults derived from the name), and each file's name and size."""
    folder = Path(word)
    files = sorted((p.name, p.stat().st_size) for p in folder.iterdir() if p.is_file())
    return json.dumps([folder.name, (folder / "config.json").read_text(), files])


def _local_key(python: Path, engine: str, argv: list[str], request_text: str) -> str:
    """What a local resolution depends on: this extractor, the interpreter, the engine's
    installed distribution (its dist-info folder names the version), the request with each
    model folder given by its content (`_folder`) rather than its path, and the engine's own
    variables in this environment (the subprocess inherits them)."""
    site = sorted(python.parent.parent.glob("lib/python3*/site-packages"))
    dists = sorted(p.name for s in site for p in s.glob(f"{engine}*.dist-info"))
    request_text = _relocated(request_text, argv, stored=True)
    folders = [_folder(w) for w in _model_dirs(argv)]
    own = sorted((k, v) for k, v in os.environ.items() if k.startswith(engine.upper() + "_"))
    parts = [_SOURCE, str(python), request_text, *dists, *folders, json.dumps(own)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:20]


def _json_str(text: str) -> str:
    """`text` as it appears inside a JSON string."""
    return json.dumps(text)[1:-1]


def _relocated(text: str, argv: list[str], stored: bool) -> str:
    """A resolution's JSON with this command's model folders as placeholders (`stored`: to
    write it to the cache) or the placeholders as this command's folders (read back)."""
    for i, word in enumerate(_movable(argv)):
        here, there = _json_str(word), _json_str(_PLACEHOLDER.format(i))
        text = text.replace(here, there) if stored else text.replace(there, here)
    return text


def _run_local(python: str | Path, text: str, commands: int) -> tuple[int, str]:
    done = subprocess.run(
        [str(python), "-c", _SOURCE, text],
        capture_output=True,
        text=True,
        timeout=timeout_s(commands),
        # the engine's own packages only: a PYTHONPATH set for flagtrial must not reach it
        env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "HF_HUB_OFFLINE": "1"},
    )
    return done.returncode, done.stdout + done.stderr


def resolve_local(
    python: str | Path,
    engine: str,
    argv: list[str],
    facts: ResolveFacts | None = None,
    env: dict[str, str] | None = None,
    *,
    cached: bool = False,
) -> Resolution:
    """One command resolved on this machine, without a target (the gates evaluator, tests).
    `cached`: reuse a resolution of the same request, engine build and model config (under
    ~/.cache/flagtrial/resolve/), wherever the model folder lies; a test resolves afresh."""
    text = request(engine, [argv], facts, env or {})
    path = cache_root() / "resolve" / f"{_local_key(Path(python), engine, argv, text)}.json"
    if cached and path.exists():
        return Resolution.model_validate_json(_relocated(path.read_text(), argv, stored=False))
    got = parse(engine, argv, facts, *_run_local(python, text, 1))
    if cached and got.status != "unresolved":
        store(path, _relocated(got.model_dump_json(), argv, stored=True))
    return got


def resolve_local_all(
    python: str | Path,
    engine: str,
    commands: list[list[str]],
    facts: ResolveFacts | None = None,
    env: dict[str, str] | None = None,
) -> list[Resolution]:
    """Several commands resolved on this machine, the engine imported once for all."""
    rc, text = _run_local(python, request(engine, commands, facts, env or {}), len(commands))
    return [parse(engine, argv, facts, rc, text, i) for i, argv in enumerate(commands)]


async def _launch_env(target: Target, engine: str, spec: LaunchSpec) -> dict[str, str]:
    """What of the environment the server would start with goes into the request:
    Environment=, and of what else it gets (EnvironmentFile= files, which often hold secrets,
    and a process target's own environment) the engine's own variables only (`SGLANG_...`),
    as the request travels on the host's command line; what a local target's commands
    inherit anyway is not repeated."""
    env = await target.environment(spec)
    inherited = os.environ if target.local else {}
    own = engine.upper() + "_"
    return {
        k: v
        for k, v in env.items()
        if (k in spec.env or k.startswith(own)) and inherited.get(k) != v
    }


async def resolve_specs(
    target: Target, engine: str, specs: list[LaunchSpec], facts: ResolveFacts | None
) -> list[Resolution]:
    """Launch specs' commands resolved, each with its own interpreter and the environment its
    server would start with (`_launch_env`). Specs alike in both share one process, which
    imports the engine once and resolves one command after the other (two at once would
    double the memory); others get a process each."""
    shared: dict[tuple[str, str], list[int]] = {}
    envs = [await _launch_env(target, engine, spec) for spec in specs]
    for i, spec in enumerate(specs):
        key = (host_python(spec.program), json.dumps(envs[i], sort_keys=True))
        shared.setdefault(key, []).append(i)
    got: dict[int, Resolution] = {}
    for (python, _), members in shared.items():
        commands = [specs[i].argv[specs[i].program_words :] for i in members]
        each = await resolve_commands(target, engine, python, commands, facts, envs[members[0]])
        got.update(zip(members, each, strict=True))
    return [got[i] for i in range(len(specs))]


async def resolve_pair(
    target: Target, engine: str, known_good: LaunchSpec, candidate: LaunchSpec,
    facts: ResolveFacts | None,
) -> tuple[Resolution, Resolution] | None:  # fmt: skip
    """Known-good and candidate resolved; None for an engine flagtrial does not resolve."""
    if engine not in ENGINES:
        return None
    good, cand = await resolve_specs(target, engine, [known_good, candidate], facts)
    return good, cand


def predicted_diff(known_good: Resolution, candidate: Resolution, named: set[str]) -> FactsDiff:
    """What the restart will change, as the engine resolves both commands: the settings the
    change names (explicit) and those it changes on its own (implicit)."""
    before = Facts(engine=known_good.engine, settings=known_good.settings)
    after = Facts(engine=candidate.engine, settings=candidate.settings)
    return diff_facts(before, after, named)


def _reported_as(value: Scalar, reported: Scalar) -> bool:
    return reported == value or pyrepr.scalar(repr(value)) == reported


def compare(predicted: Resolution, facts: Facts) -> tuple[int, list[str]]:
    """(settings the server reports as predicted, one line per one it reports otherwise), over
    the settings both name."""
    same, differ = 0, []
    for key, value in sorted(predicted.settings.items()):
        if key not in facts.settings or facts.settings[key] == MARK:
            continue  # not reported, or a secret (shown redacted, never compared)
        reported = facts.settings[key]
        if _reported_as(value, reported):
            same += 1
        else:
            differ.append(f"{key}: predicted {value!r}, the server reports {reported!r}")
    return same, differ


class PredictionCheck(BaseModel):
    """The candidate's resolution held against what its server reports after the restart."""

    settings: int  # settings reported as predicted
    mismatches: list[str]  # one line per setting reported otherwise
    implicit: int  # predicted implicit changes reported as predicted
    predicted: int  # predicted implicit changes

    def reason(self) -> Reason | None:
        """A note for the verdict; None when the server reports none of the settings."""
        if self.mismatches:
            count, compared = len(self.mismatches), self.settings + len(self.mismatches)
            # the first few in the verdict; the journal's record holds them all
            shown = "; ".join(self.mismatches[:SHOWN_MISMATCHES])
            if count > SHOWN_MISMATCHES:
                shown += f"; and {count - SHOWN_MISMATCHES} more"
            values: dict[str, int | str] = {"count": count, "compared": compared,
                                            "mismatches": shown}  # fmt: skip
            return Reason(code=Code.PREDICTION_MISSED, values=values)
        if not self.settings:
            return None
        confirmed = {"settings": self.settings, "implicit": self.implicit,
                     "predicted": self.predicted}  # fmt: skip
        return Reason(code=Code.PREDICTION_CONFIRMED, values=confirmed)


class Prediction(BaseModel):
    """Known-good and candidate resolved on one host, and what the restart will change."""

    known_good: Resolution
    candidate: Resolution
    diff: FactsDiff | None  # None where either side did not resolve

    @property
    def refused(self) -> bool:
        """The candidate raises where the known-good does not: it fails at startup."""
        return self.candidate.raised is not None and self.known_good.raised is None

    @property
    def model(self) -> ModelRead | None:
        """The model the candidate names, as its resolution read it (else the known-good's)."""
        return self.candidate.model or self.known_good.model

    def lines(self) -> list[str]:
        """What preflight shows."""
        out = [
            f"engine's own resolution ({self.candidate.facts}):",
            f"  known-good: {self.known_good.describe()}",
            f"  candidate: {self.candidate.describe()}",
            f"  model: {self._model_line()}",
        ]
        if self.diff is not None:
            changes = self.diff.implicit
            out.append(f"  predicted implicit changes: {len(changes) or 'none'}")
            out += [f"    {c.describe()}" for c in changes]
            out += [f"  the change sets: {c.describe()}" for c in self.diff.explicit]
        if self.candidate.stood_in:
            out.append(
                f"  (stand-ins for {len(self.candidate.stood_in)} GPU-only modules absent here; "
                f"patched platform queries: {', '.join(self.candidate.patched)})"
            )
        return out

    def _model_line(self) -> str:
        if self.model is not None:
            return self.model.describe()
        if self.known_good.status == self.candidate.status == "unresolved":
            why = "not read: the resolution did not run"
        else:
            why = "no config.json found on the host for the model the command names"
        return f"{why} (the gate analysis does not follow what depends on the model)"

    def check(self, facts: Facts) -> PredictionCheck | None:
        """After the candidate's restart: its resolution against `facts`, what its server
        reports; None where the candidate did not resolve."""
        if self.candidate.status != "resolved":
            return None
        same, differ = compare(self.candidate, facts)
        implicit = self.diff.implicit if self.diff is not None else []
        confirmed = sum(
            c.name in facts.settings and _reported_as(c.after, facts.settings[c.name])
            for c in implicit
        )
        return PredictionCheck(
            settings=same, mismatches=differ, implicit=confirmed, predicted=len(implicit)
        )


async def predict(
    target: Target,
    engine: str,
    known_good: LaunchSpec,
    candidate: LaunchSpec,
    facts: ResolveFacts | None,
    named: set[str],
) -> Prediction | None:
    """Both commands resolved and compared; None for an engine flagtrial does not resolve."""
    pair = await resolve_pair(target, engine, known_good, candidate, facts)
    if pair is None:
        return None
    good, cand = pair
    both = good.status == cand.status == "resolved"
    return Prediction(
        known_good=good, candidate=cand, diff=predicted_diff(good, cand, named) if both else None
    )
