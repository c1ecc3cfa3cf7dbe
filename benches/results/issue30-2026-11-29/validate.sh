#!/usr/bin/env bash
# The streamed-compute healing and the monotone sampled curve, on the home
# the fresh-home runs trained (acceptance counted): the target's curve is
# sampled again, fixed strategies run first so their passes are recorded,
# then auto; --explain before and after at 900 MiB.
set -u
BIN=/work/arbor-ms
H=/work/home-ms
O=/work/ms2
SLIM=$H/slim/qwen2.5-coder-0.5b-k32768-keep.gguf
P="Compose an engaging travel blog post about a recent trip to Hawaii."
rm -f $H/profiles/qwen2.5-coder-1.5b-candle-qmm4-vnni-t2.json
echo "=== explain before $(date -u +%H:%M:%S)"
ARBOR_HOME=$H $BIN generate --memory-budget 900MiB --explain --max-tokens 1 --prompt "$P" > $O/v-explain0.txt 2>&1
echo "=== bench $(date -u +%H:%M:%S)"
ARBOR_HOME=$H $BIN bench spec --limit 4 --max-tokens 48 --memory-budget 900MiB,800MiB \
  --strategies "ppd,tree-no-fallback@$SLIM,auto" --json --plot $O/v.png > $O/v.jsonl 2> $O/v.log
echo "=== explain after $(date -u +%H:%M:%S)"
ARBOR_HOME=$H $BIN generate --memory-budget 900MiB --explain --max-tokens 1 --prompt "$P" > $O/v-explain1.txt 2>&1
ARBOR_HOME=$H $BIN generate --memory-budget 800MiB --explain --max-tokens 1 --prompt "$P" > $O/v-explain2.txt 2>&1
echo "=== done $(date -u +%H:%M:%S)"
