#!/usr/bin/env bash
# Issue 30, 2026-12-03: the deep wall's Q8_0 cell at half the file (900 MiB
# of 1.76 GiB) with the rows in rounds (bench spec --rounds 4, as
# ../cell-2026-12-03/), 8 MT-Bench first turns x 128 tokens (llama.cpp
# 2 x 32 in the same cgroup), uncapped, cgroup v1. Home: a copy of the
# F16 cell's as it left it (nothing learned about the Q8_0 file yet).
set -u
BIN=${BIN:-/work/arbor-rounds}
H=${H:-/work/home-q8}
L=/root/.cache/arbor/llama.cpp/build/bin
M=/root/.cache/arbor/models
O=${O:-/work/q8}
T=$M/qwen2.5-coder-1.5b-q8_0.gguf
mkdir -p $O
[ -d $H ] || cp -a /work/home-cell $H
echo "=== q8_0 $(date -u +%H:%M:%S)"
ARBOR_HOME=$H $BIN bench spec --target $T --draft qwen2.5-coder-0.5b --memory-budget 900MiB \
  --strategies auto,autoregressive-pipelined --limit 8 --max-tokens 128 \
  --rounds 4 --peer llama.cpp=$L --peer-prompts 2 --peer-tokens 32 \
  --json --plot $O/q8_0.png > $O/q8_0.jsonl 2> $O/q8_0.log
echo "=== q8_0 done $(date -u +%H:%M:%S) rc=$?"
ARBOR_HOME=$H $BIN generate --model $T --draft qwen2.5-coder-0.5b --memory-budget 900MiB \
  --explain --max-tokens 1 --prompt "Compose an engaging travel blog post about a recent trip to Hawaii." \
  > $O/q8_0-explain-after.txt 2>&1
echo "=== all done $(date -u +%H:%M:%S)"
