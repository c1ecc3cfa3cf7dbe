#!/bin/bash
# One prepared GPU run (issue 32, fewer launches and uploads per layer):
# random Qwen2.5-7B- and 1.5B-shape Q4_K_M files made here by our GGUF
# writer; decode speed and L_fp(n) on wgpu for the build before (base) and
# after (new) in the same run, alternated; CubeCL's tasks per submit; a
# GPU budget run that streams layers.
set -u
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib:${LD_LIBRARY_PATH:-}
export ARBOR_HOME=/tmp/arbor-home
echo '{"file_format_version":"1.0.1","ICD":{"library_path":"libEGL_nvidia.so.0","api_version":"1.4.312"}}' > /tmp/nvidia_egl_icd.json
export VK_ICD_FILENAMES=/tmp/nvidia_egl_icd.json
O=${OUT:-/tmp/out}; mkdir -p $O
for b in base new; do gunzip -c arbor-$b.gz > /tmp/arbor-$b; chmod +x /tmp/arbor-$b; done
T0=$(date +%s)
t() { echo "$(( $(date +%s) - T0 )) s"; }
sample() { while true; do echo "$(date +%s.%N) $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)" >> $O/mem-$1.txt; sleep 0.3; done; }
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv | tee $O/gpu.txt
for shape in qwen2.5-7b qwen2.5-1.5b; do
  /tmp/arbor-new bench random-model --shape $shape --out /tmp/$shape.gguf 2>&1 | tail -1 | tee -a $O/log.txt
done
dec() { # tag bin shape [env...]
  local tag=$1 b=$2 shape=$3; shift 3
  env "$@" timeout 100 /tmp/arbor-$b bench decode --model /tmp/$shape.gguf --backend wgpu --tokens 64 --prompt-tokens 128 > $O/decode-$tag.json 2> $O/decode-$tag.err
  echo "$tag rc=$? $(t) $(cat $O/decode-$tag.json)" | tee -a $O/log.txt
}
for rep in 1 2; do
  for shape in qwen2.5-7b qwen2.5-1.5b; do
    dec $shape-base-$rep base $shape
    [ $rep = 1 ] && { sample decode-$shape-new & S=$!; }
    dec $shape-new-$rep new $shape
    [ $rep = 1 ] && kill $S
  done
done
for n in 128 512; do dec qwen2.5-7b-new-tasks$n new qwen2.5-7b CUBECL_WGPU_MAX_TASKS=$n; done
echo "profiles $(t)" | tee -a $O/log.txt
for b in base new; do
  timeout 100 /tmp/arbor-$b profile --model /tmp/qwen2.5-7b.gguf --backend wgpu --json --refresh > $O/profile-7b-$b.json 2> $O/profile-7b-$b.err
  echo "profile $b rc=$? $(t)" | tee -a $O/log.txt
done
# The 7B-shape file under a GPU budget of a third of it (weights streamed
# from host memory every pass, pipelined): base packs blocks on the CPU,
# new uploads the file's bytes and packs them on the GPU.
P="def quicksort(xs):\n    if len(xs) <= 1:\n        return xs\n"
for b in base new; do
  sample budget-$b & S=$!
  timeout 120 /tmp/arbor-$b generate --model /tmp/qwen2.5-7b.gguf --backend wgpu --prompt "$P" --max-tokens 12 --temperature 0 --gpu-memory-budget 1.5GiB --strategy autoregressive-pipelined > /dev/null 2> $O/budget-$b.err
  echo "budget $b rc=$? $(t)" | tee -a $O/log.txt; kill $S; grep -E "^\[|memory budget|streamed" $O/budget-$b.err | tee -a $O/log.txt
done
echo "done $(t)" | tee -a $O/log.txt
