#!/usr/bin/env bash
# Issue 30, the F16 deep-wall cell on 2026-12-02 (2-vCPU AMD EPYC VM,
# AVX-512 VNNI, uncapped, cgroup v1). The home held only the fetched models
# (hard links) and the F16 re-encoding; three generations (below, and one
# before them with --explain) taught it before the cell. Then the cell's
# script from f16-tiles-2026-12-01, unchanged.
set -u
H=/work/home-cell; B=/work/arbor-new; M=$H/models/qwen2.5-coder-1.5b-f16.gguf
for p in "Explain how a hash map handles collisions, with an example in Rust." "Write a short story opening about a lighthouse keeper who finds a message in a bottle."; do
  echo "=== warm $(date -u +%H:%M:%S)"
  ARBOR_HOME=$H $B generate --model $M --draft qwen2.5-coder-0.5b --memory-budget 1130MiB --max-tokens 96 --chat --prompt "$p" 2>&1 >/dev/null | grep -E "tok/s|\[tree|\[memory"
done
BIN=$B H=$H O=/work/cell bash "$(dirname "$0")/../f16-tiles-2026-12-01/run.sh"
