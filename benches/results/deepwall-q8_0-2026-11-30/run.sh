#!/usr/bin/env bash
# Issue 30, the deep wall's Q8_0 cells at the must-show's 8 MT-Bench first
# turns x 128 tokens (deepwall-2026-11-30 ran them at 4 to fit its session):
# 2-vCPU AMD EPYC VM (AVX-512 VNNI), uncapped, cgroup v1. auto against
# autoregressive-pipelined, llama.cpp target-only and speculative (0.5B
# draft) in the same cgroup, llama.cpp at 2 x 32.
# Home: a copy of deepwall-2026-11-30's as that run left it.
set -u
BIN=${BIN:-/work/arbor-fh}
H=${H:-/work/home-dw8}
L=/root/.cache/arbor/llama.cpp/build/bin
M=/root/.cache/arbor/models
O=${O:-/work/dw8}
mkdir -p $O
T=$M/qwen2.5-coder-1.5b-q8_0.gguf
echo "=== q8_0 $(date -u +%H:%M:%S)"
ARBOR_HOME=$H $BIN bench spec --target $T --draft qwen2.5-coder-0.5b --memory-budget 600MiB,900MiB \
  --strategies auto,autoregressive-pipelined --limit 8 --max-tokens 128 \
  --peer llama.cpp=$L --peer-prompts 2 --peer-tokens 32 \
  --json --plot $O/q8_0.png > $O/q8_0.jsonl 2> $O/q8_0.log
echo "=== q8_0 done $(date -u +%H:%M:%S) rc=$?"
for b in 600 900; do
  ARBOR_HOME=$H $BIN generate --model $T --draft qwen2.5-coder-0.5b --memory-budget ${b}MiB \
    --explain --max-tokens 1 --prompt "Compose an engaging travel blog post about a recent trip to Hawaii." \
    > $O/q8_0-$b-explain-after.txt 2>&1
done
echo "=== all done $(date -u +%H:%M:%S)"
