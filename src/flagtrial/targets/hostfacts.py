"""Host facts gathered by running ordinary commands on the host, shared by every target."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from flagtrial.targets.base import Gpu, HostFacts

NVIDIA_SMI = [
    "nvidia-smi",
    "--query-gpu=name,compute_cap,memory.total,driver_version",
    "--format=csv,noheader",
]

Runner = Callable[[list[str]], Awaitable[tuple[int, str]]]


def parse_nvidia_smi(text: str) -> list[Gpu]:
    gpus = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 4:
            gpus.append(
                Gpu(
                    name=fields[0],
                    compute_cap=fields[1],
                    memory_total=fields[2],
                    driver_version=fields[3],
                )
            )
    return gpus


async def collect_host_facts(run: Runner) -> HostFacts:
    """A CPU-only host (no nvidia-smi, or one that fails) reports no GPU instead of failing."""
    _, hostname = await run(["uname", "-n"])
    _, kernel = await run(["uname", "-r"])
    _, cpus = await run(["nproc"])
    rc, smi = await run(NVIDIA_SMI)
    return HostFacts(
        hostname=hostname.strip(),
        kernel=kernel.strip(),
        cpus=int(cpus.strip() or 0),
        gpus=parse_nvidia_smi(smi) if rc == 0 else [],
    )
