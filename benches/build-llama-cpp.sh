#!/usr/bin/env bash
# Builds llama.cpp's CPU tools (llama-completion, llama-speculative, llama-bench,
# llama-server) from the sources vendored in the PyPI sdist of llama-cpp-python.
# Only package registries are reachable from our machines, so this is the way to
# get a llama.cpp of a known version. About 15 minutes on 2 cores.
#
#   benches/build-llama-cpp.sh [DIR]     # default DIR: $ARBOR_HOME/llama.cpp
#
# Prints the directory holding the binaries; pass it to
# `arbor bench spec --memory-budget ... --peer llama.cpp=DIR`.
set -euo pipefail
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
DIR="${1:-${ARBOR_HOME:-$HOME/.cache/arbor}/llama.cpp}"
mkdir -p "$DIR"
cd "$DIR"
sdist="llama_cpp_python-$VERSION.tar.gz"
if [ ! -f "$sdist" ]; then
  # `pip download --no-binary` would try to build the package's metadata (and
  # needs scikit-build-core); the sdist's address comes from the simple index.
  url=$(curl -fsSL "https://pypi.org/simple/llama-cpp-python/" -H "Accept: text/html" |
    grep -o "https://[^\"#]*/$sdist" | head -1)
  [ -n "$url" ] || { echo "no $sdist on the package index" >&2; exit 1; }
  curl -fsSL -o "$sdist.part" "$url" && mv "$sdist.part" "$sdist"
fi
src="llama_cpp_python-$VERSION/vendor/llama.cpp"
[ -d "$src" ] || tar xzf "$sdist"
command -v cmake >/dev/null || pip install cmake >&2
cmake -S "$src" -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON >&2
cmake --build build -j "$(nproc)" --target llama-completion llama-speculative llama-bench llama-server >&2
echo "$DIR/build/bin"
