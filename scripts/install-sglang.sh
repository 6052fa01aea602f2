#!/usr/bin/env bash
# Install SGLang (PyPI `sglang`) for CPU serving in its own venv, cached by version under the
# flagtrial cache. Built in a temporary directory and renamed into place, so a killed install
# never leaves a half venv where a whole one is expected. Prints the venv's path.
#
# PyPI's sglang requires CUDA-only packages (torch==2.14.1 CUDA, sglang-kernel, flashinfer,
# ...), so it is installed with --no-deps on torch's CPU build, with its other requirements
# minus the CUDA and torch-family ones. Two files are then not as PyPI ships them:
# - `sgl_kernel` is flagtrial's stand-in (scripts/sglang-cpu/sgl_kernel: no CPU build is on
#   PyPI; why it is enough, and what it cannot do, is in that file);
# - torchvision (PyPI's is a CUDA build; sglang imports it for its multimodal configs) has its
#   two `register_fake` decorators for ops its CUDA-only _C.so provides made conditional, so
#   that `import torchvision` works on CPU torch.
# Serve with SGLANG_USE_CPU_ENGINE=1 and --device cpu (see tests/harness/sglang_fixtures.py).
set -euo pipefail
VERSION="${SGLANG_VERSION:-0.5.23}"
TORCH="${SGLANG_TORCH_VERSION:-2.13.0+cpu}"
TORCHVISION="${SGLANG_TORCHVISION_VERSION:-0.28.0}" # the release built against torch 2.13
TORCH_INDEX="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
CACHE="${FLAGTRIAL_CACHE:-$HOME/.cache/flagtrial}"
OUT="$CACHE/sglang-$VERSION"
PYTHON="${PYTHON:-python3}"
HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=scripts/install-lock.sh
. "$HERE/install-lock.sh"
one_install "sglang-$VERSION"
WORK="$(mktemp -d "$CACHE/sglang-$VERSION.tmp-XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
"$PYTHON" -m venv "$WORK"
PY="$WORK/bin/python"
PIP=("$PY" -m pip install -q)
# torch's CPU build is not on PyPI: the configured indexes (or a local wheel) first, else its own.
"${PIP[@]}" "torch==$TORCH" >&2 2>/dev/null ||
  "${PIP[@]}" --extra-index-url "$TORCH_INDEX" "torch==$TORCH" >&2
"$PY" -m pip download -q --no-deps -d "$WORK/dl" "sglang==$VERSION" >&2
# sglang's own requirements, without extras, minus what needs CUDA or another torch.
"$PY" - "$WORK/dl"/sglang-*.whl >"$WORK/requirements.txt" <<'EOF'
import re, sys, zipfile
from email.parser import Parser
CUDA_OR_TORCH = re.compile(
    r"(apache-tvm|av|cuda-python|decord2|deepseek-recipe|flash-attn|flashinfer|humming|kernels|"
    r"nvidia|nvshmem4py|py-spy|quack|sgl|sglang-kernel|tilelang|timm|torch|torchaudio|"
    r"torchcodec|torchvision)(-.*)?", re.I)
wheel = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
for req in Parser().parsestr(wheel.read(meta).decode()).get_all("Requires-Dist"):
    name = re.match(r"[\w.-]+", req)[0]
    if "extra ==" not in req and not CUDA_OR_TORCH.fullmatch(re.sub(r"[-_.]+", "-", name.lower())):
        print(req)
EOF
echo "torch==$TORCH" >"$WORK/constraints.txt"
"${PIP[@]}" -c "$WORK/constraints.txt" -r "$WORK/requirements.txt" >&2
"${PIP[@]}" --no-deps "$WORK/dl"/sglang-*.whl "torchvision==$TORCHVISION" >&2
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
sed -i 's/^@torch\.library\.register_fake(\("torchvision::[a-z_]*"\))$/@(torch.library.register_fake(\1) if torchvision.extension._has_ops() else (lambda f: f))/' \
  "$SITE/torchvision/_meta_registrations.py"
if [ "$(grep -c '_has_ops() else (lambda f: f)' "$SITE/torchvision/_meta_registrations.py")" != 2 ]; then
  echo "install-sglang: torchvision $TORCHVISION's _meta_registrations.py is not the one patched" >&2
  exit 1
fi
cp -r "$HERE/sglang-cpu/sgl_kernel" "$SITE/sgl_kernel"
rm -rf "$WORK/dl" "$SITE/sgl_kernel/__pycache__"
SGLANG_USE_CPU_ENGINE=1 "$PY" -c 'import sglang.launch_server, sglang.srt.server_args' >&2
# Scripts in bin/ name the venv by its path: point them at the final one before the rename.
grep -rlI --null "$WORK" "$WORK/bin" | xargs -0 -r sed -i "s|$WORK|$OUT|g"
rm -rf "$OUT"
mv "$WORK" "$OUT"
trap - EXIT
echo "$OUT"
