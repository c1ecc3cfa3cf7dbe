#!/bin/bash
# Second GPU run: three builds in one run, alternated — base (before this
# work), mid (fewer launches and uploads per layer, blocks packed on the
# GPU), new (mid + unrolled dequantization, the group kept in registers).
# Decode with CPU time (is the host the limit?), L_fp(n), driver memory.
# Everything lands in one tarball (the device returns only a few files).
set -u
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib:${LD_LIBRARY_PATH:-}
export ARBOR_HOME=/tmp/arbor-home
echo '{"file_format_version":"1.0.1","ICD":{"library_path":"libEGL_nvidia.so.0","api_version":"1.4.312"}}' > /tmp/nvidia_egl_icd.json
export VK_ICD_FILENAMES=/tmp/nvidia_egl_icd.json
R=/tmp/res; mkdir -p $R
for b in base mid new; do gunzip -c arbor-$b.gz > /tmp/arbor-$b; chmod +x /tmp/arbor-$b; done
T0=$(date +%s)
t() { echo "$(( $(date +%s) - T0 )) s"; }
sample() { while true; do echo "$(date +%s.%N) $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)" >> $R/mem-$1.txt; sleep 0.3; done; }
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv > $R/gpu.txt
for shape in qwen2.5-7b qwen2.5-1.5b; do
  [ -f /tmp/$shape.gguf ] || /tmp/arbor-new bench random-model --shape $shape --out /tmp/$shape.gguf 2>&1 | tail -1 >> $R/log.txt
done
dec() { # tag bin shape
  local tag=$1 b=$2 shape=$3
  /usr/bin/time -f "cpu user %U s sys %S s wall %e s" timeout 100 /tmp/arbor-$b bench decode --model /tmp/$shape.gguf --backend wgpu --tokens 64 --prompt-tokens 128 > $R/decode-$tag.json 2> $R/decode-$tag.err
  echo "$tag rc=$? $(t) $(tail -1 $R/decode-$tag.err) $(cat $R/decode-$tag.json)" >> $R/log.txt
}
for rep in 1 2; do
  for shape in qwen2.5-7b qwen2.5-1.5b; do
    for b in base mid new; do
      [ $rep = 1 ] && [ $b = new ] && { sample decode-$shape-new & S=$!; }
      dec $shape-$b-$rep $b $shape
      [ $rep = 1 ] && [ $b = new ] && kill $S
    done
  done
done
for b in base mid new; do
  timeout 100 /tmp/arbor-$b profile --model /tmp/qwen2.5-7b.gguf --backend wgpu --json --refresh > $R/profile-7b-$b.json 2> $R/profile-7b-$b.err
  echo "profile 7b $b rc=$? $(t)" >> $R/log.txt
done
timeout 60 /tmp/arbor-new profile --model /tmp/qwen2.5-1.5b.gguf --backend wgpu --json --refresh > $R/profile-1.5b-new.json 2> $R/profile-1.5b-new.err
echo "done $(t)" >> $R/log.txt
tar czf ${OUT:-/tmp}/results.tgz -C $R .
cat $R/log.txt
