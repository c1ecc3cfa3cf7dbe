#!/usr/bin/env bash
# Issue 30 item 3: read caps x budgets, 2 MT-Bench first turns x 48 tokens a
# cell, auto beside the fixed strategies (2-vCPU AMD EPYC VM, cgroup v1,
# nothing else running). One ARBOR_HOME for the whole sweep: it starts with
# the models only; auto derives the slim draft and learns as the sweep goes.
# Cells run in order of interest so a sweep cut short still spans the caps.
set -u
BIN=${BIN:-/work/arbor-fh}   # release build of d645571 (main 091377b behaves the same)
H=${H:-/work/home-sweep2}   # a copy of the first sweep home, as that sweep left it
M=/root/.cache/arbor/models
O=${O:-/work/sweep2}
mkdir -p $O
if [ ! -d $H ]; then
  mkdir -p $H/models
  ln -sf $M/qwen2.5-coder-1.5b.gguf $M/qwen2.5-coder-0.5b.gguf $H/models/
  ln -sf /root/.cache/arbor/datasets $H/datasets
  # auto derives the slim draft on first use; the fixed slim row needs it.
  ARBOR_HOME=$H $BIN generate --memory-budget 900MiB --explain --max-tokens 1 \
    --prompt "Compose an engaging travel blog post about a recent trip to Hawaii." > $O/explain-first.txt 2>&1
fi
SLIM=$H/slim/qwen2.5-coder-0.5b-k32768-keep.gguf
STRATS="ppd,tree@lookup,tree-no-fallback@$SLIM,tree-no-fallback,auto"
cell() {  # name target budgets cap(GB/s or none)
  local name=$1 target=$2 budgets=$3 cap=$4
  local out=$O/$name-cap$cap
  [ -s $out.jsonl ] && return
  local limit=(); [ "$cap" != none ] && limit=(--read-limit ${cap}GB/s)
  echo "=== $name cap $cap $(date -u +%H:%M:%S)"
  ARBOR_HOME=$H $BIN bench spec --target $target --draft qwen2.5-coder-0.5b \
    --memory-budget $budgets "${limit[@]}" --strategies "$STRATS" \
    --limit 2 --max-tokens 48 --json --plot $out.png > $out.jsonl 2> $out.log
  echo "=== $name cap $cap done $(date -u +%H:%M:%S) rc=$?"
}
Q4=$M/qwen2.5-coder-1.5b.gguf Q8=$M/qwen2.5-coder-1.5b-q8_0.gguf F16=$M/qwen2.5-coder-1.5b-f16.gguf
# 2026-11-30 afternoon: the cells the first sweep cut, IO-heaviest first but
# F16 at 0.5 GB/s last (about 35 minutes); F16 at 0.25 GB/s (about 70) not run.
cell q8_0 $Q8 900MiB 0.25
cell q8_0 $Q8 900MiB 1
cell q8_0 $Q8 900MiB 2
cell f16 $F16 1130MiB 2
cell f16 $F16 1130MiB 1
cell f16 $F16 1130MiB 0.5
echo "=== all done $(date -u +%H:%M:%S)"
