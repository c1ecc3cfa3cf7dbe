#!/usr/bin/env bash
# Issue 30, 2026-12-02 (third session): the AVX2 F16 tiles (6 rows x 2 tokens,
# lanes 0-7 then 8-15) against the binary before them, on a 2-vCPU AMD EPYC
# VM with AVX2 only, F16 at 1130 MiB, two prompts x 128 tokens,
# alternated twice, in the home warm.sh taught. /work/arbor-{base,new}.
# A/B: base vs new binary, F16 at 1130 MiB, 2 prompts x 128, alternated
set -u
H=/work/home-cell; M=$H/models/qwen2.5-coder-1.5b-f16.gguf
P1="Describe three ways to make a Python web service faster, with short code examples."
P2="Write a letter to a friend describing a hiking trip in the Alps."
for rep in 1 2; do for bin in base new; do for p in "$P1" "$P2"; do
  echo "=== $bin rep$rep $(date -u +%H:%M:%S)"
  ARBOR_HOME=$H /work/arbor-$bin generate --model $M --draft qwen2.5-coder-0.5b --memory-budget 1130MiB --max-tokens 128 --chat --prompt "$p" 2>/work/exp/ab-err >/work/exp/ab-out-$bin-$rep-${#p}.txt
  grep -E "generated|\[memory|\[tree" /work/exp/ab-err | sed 's/memory budget.*held); //'
done; done; done
echo "=== done $(date -u +%H:%M:%S)"
