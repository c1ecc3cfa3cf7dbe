#!/usr/bin/env bash
# Issue 30, the deep wall's F16 cell after the F16 tiles change (c9d8a2c),
# on this session's machine: 2-vCPU AMD EPYC VM (Zen 4, AVX-512 VNNI),
# uncapped, cgroup v1. auto against autoregressive-pipelined, llama.cpp
# target-only and speculative (0.5B draft) in the same cgroup, F16 at
# 1130 MiB (a third of the file), 8 MT-Bench first turns x 128 tokens
# (llama.cpp 2 x 32). The home is a copy of the one ab.sh's new build
# learned in (7 generations).
set -u
BIN=${BIN:-/work/arbor-t3}
H=${H:-/work/home-cell}
L=/root/.cache/arbor/llama.cpp/build/bin
M=/root/.cache/arbor/models
O=${O:-/work/cell}
mkdir -p $O
[ -d $H ] || cp -a /work/ab-tiles/home-new $H
run() {  # name target budgets prompts
  echo "=== $1 $(date -u +%H:%M:%S)"
  ARBOR_HOME=$H $BIN bench spec --target $2 --draft qwen2.5-coder-0.5b --memory-budget $3 \
    --strategies auto,autoregressive-pipelined --limit $4 --max-tokens 128 \
    --peer llama.cpp=$L --peer-prompts 2 --peer-tokens 32 \
    --json --plot $O/$1.png > $O/$1.jsonl 2> $O/$1.log
  echo "=== $1 done $(date -u +%H:%M:%S) rc=$?"
  ARBOR_HOME=$H $BIN generate --model $2 --draft qwen2.5-coder-0.5b --memory-budget ${3%%,*} \
    --explain --max-tokens 1 --prompt "Compose an engaging travel blog post about a recent trip to Hawaii." \
    > $O/$1-explain-after.txt 2>&1
}
run f16 $M/qwen2.5-coder-1.5b-f16.gguf 1130MiB 8
echo "=== all done $(date -u +%H:%M:%S)"
