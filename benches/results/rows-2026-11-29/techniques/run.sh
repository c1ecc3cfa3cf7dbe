#!/bin/bash
# Issue 29, what the kernels do to the techniques: old (29e1569) and new (66c330f) release builds,
# one ARBOR_HOME (profiles are keyed by kernel tag: qmm4 / qmm5), 8 MT-Bench prompts x 128 tokens,
# 2 threads, the AVX-512 VM, uncapped.
set -u
H=/work/home-k; O=/work/tech
OLD=/work/arbor-rates; NEW=/work/arbor-q5tag
for b in OLD NEW; do
  BIN=${!b}
  echo "=== $b no budget $(date -u +%H:%M:%S)"
  ARBOR_HOME=$H $BIN bench spec --limit 8 --max-tokens 128 --strategies tree,auto --json --plot $O/nobudget-$b.png > $O/nobudget-$b.jsonl 2> $O/nobudget-$b.log
done
for b in OLD NEW; do
  BIN=${!b}
  echo "=== $b 800MiB $(date -u +%H:%M:%S)"
  ARBOR_HOME=$H $BIN bench spec --limit 8 --max-tokens 128 --memory-budget 800MiB --strategies ppd,auto --json --plot $O/b800-$b.png > $O/b800-$b.jsonl 2> $O/b800-$b.log
done
echo "=== done $(date -u +%H:%M:%S)"
