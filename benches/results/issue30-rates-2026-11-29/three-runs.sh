#!/usr/bin/env bash
# Issue 30: three runs from one fresh ARBOR_HOME, 8 MT-Bench first turns x
# 128 tokens at 800 and 900 MiB, uncapped, auto beside the fixed strategies
# in a different order each run (2-core VM, cgroup v1, nothing else running).
set -u
BIN=${BIN:-/work/arbor-rates}  # release build of 29e1569
H=/work/home-ms4
M=/root/.cache/arbor/models
O=/work/ms4
rm -rf $H; mkdir -p $H/models $O
ln -sf $M/qwen2.5-coder-1.5b.gguf $M/qwen2.5-coder-0.5b.gguf $H/models/
ln -sf /root/.cache/arbor/datasets $H/datasets
SLIM=$H/slim/qwen2.5-coder-0.5b-k32768-keep.gguf
P="Compose an engaging travel blog post about a recent trip to Hawaii."
echo "=== explain before $(date -u +%H:%M:%S)"
ARBOR_HOME=$H $BIN generate --memory-budget 900MiB --explain --max-tokens 1 --prompt "$P" > $O/explain-before.txt 2>&1
ORDERS=("auto,ppd,tree@lookup,tree-no-fallback@$SLIM"
        "tree-no-fallback@$SLIM,tree@lookup,ppd,auto"
        "ppd,auto,tree-no-fallback@$SLIM,tree@lookup")
for i in 1 2 3; do
  echo "=== run $i $(date -u +%H:%M:%S)"
  ARBOR_HOME=$H $BIN bench spec --limit 8 --max-tokens 128 --memory-budget 800MiB,900MiB \
    --strategies "${ORDERS[$((i-1))]}" --json --plot $O/run$i.png \
    > $O/run$i.jsonl 2> $O/run$i.log
  echo "=== run $i done $(date -u +%H:%M:%S) rc=$?"
  for b in 800 900; do
    ARBOR_HOME=$H $BIN generate --memory-budget ${b}MiB --explain --max-tokens 1 --prompt "$P" > $O/explain-after$i-$b.txt 2>&1
  done
done
cp -r $H/profiles $O/profiles-after
echo "=== all done $(date -u +%H:%M:%S)"
