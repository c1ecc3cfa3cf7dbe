#!/usr/bin/env bash
# Issue 30 must-show 2: three runs of 8 MT-Bench first turns x 128 tokens at
# 800 and 900 MiB, uncapped, cgroup v1, in one ARBOR_HOME that holds only the
# fetched models and datasets before the first run (later runs keep what the
# first derived and learned). The fixed strategies' order rotates run to run.
set -u
BIN=${BIN:-/work/arbor-fh}   # release build of the commit named in README.md
H=${H:-/work/home-fh30}
M=/root/.cache/arbor/models
O=${O:-/work/fh30}
RUNS=${RUNS:-"1 2 3"}
mkdir -p $O
if [ "${KEEP_HOME:-0}" != 1 ]; then
  rm -rf $H; mkdir -p $H/models
  ln -sf $M/qwen2.5-coder-1.5b.gguf $M/qwen2.5-coder-0.5b.gguf $H/models/
  ln -sf /root/.cache/arbor/datasets $H/datasets
fi
SLIM=$H/slim/qwen2.5-coder-0.5b-k32768-keep.gguf
P="Compose an engaging travel blog post about a recent trip to Hawaii."
ORDERS=("auto,ppd,tree@lookup,tree-no-fallback@$SLIM"
        "tree-no-fallback@$SLIM,auto,tree@lookup,ppd"
        "ppd,tree@lookup,auto,tree-no-fallback@$SLIM")
for r in $RUNS; do
  for b in 800 900; do
    echo "=== run $r explain $b $(date -u +%H:%M:%S)"
    ARBOR_HOME=$H $BIN generate --memory-budget ${b}MiB --explain --max-tokens 1 --prompt "$P" > $O/explain-before-run$r-$b.txt 2>&1
  done
  echo "=== run $r bench $(date -u +%H:%M:%S)"
  ARBOR_HOME=$H $BIN bench spec --limit 8 --max-tokens 128 --memory-budget 800MiB,900MiB \
    --strategies "${ORDERS[$((r-1))]}" --json --plot $O/run$r.png \
    > $O/run$r.jsonl 2> $O/run$r.log
  echo "=== run $r done $(date -u +%H:%M:%S) rc=$?"
done
for b in 800 900; do
  ARBOR_HOME=$H $BIN generate --memory-budget ${b}MiB --explain --max-tokens 1 --prompt "$P" > $O/explain-after-$b.txt 2>&1
done
echo "=== all done $(date -u +%H:%M:%S)"
