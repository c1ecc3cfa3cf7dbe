#!/bin/bash
# Fourth GPU run: the committed code on the H200. Our wgpu test binaries
# (kernel bits against the host, a row's bits alone and in a pass, the
# pass cache, matmul_add, GPU packing; chain/tree/static-tree, PPD and
# elastic speculation equal to target-only on tiny random models) run on
# the real GPU; then decode and L_fp(n) of the final build next to the
# build before this work (base), alternated.
set -u
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib:${LD_LIBRARY_PATH:-}
export ARBOR_HOME=/tmp/arbor-home
echo '{"file_format_version":"1.0.1","ICD":{"library_path":"libEGL_nvidia.so.0","api_version":"1.4.312"}}' > /tmp/nvidia_egl_icd.json
export VK_ICD_FILENAMES=/tmp/nvidia_egl_icd.json
R=/tmp/res4; mkdir -p $R /tmp/tbins
xz -dc tbins.txz | tar xf - -C /tmp/tbins
for b in base final; do xz -dc arbor-$b.xz > /tmp/arbor-$b; chmod +x /tmp/arbor-$b; done
T0=$(date +%s)
t() { echo "$(( $(date +%s) - T0 )) s"; }
apps() { while true; do echo "$(date +%s.%N) $(nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader | tr '\n' ';')" >> $R/apps-$1.txt; sleep 0.5; done; }
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt
for tb in arbor_backend_burn cube wgpu; do
  apps $tb & S=$!
  (cd /tmp && timeout 150 /tmp/tbins/$tb --test-threads 1 > $R/test-$tb.txt 2>&1); echo "test $tb rc=$? $(t) $(grep 'test result' $R/test-$tb.txt)" >> $R/log.txt
  kill $S
done
for shape in qwen2.5-7b qwen2.5-1.5b; do
  /tmp/arbor-final bench random-model --shape $shape --out /tmp/$shape.gguf 2>&1 | tail -1 >> $R/log.txt
done
for rep in 1 2; do for shape in qwen2.5-7b qwen2.5-1.5b; do for b in base final; do
  timeout 60 /tmp/arbor-$b bench decode --model /tmp/$shape.gguf --backend wgpu --tokens 64 --prompt-tokens 128 > $R/decode-$shape-$b-$rep.json 2>/dev/null
  echo "decode $shape $b $rep $(t) $(cat $R/decode-$shape-$b-$rep.json)" >> $R/log.txt
done; done; done
for shape in qwen2.5-7b qwen2.5-1.5b; do
  timeout 60 /tmp/arbor-final profile --model /tmp/$shape.gguf --backend wgpu --json --refresh > $R/profile-$shape-final.json 2>/dev/null
  echo "profile $shape rc=$? $(t)" >> $R/log.txt
done
echo "done $(t)" >> $R/log.txt
tar czf ${OUT:-/tmp}/results4.tgz -C $R .
cat $R/log.txt
