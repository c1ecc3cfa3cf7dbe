#!/usr/bin/env bash
# Threads A/B on the F16 deep-wall cell: auto at 1130 MiB, 2 threads vs 1,
# alternated, one MT-Bench-like prompt x 64 tokens each, greedy.
set -u
B=${B:-/root/.cache/arbor/target/release/arbor}  # main at a6942eb
H=${H:-/work/home-thr}
M=$H/models/qwen2.5-coder-1.5b-f16.gguf
P1="Explain how a hash map handles collisions, with an example in Rust."
P2="Write a short story opening about a lighthouse keeper who finds a message in a bottle."
run() { # threads prompt
  echo "=== t$1 $(date -u +%H:%M:%S) ${2:0:30}"
  ARBOR_HOME=$H $B --threads $1 generate --model $M --draft qwen2.5-coder-0.5b --memory-budget 1130MiB \
    --max-tokens ${N:-64} --chat --prompt "$2" 2>&1 >/dev/null | grep -E "auto:|tok/s|\[tree|\[memory" | sed 's/memory budget.*held)//'
}
for r in ${ROUNDS:-1 2}; do
  for p in "$P1" "$P2"; do
    run 2 "$p"; run 1 "$p"
  done
done
echo "=== done $(date -u +%H:%M:%S)"
