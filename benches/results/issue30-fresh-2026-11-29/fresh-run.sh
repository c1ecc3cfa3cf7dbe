#!/usr/bin/env bash
# Issue 30: one fresh-home run of 8 MT-Bench first turns x 128 tokens at
# 800 and 900 MiB, uncapped, auto beside the fixed strategies (2-core VM).
set -u
BIN=${BIN:-/work/arbor-load}  # release build of 7149199
H=/work/home-ms3
M=/root/.cache/arbor/models
O=/work/ms3
rm -rf $H; mkdir -p $H/models
ln -sf $M/qwen2.5-coder-1.5b.gguf $M/qwen2.5-coder-0.5b.gguf $H/models/
ln -sf /root/.cache/arbor/datasets $H/datasets
SLIM=$H/slim/qwen2.5-coder-0.5b-k32768-keep.gguf
P="Compose an engaging travel blog post about a recent trip to Hawaii."
echo "=== explain 900 $(date -u +%H:%M:%S)"
ARBOR_HOME=$H $BIN generate --memory-budget 900MiB --explain --max-tokens 1 --prompt "$P" > $O/explain-before.txt 2>&1
echo "=== run $(date -u +%H:%M:%S)"
ARBOR_HOME=$H $BIN bench spec --limit 8 --max-tokens 128 --memory-budget 800MiB,900MiB \
  --strategies "auto,ppd,tree@lookup,tree-no-fallback@$SLIM" --json --plot $O/run1.png \
  > $O/run1.jsonl 2> $O/run1.log
echo "=== run done $(date -u +%H:%M:%S) rc=$?"
for b in 800 900; do
  ARBOR_HOME=$H $BIN generate --memory-budget ${b}MiB --explain --max-tokens 1 --prompt "$P" > $O/explain-after-$b.txt 2>&1
done
echo "=== all done $(date -u +%H:%M:%S)"
