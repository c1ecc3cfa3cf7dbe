#!/usr/bin/env bash
# Issue 30, 2026-12-03 (b): the F16 cell again, with the certified head (a
# held Q8_0 copy gives greedy passes their argmax; 81e4334), in rounds
# (bench spec --rounds 4: 2 prompts a round, the rows' order reversed every
# other round, llama.cpp's 2 prompts in rounds 2 and 4), so a drift of the
# host's reads through the run weighs on every row alike. F16 1.5B at
# 1130 MiB (a third of the file), 8 MT-Bench first turns x 128 tokens
# (llama.cpp 2 x 32 in the same cgroup), uncapped, cgroup v1.
set -u
BIN=${BIN:-/work/arbor-cert}
H=${H:-/work/home-cert}
L=/root/.cache/arbor/llama.cpp/build/bin
M=/root/.cache/arbor/models
O=${O:-/work/cellb}
mkdir -p $O
echo "=== f16 $(date -u +%H:%M:%S)"
ARBOR_HOME=$H $BIN bench spec --target $M/qwen2.5-coder-1.5b-f16.gguf --draft qwen2.5-coder-0.5b \
  --memory-budget 1130MiB --strategies auto,autoregressive-pipelined --limit 8 --max-tokens 128 \
  --rounds 4 --peer llama.cpp=$L --peer-prompts 2 --peer-tokens 32 \
  --json --plot $O/f16.png > $O/f16.jsonl 2> $O/f16.log
echo "=== f16 done $(date -u +%H:%M:%S) rc=$?"
ARBOR_HOME=$H $BIN generate --model $M/qwen2.5-coder-1.5b-f16.gguf --draft qwen2.5-coder-0.5b \
  --memory-budget 1130MiB --explain --max-tokens 1 \
  --prompt "Compose an engaging travel blog post about a recent trip to Hawaii." > $O/f16-explain-after.txt 2>&1
echo "=== all done $(date -u +%H:%M:%S)"
