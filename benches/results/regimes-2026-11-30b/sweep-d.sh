#!/usr/bin/env bash
# F16 at 0.25 GB/s, the last cell of the sweep (sweep.sh's home, as its F16
# cells at 2, 1 and 0.5 GB/s left it; nothing else running, no builds).
set -u
cd "$(dirname "$0")"
source <(sed -n '/^BIN=/,/^}/p' sweep.sh)
F16=$M/qwen2.5-coder-1.5b-f16.gguf
cell f16 $F16 1130MiB 0.25
echo "=== d done $(date -u +%H:%M:%S)"
