#!/usr/bin/env bash
# Streamed weights kept in their read buffers (no copy, three buffer sets in
# place of two sets and two built copies): A/B of the release builds before
# (OLD, be64af9) and after (NEW), alternated twice. 2-vCPU AMD EPYC VM,
# cgroup v1, uncapped, 2 MT-Bench first turns x 48 tokens a row; each
# binary keeps its own copy of the regime sweep's home, nothing else running.
set -u
OLD=${OLD:-/work/arbor-hs} NEW=${NEW:-/work/arbor-zc}
M=/root/.cache/arbor/models O=${O:-/work/zc}
mkdir -p $O
for b in old new; do [ -d $O/home-$b ] || cp -a /work/home-sweep2 $O/home-$b; done
SLIM=/work/home-sweep2/slim/qwen2.5-coder-0.5b-k32768-keep.gguf
row() {  # round bin name target budget strategies
  local bin=$OLD; [ $2 = new ] && bin=$NEW
  echo "=== r$1 $2 $3 $(date -u +%H:%M:%S)"
  ARBOR_HOME=$O/home-$2 $bin bench spec --target $4 --draft qwen2.5-coder-0.5b \
    --memory-budget $5 --strategies "$6" --limit 2 --max-tokens 48 --json \
    > $O/r$1-$2-$3.jsonl 2> $O/r$1-$2-$3.log
}
for r in 1 2; do
  for b in old new; do
    row $r $b f16 $M/qwen2.5-coder-1.5b-f16.gguf 1130MiB \
      "autoregressive-pipelined,tree-no-fallback@$SLIM,auto"
    row $r $b q8_0 $M/qwen2.5-coder-1.5b-q8_0.gguf 900MiB "tree-no-fallback"
    row $r $b q4km $M/qwen2.5-coder-1.5b.gguf 800MiB "autoregressive-pipelined,ppd"
  done
done
echo "=== ab done $(date -u +%H:%M:%S)"
