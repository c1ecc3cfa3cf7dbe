#!/usr/bin/env bash
# The F16 tile fix, A/B at the deep wall: release builds of 910510a (OLD)
# and of the change (NEW), `arbor generate` under the planner's choice
# (auto) with the F16 1.5B at 1130 MiB, uncapped, no cgroup, MT-Bench first
# turns 2-4 x 128 tokens, binaries alternated twice per prompt. Each binary
# has its own home holding only the fetched models, warmed by one
# generation of prompt 1 (not counted: it derives the slim draft and
# samples the latency profiles with its own kernels). Prints per-run tok/s
# and the traced verification and draft times.
set -u
OLD=${OLD:-/work/arbor-base} NEW=${NEW:-/work/arbor-t3}
M=/root/.cache/arbor/models O=${O:-/work/ab-tiles}
mkdir -p $O
python3 -c "
import json
for i,l in enumerate(open('/root/.cache/arbor/datasets/mt-bench-question.jsonl')):
    if i>=4: break
    open('$O/p%d.txt'%(i+1),'w').write(json.loads(l)['turns'][0])
"
gen() {  # binary-name prompt out
  local bin=$OLD; [ $1 = new ] && bin=$NEW
  ARBOR_HOME=$O/home-$1 $bin generate --model $M/qwen2.5-coder-1.5b-f16.gguf \
    --draft qwen2.5-coder-0.5b --memory-budget 1130MiB --max-tokens 128 \
    --prompt "$(cat $O/p$2.txt)" --trace $O/$3.json > $O/$3.txt 2> $O/$3.log
  echo "$3 $(grep -o 'generated [0-9]* tok at [0-9.]* tok/s' $O/$3.log) $(grep -o 'mean accepted [0-9.]*' $O/$3.log)"
}
for b in old new; do
  mkdir -p $O/home-$b/models
  for f in qwen2.5-coder-1.5b-f16.gguf qwen2.5-coder-0.5b.gguf qwen2.5-coder-0.5b.gguf.sha256-ok; do
    [ -e $O/home-$b/models/$f ] || ln $M/$f $O/home-$b/models/$f
  done
  gen $b 1 warm-$b
done
for r in 1 2; do
  for p in 2 3 4; do
    for b in old new; do gen $b $p r$r-p$p-$b; done
  done
done
python3 - "$O" <<'PY'
import json, sys, statistics as st
o = sys.argv[1]
for b in ("old", "new"):
    v, g, rows = [], [], []
    for r in (1, 2):
        for p in (2, 3, 4):
            s = json.load(open(f"{o}/r{r}-p{p}-{b}.json"))["segments"]
            v += [x["end"] - x["start"] for x in s if x["activity"] == "Verify"]
            rows += [x["tokens"] for x in s if x["activity"] == "Verify"]
            g += [x["end"] - x["start"] for x in s if x["activity"] == "Grow"]
    print(f"{b}: {len(v)} verifications, median {st.median(v):.3f} s over median {st.median(rows)} rows; grow mean {st.mean(g):.3f} s")
PY
