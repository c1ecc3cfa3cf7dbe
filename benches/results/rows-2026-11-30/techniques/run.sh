#!/bin/bash
# Issue 29 on the AMD EPYC VM: what one-token passes without software prefetches do to the
# techniques. Before (eb895b0, candle-qmm7-vnni) and after (4032355, candle-qmm8-vnni) release
# builds, one ARBOR_HOME (profiles keyed by kernel tag; models and datasets linked in),
# 8 MT-Bench prompts x 128 tokens, 2 threads, uncapped, no budget.
set -u
H=/work/home-t; O=/work/tech
BEFORE=/work/arbor-base; AFTER=/work/arbor-new
for b in BEFORE AFTER; do
  BIN=${!b}
  echo "=== $b no budget $(date -u +%H:%M:%S)"
  ARBOR_HOME=$H $BIN bench spec --limit 8 --max-tokens 128 --strategies tree,auto --json --plot $O/nobudget-$b.png > $O/nobudget-$b.jsonl 2> $O/nobudget-$b.log
done
echo "=== done $(date -u +%H:%M:%S)"
