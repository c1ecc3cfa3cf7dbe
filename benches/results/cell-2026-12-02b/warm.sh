#!/usr/bin/env bash
# Issue 30, 2026-12-02 (second session): teaches a home that holds only the
# fetched models (hard links) and the F16 re-encoding: one --explain
# generation, then two more, F16 at 1130 MiB with the 0.5B offered.
set -u
H=${H:-/work/home-cell}; B=${B:-/work/arbor-base}; M=$H/models/qwen2.5-coder-1.5b-f16.gguf
echo "=== explain $(date -u +%H:%M:%S)"
ARBOR_HOME=$H $B generate --model $M --draft qwen2.5-coder-0.5b --memory-budget 1130MiB --explain --max-tokens 32 --chat --prompt "Summarise the plot of Hamlet in three sentences." 2>&1 | tail -20
for p in "Explain how a hash map handles collisions, with an example in Rust." "Write a short story opening about a lighthouse keeper who finds a message in a bottle."; do
  echo "=== warm $(date -u +%H:%M:%S)"
  ARBOR_HOME=$H $B generate --model $M --draft qwen2.5-coder-0.5b --memory-budget 1130MiB --max-tokens 96 --chat --prompt "$p" 2>&1 >/dev/null | grep -E "auto|tok/s|\[tree|\[memory"
done
echo "=== warm done $(date -u +%H:%M:%S)"
