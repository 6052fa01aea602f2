"""The project file, flagtrial.toml: where the server runs, what it is, how to load and judge it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from flagtrial.errors import ProjectError
from flagtrial.load.prompts import read_traffic
from flagtrial.load.workload import Workload

PROJECT_FILE = "flagtrial.toml"


class Policy(BaseModel):
    """How a verdict is reached. Percentages are relative changes candidate vs known-good."""

    model_config = ConfigDict(extra="forbid")

    primary_metric: Literal["output_tok_s", "request_rate", "goodput"] = Field(
        "output_tok_s",
        description="the objective, higher is better; goodput: requests/s meeting the "
        "goodput_ttft_max_s and goodput_itl_max_s limits",
    )
    goodput_ttft_max_s: float = Field(1.0, gt=0, description="goodput: a request's TTFT limit")
    goodput_itl_max_s: float = Field(
        0.1, gt=0, description="goodput: a request's mean inter-token latency limit"
    )
    slo_good_share: float = Field(
        0.99,
        gt=0,
        le=1,
        description="the SLO a workload level meets when at least this share of its requests "
        "keep both goodput limits; each arm's highest level that meets it is reported",
    )
    primary_concurrency: int | None = Field(
        None,
        description="concurrency level the objective is read at (default: the highest)",
        examples=[8],
    )
    improvement_margin_pct: float = Field(
        2.0, gt=0, description="a gain counts only when its whole interval lies beyond this"
    )
    harm_margin_pct: float = Field(
        2.0, gt=0, description="a loss counts as harm when its whole interval lies beyond this"
    )
    capacity_loss_max_pct: float = Field(
        5.0, ge=0, description="guardrail: capacity may not fall by more than this"
    )
    capacity_guard: Literal["report", "revert"] = Field(
        "report", description="'revert' reverts on a capacity loss before any load is spent"
    )
    ttft_p99_worse_max_pct: float = Field(
        25.0, ge=0, description="guardrail: p99 TTFT may not grow by more than this"
    )
    error_rate_max: float = Field(
        0.0, ge=0, le=1, description="guardrail: candidate error rate above this reverts"
    )
    equivalence_margin_pct: float = Field(
        5.0,
        gt=0,
        description="no effect, and the measurement stops, when the whole interval lies "
        "inside +-this",
    )
    runs: int = Field(3, ge=2, description="before-after: known-good runs before the change")
    confidence: float = Field(0.95, gt=0.5, lt=1, description="confidence of the intervals")
    protocol: Literal["auto", "interleaved", "before-after"] = Field(
        "auto",
        description="interleaved A B A B restart blocks, or A before, B after and an A "
        "re-check; auto: interleaved when restarts are cheap against a run",
    )
    restart_overhead_max: float = Field(
        0.25,
        gt=0,
        lt=1,
        description="auto: interleave when a restart costs at most this share of a block",
    )
    max_runs: int = Field(
        40, ge=2, description="bound: runs per arm at the primary level, disturbed ones included"
    )
    max_seconds: float = Field(
        900.0, gt=0, description="bound: wall seconds of measurement, restarts included"
    )
    recheck_runs: int = Field(3, ge=2, description="before/after: runs of the A re-check")
    autocorrelation: float = Field(
        0.6, ge=0, lt=1, description="before/after: least lag-1 correlation of back-to-back runs"
    )
    drift_pct_per_hour: float = Field(
        40.0, ge=0, description="before/after: drift bound until the re-check measures it"
    )
    foreign_cpu_max_cores: float = Field(
        0.5, gt=0, description="a run with more foreign CPU load than this is disturbed"
    )
    set_aside_disturbed: bool = Field(
        True,
        description="false: foreign load is still measured and shown for every run, but "
        "disturbed runs count (e.g. when the load generator shares the server's CPUs)",
    )
    disturbed_max_fraction: float = Field(
        0.5, gt=0, le=1, description="more disturbed runs than this: too busy to measure"
    )
    attribution_max_restarts: int = Field(
        100,
        ge=0,
        description="bound: restarts one attribution may spend, its probe trials' included "
        "(checked before each restart or probe)",
    )
    attribution_max_seconds: float = Field(
        3600.0, gt=0, description="bound: wall seconds of one attribution"
    )
    on_inconclusive: Literal["revert", "keep"] = Field(
        "revert", description="what happens to the server when the answer is INCONCLUSIVE"
    )

    @property
    def equivalence_bounds_pct(self) -> tuple[float, float]:
        """(low, high) of the no-effect region."""
        return -self.equivalence_margin_pct, self.equivalence_margin_pct


class Ssh(BaseModel):
    """How to reach an ssh:// target. Host keys are always checked against known_hosts."""

    model_config = ConfigDict(extra="forbid")

    known_hosts: str | None = Field(
        None, description="default ~/.ssh/known_hosts", examples=["~/.ssh/known_hosts"]
    )
    accept_new_host_key: bool = Field(
        False, description="trust and record an unknown host's key (a changed key never is)"
    )
    identity_file: str | None = Field(
        None, description="default: ssh-agent and ~/.ssh/id_*", examples=["~/.ssh/id_ed25519"]
    )
    ssh_config: str | None = Field(
        None, description="default ~/.ssh/config (aliases, ProxyJump)", examples=["~/.ssh/config"]
    )
    proxy_jump: str | None = Field(
        None, description="a bastion: [user@]host[:port]", examples=["user@bastion"]
    )
    connect_timeout_s: float = Field(
        10.0, gt=0, description="seconds a connection may take before the host is unreachable"
    )


