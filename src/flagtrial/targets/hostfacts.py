"""Host facts gathered by running ordinary commands on the host, shared by every target."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from flagtrial.targets.base import Gpu, HostFacts


def nvidia_smi(query: str, fields: str, *, units: bool = True) -> list[str]:
    """The one nvidia-smi probe: `fields` of each GPU (query "gpu") or each compute process
    ("compute-apps"), one CSV row each; `units=False` prints bare numbers."""
    csv = "csv,noheader" if units else "csv,noheader,nounits"
    return ["nvidia-smi", f"--query-{query}={fields}", f"--format={csv}"]


def nvidia_smi_rows(text: str, width: int) -> list[list[str]]:
    """The rows of `width` cells in nvidia-smi's CSV; other lines (a driver's error) are not
    rows."""
    rows = [[c.strip() for c in line.split(",")] for line in text.splitlines()]
    return [r for r in rows if len(r) == width]


NVIDIA_SMI = nvidia_smi("gpu", "name,compute_cap,memory.total,driver_version")

Runner = Callable[[list[str]], Awaitable[tuple[int, str]]]


def parse_nvidia_smi(text: str) -> list[Gpu]:
    return [
        Gpu(name=name, compute_cap=cap, memory_total=memory, driver_version=driver)
        for name, cap, memory, driver in nvidia_smi_rows(text, 4)
    ]


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
