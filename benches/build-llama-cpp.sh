#!/usr/bin/env bash
# Builds llama.cpp's CPU tools (llama-completion, llama-speculative, llama-bench,
# llama-server) from the sources vendored in the sdist of llama-cpp-python.
# Only package registries are reachable from our machines, so this is the way to
# get a llama.cpp of a known version. About 15 minutes on 2 cores.
#
#   benches/build-llama-cpp.sh [DIR]     # default DIR: $ARBOR_HOME/llama.cpp
#
# The sdist comes through pip, so pip's own configuration holds (index or mirror,
# proxy, certificates: pip.conf, PIP_INDEX_URL, ...). PYTHON picks the interpreter
# whose pip is used (default python3).
#
# Prints the directory holding the binaries; pass it to
# `arbor bench spec --memory-budget ... --peer llama.cpp=DIR`.
set -euo pipefail
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
PYTHON="${PYTHON:-python3}"
DIR="${1:-${ARBOR_HOME:-$HOME/.cache/arbor}/llama.cpp}"
mkdir -p "$DIR"
cd "$DIR"
# The index may name the file llama_cpp_python-V.tar.gz or llama-cpp-python-V.tar.gz.
find_sdist() {
  local f
  for f in sdist/llama[-_]cpp[-_]python-"$VERSION".tar.gz; do
    [ -f "$f" ] && { echo "$f"; return; }
  done
}
# pip prepares an sdist's metadata even to download it: that runs the package's
# build backend, scikit-build-core (with cmake), installed here and used without
# isolation so pip fetches nothing else. `--no-binary :all:` keeps it to the sdist.
"$PYTHON" -m pip install cmake scikit-build-core >&2
if [ -z "$(find_sdist)" ]; then
  "$PYTHON" -m pip download --no-deps --no-binary :all: --no-build-isolation \
    --dest sdist "llama-cpp-python==$VERSION" >&2
fi
sdist=$(find_sdist)
[ -n "$sdist" ] || { echo "pip downloaded no llama-cpp-python $VERSION sdist into $DIR/sdist" >&2; exit 1; }
# An sdist unpacks into NAME-VERSION/, named as the file is.
src="$(basename "$sdist" .tar.gz)/vendor/llama.cpp"
[ -d "$src" ] || tar xzf "$sdist"
[ -d "$src" ] || { echo "$sdist has no $src" >&2; exit 1; }
# pip's cmake lands next to its interpreter's scripts, maybe not on PATH.
cmake=$(command -v cmake || "$PYTHON" -c 'import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, "cmake"))')
"$cmake" -S "$src" -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON >&2
"$cmake" --build build -j "$(nproc)" --target llama-completion llama-speculative llama-bench llama-server >&2
echo "$DIR/build/bin"
