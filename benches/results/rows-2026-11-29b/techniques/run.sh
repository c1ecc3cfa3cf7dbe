#!/bin/bash
# Issue 29, what the Q8_0/Q5_0 exact-sum kernels do to the techniques: before (66c330f,
# candle-qmm5-vnni) and after (c3092d1, candle-qmm6-vnni) release builds, one ARBOR_HOME
# (profiles keyed by kernel tag), 8 MT-Bench prompts x 128 tokens, 2 threads, the AVX-512 VM,
# uncapped, no budget.
set -u
H=/work/home-k; O=/work/tech2
BEFORE=/work/arbor-q5tag; AFTER=/work/arbor-q8x16
for b in BEFORE AFTER; do
  BIN=${!b}
  echo "=== $b no budget $(date -u +%H:%M:%S)"
  ARBOR_HOME=$H $BIN bench spec --limit 8 --max-tokens 128 --strategies tree,auto --json --plot $O/nobudget-$b.png > $O/nobudget-$b.jsonl 2> $O/nobudget-$b.log
done
echo "=== done $(date -u +%H:%M:%S)"
