#!/usr/bin/env bash
# auto and AR-pipelined on F16 1.5B at 1130 MiB, one MT-Bench prompt x 64,
# with and without a cgroup v1 memory limit of 1130 MiB, alternated.
set -u
BIN=${BIN:-/work/arbor-hold}
O=/work/cg
H=$O/home
M=/root/.cache/arbor/models
if [ ! -d $H ]; then
  mkdir -p $H/models $H/slim $H/profiles
  for f in qwen2.5-coder-1.5b-f16.gguf qwen2.5-coder-0.5b.gguf qwen2.5-coder-0.5b.gguf.sha256-ok; do ln $M/$f $H/models/$f; done
  ln /work/ab-tiles/home-new/slim/*.gguf $H/slim/
  cp /work/ab-tiles/home-new/profiles/* $H/profiles/
fi
CG=/sys/fs/cgroup/memory/arbor-cgx
vm() { awk '/^(pgscan|pgsteal|allocstall|pgmajfault|workingset_refault)/{s[$1]=$2} END{for(k in s) printf "%s=%s ", k, s[k]}' /proc/vmstat; }
gen() { # name strategy cg(0/1) tokens
  local pre=""
  if [ $3 = 1 ]; then
    rmdir $CG 2>/dev/null; mkdir -p $CG
    echo 1184890880 > $CG/memory.limit_in_bytes
    echo 0 > $CG/memory.swappiness 2>/dev/null
    pre="echo \$\$ > $CG/cgroup.procs;"
  fi
  local before="$(vm)"
  ARBOR_HOME=$H bash -c "$pre exec $BIN generate --model $H/models/qwen2.5-coder-1.5b-f16.gguf \
    --draft qwen2.5-coder-0.5b --memory-budget 1130MiB --max-tokens $4 --strategy $2 \
    --prompt \"\$(cat /work/ab-tiles/p2.txt)\" --trace $O/$1.json" > $O/$1.txt 2> $O/$1.log
  local after="$(vm)"
  local extra=""
  if [ $3 = 1 ]; then
    extra="failcnt=$(cat $CG/memory.failcnt) max=$(( $(cat $CG/memory.max_usage_in_bytes) >> 20 ))MiB $(grep -E '^(total_cache|total_rss|total_mapped_file) ' $CG/memory.stat | tr '\n' ' ')"
  fi
  echo "$1 $(grep -o 'generated [0-9]* tok at [0-9.]* tok/s' $O/$1.log) $(grep -o 'mean accepted [0-9.]*' $O/$1.log) | $extra"
  echo "   vm before: $before"
  echo "   vm after:  $after"
}
gen warm auto 0 16
for r in 1 2; do
  for s in auto autoregressive-pipelined; do
    for c in 0 1; do gen r$r-$s-cg$c $s $c 64; done
  done
done
