#!/usr/bin/env bash
# F16 at 0.5 GB/s, after CI finished (sweep.sh's home, as its F16 cells at
# 2 and 1 GB/s left it; nothing else running).
set -u
cd "$(dirname "$0")"
source <(sed -n '/^BIN=/,/^}/p' sweep.sh)
F16=$M/qwen2.5-coder-1.5b-f16.gguf
cell f16 $F16 1130MiB 0.5
echo "=== c done $(date -u +%H:%M:%S)"
