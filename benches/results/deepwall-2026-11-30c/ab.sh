#!/usr/bin/env bash
# The head read ahead, A/B: release builds of d597ee4 (OLD) and of the
# change (NEW), `arbor generate` under the planner's choice (auto: the slim
# 0.5B tree) with the F16 1.5B at 1130 MiB, uncapped, no cgroup, MT-Bench
# first turns 1-4 x 128 tokens, binaries alternated twice per prompt; each
# binary with its own copy of the deep wall's home. Prints per-run tok/s and
# the traced verification and draft times.
set -u
OLD=${OLD:-/work/arbor-d597} NEW=${NEW:-/work/arbor-hb}
M=/root/.cache/arbor/models O=${O:-/work/dw3-ab}
mkdir -p $O
for b in old new; do [ -d $O/home-$b ] || cp -a /work/home-dw3 $O/home-$b; done
python3 -c "
import json
for i,l in enumerate(open('/root/.cache/arbor/datasets/mt-bench-question.jsonl')):
    if i>=4: break
    open('$O/p%d.txt'%(i+1),'w').write(json.loads(l)['turns'][0])
"
for r in 1 2; do
  for p in 1 2 3 4; do
    for b in old new; do
      bin=$OLD; [ $b = new ] && bin=$NEW
      ARBOR_HOME=$O/home-$b $bin generate --model $M/qwen2.5-coder-1.5b-f16.gguf \
        --draft qwen2.5-coder-0.5b --memory-budget 1130MiB --max-tokens 128 \
        --prompt "$(cat $O/p$p.txt)" --trace $O/r$r-p$p-$b.json > $O/r$r-p$p-$b.txt 2> $O/r$r-p$p-$b.log
      echo "r$r p$p $b $(grep -o 'generated [0-9]* tok at [0-9.]* tok/s' $O/r$r-p$p-$b.log)"
    done
  done
done
python3 - "$O" <<'PY'
import json, sys, statistics as st
o = sys.argv[1]
for b in ("old", "new"):
    v, g = [], []
    for r in (1, 2):
        for p in (1, 2, 3, 4):
            s = json.load(open(f"{o}/r{r}-p{p}-{b}.json"))["segments"]
            v += [x["end"] - x["start"] for x in s if x["activity"] == "Verify"]
            g += [x["end"] - x["start"] for x in s if x["activity"] == "Grow"]
    print(f"{b}: {len(v)} verifications, median {st.median(v):.3f} s, mean {st.mean(v):.3f} s; grow mean {st.mean(g):.3f} s")
PY
