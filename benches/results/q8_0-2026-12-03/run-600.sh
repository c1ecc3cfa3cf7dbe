#!/usr/bin/env bash
# Issue 30, 2026-12-03: the Q8_0 cell at a third of the file (600 MiB of
# 1.76 GiB), as run.sh does at half: rows in rounds (bench spec --rounds 4),
# 8 MT-Bench first turns x 128 tokens (llama.cpp 2 x 32 in the same cgroup),
# uncapped, cgroup v1. Home: run.sh's as it left it (the Q8_0 learned at
# 900 MiB only).
set -u
BIN=${BIN:-/work/arbor-rounds}
H=${H:-/work/home-q8}
L=/root/.cache/arbor/llama.cpp/build/bin
M=/root/.cache/arbor/models
O=${O:-/work/q8}
T=$M/qwen2.5-coder-1.5b-q8_0.gguf
mkdir -p $O
echo "=== q8_0 600 $(date -u +%H:%M:%S)"
ARBOR_HOME=$H $BIN bench spec --target $T --draft qwen2.5-coder-0.5b --memory-budget 600MiB \
  --strategies auto,autoregressive-pipelined --limit 8 --max-tokens 128 \
  --rounds 4 --peer llama.cpp=$L --peer-prompts 2 --peer-tokens 32 \
  --json --plot $O/q8_0-600.png > $O/q8_0-600.jsonl 2> $O/q8_0-600.log
echo "=== q8_0 600 done $(date -u +%H:%M:%S) rc=$?"
