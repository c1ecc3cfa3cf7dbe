#!/usr/bin/env bash
# Three buffer sets or four when streamed weights stay in them: the release
# build of the change (ZC3, three sets: one layer more resident) against the
# same code with four sets (ZC4: the old reserve, copies saved only) and the
# build before the change (OLD), alternated twice. 2-vCPU AMD EPYC VM,
# cgroup v1, uncapped, 2 MT-Bench first turns x 48 tokens a row; each binary
# keeps its own copy of the regime sweep's home.
set -u
M=/root/.cache/arbor/models O=${O:-/work/zs}
mkdir -p $O
declare -A BIN=([old]=/work/arbor-hs [zc3]=/work/arbor-zc [zc4]=/work/arbor-zc4)
for b in old zc3 zc4; do [ -d $O/home-$b ] || cp -a /work/home-sweep2 $O/home-$b; done
row() {  # round bin name target budget strategies
  echo "=== r$1 $2 $3 $(date -u +%H:%M:%S)"
  ARBOR_HOME=$O/home-$2 ${BIN[$2]} bench spec --target $4 --draft qwen2.5-coder-0.5b \
    --memory-budget $5 --strategies "$6" --limit 2 --max-tokens 48 --json \
    > $O/r$1-$2-$3.jsonl 2> $O/r$1-$2-$3.log
}
for r in 1 2; do
  for b in zc3 zc4 old; do
    row $r $b f16 $M/qwen2.5-coder-1.5b-f16.gguf 1130MiB auto
    [ $b = old ] || row $r $b q8_0 $M/qwen2.5-coder-1.5b-q8_0.gguf 900MiB tree-no-fallback
  done
done
echo "=== sets done $(date -u +%H:%M:%S)"
