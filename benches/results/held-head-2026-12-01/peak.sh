#!/bin/bash
# The peak of a fresh home's first auto run (F16 1.5B, 1130 MiB, no cgroup): runs
# `arbor generate` (binary BIN, home HOME) and samples VmHWM and VmRSS of
# the process every 50 ms into OUT.rss (seconds, VmHWM KiB, VmRSS KiB).
# Used as: rm -rf HOME/profiles HOME/slim; peak.sh BIN HOME OUT
# usage: peak.sh BIN HOME OUT
BIN=$1; H=$2; OUT=$3
ARBOR_HOME=$H $BIN generate --model $H/models/qwen2.5-coder-1.5b-f16.gguf --draft qwen2.5-coder-0.5b --memory-budget 1130MiB --max-tokens 16 --prompt "Compose an engaging travel blog post about a recent trip to Hawaii." > $OUT.out 2> $OUT.err &
P=$!
t0=$(date +%s.%N)
: > $OUT.rss
while kill -0 $P 2>/dev/null; do
  r=$(awk '/VmRSS|VmHWM/{printf "%s ", $2}' /proc/$P/status 2>/dev/null)
  echo "$(echo "$(date +%s.%N) - $t0" | bc) $r" >> $OUT.rss
  sleep 0.05
done
wait $P; echo rc=$?
