#!/usr/bin/env bash
# Build llama.cpp's llama-server from the vendored source in the pinned llama-cpp-python sdist.
# Cached by version under ~/.cache/flagtrial/; rebuilt only when missing.
set -euo pipefail
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${FLAGTRIAL_CACHE:-$HOME/.cache/flagtrial}"
OUT="$CACHE/llama-server-$VERSION"
PYTHON="${PYTHON:-python3}"
if [ -x "$OUT/llama-server" ]; then
  echo "$OUT/llama-server"
  exit 0
fi
mkdir -p "$CACHE"
WORK="$(mktemp -d "$CACHE/build-XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
"$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK" >&2
tar -xzf "$WORK"/llama_cpp_python-"$VERSION".tar.gz -C "$WORK"
# GGML_NATIVE=ON: the binary only runs on this machine (and in containers booted on it).
cmake -S "$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp" -B "$WORK/build" \
  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_APP=OFF >&2
cmake --build "$WORK/build" --target llama-server -j"$(nproc)" >&2
mkdir -p "$OUT.tmp"
cp "$WORK/build/bin/llama-server" "$OUT.tmp/llama-server"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
echo "$OUT/llama-server"
