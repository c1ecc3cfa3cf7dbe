#!/usr/bin/env bash
# The head read ahead, A/B inside a cgroup v1 memory group of the budget (as
# `bench spec` runs its rows): release builds of d597ee4 (OLD) and of
# b5a72e4 (NEW), `arbor generate` under auto with the F16 1.5B at 1130 MiB,
# uncapped, MT-Bench first turns 1-2 x 128 tokens, alternated twice; each
# binary with its own copy of the deep wall's home. Prints tok/s, the
# group's peak and the traced verification times.
set -u
OLD=${OLD:-/work/arbor-d597} NEW=${NEW:-/work/arbor-hc}
M=/root/.cache/arbor/models O=${O:-/work/dw4-ab} G=/sys/fs/cgroup/memory/arbor-ab
mkdir -p $O
for b in old new; do [ -d $O/home-$b ] || cp -a /work/home-dw4 $O/home-$b; done
for p in 1 2; do cp /work/dw3-ab/p$p.txt $O/; done
for r in 1 2; do
  for p in 1 2; do
    for b in old new; do
      bin=$OLD; [ $b = new ] && bin=$NEW
      mkdir -p $G && echo $((1130 << 20)) > $G/memory.limit_in_bytes
      echo 0 > $G/memory.max_usage_in_bytes
      ARBOR_HOME=$O/home-$b sh -c 'echo $$ > '$G'/cgroup.procs; exec "$@"' _ $bin generate \
        --model $M/qwen2.5-coder-1.5b-f16.gguf --draft qwen2.5-coder-0.5b --memory-budget 1130MiB \
        --max-tokens 128 --prompt "$(cat $O/p$p.txt)" --trace $O/r$r-p$p-$b.json \
        > $O/r$r-p$p-$b.txt 2> $O/r$r-p$p-$b.log
      peak=$(( $(cat $G/memory.max_usage_in_bytes) >> 20 ))
      echo "r$r p$p $b $(grep -o 'generated [0-9]* tok at [0-9.]* tok/s' $O/r$r-p$p-$b.log) cgroup peak ${peak} MiB"
      rmdir $G
    done
  done
done
python3 - "$O" <<'PY'
import json, sys, statistics as st
o = sys.argv[1]
for b in ("old", "new"):
    v, g = [], []
    for r in (1, 2):
        for p in (1, 2):
            s = json.load(open(f"{o}/r{r}-p{p}-{b}.json"))["segments"]
            v += [x["end"] - x["start"] for x in s if x["activity"] == "Verify"]
            g += [x["end"] - x["start"] for x in s if x["activity"] == "Grow"]
    print(f"{b}: {len(v)} verifications, median {st.median(v):.3f} s, mean {st.mean(v):.3f} s; grow mean {st.mean(g):.3f} s")
PY
