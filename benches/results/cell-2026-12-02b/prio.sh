#!/usr/bin/env bash
# Issue 30, 2026-12-02 (second session): does the reader thread read faster at
# a higher priority? (It did not.)
# A/B: the arbor-reader thread at nice -10 vs default, F16 at 1130 MiB, 1 prompt x 64, alternated
set -u
H=/work/home-cell; M=$H/models/qwen2.5-coder-1.5b-f16.gguf
P1="Describe three ways to make a Python web service faster, with short code examples."
for rep in 1 2 3 4; do for mode in plain nice; do
  echo "=== $mode rep$rep $(date -u +%H:%M:%S)"
  ARBOR_HOME=$H /work/arbor-new generate --model $M --draft qwen2.5-coder-0.5b --memory-budget 1130MiB --max-tokens 64 --chat --prompt "$P1" 2>/tmp/prio-err >/dev/null &
  pid=$!
  if [ $mode = nice ]; then
    for i in $(seq 1 200); do
      t=$(grep -l arbor-reader /proc/$pid/task/*/comm 2>/dev/null | head -1)
      [ -n "$t" ] && { tid=$(basename $(dirname $t)); renice -n -10 -p $tid >/dev/null; echo "reniced $tid"; break; }
      sleep 0.05
    done
  fi
  wait $pid
  grep -E "generated|\[memory|\[tree" /tmp/prio-err | sed 's/memory budget.*held); //'
done; done
echo "=== done $(date -u +%H:%M:%S)"
