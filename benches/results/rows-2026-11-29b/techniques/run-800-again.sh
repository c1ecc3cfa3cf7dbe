#!/bin/bash
# The 800 MiB autoregressive-pipelined slowdown in run-800.sh, checked again: 4 MT-Bench prompts x 64
# tokens, before/after alternated twice, ppd beside the baseline.
set -u
H=/work/home-k; O=/work/tech4
BEFORE=/work/arbor-q8x16; AFTER=/work/arbor-passing
for i in 1 2; do for b in BEFORE AFTER; do
  BIN=${!b}
  echo "=== $b.$i 800MiB $(date -u +%H:%M:%S)"
  ARBOR_HOME=$H $BIN bench spec --limit 4 --max-tokens 64 --memory-budget 800MiB --strategies ppd --json > $O/b800-$b.$i.jsonl 2> $O/b800-$b.$i.log
done; done
echo "=== done $(date -u +%H:%M:%S)"
