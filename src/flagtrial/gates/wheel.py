"""An engine's Python source for an exact version: its PyPI wheel, downloaded once and cached.

Only the `.py` files and the dist-info are extracted (the analysis reads nothing else), into
`<cache>/wheels/<engine>-<version>/`, so a later query reads plain files from disk.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from flagtrial.cache import cache_root, file_lock
from flagtrial.errors import TargetError


def _download(engine: str, version: str, dest: Path) -> Path:
    # The .py files are the same in every platform's wheel, so the local interpreter's pick
    # is fine; binary-only keeps pip from building an sdist.
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--quiet",
        "--dest",
        str(dest),
        f"{engine}=={version}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no wheel"]
        raise TargetError(f"pip download {engine}=={version} failed: {tail[0]}")
    return wheels[0]


def _extract_python(wheel: Path, dest: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            name = info.filename
            # .py for the analysis; dist-info so the folder also works as an installed package
            # (on PYTHONPATH, importlib.metadata then reports the version).
            wanted = name.endswith(".py") or ".dist-info/" in name
            if wanted and ".." not in Path(name).parts and not name.startswith("/"):
                zf.extract(info, dest)


def engine_source(engine: str, version: str) -> Path:
    """The directory holding `<engine>/...` source files of that exact version."""
    root = cache_root() / "wheels"
    target = root / f"{engine}-{version}"

    def complete() -> bool:
        return (target / engine).is_dir() and any(target.glob("*.dist-info"))

    if complete():
        return target
    with file_lock(root / f".{engine}-{version}.lock"):
        if complete():
            return target
        with tempfile.TemporaryDirectory(dir=root, prefix=".dl-") as tmp:
            work = Path(tmp)
            wheel = _download(engine, version, work / "wheel")
            _extract_python(wheel, work / "src")
            if not (work / "src" / engine).is_dir():
                raise TargetError(f"{wheel.name} has no {engine}/ package")
            shutil.rmtree(target, ignore_errors=True)
            # A rename is atomic: readers see no directory or a complete one.
            (work / "src").rename(target)
    return target
