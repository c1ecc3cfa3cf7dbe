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
# ggml's native build compiles its AMX kernels on CPUs that list AMX, and
# llama-bench then dies of SIGSEGV in ggml_backend_amx_mul_mat where the
# kernel grants no AMX tile state (our VMs). There, and always with
# LLAMA_NO_AMX=1, the CPU's other vector extensions are named instead.
# LLAMA_CMAKE_FLAGS adds flags of one's own (e.g. an AVX2-only build:
# "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON").
isa=(-DGGML_NATIVE=ON)
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has() { [[ " $flags " == *" $1 "* ]]; }
if has amx_tile || [ "${LLAMA_NO_AMX:-0}" = 1 ]; then
  isa=(-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
  has avx2 && isa+=(-DGGML_AVX=ON -DGGML_AVX2=ON)
  has fma && isa+=(-DGGML_FMA=ON)
  has f16c && isa+=(-DGGML_F16C=ON)
  has avx512f && isa+=(-DGGML_AVX512=ON)
  has avx512_vnni && isa+=(-DGGML_AVX512_VNNI=ON)
  has avx512vbmi && isa+=(-DGGML_AVX512_VBMI=ON)
  has avx512_bf16 && isa+=(-DGGML_AVX512_BF16=ON)
  has avx_vnni && isa+=(-DGGML_AVX_VNNI=ON)
fi
# shellcheck disable=SC2086 # LLAMA_CMAKE_FLAGS is a list of flags
"$cmake" -S "$src" -B build -DCMAKE_BUILD_TYPE=Release "${isa[@]}" ${LLAMA_CMAKE_FLAGS:-} -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON >&2
"$cmake" --build build -j "$(nproc)" --target llama-completion llama-speculative llama-bench llama-server >&2
echo "$DIR/build/bin"
