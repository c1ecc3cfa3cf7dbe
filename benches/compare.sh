#!/usr/bin/env bash
# arbor vs llama.cpp on the same GGUF files and thread count, in one run.
#   benches/compare.sh [MODEL_NAME...]   (default: both Qwen models)
# Needs a release build (cargo build --release -p arbor-cli) and
# llama-cpp-python installed; prints the two JSON rows and the ratios.
#
# Same instruction set on both sides: pip builds llama-cpp-python for the
# host CPU (AVX-512 where present) while arbor picks its kernels at run time.
# For an AVX2-only comparison (the reference machine kind), build llama.cpp
# without AVX-512 into a directory and force arbor's AVX2 kernels:
#   CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
#     -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX_VNNI=OFF" \
#     pip install --no-deps --target /tmp/llama-avx2 --no-binary llama-cpp-python llama-cpp-python==0.3.36
#   ARBOR_NO_AVX512=1 PYTHONPATH=/tmp/llama-avx2 benches/compare.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ARBOR=${ARBOR:-${CARGO_TARGET_DIR:-target}/release/arbor}
THREADS=${THREADS:-2}
models=("$@")
[[ ${#models[@]} -gt 0 ]] || models=(qwen2.5-coder-0.5b qwen2.5-coder-1.5b)
home=${ARBOR_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/arbor}
for m in "${models[@]}"; do
  a=$("$ARBOR" --threads "$THREADS" bench decode --model "$m" 2>/dev/null)
  l=$(python3 benches/llamacpp_bench.py "$home/models/$m.gguf" --threads "$THREADS")
  echo "$a"
  echo "$l"
  python3 - "$a" "$l" <<'PY'
import json, sys
a, l = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"{a['model']}: decode {a['decode_tok_s']:.1f} vs {l['decode_tok_s']:.1f} tok/s "
      f"({a['decode_tok_s'] / l['decode_tok_s']:.2f}x), prefill {a['prefill_tok_s']:.1f} vs "
      f"{l['prefill_tok_s']:.1f} tok/s ({a['prefill_tok_s'] / l['prefill_tok_s']:.2f}x)")
PY
done
