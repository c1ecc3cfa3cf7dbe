#!/bin/bash
# Second GPU run (issue 32): the 7B-shape file under a GPU budget of a third
# of its size, weights streamed from host memory, next to the same file
# resident, in one run.
set -u
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib:${LD_LIBRARY_PATH:-}
export ARBOR_HOME=/tmp/arbor-home
echo '{"file_format_version":"1.0.1","ICD":{"library_path":"libEGL_nvidia.so.0","api_version":"1.4.312"}}' > /tmp/nvidia_egl_icd.json
export VK_ICD_FILENAMES=/tmp/nvidia_egl_icd.json
B=/tmp/arbor; gunzip -c arbor.gz > $B; chmod +x $B
O=${OUT:-/tmp/out}; mkdir -p $O
T0=$(date +%s)
sample() { while true; do echo "$(date +%s.%N) $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits) $(nvidia-smi --query-compute-apps=used_memory --format=csv,noheader,nounits | tr '\n' ' ')" >> $O/mem-$1.txt; sleep 0.3; done; }
f=/tmp/q7b.gguf
$B bench random-model --shape qwen2.5-7b --out $f 2>&1 | tail -1
P="def quicksort(xs):\n    if len(xs) <= 1:\n        return xs\n"
run() { tag=$1; shift; sample $tag & S=$!; timeout 170 $B generate --model $f --backend wgpu --prompt "$P" --max-tokens 24 "$@" > /dev/null 2> $O/gen-$tag.err; echo "$tag rc=$? at $(( $(date +%s) - T0 )) s"; kill $S; grep -E "^\[|memory budget|streamed" $O/gen-$tag.err; }
run resident --strategy autoregressive
run third-pipelined --gpu-memory-budget 1.5GiB --strategy autoregressive-pipelined
run third-ondemand --gpu-memory-budget 1.5GiB --strategy autoregressive
$B bench decode --model $f --backend wgpu --tokens 32 --prompt-tokens 64 2>/dev/null | tee $O/decode-7b.json
