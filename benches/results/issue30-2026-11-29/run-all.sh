#!/usr/bin/env bash
# Issue 30 must-shows, trimmed to fit one session (2-core AVX-512 VM, uncapped):
#  A. a fresh ARBOR_HOME (models and datasets only), three runs of 4 MT-Bench
#     first turns x 48 tokens at 800 and 900 MiB, fixed strategies alternated;
#  D. --kv q8_0 against the f16 default under 800 MiB (2 prompts x 48);
#  B. the deep wall: Q8_0 at 600/900 MiB, F16 at 1130 MiB, auto vs
#     autoregressive-pipelined (2 prompts x 48), llama.cpp peers 1 x 16.
set -u
BIN=/work/arbor-ms
H=/work/home-ms
L=/root/.cache/arbor/llama.cpp/build/bin
M=/root/.cache/arbor/models
O=/work/ms2
rm -rf $H; mkdir -p $H/models
ln -sf $M/qwen2.5-coder-1.5b.gguf $M/qwen2.5-coder-0.5b.gguf $H/models/
ln -sf /root/.cache/arbor/datasets $H/datasets
SLIM=$H/slim/qwen2.5-coder-0.5b-k32768-keep.gguf
orders=(
  "auto,ppd,tree@lookup,tree-no-fallback@$SLIM,tree-no-fallback"
  "tree-no-fallback,tree-no-fallback@$SLIM,tree@lookup,ppd,auto"
  "ppd,auto,tree-no-fallback@$SLIM,tree-no-fallback,tree@lookup"
)
for i in 0 1 2; do
  echo "=== A run $((i+1)) $(date -u +%H:%M:%S) ${orders[$i]}"
  ARBOR_HOME=$H $BIN bench spec --limit 4 --max-tokens 48 --memory-budget 800MiB,900MiB \
    --strategies "${orders[$i]}" --json --plot $O/a-run$((i+1)).png \
    > $O/a-run$((i+1)).jsonl 2> $O/a-run$((i+1)).log
  echo "=== A run $((i+1)) done $(date -u +%H:%M:%S) rc=$?"
  ARBOR_HOME=$H $BIN generate --memory-budget 800MiB --explain --max-tokens 1 --prompt "Compose an engaging travel blog post about a recent trip to Hawaii." > $O/a-explain$((i+1)).txt 2>&1
done
for kv in f16 q8_0; do
  echo "=== D kv $kv $(date -u +%H:%M:%S)"
  ARBOR_HOME=$H $BIN --kv $kv bench spec --limit 2 --max-tokens 48 --memory-budget 800MiB \
    --strategies auto --json > $O/d-kv-$kv.jsonl 2> $O/d-kv-$kv.log
  echo "=== D kv $kv done $(date -u +%H:%M:%S) rc=$?"
done
run() {  # name target budgets
  echo "=== B $1 $(date -u +%H:%M:%S)"
  ARBOR_HOME=$H $BIN bench spec --target $2 --draft qwen2.5-coder-0.5b --memory-budget $3 \
    --strategies auto --limit 2 --max-tokens 48 --peer llama.cpp=$L --peer-prompts 1 --peer-tokens 16 \
    --json --plot $O/b-$1.png > $O/b-$1.jsonl 2> $O/b-$1.log
  echo "=== B $1 done $(date -u +%H:%M:%S) rc=$?"
}
run q8_0 $M/qwen2.5-coder-1.5b-q8_0.gguf 600MiB,900MiB
run f16 $M/qwen2.5-coder-1.5b-f16.gguf 1130MiB
echo "=== all done $(date -u +%H:%M:%S)"
