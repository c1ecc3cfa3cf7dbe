#!/usr/bin/env bash
# The Q8_0 cells at 1 and 2 GB/s again: their first runs (in contaminated/)
# overlapped builds of arbor on the same disk and cores. Same binary,
# strategies and cell as sweep.sh; the home is a fresh copy of the first
# sweep's (/work/home-sweep, as that sweep left it): the first runs' learned
# rates and disk observations for these regimes are not carried over.
set -u
cd "$(dirname "$0")"
export H=/work/home-sweep2b
source <(sed -n '/^BIN=/,/^}/p' sweep.sh)
Q8=$M/qwen2.5-coder-1.5b-q8_0.gguf
cell q8_0 $Q8 900MiB 1
cell q8_0 $Q8 900MiB 2
echo "=== b done $(date -u +%H:%M:%S)"
