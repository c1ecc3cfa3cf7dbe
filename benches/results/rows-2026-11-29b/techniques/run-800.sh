#!/bin/bash
# Issue 29: the 1.5B under 800 MiB (11+ layers streamed, K-quants) before (c3092d1: streamed K-quant
# layers row at a time) and after (the laid-out-in-passing commit: passes of 16+ tokens take the group
# kernels), one ARBOR_HOME, 8 MT-Bench prompts x 128 tokens, 2 threads, the AVX-512 VM, uncapped.
set -u
H=/work/home-k; O=/work/tech3
BEFORE=/work/arbor-q8x16; AFTER=/work/arbor-passing
for b in BEFORE AFTER; do
  BIN=${!b}
  echo "=== $b 800MiB $(date -u +%H:%M:%S)"
  ARBOR_HOME=$H $BIN bench spec --limit 8 --max-tokens 128 --memory-budget 800MiB --strategies ppd,auto --json --plot $O/b800-$b.png > $O/b800-$b.jsonl 2> $O/b800-$b.log
done
echo "=== done $(date -u +%H:%M:%S)"
