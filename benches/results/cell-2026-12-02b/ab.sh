#!/usr/bin/env bash
# Issue 30, 2026-12-02 (second session): the rider-cost change (a leaf that
# joins a batched draft pass is priced at its share of the pass) against
# the binary before it, F16 at 1130 MiB, two prompts x 128 tokens,
# alternated twice, in the home warm.sh taught. /work/arbor-{base,new}.
# A/B: base vs new binary, F16 at 1130 MiB, 2 prompts x 128, alternated
set -u
H=/work/home-cell; M=$H/models/qwen2.5-coder-1.5b-f16.gguf
P1="Describe three ways to make a Python web service faster, with short code examples."
P2="Write a letter to a friend describing a hiking trip in the Alps."
for rep in 1 2; do for bin in base new; do for p in "$P1" "$P2"; do
  echo "=== $bin rep$rep $(date -u +%H:%M:%S)"
  ARBOR_HOME=$H /work/arbor-$bin generate --model $M --draft qwen2.5-coder-0.5b --memory-budget 1130MiB --max-tokens 128 --chat --prompt "$p" 2>/tmp/ab-err >/tmp/ab-out-$bin-$rep-${#p}.txt
  grep -E "generated|\[memory|\[tree" /tmp/ab-err | sed 's/memory budget.*held); //'
done; done; done
echo "=== done $(date -u +%H:%M:%S)"
