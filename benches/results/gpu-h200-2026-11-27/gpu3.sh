#!/bin/bash
# Third GPU run: how many activation rows one matmul unit takes (1, 2, 4,
# 8; ARBOR_CUBE_TILE forces it; the default caps 8 at the pass size):
# L_fp(n) of the 7B and 1.5B shapes, and decode, next to the previous
# build (new: 8 rows per unit always) in the same run.
set -u
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib:${LD_LIBRARY_PATH:-}
export ARBOR_HOME=/tmp/arbor-home
echo '{"file_format_version":"1.0.1","ICD":{"library_path":"libEGL_nvidia.so.0","api_version":"1.4.312"}}' > /tmp/nvidia_egl_icd.json
export VK_ICD_FILENAMES=/tmp/nvidia_egl_icd.json
R=/tmp/res3; mkdir -p $R
for b in new tile; do gunzip -c arbor-$b.gz > /tmp/arbor-$b; chmod +x /tmp/arbor-$b; done
T0=$(date +%s)
t() { echo "$(( $(date +%s) - T0 )) s"; }
for shape in qwen2.5-7b qwen2.5-1.5b; do
  [ -f /tmp/$shape.gguf ] || /tmp/arbor-tile bench random-model --shape $shape --out /tmp/$shape.gguf 2>&1 | tail -1 >> $R/log.txt
done
prof() { # tag bin shape [env]
  local tag=$1 b=$2 shape=$3; shift 3
  env "$@" timeout 60 /tmp/arbor-$b profile --model /tmp/$shape.gguf --backend wgpu --json --refresh > $R/profile-$tag.json 2> $R/profile-$tag.err
  echo "profile $tag rc=$? $(t)" >> $R/log.txt
}
for shape in qwen2.5-7b qwen2.5-1.5b; do
  prof $shape-new new $shape
  for tile in 1 2 4 8; do prof $shape-tile$tile tile $shape ARBOR_CUBE_TILE=$tile; done
done
for b in new tile; do
  timeout 60 /tmp/arbor-$b bench decode --model /tmp/qwen2.5-7b.gguf --backend wgpu --tokens 64 --prompt-tokens 128 > $R/decode-7b-$b.json 2>/dev/null
  echo "decode $b $(t) $(cat $R/decode-7b-$b.json)" >> $R/log.txt
done
echo "done $(t)" >> $R/log.txt
tar czf ${OUT:-/tmp}/results3.tgz -C $R .
cat $R/log.txt