class DeclaredGpu(BaseModel):
    """GPU facts for the source gate analysis when the host's nvidia-smi reports none
    (a container without the driver, an AMD host, a test host): an NVIDIA GPU by its compute
    capability or an AMD one by its gfx architecture. The host's own facts win when it has
    any."""

    model_config = ConfigDict(extra="forbid")

    compute_cap: str | None = Field(None, description='e.g. "12.0" for SM120', examples=["12.0"])
    gfx: str | None = Field(
        None, description="an AMD GPU's architecture, in place of compute_cap", examples=["gfx942"]
    )
    count: int = Field(1, ge=1, description="how many such GPUs the host has")
    cuda: str | None = Field(None, description='the CUDA version, e.g. "12.8"', examples=["12.8"])
    rocm: str | None = Field(None, description='the ROCm version, e.g. "6.3"', examples=["6.3"])

    @field_validator("gfx")
    @classmethod
    def _gfx(cls, v: str | None) -> str | None:
        if v is None:
            return None
        name = v.strip().lower()
        if not re.fullmatch(r"gfx[0-9a-f]+", name):
            raise ValueError(f"not a gfx architecture: {v!r} (expected e.g. gfx942)")
        return name

    @model_validator(mode="after")
    def _one_kind(self) -> DeclaredGpu:
        if self.compute_cap and self.gfx:
            raise ValueError("declare compute_cap (NVIDIA) or gfx (AMD), not both")
        return self


class Fleet(BaseModel):
    """Fleets (`flagtrial fleet status GROUP`, `flagtrial trial --fleet GROUP`): an Ansible
    inventory of identical hosts; a change kept on a canary is promoted to the rest in waves
    by ansible-core (driven by ansible-runner), each host verified against the canary."""

    model_config = ConfigDict(extra="forbid")

    inventory: str | None = Field(
        None,
        description="the Ansible inventory (INI or YAML), relative to this file; each host "
        "is reached at its ansible_host / ansible_user / ansible_port with the [ssh] settings",
        examples=["inventory.yml"],
    )
    canary: str | list[str] | None = Field(
        None,
        description="the host the trial runs on, or several (each its own trial, in this "
        "order; the change is promoted only when every one keeps it)",
        examples=["gpu-01", ["gpu-01", "gpu-07"]],
    )
    canary_count: int = Field(
        1, ge=1, description="canaries when none is named: the group's first N hosts"
    )
    serial: list[int | str] = Field(
        default_factory=lambda: list[int | str]([1, "50%", "100%"]),
        description="promotion waves as Ansible's serial: host counts or percentages of the "
        "hosts left after the canary, the last repeated until every host is done",
    )
    max_fail_percentage: float = Field(
        0.0,
        ge=0,
        le=100,
        description="failure budget: a wave whose failed hosts exceed this share stops the "
        "promotion and every promoted host is rolled back",
    )
    pause_s: float = Field(0.0, ge=0, description="seconds to wait between waves")
    forks: int = Field(5, ge=1, description="hosts Ansible works on at once within a wave")

    @model_validator(mode="after")
    def _canaries(self) -> Fleet:
        if self.canary is not None and self.canary_count != 1:
            raise ValueError("name the canaries (canary) or count them (canary_count), not both")
        return self

    @field_validator("serial")
    @classmethod
    def _waves(cls, v: list[int | str]) -> list[int | str]:
        if not v:
            raise ValueError("give at least one wave")
        for wave in v:
            ok = (
                wave >= 1
                if isinstance(wave, int)
                else re.fullmatch(r"[1-9][0-9]?%|100%", wave) is not None
            )
            if not ok:
                raise ValueError(f"a wave is a host count >= 1 or a percentage 1%..100%: {wave!r}")
        return v


class Project(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target: str = Field(
        "process",
        description="'process' (a child process here), 'local' (systemd here) "
        "or ssh://user@host[:port] (systemd there)",
    )
    unit: str = Field(
        description="process target: the unit file's path; systemd targets: the unit's name"
    )
    spec_path: str | None = Field(
        None,
        description="systemd targets: the file to edit, e.g. a drop-in UNIT.d/flags.conf",
        examples=["/etc/systemd/system/llama.service.d/flags.conf"],
    )
    ssh: Ssh = Field(default_factory=Ssh)
    gpu: DeclaredGpu = Field(default_factory=DeclaredGpu)
    engine: Literal["llamacpp", "sglang", "vllm"] = Field(
        "llamacpp", description="what the server is: 'llamacpp', 'sglang' or 'vllm'"
    )
    endpoint: str = Field("http://127.0.0.1:8080", description="base URL of the server's HTTP API")
    ready_timeout_s: float = Field(
        120.0, gt=0, description="how long a restart may take to get ready"
    )
    ledger: str = Field(
        ".flagtrial/ledger.db", description="ledger path, relative to the project file"
    )
    secret_names: list[str] = Field(
        default_factory=list,
        description="environment variables (NAME) and flags (--flag) whose values are "
        "redacted from every output, beyond those whose names look secret (TOKEN, KEY, ...)",
    )
    workload: Workload = Field(default_factory=Workload)
    policy: Policy = Field(default_factory=Policy)
    fleet: Fleet = Field(default_factory=Fleet)

    # Where the project file lives; relative paths resolve against it.
    root: Path = Field(default=Path("."), exclude=True)

    @field_validator("target")
    @classmethod
    def _known_target(cls, v: str) -> str:
        if v in ("process", "local") or v.startswith("ssh://"):
            return v
        raise ValueError("must be 'process', 'local' or ssh://user@host[:port]")

    @field_validator("endpoint")
    @classmethod
    def _strip_slash(cls, v: str) -> str:
        return v.rstrip("/")

    def path(self, relative: str) -> Path:
        p = Path(relative).expanduser()
        return p if p.is_absolute() else self.root / p

    @property
    def ledger_path(self) -> Path:
        return self.path(self.ledger)

    @property
    def state_dir(self) -> Path:
        return self.ledger_path.parent


def load_project(path: Path) -> Project:
    """Read and validate flagtrial.toml (a folder means its flagtrial.toml); every failure is
    one ProjectError line."""
    if path.is_dir():
        path = path / PROJECT_FILE
    if not path.exists():
        raise ProjectError(f"no project file at {path} (run `flagtrial init` to write one)")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ProjectError(f"cannot read {path}: {e}") from e
    return parse_project(text, path)


def parse_project(text: str, path: Path) -> Project:
    """Validate a project file's text as if it were at `path`."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ProjectError(f"{path}: not valid TOML: {e}") from e
    return validate_project(data, path)


def validate_project(data: dict[str, Any], path: Path) -> Project:
    """A project from its keys and values as if read from `path`; the first bad key is one
    ProjectError line."""
    try:
        project = Project.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ProjectError(f"{path}: {where}: {first['msg']}") from e
    project.root = path.resolve().parent
    traffic = project.workload.prompts_file
    if traffic is not None:
        project.workload.prompts_file = project.path(str(traffic))
        try:
            read_traffic(project.workload.prompts_file)
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise ProjectError(f"{path}: workload.prompts_file: {e}") from e
    return project
